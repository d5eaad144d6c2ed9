"""Seeded mutations of the shipped specs: validation answers every one with SpecErrors or a spec, nothing else.

Each case mutates one shipped spec (a deleted, inserted or repeated character or line, a changed indentation, a
value swapped for a hostile one: huge numbers, deep nesting, aliases, control characters, sandbox escapes,
pathological regexes and templates, octal / hex integers past the digit limit, lone surrogates) and runs the whole
validation stage, then renders the script of what validates. The test fails on any other exception
(RecursionError, ReaderError, OSError, ValueError ...), on a problem without a known code or a report that does
not format, and on a case slower than the 2 s every input must be answered in.

The command line's inputs from the environment are fuzzed the same way (seeded): folders that cannot be written
(the run directory, ``$SAILRL_HOME``), path arguments of hostile lengths, and a stdout whose reader has gone:
each ends in one line with exit 1 or 2 (a closed pipe: quietly, exit 0), never exit 70 or a traceback.
"""

from __future__ import annotations

import copy
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sailrl.cli import main
from sailrl.compiler.render import render_script
from sailrl.compiler.validate import validate_text
from sailrl.compiler.words import reward_words
from sailrl.spec.codes import CODES
from sailrl.spec.errors import SpecErrors

ROOT = Path(__file__).resolve().parents[2]
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
    # integers past the digit limit in octal / hex (int() converts those without a limit; str() then raises),
    # a float tag on one, and lone UTF-16 surrogates (no UTF-8 text can hold them)
    "0x" + "f" * 3600, "0o" + "7" * 5200, "!!float 0x" + "f" * 300, "!!int 0x" + "f" * 4000, '"\\ud800"',
    '"ok \\udfff"', '"\\ud83d\\ude00"',
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
            # what validates must compile: every value reaches the script as a literal
            render_script(loaded.spec, spec_path=str(where), spec_bytes=text.encode("utf-8", "surrogatepass"),
                          output_path=str(ROOT / "generated" / f"{name}.py"),
                          reward_words=reward_words(loaded.spec))
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


