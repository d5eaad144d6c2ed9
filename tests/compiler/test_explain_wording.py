"""Issue 18.14: what `explain`, S301 and preflight say in words.

Before: "the whole completion in the completion"; "-0.5 unless ...; otherwise 0"; nothing said that "7 apples"
passes a numeric rule against 7; S301's hint always said `--field answer=...`; preflight's verdict called the
W110 "can be gamed" warning "looks unusual".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sailrl.compiler.validate import validate_text
from sailrl.preflight import build_report
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.errors import SpecErrors
from sailrl.spec.rewards import RewardSpec


def reward(*rules: dict) -> RewardFunction:
    return RewardFunction.from_spec(RewardSpec.model_validate({"rules": list(rules)}), "answer")


def test_a_whole_completion_is_said_once_and_a_unit_word_is_said() -> None:
    fn = reward({"name": "correct", "kind": "answer", "extract": {"from": "whole"}, "compare": "numeric"})
    assert fn.explain()[0] == (
        "correct: +1 if the whole completion equals the reference answer (field 'answer') as a number (a unit word "
        "after the number is ignored: '7 apples' counts as 7); otherwise 0.")
    assert fn.score("7 apples", {"answer": "7"}).total == 1  # what the sentence promises


def test_a_fallback_is_said_after_where_the_answer_is_looked_for() -> None:
    fn = reward({"name": "c", "kind": "answer", "extract": {"from": "boxed", "fallback": "whole"},
                 "compare": "exact"})
    assert fn.explain()[0] == ("c: +1 if the last \\boxed{...} answer in the completion (or the whole completion if "
                               "there is none) is exactly the same text as the reference answer (field 'answer'); "
                               "otherwise 0.")


def test_a_penalty_rule_reads_as_if_then_otherwise() -> None:
    fn = reward({"name": "short", "kind": "length", "unit": "chars", "max": 10, "pass_score": 0, "fail_score": -0.5})
    assert fn.explain()[0] == "short: 0 if the completion is at most 10 chars long; otherwise -0.5."


def test_a_rule_of_weight_0_reads_as_measured_only_and_a_constant_total_as_such() -> None:
    fn = reward({"name": "correct", "kind": "answer", "extract": {"from": "whole"}, "compare": "numeric",
                 "weight": 0.0})
    assert fn.explain()[:2] == [
        "correct: measured only (weight 0, adds nothing to the total): passes if the whole completion equals the "
        "reference answer (field 'answer') as a number (a unit word after the number is ignored: '7 apples' counts "
        "as 7).",
        "total = correct (always 0: no rule can move it).",
    ]
    passed = fn.score("7", {"answer": "7"})
    assert passed.total == 0 and passed.passed == {"correct": True}  # measured, and adds nothing
    both = reward({"name": "correct", "kind": "answer", "extract": {"from": "whole"}, "compare": "numeric",
                   "weight": 0.0},
                  {"name": "format", "kind": "match", "pattern": "^[0-9]+$", "weight": 0.5})
    assert both.explain()[2] == "total = correct + format (from 0 to 0.5)."


SPEC = """\
name: t
model: {name: sailrl/tiny}
dataset: {source: data.jsonl, fields: [question, final]}
prompt: {user: '{{ question }}', reference_field: final}
reward:
  rules:
    - {name: correct, kind: answer, extract: {from: boxed}, compare: numeric}
examples:
  - {completion: '\\boxed{5}', fields: {final: '6'}, expect: {correct: 1}}
"""


def test_the_s301_hint_names_the_reference_field(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text('{"question": "q", "final": "1"}\n')
    with pytest.raises(SpecErrors) as info:
        validate_text(SPEC, str(tmp_path / "spec.yaml"), path=tmp_path / "spec.yaml")
    [err] = [e for e in info.value.errors if e.code == "S301"]
    assert "--field final=..." in err.hint and "--field answer" not in err.hint


def test_preflight_names_a_gameable_rule_in_its_verdict(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text("".join(f'{{"question": "{i}+1", "answer": "{i + 1}"}}\n' for i in range(40)))
    text = """\
name: t
model: {name: sailrl/tiny}
dataset: {source: data.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}'}
reward:
  rules:
    - {name: correct, kind: answer, extract: {from: last_number}, compare: numeric}
sampling: {sampler: local}
"""
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(text)
    loaded = validate_text(text, str(spec_path), path=spec_path)
    assert [w.code for w in loaded.warnings] == ["W110"]
    report = build_report(loaded.spec, tmp_path, spec_path=str(spec_path), spec_warnings=loaded.warnings)
    assert report["verdict"] == "ready, with 1 warning: rule 'correct' can be gamed"
