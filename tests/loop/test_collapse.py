"""Issue 18.17: a run whose policy collapses to one answer (every group degenerate for many steps) said nothing.
After COLLAPSE_STEPS steps in a row with at least COLLAPSE_FRACTION of groups degenerate, one warning names the
step's most common completion."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tinker
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from sailrl.runtime.loop.collapse import (
    COLLAPSE_FRACTION,
    COLLAPSE_STEPS,
    collapse_warning,
    degenerate_streak,
    dominant_completion,
)
from tests.fakes.tokenizer import CharTokenizer

ROOT = Path(__file__).resolve().parents[2]


def group(*completions: str, logged: bool = True) -> TrajectoryGroup:
    trajs = []
    for text in completions:
        tr = Transition(ob=tinker.ModelInput.from_ints([1, 2]),
                        ac=TokensWithLogprobs(tokens=[ord(c) for c in text], maybe_logprobs=None, stop_reason="stop"),
                        reward=0.0, episode_done=True, metrics={}, logs={"completion": text} if logged else {})
        trajs.append(Trajectory(transitions=[tr], final_ob=tinker.ModelInput.empty()))
    return TrajectoryGroup(trajs, [0.0] * len(trajs), [{} for _ in trajs])


def lines(*fracs) -> list[dict]:
    return [{"step": i + 1, "degenerate_frac": f} for i, f in enumerate(fracs)]


def test_the_streak_counts_steps_in_a_row_at_or_above_the_threshold() -> None:
    assert degenerate_streak(lines(1.0, 0.5, 0.9, 1.0, 0.95)) == 3
    assert degenerate_streak(lines(1.0, None)) == 0  # a step without a value ends it
    assert degenerate_streak(lines(0.2)) == 0 and degenerate_streak([]) == 0


def test_the_dominant_completion_and_its_share() -> None:
    groups = [group("0", " 0 ", "1"), group("0", "0", logged=False)]  # decoded when the text was not logged
    assert dominant_completion(groups, CharTokenizer()) == ("0", 4, 5)
    assert dominant_completion([], CharTokenizer()) is None


def test_warned_once_when_the_streak_reaches_its_length() -> None:
    groups = [group("0", "0"), group("0", "0"), group("7", "7")]
    history = lines(*([COLLAPSE_FRACTION] * (COLLAPSE_STEPS - 1)))
    assert collapse_warning(COLLAPSE_STEPS - 1, history, groups, CharTokenizer()) is None
    history += lines(1.0)
    warning = collapse_warning(COLLAPSE_STEPS, history, groups, CharTokenizer(), run_dir="runs/x")
    assert warning == (
        f"step {COLLAPSE_STEPS}: {COLLAPSE_STEPS} steps in a row with at least 90% of groups degenerate (the same "
        "reward within each group: no gradient); the most common completion this step is '0' (4 of 6 rollouts). "
        "The policy may have collapsed to one answer: lower training.learning_rate, raise sampling.temperature, "
        "or resume from an earlier checkpoint; `sailrl show runs/x` shows the completions.")
    assert collapse_warning(COLLAPSE_STEPS + 1, history + lines(1.0), groups, CharTokenizer()) is None  # once


def test_degenerate_groups_with_different_answers_are_not_called_a_collapse() -> None:
    """SmolLM2 solving every sum (issue 22.6): each group all right, each with its own sum -- solved, not
    collapsed; the warning says so with the step's mean reward."""
    groups = [group("3", "3"), group("5", "5"), group("9", "9", " 9")]
    history = lines(*([1.0] * COLLAPSE_STEPS))
    history[-1]["reward/total"] = 1.2
    warning = collapse_warning(COLLAPSE_STEPS, history, groups, CharTokenizer(), run_dir="runs/x")
    assert warning == (
        f"step {COLLAPSE_STEPS}: {COLLAPSE_STEPS} steps in a row with at least 90% of groups degenerate (the same "
        "reward within each group: no gradient); the most common completion this step is '9' (3 of 7 rollouts), "
        "so the rollouts do not share one answer. Every rollout of a group scores alike (mean reward +1.200 this "
        "step): if that is the best score, the task is solved at this difficulty (stop, or train on harder rows); "
        "if it is the worst, the rows are too hard for now (raise sampling.temperature or training.group_size, or "
        "give easier rows); `sailrl show runs/x` shows the completions.")
    half = [group("0", "0"), group("0", "0"), group("7", "7"), group("8", "8")]  # 4 of 8: one answer
    assert "collapsed to one answer" in collapse_warning(COLLAPSE_STEPS, history, half, CharTokenizer())


SPEC = """\
name: collapse
model: {name: sailrl/tiny}
dataset: {source: rows.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}'}
reward:
  rules:
    - {name: never, kind: match, pattern: 'zzzz-never-written'}
training: {steps: 6, group_size: 2, groups_per_step: 2, learning_rate: 1e-4}
sampling: {sampler: local, max_tokens: 3}
"""


@pytest.mark.slow
def test_a_run_that_never_learns_anything_is_warned_once(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text("".join(f'{{"question": "{i}+1=", "answer": "{i + 1}"}}\n'
                                                 for i in range(8)))
    (tmp_path / "spec.yaml").write_text(SPEC)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "sailrl", "run", str(tmp_path / "spec.yaml")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    warnings = [line for line in out.splitlines() if "steps in a row with at least" in line]
    assert len(warnings) == 1, out[-3000:]
    assert warnings[0].startswith(f"warning: step {COLLAPSE_STEPS}: {COLLAPSE_STEPS} steps in a row")
    assert "the most common completion this step is '" in warnings[0] and "of 4 rollouts)" in warnings[0]
