"""Keep docs/reward-rules.md true: every snippet loads, every claimed score holds, every shown output is real.

Conventions in the guide (a fenced block's first line decides what it is):

* ```` ```yaml ```` starting ``# example: <name>``: a complete ``reward:`` section plus ``examples:``. It is put in a
  small spec (``HEADER`` below, then the snippet as written) and loaded with :func:`sailrl.compiler.validate.validate_file`,
  which scores every example; a disagreement raises. Every example block must have examples.
* ```` ```yaml ```` starting ``# mistake: <name>``: a deliberately wrong section; loading it must fail.
* ```` ```text ```` starting ``$ sailrl ...``: that command, run on the spec of the nearest yaml block above it
  (or of the example named by a ``<!-- spec: NAME -->`` line right before the fence). Every following line must appear in the command's output, in order (``...`` marks lines left out). Commands on
  an example must exit 0, ``validate`` on a mistake must exit 1.

* ```` ```python ```` starting ``# file: <name>``: a Python file that every snippet's spec folder gets (what
  ``kind: python`` rules name). Every python block must name its file.

Every ```` ```yaml ```` block in the guide must be an example or a mistake, so nothing goes unchecked. An example
whose answer rules draw a "can be gamed" warning (W110) must show that warning in a ``$ sailrl validate`` block.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from sailrl.cli import main as sailrl_main
from sailrl.compiler.validate import validate_file
from sailrl.spec.errors import SpecErrors

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "reward-rules.md"

# The spec around every snippet; the guide's error locations count from here (the snippet starts at line 6).
HEADER = """\
name: reward-guide
model: {{name: sailrl/tiny}}
dataset: {{source: rows.jsonl, fields: [{fields}]}}
prompt: {{user: '{{{{ question }}}}'}}
sampling: {{sampler: local}}
"""
HEADER_LINES = 5

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"#\s*(example|mistake):\s*(\S+)")
_SPEC_COMMENT = re.compile(r"<!--\s*spec:\s*(\S+)\s*-->")


@dataclass
class Snippet:
    kind: str  # "example" | "mistake"
    name: str
    text: str
    line: int  # line of the opening fence in the guide
    commands: list[tuple[str, list[str], int]] = field(default_factory=list)  # (command, expected lines, line)


_FILE_MARK = re.compile(r"#\s*file:\s*(\S+)")
#: The guide's Python files (name -> text), written next to every snippet's spec.
FILES: dict[str, str] = {}


def _snippets() -> list[Snippet]:
    source = GUIDE.read_text(encoding="utf-8")
    out: list[Snippet] = []
    for m in _FENCE.finditer(source):
        lang, body = m.group(1), m.group(2)
        line = source.count("\n", 0, m.start()) + 1
        first = body.split("\n", 1)[0]
        if lang == "python":
            mark = _FILE_MARK.fullmatch(first.strip())
            assert mark, f"reward-rules.md:{line}: a python block must start with '# file: NAME'"
            FILES[mark.group(1)] = body
        elif lang == "yaml":
            mark = _MARK.fullmatch(first.strip())
            assert mark, f"reward-rules.md:{line}: a yaml block must start with '# example: NAME' or '# mistake: NAME'"
            out.append(Snippet(mark.group(1), mark.group(2), body, line))
        elif lang == "text" and first.startswith("$ sailrl "):
            before = source[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            chosen = _SPEC_COMMENT.fullmatch(before.strip())
            target = [s for s in out if chosen and s.name == chosen.group(1)] or out[-1:]
            assert target, f"reward-rules.md:{line}: a command block needs a yaml block above it"
            expected = [x.rstrip() for x in body.split("\n")[1:] if x.strip()]
            target[0].commands.append((first[2:], expected, line))
    return out


SNIPPETS = _snippets()


def _fields(snippet: Snippet) -> list[str]:
    """question and answer, then every field the snippet's examples and references name (examples only)."""
    names = ["question", "answer"]
    if snippet.kind != "example":
        return names
    data = yaml.safe_load(snippet.text)
    for ex in data.get("examples") or []:
        names += [k for k in (ex.get("fields") or {}) if k not in names]
    for rule in data["reward"]["rules"]:
        ref = (rule.get("reference") or {}).get("field")
        if ref and ref not in names:
            names.append(ref)
    return names