def _sections(node, path=()):
    """(key path, value) of every mapping and list in ``node`` down to two keys deep (a section, its subsections
    and lists: ``model``, ``reward.rules``, ``environment.tools``)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if isinstance(value, (dict, list)):
            yield (*path, key), value
            if len(path) < 1:
                yield from _sections(value, (*path, key))


def _wrong_shapes():
    for source in SOURCES:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
        for path, value in _sections(data):
            for other in ("x", 3, ["a", 1] if isinstance(value, dict) else {"a": 1}):
                changed = copy.deepcopy(data)
                parent = changed
                for key in path[:-1]:
                    parent = parent[key]
                parent[path[-1]] = other
                yield f"{source.stem}:{'.'.join(map(str, path))}={other!r}", yaml.safe_dump(changed, sort_keys=False)


def test_a_section_of_the_wrong_shape_is_a_located_error():
    """Every mapping or list of the shipped specs (two keys deep) replaced by a plain value, a number, or a list
    for a mapping (a mapping for a list): each is a problem (a plain value one located at that key), never another
    exception. (A mapping is a valid ``dataset.fields``: the templates then name unknown fields.)"""
    failures = []
    for name, text in _wrong_shapes():
        path, other = name.split(":", 1)[1].split("=", 1)
        try:
            validate_text(text, "s.yaml", path=EXAMPLES / "s.yaml")
        except SpecErrors as exc:
            if other[0] not in "[{" and not any(e.key_path == path or path.startswith(e.key_path + ".") or e.key_path.startswith(path + ".")
                       for e in exc.errors if not e.is_warning):
                failures.append(f"{name}: no error at {path}: {[e.key_path for e in exc.errors]}")
        except Exception as exc:  # noqa: BLE001 -- the point of the test
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            failures.append(f"{name}: validated")
    assert not failures, "\n".join(failures)


def test_a_plain_model_beside_an_environment_is_one_located_error(tmp_path, capsys):
    """calculator.yaml with ``model: sailrl/tiny-tools``: exit 1 with the schema's S103 at ``model``, and no
    check speaks of a model the spec does not name."""
    text = (EXAMPLES / "calculator.yaml").read_text(encoding="utf-8")
    start = text.index("\nmodel:\n") + 1
    end = text.index("\n\n", start)
    (tmp_path / "data").mkdir()
    shutil.copy(EXAMPLES / "data" / "addition.jsonl", tmp_path / "data")
    spec = tmp_path / "calculator.yaml"
    spec.write_text(text[:start] + "model: sailrl/tiny-tools" + text[end:], encoding="utf-8")
    assert main(["validate", str(spec)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{spec}:23:8: model: expected a mapping (indented `key: value` lines), got "
                          "'sailrl/tiny-tools'\n")
    assert err.count("= code: ") == 1 and "= code: S103 wrong-type" in err
    assert "Traceback" not in err and "Kimi" not in err


# ------------------------------------------------------------------------------ the command line's environment

QUICKSTART = EXAMPLES / "quickstart.yaml"


def _hostile_names(rng: random.Random, n: int = 6) -> list[str]:
    names = ["a" * 300, "a" * 256, "x/" * 2100, "a" * 255 + "/b"]
    names += ["".join(rng.choice("ab/.é ") for _ in range(rng.randint(256, 5000))) for _ in range(n)]
    return names


@pytest.mark.parametrize("name", _hostile_names(random.Random(SEED)), ids=lambda n: f"{len(n)}chars")
def test_clean_runs_with_a_hostile_path_is_a_usage_error(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SAILRL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert main(["clean", "--runs", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sailrl clean: error: --runs ") and "Traceback" not in err and err.count("\n") == 1


def _unwritable(tmp_path: Path, how: str) -> Path:
    """A folder path that cannot be written: under a regular file, or (as root can write anywhere) reported
    read-only by os.access, as on a read-only file system."""
    if how == "under a file":
        (tmp_path / "afile").write_text("")
        return tmp_path / "afile" / "sub"
    target = tmp_path / "readonly"
    target.mkdir()
    return target


@pytest.mark.parametrize("how", ["under a file", "read-only"])
@pytest.mark.parametrize("which", ["run_dir", "SAILRL_HOME"])
def test_a_folder_that_cannot_be_written_is_one_line_and_nothing_is_written(which, how, tmp_path, monkeypatch,
                                                                            capsys):
    import os

    bad = _unwritable(tmp_path, how)
    if how == "read-only":
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) in (bad, bad / "checkpoints")
                            else real(p, mode, **kw))
    run_dir = bad / "run" if which == "run_dir" and how == "under a file" else (
        bad if which == "run_dir" else tmp_path / "runs" / "q")
    monkeypatch.setenv("SAILRL_HOME", str(bad if which == "SAILRL_HOME" else tmp_path / "home"))
    rc = main(["run", str(QUICKSTART), "--set", f"output.run_dir={run_dir}", "--set", "training.steps=1"])
    err = capsys.readouterr().err
    assert rc == 1, err
    what = "the run directory" if which == "run_dir" else "the embedded backend's checkpoint folder"
    line = next(x for x in err.splitlines() if x.startswith("error: "))
    assert what in line and ("Not a directory" in line or "no permission" in line or "read-only" in line), err
    assert "Traceback" not in err and "internal error" not in err
    if which == "SAILRL_HOME":
        assert not (tmp_path / "runs").exists()  # refused before the run directory was made


def _closed_stdout(argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``python -m sailrl ARGV`` with stdout a pipe whose reader is already closed (``| head`` gone)."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "sailrl", *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120, cwd=ROOT)
    finally:
        os.close(write)


@pytest.mark.parametrize("argv", [
    ["explain", str(QUICKSTART)],  # plain print()
    ["rewards", str(QUICKSTART), "--completion", "7", "--field", "answer=7"],  # a rich Console
    ["schema"],
], ids=lambda a: a[0])
def test_a_closed_pipe_ends_quietly_with_exit_0(argv):
    out = _closed_stdout(argv)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
