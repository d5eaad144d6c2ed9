"""A warning is said once: a spec's warnings once per command (in full by ``sailrl validate``, one line each by the
commands that go on to do something else), and a run's step warnings once per streak -- when it starts and, with
its length, when it ends or the run does -- never step by step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sailrl.cli import main
from sailrl.runtime.loop.records import Streaks

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "spec/examples/quickstart.yaml"
GAMED = ("rule 'correct' can be gamed: it scores 6 adversarial completion(s) as correct -- every option listed: "
         "'The answer is \\boxed{43, 42}.'; two answers: 'The answer is \\boxed{43 or 42}.'; the right answer "
         "outside the answer, after a wrong one: 'The answer is \\boxed{43}. (or maybe 42)' (and 3 more)")


def _gameable_quickstart(tmp_path: Path) -> Path:
    """The quickstart with its `correct` rule reading the last number anywhere (a W110) and no examples."""
    text = QUICKSTART.read_text(encoding="utf-8")
    text = text.replace("extract: {from: whole}\n      reference:", "extract: {from: last_number}\n      reference:")
    text = text.replace("source: data/addition.jsonl", f"source: {ROOT / 'spec/examples/data/addition.jsonl'}")
    text = text.replace("run_dir: runs/quickstart", f"run_dir: {tmp_path / 'run'}")
    text = text[: text.index("examples:")]
    path = tmp_path / "gameable.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _where(spec: Path) -> str:
    """``file:line:col`` of the `correct` rule's extract in the gameable copy (the quickstart's header may grow)."""
    lines = spec.read_text(encoding="utf-8").splitlines()
    n = next(i for i, line in enumerate(lines, 1) if "extract: {from: last_number}" in line)
    return f"{spec}:{n}:{lines[n - 1].index('{') + 1}"


def _lines(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def test_validate_shows_the_gameable_rule_once_with_its_line_hint_and_code(tmp_path, capsys):
    spec = _gameable_quickstart(tmp_path)
    assert main(["validate", str(spec), "--color", "never"]) == 0
    out, err = capsys.readouterr()
    assert out == f"ok: {spec} (1 warning)\n"
    assert _lines(err, "can be gamed") == [f"{_where(spec)}: warning: reward.rules.0.extract: {GAMED}"]
    assert err.count("= hint: from: last_number takes the last number") == 1
    assert err.count("= code: W110 answer-rule-gameable") == 1


def test_compile_says_each_warning_in_one_line_and_where_to_read_it(tmp_path, capsys):
    spec = _gameable_quickstart(tmp_path)
    assert main(["compile", str(spec), "-o", str(tmp_path / "train.py")]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"{_where(spec)}: warning: reward.rules.0.extract: {GAMED} [W110]",
        f"(sailrl validate {spec} shows each warning with its line and what to do)",
    ]


def test_run_with_a_refused_override_says_the_spec_warning_once(tmp_path, capsys):
    spec = _gameable_quickstart(tmp_path)
    assert main(["run", str(spec), "--set", "training.steps=0"]) == 2
    err = capsys.readouterr().err
    assert len(_lines(err, "can be gamed")) == 1, err
    assert _lines(err, "can be gamed") == [f"{_where(spec)}: warning: reward.rules.0.extract: {GAMED} [W110]"]
    assert "<spec with --set overrides>:31:10: training.steps: must be greater than 0, got '0'" in err
    assert "= code: W110" not in err and "1 error and 1 warning" not in err
    assert err.rstrip().endswith("(these come from the --set overrides: training.steps=0)")
    assert not (tmp_path / "run").exists()


def test_an_override_that_fixes_a_warning_drops_it_and_one_that_adds_one_says_so(tmp_path, capsys):
    spec = _gameable_quickstart(tmp_path)
    # steps=0 is refused, so nothing trains; the warnings printed are those of the spec the run would use
    assert main(["run", str(spec), "--set", "reward.rules.0.extract.from=whole", "--set", "training.steps=0"]) == 2
    assert "can be gamed" not in capsys.readouterr().err
    assert main(["run", str(spec), "--set", "sampling.temperature=0", "--set", "training.steps=0"]) == 2
    err = capsys.readouterr().err
    assert len(_lines(err, "can be gamed")) == 1
    (unusual,) = _lines(err, "warning: sampling.temperature")
    assert unusual.startswith("<spec with --set overrides>:") and unusual.endswith("[W101]")


@pytest.mark.slow
def test_a_run_says_a_spec_warning_once_and_a_truncation_streak_twice(tmp_path, capsys):
    spec = _gameable_quickstart(tmp_path)
    rc = main(["run", str(spec), "--set", "training.steps=4", "--set", "training.groups_per_step=2",
               "--set", "training.group_size=4", "--set", "sampling.max_tokens=1", "--set", "training.warmup=null"])
    out, err = capsys.readouterr()
    assert rc == 0, err[-3000:]
    assert len(re.findall(r"^step +\d/4 \|.*truncated 100%", out, re.M)) == 4  # every step is cut short
    assert _lines(err, "can be gamed") == [f"{_where(spec)}: warning: reward.rules.0.extract: {GAMED} [W110]"]
    assert _lines(err, "max_tokens") == [
        "warning: step 1: 100% of completions were cut at max_tokens=1; raise sampling.max_tokens or ask for "
        "shorter answers in the prompt",
        "steps 1-4: over half the completions were cut at max_tokens=1 (4 steps, until the run's end)",
    ]
    assert _lines(err, "every group was degenerate") == [
        "step 1: every group was degenerate (same reward within each group): no gradient, step skipped",
        "steps 1-4: every group was degenerate, no gradient: steps skipped (4 steps, until the run's end)",
    ]


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str) -> None:
        self.lines.append(text)


def test_a_streak_is_said_when_it_starts_and_when_it_ends_with_its_length():
    console = _Console()
    streaks = Streaks(console)
    for step in range(1, 101):
        cut = 12 <= step <= 77 or step in (80, 90, 91)
        streaks.step(step, {"truncated": (f"step {step}: most completions were cut",
                                          "over half the completions were cut at max_tokens")} if cut else {})
    streaks.end()
    assert console.lines == [
        "[yellow]step 12: most completions were cut[/yellow]",
        "[yellow]steps 12-77: over half the completions were cut at max_tokens (66 steps)[/yellow]",
        "[yellow]step 80: most completions were cut[/yellow]",  # one step: nothing to add when it ends
        "[yellow]step 90: most completions were cut[/yellow]",
        "[yellow]steps 90-91: over half the completions were cut at max_tokens (2 steps)[/yellow]",
    ]


def test_a_streak_open_at_the_run_s_end_is_summed_up_once():
    console = _Console()
    streaks = Streaks(console)
    for step in (1, 2, 3):
        streaks.step(step, {"a": (f"step {step}: a starts", "a held"), "b": (f"step {step}: b starts", "b held")}
                     if step > 1 else {"b": ("step 1: b starts", "b held")})
    streaks.end()
    streaks.end()
    assert console.lines == [
        "[yellow]step 1: b starts[/yellow]",
        "[yellow]step 2: a starts[/yellow]",
        "[yellow]steps 1-3: b held (3 steps, until the run's end)[/yellow]",
        "[yellow]steps 2-3: a held (2 steps, until the run's end)[/yellow]",
    ]