def _write_spec(snippet: Snippet, folder: Path) -> Path:
    names = _fields(snippet)
    (folder / "rows.jsonl").write_text(
        "{" + ", ".join(f'"{n}": "1"' for n in names) + "}\n", encoding="utf-8"
    )
    for name, text in FILES.items():
        (folder / name).write_text(text, encoding="utf-8")
    path = folder / "spec.yaml"
    path.write_text(HEADER.format(fields=", ".join(names)) + snippet.text, encoding="utf-8")
    return path


def _in_order(expected: list[str], output: str) -> str | None:
    """None when every expected line (``...`` skipped) occurs in ``output`` in order, else the first missing."""
    lines = [x.rstrip() for x in output.splitlines()]
    i = 0
    for want in expected:
        if want.strip() == "...":
            continue
        while i < len(lines) and lines[i] != want:
            i += 1
        if i == len(lines):
            return want
        i += 1
    return None


def test_guide_has_the_documented_snippets() -> None:
    kinds = [s.kind for s in SNIPPETS]
    assert kinds.count("example") >= 15 and kinds.count("mistake") >= 8
    names = [s.name for s in SNIPPETS]
    assert len(names) == len(set(names)), "snippet names must be unique"
    # Every kind of rule, extractor and comparison appears in some example.
    examples = "\n".join(s.text for s in SNIPPETS if s.kind == "example")
    for word in ("kind: answer", "kind: match", "kind: termination", "kind: length", "kind: has_answer",
                 "kind: all_of", "from: boxed", "from: regex", "from: last_number", "from: after_marker",
                 "from: whole", "compare: exact", "compare: normalized", "compare: numeric", "compare: math",
                 "mode: fullmatch", "negate: true", "DOTALL", "clip:", "correct_rule:", "abs_tol", "rel_tol",
                 "fallback: whole", "occurrence: first", "truncated: true", "num_tokens:", "kind: python",
                 "timeout_s:"):
        assert word in examples, f"no example in the guide uses {word!r}"


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if s.kind == "example"], ids=lambda s: s.name)
def test_example_snippet_loads_and_scores_as_claimed(snippet: Snippet, tmp_path: Path, monkeypatch) -> None:
    data = yaml.safe_load(snippet.text)
    assert set(data) <= {"reward", "examples"}, f"{snippet.name}: only reward: and examples: belong in a snippet"
    assert data.get("examples"), f"{snippet.name}: an example snippet must have worked examples"
    monkeypatch.chdir(tmp_path)
    _write_spec(snippet, tmp_path)
    try:
        loaded = validate_file("spec.yaml")  # scores every example; a disagreement raises SpecErrors
    except SpecErrors as exc:
        pytest.fail(f"reward-rules.md:{snippet.line}: snippet '{snippet.name}' does not load:\n{exc.format()}")
    assert len(loaded.spec.examples) == len(data["examples"])
    shown = "\n".join("\n".join(e) for c, e, _ in snippet.commands if c.startswith("sailrl validate"))
    for w in loaded.warnings:
        assert w.code != "W110" or w.message in shown, (
            f"reward-rules.md:{snippet.line}: snippet '{snippet.name}' can be gamed and the guide does not say so "
            f"(show it in a `$ sailrl validate spec.yaml` block):\n{w.message}")


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if s.kind == "mistake"], ids=lambda s: s.name)
def test_mistake_snippet_is_rejected(snippet: Snippet, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write_spec(snippet, tmp_path)
    with pytest.raises(SpecErrors):
        validate_file("spec.yaml")
    assert snippet.commands, f"reward-rules.md:{snippet.line}: show what sailrl says about mistake '{snippet.name}'"


@pytest.mark.parametrize(
    "snippet, command, expected, line",
    [pytest.param(s, c, e, ln, id=f"{s.name}-{c.split()[1]}-line{ln}") for s in SNIPPETS for c, e, ln in s.commands],
)
def test_shown_command_output_is_real(snippet: Snippet, command: str, expected: list[str], line: int,
                                      tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setenv("NO_COLOR", "1")
    _write_spec(snippet, tmp_path)
    argv = shlex.split(command)
    assert argv[0] == "sailrl"
    rc = sailrl_main(argv[1:])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert rc == (1 if snippet.kind == "mistake" else 0), output
    missing = _in_order(expected, output)
    assert missing is None, f"reward-rules.md:{line}: `{command}` does not print\n{missing}\nIt printed:\n{output}"
