"""runtime/loop/gaming.py: a rule gamed by degenerate replies, or climbing while correctness does not, is warned of once,
with three passing replies and a fix, and written to gaming.jsonl."""

from __future__ import annotations

import json
from types import SimpleNamespace

from sailrl.runtime.loop.gaming import GAMING_FILE, GamingWatch, degenerate_kind
from sailrl.spec.rewards import RewardSpec

RULES = RewardSpec.model_validate({"rules": [
    {"name": "correct", "kind": "answer", "extract": {"from": "whole"}, "compare": "numeric", "weight": 0.5},
    {"name": "working", "kind": "match", "pattern": "=", "weight": 1.0},
]}).rules


def _groups(replies: list[list[tuple[str, bool, bool]]]) -> list[SimpleNamespace]:
    """groups of (text, passes 'working', truncated)."""
    out = []
    for group in replies:
        trajs = [SimpleNamespace(transitions=[SimpleNamespace(
            logs={"completion": t, "passed/working": int(p), "passed/correct": 0},
            metrics={"truncated": float(cut)})]) for t, p, cut in group]
        out.append(SimpleNamespace(trajectories_G=trajs))
    return out


def test_degenerate_kind() -> None:
    assert degenerate_kind("2=aaaa", True) == "cut at max_tokens"
    assert degenerate_kind("2=aaaaaaaaa", False) == "one character repeated"
    assert degenerate_kind(" 7", False) is None
    assert degenerate_kind("2+3=5", False) is None


def test_degenerate_passing_replies_warn_once_with_fix(tmp_path) -> None:
    watch = GamingWatch(RULES, "correct", tmp_path)
    cut = _groups([[(f"{i}=sa: 1=", True, True) for _ in range(4)] for i in range(3)])
    history = [{"step": 1, "reward/working": 0.75, "correct": 0.3}]
    warnings = watch.observe(1, history, cut)
    assert len(warnings) == 1
    assert warnings[0].startswith("step 1: rule 'working' looks gamed: 12 of the 12 replies that pass it are "
                                  "degenerate (12 cut at max_tokens)")
    assert "Proposed fix: also require the reply to end on its own" in warnings[0]
    record = json.loads((tmp_path / GAMING_FILE).read_text())
    assert record["rule"] == "working" and record["signs"] == ["degenerate"]
    assert record["examples"] == ["0=sa: 1="] * 3
    assert record["fix"]["rule"] == {"name": "working", "weight": 1.0, "kind": "all_of",
                                     "checks": [{"kind": "match", "pattern": "="}, {"kind": "termination"}]}
    assert watch.observe(2, history, cut) == []  # once per rule


def test_clean_replies_do_not_warn(tmp_path) -> None:
    watch = GamingWatch(RULES, "correct", tmp_path)
    fine = _groups([[(f"{i}+{j}={i + j}", True, False) for j in range(4)] for i in range(3)])
    assert watch.observe(1, [{"step": 1, "reward/working": 1.0, "correct": 0.3}], fine) == []
    assert not (tmp_path / GAMING_FILE).exists()


def test_climb_without_correctness(tmp_path) -> None:
    watch = GamingWatch(RULES, "correct", tmp_path)
    history = [{"step": s, "reward/working": w, "correct": c} for s, w, c in
               [(1, 0.0, 0.4), (2, 0.0, 0.38), (3, 0.1, 0.4), (4, 0.5, 0.4), (5, 0.6, 0.39), (6, 0.7, 0.4)]]
    warnings = watch.observe(6, history, _groups([[("1=2", True, False)]]))
    assert len(warnings) == 1
    assert "its pass rate climbed from 3% to 60% while correct went from 39% to 40%" in warnings[0]
    climbing_with_correct = [dict(x, correct=0.4 + 0.1 * i) for i, x in enumerate(history)]
    assert GamingWatch(RULES, "correct", None).observe(6, climbing_with_correct, []) == []


def test_a_rule_that_never_passes_for_ten_steps_is_said_once(tmp_path) -> None:
    rules = RewardSpec.model_validate({"rules": [
        {"name": "correct", "kind": "answer", "extract": {"from": "whole"}, "compare": "numeric"},
        {"name": "shows_working", "kind": "match", "pattern": "=", "pass_score": 0.5, "fail_score": -0.5},
        {"name": "too_long", "kind": "length", "unit": "chars", "min": 40, "pass_score": -1.0},  # a penalty: never passing is good
    ]}).rules
    watch = GamingWatch(rules, "correct", tmp_path)
    history = []
    said = []
    for step in range(1, 13):
        history.append({"step": step, "correct": 0.4, "reward/correct": 0.4, "reward/shows_working": -0.5,
                         "reward/too_long": 0.0})
        said += [(step, w) for w in watch.observe(step, history, [])]
    assert said == [(10, "step 10: no reply passed 'shows_working' in the last 10 steps: the model never writes what "
                         "it asks for; this model may not be able to (score a reply you write with `sailrl rewards "
                         "SPEC --completion TEXT`), or give it examples (training.warmup)")]
    record = json.loads((tmp_path / GAMING_FILE).read_text())
    assert record["step"] == 10 and record["rule"] == "shows_working" and record["signs"] == ["never_passed"]
    assert record["studio_message"] == (
        "no reply passed 'shows_working' in the last 10 steps: the model never writes what it asks for; this model "
        "may not be able to (try a reply by hand with Try), or give it examples (training.warmup)")


def test_a_rule_that_passed_once_in_ten_steps_is_not_said(tmp_path) -> None:
    watch = GamingWatch(RULES, "correct", None)
    history = [{"step": s, "correct": 0.0, "reward/correct": 0.0, "reward/working": 0.1 if s == 5 else 0.0}
               for s in range(1, 15)]
    said = [w for s in range(1, 15) for w in watch.observe(s, history[:s], [])]
    assert len(said) == 1 and said[0].startswith("step 10: no reply passed 'correct' in the last 10 steps")
