"""Seeded mutations of the shipped specs: validation answers every one with SpecErrors or a spec, nothing else.

Each case mutates one shipped spec (a deleted, inserted or repeated character or line, a changed indentation, a
value swapped for a hostile one: huge numbers, deep nesting, aliases, control characters, sandbox escapes,
pathological regexes and templates) and runs the whole validation stage. The test fails on any other exception
(RecursionError, ReaderError, OSError, ValueError ...), on a problem without a known code or a report that does
not format, and on a case slower than the 2 s every input must be answered in.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from sailrl.compiler.validate import validate_text
from sailrl.spec.codes import CODES
from sailrl.spec.errors import SpecErrors

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "spec" / "examples"
SOURCES = [*sorted(EXAMPLES.glob("*.yaml")), ROOT / "spec" / "starter.yaml"]
CASES = 240
SEED = 20261201

CHARS = ["\x00", "\x0c", "\x1b", "\x7f", "\t", "'", '"', "[", "]", "{", "}", "{{", "{%", "%}", "&a ", "*a", ": ",
         "- ", "#", "\n", "é", "\u2028", "\\", "\\U99999999", "!!", "<<: ", "|", ">", "?", "@", "`", "\r"]
VALUES = [
    "9" * 5000, "1e400", "-1", "0", ".nan", "-.inf", "[" * 700 + "]" * 700, "{a: " * 300 + "1" + "}" * 300,
    "*undefined", "&x [*x]", "'" + "a" * 300 + "'", "'{{ question.__class__.__mro__ }}'", "'{{ cycler.__init__ }}'",
    "'" + "(" * 600 + "a" + ")" * 600 + "'", "'(?:a{1000}){1000}'", "!!python/object:os.system", '"\\U99999999"',
    "null", "[]", "{}", "true", "'\\x'", "'{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}'", "'{{ 9**(9*10**8) }}'", "'{{ \"a\" * 10**8 }}'", "'{{ lipsum(n=100000) }}'",
    "'{{ x" + "|upper" * 200 + " }}'", "'{{ 1" + " + 1" * 700 + " }}'", "'" + "{% if x %}" * 150 + "'",
    "priority", "1e5", "'\\b\\d+'", '"\\bx"', "0x" + "f" * 3000, "'" + "x" * 300 + "/y'", "[1, 2, 3]",
]


def _mutate(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    op = rng.randrange(9)
    if op == 0 and text:
        i = rng.randrange(len(text))
        return text[:i] + text[i + 1:]
    if op == 1:
        i = rng.randrange(len(text) + 1)
        return text[:i] + rng.choice(CHARS) + text[i:]
    if op == 2:
        i = rng.randrange(len(lines))
        return "\n".join(lines[:i + 1] + [lines[i]] + lines[i + 1:])
    if op == 3:
        i = rng.randrange(len(lines))
        return "\n".join(lines[:i] + lines[i + 1:])
    if op == 4:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    if op == 5:
        i = rng.randrange(len(lines))
        lines[i] = (" " * rng.randint(1, 3) + lines[i]) if rng.random() < 0.5 else lines[i][rng.randint(1, 3):]
        return "\n".join(lines)
    if op == 6:
        candidates = [i for i, line in enumerate(lines) if ": " in line and not line.lstrip().startswith("#")]
        if candidates:
            i = rng.choice(candidates)
            key = lines[i].split(": ", 1)[0]
            lines[i] = f"{key}: {rng.choice(VALUES)}"
        return "\n".join(lines)
    if op == 7:
        return text[: rng.randrange(len(text) + 1)]
    i = rng.randrange(len(lines))
    return "\n".join(lines[:i] + [f"extra{i}: {rng.choice(VALUES)}"] + lines[i:])


def _cases() -> list[tuple[str, Path, str]]:
    rng = random.Random(SEED)
    out = []
    for n in range(CASES):
        source = SOURCES[n % len(SOURCES)]
        text = source.read_text(encoding="utf-8")
        for _ in range(rng.choice((1, 1, 2, 3))):
            text = _mutate(rng, text)
        out.append((f"{source.stem}-{n}", source, text))
    return out


def test_no_mutation_escapes_as_anything_but_spec_errors():
    slowest = (0.0, "")
    failures = []
    for name, _source, text in _cases():
        where = EXAMPLES / f"{name}.yaml"  # relative data paths resolve as for the shipped specs
        start = time.perf_counter()
        try:
            loaded = validate_text(text, f"{name}.yaml", path=where)
            found = loaded.warnings
        except SpecErrors as exc:
            found = exc.errors
            report = exc.format()
            assert report and "Traceback" not in report
        except Exception as exc:  # noqa: BLE001 -- the point of the test
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        took = time.perf_counter() - start
        slowest = max(slowest, (took, name))
        for e in found:
            assert e.code in CODES, (name, e)
            assert e.line >= 0 and e.column >= 0, (name, e)
    assert not failures, "\n".join(failures)
    assert slowest[0] < 2.0, f"{slowest[1]} took {slowest[0]:.2f} s"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_the_unmutated_sources_are_valid(source):
    where = EXAMPLES / source.name  # the starter's data/addition.jsonl lives beside the examples
    loaded = validate_text(source.read_text(encoding="utf-8"), source.name, path=where)
    assert loaded.spec is not None
    assert all(e.code in CODES for e in loaded.warnings)
