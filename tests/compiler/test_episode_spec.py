"""The ``environment:`` section at validate: located, coded errors for every bad input the issue lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from sailrl.compiler.validate import problems
from sailrl.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = (ROOT / "spec" / "examples" / "quickstart.yaml").read_text(encoding="utf-8")
BASE = QUICKSTART[: QUICKSTART.index("\nexamples:")].replace("data/addition.jsonl", "addition.jsonl")

TOOLS_PY = '''
def lookup(city: str) -> str:
    """The weather in a city."""
    return city

def untyped(x):
    return x
'''


def _problems(tmp_path: Path, environment: str, *, renderer: str = "role_colon_tools") -> list:
    (tmp_path / "tools.py").write_text(TOOLS_PY)
    (tmp_path / "addition.jsonl").write_text('{"question": "1+2", "answer": "3"}\n')
    text = BASE.replace("renderer: role_colon      #", f"renderer: {renderer}  #") + "\nenvironment:\n" + environment
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return problems(text, str(path), path=path)[1]


def _codes(found) -> dict[str, list]:
    out: dict[str, list] = {}
    for e in found:
        if not e.is_warning:
            out.setdefault(e.code, []).append(e)
    return out


def test_a_good_environment_has_no_problem(tmp_path):
    found = _codes(_problems(tmp_path, "  max_turns: 3\n  tools:\n    - builtin: calculator\n"
                                       "    - function: tools:lookup\n  feedback:\n    - rule: correct\n"))
    assert found == {}


def test_every_bad_input_is_located_and_coded(tmp_path):
    env = ("  max_turns: 0\n  tools:\n    - builtin: calculator\n    - builtin: calculator\n"
           "    - function: tools:nope\n    - function: missing:fn\n    - function: tools:untyped\n"
           "    - builtin: pythn\n  feedback:\n    - rule: corect\n      message: 'Not quite: {{ wyh }}'\n")
    found = _codes(_problems(tmp_path, env, renderer="role_colon"))
    by_path = {(e.code, e.key_path): e for errs in found.values() for e in errs}
    assert ("S107", "environment.max_turns") in by_path
    dup = by_path[("S250", "environment.tools.1.builtin")]
    assert "two tools are named 'calculator'" in dup.message and dup.line > 0
    assert "has no function 'nope'" in by_path[("S254", "environment.tools.2.function")].message
    assert "no file missing.py" in by_path[("S254", "environment.tools.3.function")].message
    assert "has no type hint" in by_path[("S254", "environment.tools.4.function")].message
    assert "'pythn' is not a built-in tool; the built-in tools are: calculator, python" in \
        by_path[("S104", "environment.tools.5.builtin")].message
    fb = by_path[("S251", "environment.feedback.0.rule")]
    assert "did you mean 'correct'" in fb.message
    assert "did you mean 'why'" in by_path[("S206", "environment.feedback.0.message")].message
    r = by_path[("S252", "model.renderer")]
    assert "role_colon" in r.message and "role_colon_tools" in r.hint
    assert not any(e.code == "S250" and e.key_path == "environment" for e in found.get("S250", []))


@pytest.mark.parametrize("renderer, ok", [("qwen3", True), ("llama3", False), ("chat_template", False)])
def test_renderers_that_cannot_write_tool_calls_are_refused(tmp_path, renderer, ok):
    found = _codes(_problems(tmp_path, "  tools:\n    - builtin: calculator\n", renderer=renderer))
    assert ("S252" not in found) == ok


def test_feedback_without_tools_works_with_any_renderer(tmp_path):
    found = _codes(_problems(tmp_path, "  feedback:\n    - rule: correct\n", renderer="role_colon"))
    assert found == {}


def test_a_spec_without_environment_resolves_as_before(tmp_path):
    (tmp_path / "spec.yaml").write_text(BASE)
    spec = load_spec(tmp_path / "spec.yaml").spec
    assert spec.environment is None and "environment" not in spec.resolved()


def test_feedback_that_shows_an_answer_rules_reason_is_warned(tmp_path):
    found = _problems(tmp_path, "  feedback:\n    - rule: correct\n      message: 'Not quite: {{ why }}'\n")
    warned = [e for e in found if e.code == "W130"]
    assert len(warned) == 1 and warned[0].key_path == "environment.feedback.0.message"
    assert "reference answer" in warned[0].message
    assert not [e for e in _problems(tmp_path, "  feedback:\n    - rule: correct\n") if e.code == "W130"]


def test_feedback_that_max_turns_never_allows_is_warned_at_its_key(tmp_path):
    found = _problems(tmp_path, "  max_turns: 1\n  feedback:\n    - rule: correct\n")
    assert [(e.code, e.key_path, e.is_warning) for e in found] == [("W132", "environment.max_turns", True)]
    assert "never gets it" in found[0].message and "max_turns: 2" in found[0].hint and found[0].line > 0
    assert _problems(tmp_path, "  max_turns: 2\n  feedback:\n    - rule: correct\n") == []
    assert _problems(tmp_path, "  max_turns: 1\n  tools:\n    - builtin: calculator\n") == []


def test_the_python_tool_validates_in_either_sandbox(tmp_path):
    for env in ("  tools:\n    - builtin: python\n", "  sandbox: sail\n  tools:\n    - builtin: python\n"):
        found = _problems(tmp_path, env)
        assert found == [], found


def test_a_sail_sandbox_without_a_tool_that_uses_it_is_warned_at_its_key(tmp_path):
    found = _problems(tmp_path, "  sandbox: sail\n  tools:\n    - builtin: calculator\n")
    assert [(e.code, e.key_path, e.is_warning) for e in found] == [("W131", "environment.sandbox", True)]
    assert "no Sailbox would start" in found[0].message and "builtin: python" in found[0].hint
    assert found[0].line > 0
    found = _codes(_problems(tmp_path, "  sandbox: docker\n  tools:\n    - builtin: python\n"))
    assert list(found) == ["S104"] and found["S104"][0].key_path == "environment.sandbox"


# ------------------------------------------------------------------------------------------------ the sandbox


def test_the_python_tool_without_its_sandbox_is_refused_at_validate_and_run_start(tmp_path, monkeypatch):
    from sailrl.runtime.rollouts.episode import ToolLoadError, build_tools
    from sailrl.runtime.sandbox import bubblewrap
    from sailrl.spec.environment import EnvironmentSpec

    why = "the python tool's isolation needs bubblewrap, which is not installed: " + bubblewrap.INSTALL_HINT
    monkeypatch.setattr(bubblewrap, "_check", lambda: (why, None))
    found = _problems(tmp_path, "  tools:\n    - builtin: calculator\n    - builtin: python\n")
    refused = [e for e in found if e.code == "S255"]
    assert [(e.key_path, e.is_warning) for e in refused] == [("environment.tools.1.builtin", False)]
    assert "apt-get install bubblewrap" in refused[0].message and "unisolated_worker" in refused[0].hint
    with pytest.raises(ToolLoadError, match="apt-get install bubblewrap"):
        build_tools(EnvironmentSpec.model_validate({"tools": [{"builtin": "python"}]}), tmp_path)
    # opting out of isolation is a warning, never a silent downgrade; a Sailbox needs no bubblewrap
    unisolated = _problems(tmp_path, "  sandbox: unisolated_worker\n  tools:\n    - builtin: python\n")
    assert [(e.code, e.key_path, e.is_warning) for e in unisolated] == [("W133", "environment.sandbox", True)]
    sail = _problems(tmp_path, "  sandbox: sail\n  tools:\n    - builtin: python\n")
    assert not [e for e in sail if e.code in ("S255", "W133")]


def test_network_and_disk_belong_to_the_python_tool_and_network_is_warned_about(tmp_path):
    networked = _problems(tmp_path, "  tools:\n    - builtin: python\n      network: true\n      disk_mb: 8\n")
    assert [(e.code, e.key_path, e.is_warning) for e in networked if e.code.startswith("W13")] == [
        ("W134", "environment.tools.0.network", True)]
    wrong = _codes(_problems(tmp_path, "  tools:\n    - builtin: calculator\n      network: true\n"))
    assert list(wrong) == ["S256"] and "remove network" in wrong["S256"][0].message
