"""Issue 14.14: validate probes each answer rule with adversarial completions and warns when one scores as correct.

Before: the guide's multiple-choice pattern ``answer:\\s*\\(?([A-D])\\)?`` (IGNORECASE) read "Answer: Definitely C"
as D, and nothing said so.
"""

from __future__ import annotations

import time

import pytest

from sailrl.compiler.reward_checks import probe_answer_rule
from sailrl.compiler.validate import validate_text
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.rewards import RewardExample, RewardSpec

HEAD = """\
name: t
model: {name: sailrl/tiny, renderer: role_colon}
dataset: {source: data.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}'}
"""
LOOSE = {"from": "regex", "pattern": r"answer:\s*\(?([A-D])\)?", "flags": ["IGNORECASE"]}
STRICT = {"from": "regex", "pattern": r"answer:\s*\(?([A-D])\)?\.?\s*$", "flags": ["IGNORECASE", "MULTILINE"]}


def fn_of(extract: dict, compare: str = "exact", **kw) -> RewardFunction:
    rule = {"name": "correct", "kind": "answer", "extract": extract, "compare": compare, **kw}
    return RewardFunction.from_spec(RewardSpec.model_validate({"rules": [rule]}), "answer")


def ex(completion: str, answer: str) -> RewardExample:
    return RewardExample.model_validate({"completion": completion, "fields": {"answer": answer},
                                         "expect": {"correct": 1}})


def test_the_loose_choice_pattern_reads_definitely_c_as_d() -> None:
    fn = fn_of(LOOSE)
    assert fn.score("Answer: Definitely C", {"answer": "D"}).correct is True  # the bug the probes catch
    gamed = probe_answer_rule(fn, "correct", [ex("Answer: (C)", "C")])
    assert gamed == [("a word that starts with the right letter, then another option", "Answer: (Clearly A)"),
                     ("a word that starts with the right letter, then another option", "Answer: Clearly A")]


def test_the_documented_choice_pattern_resists_the_probes() -> None:
    fn = fn_of(STRICT)
    assert fn.score("Answer: Definitely C", {"answer": "D"}).correct is False
    assert fn.score("Answer: A, B, C, D", {"answer": "D"}).correct is False
    assert fn.score("Reasoning...\nFinal answer: (C).\n", {"answer": "C"}).correct is True
    assert probe_answer_rule(fn, "correct", [ex("Final answer: C", "C")]) == []


def test_last_number_is_gamed_by_hedging() -> None:
    gamed = probe_answer_rule(fn_of({"from": "last_number"}, "numeric"), "correct", [ex("So it is 72.", "72")])
    assert [label for label, _ in gamed] == [
        "every option listed", "two answers", "the right answer outside the answer, after a wrong one",
        "every option listed", "two answers", "the right answer outside the answer, after a wrong one"]
    assert gamed[0][1] == "So it is 73, 72."


@pytest.mark.parametrize("compare", ["numeric", "normalized", "exact", "math"])
def test_a_boxed_answer_resists_the_probes(compare: str) -> None:
    assert probe_answer_rule(fn_of({"from": "boxed"}, compare), "correct", [ex("So \\boxed{72}", "72")]) == []


def test_without_examples_a_made_up_reference_is_used() -> None:
    assert probe_answer_rule(fn_of({"from": "last_number"}, "numeric"), "correct", [])[0] == (
        "every option listed", "The answer is \\boxed{43, 42}.")
    assert probe_answer_rule(fn_of(LOOSE), "correct", [])  # 'B': Basically A
    assert probe_answer_rule(fn_of({"from": "boxed"}, "numeric"), "correct", []) == []


def test_a_rule_that_takes_any_answer_is_not_probed() -> None:
    # A rule that passes a wrong answer says nothing about gaming (its examples show what is wrong with it).
    fn = fn_of({"from": "whole"}, "exact", reference={"extract": {"from": "whole"}})
    assert probe_answer_rule(fn, "correct", [ex("anything", "anything")]) == []


def test_validate_warns_once_per_rule_at_its_extractor_and_still_passes() -> None:
    text = HEAD + """\
reward:
  rules:
    - name: correct
      kind: answer
      extract: {from: regex, pattern: 'answer:\\s*\\(?([A-D])\\)?', flags: [IGNORECASE]}
      compare: exact
    - name: boxed
      kind: answer
      extract: {from: boxed}
      compare: exact
examples:
  - {completion: 'Answer: (C) \\boxed{C}', fields: {answer: 'C'}, expect: {correct: 1, boxed: 1}}
"""
    t0 = time.perf_counter()
    loaded = validate_text(text, "spec.yaml")
    assert time.perf_counter() - t0 < 5
    (w,) = loaded.warnings
    assert (w.code, w.severity, w.key_path, w.line, w.column) == ("W110", "warning", "reward.rules.0.extract", 9, 16)
    # The example holds the reference twice, so the probes use common answer formats instead of it.
    assert w.message == ("rule 'correct' can be gamed: it scores 1 adversarial completion(s) as correct -- "
                         "a word that starts with the right letter, then another option: 'Answer: Clearly A'")
    assert "end the answer at the end of its line" in w.hint


def test_validate_has_no_gaming_warning_for_the_sail_guide_rules() -> None:
    text = HEAD + """\
reward:
  rules:
    - {name: correct, kind: answer, extract: {from: boxed}, reference: {extract: {from: after_marker, marker: '####'}},
       compare: numeric}
examples:
  - {completion: 'So \\boxed{72}', fields: {answer: '#### 72'}, expect: {correct: 1}}
"""
    assert validate_text(text, "spec.yaml").warnings == []
