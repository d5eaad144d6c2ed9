"""RewardFunction: the issue's fidelity cases, per-rule scores, time limits, never raising, plain words.

Each fidelity case from the issue is one named test. The Sail guide's reward:
``correct - 0.1 * (1 - format)`` with format = a boxed answer is present AND the completion ended cleanly.
"""

from __future__ import annotations

import re
import time

import pytest

from sailrl.runtime.rewards import answers
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.rewards import RewardSpec

GUIDE_FORMAT = {
    "name": "format",
    "kind": "all_of",
    "checks": [{"kind": "has_answer", "extract": {"from": "boxed"}}, {"kind": "termination"}],
    "pass_score": 0.0,
    "fail_score": -0.1,
}


def reward(*rules: dict, **kw) -> RewardFunction:
    return RewardFunction.from_spec(RewardSpec.model_validate({"rules": list(rules), **kw}), "answer")


def answer_rule(compare: str = "numeric", ref: dict | None = None, **kw) -> dict:
    return {"name": "correct", "kind": "answer", "extract": {"from": "boxed"},
            "reference": {"extract": ref or {"from": "whole"}}, "compare": compare, "weight": 1.0, **kw}


GSM8K_REF = {"from": "after_marker", "marker": "####"}


def guide(compare: str = "numeric", ref: dict | None = None) -> RewardFunction:
    return reward(answer_rule(compare, ref), GUIDE_FORMAT)


# --------------------------------------------------------------------------------------- fidelity (issue)


def test_last_box_wins_reference_7_is_correct() -> None:
    s = guide().score("First try \\boxed{5}. That is wrong; the answer is \\boxed{7}.", {"answer": "7"})
    assert s.correct is True
    assert s.total == 1.0


def test_last_box_wins_reference_5_is_incorrect() -> None:
    s = guide().score("First try \\boxed{5}. That is wrong; the answer is \\boxed{7}.", {"answer": "5"})
    assert s.correct is False
    assert s.total == 0.0


@pytest.mark.parametrize("compare", ["normalized", "numeric", "math", "exact"])
def test_boxed_frac_one_third_equals_reference_frac_one_third(compare: str) -> None:
    s = guide(compare).score("So \\boxed{\\frac{1}{3}}", {"answer": "\\frac{1}{3}"})
    assert s.correct is True


def test_boxed_frac_one_half_equals_0_5_numeric() -> None:
    assert guide("numeric").score("\\boxed{\\frac{1}{2}}", {"answer": "0.5"}).correct is True


def test_boxed_1000_with_separator_equals_1000() -> None:
    assert guide("numeric").score("\\boxed{1,000}", {"answer": "1000"}).correct is True
    assert guide("normalized").score("\\boxed{1,000}", {"answer": "1000"}).correct is True


def test_boxed_minus_3_equals_gsm8k_minus_3() -> None:
    assert guide("numeric", GSM8K_REF).score("\\boxed{-3}", {"answer": "#### -3"}).correct is True


def test_boxed_3_is_not_minus_3() -> None:
    for compare in ("numeric", "normalized", "math"):
        assert guide(compare).score("\\boxed{3}", {"answer": "-3"}).correct is False


def test_boxed_frac_two_thirds_equals_slash_two_thirds() -> None:
    assert guide("numeric").score("\\boxed{\\frac{2}{3}}", {"answer": "2/3"}).correct is True
    assert guide("math").score("\\boxed{\\frac{2}{3}}", {"answer": "2/3"}).correct is True


def test_unclosed_box_is_no_answer_and_format_fails() -> None:
    s = guide().score("The answer is \\boxed{42", {"answer": "42"})
    assert s.passed == {"correct": False, "format": False}
    assert s.contributions == {"correct": 0.0, "format": -0.1}
    assert s.total == pytest.approx(-0.1)


def test_gsm8k_reference_with_calculator_notes_is_72() -> None:
    fn = guide("numeric", GSM8K_REF)
    fields = {"answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"}
    assert fn.reference_problem(fields) is None
    assert fn.reference_answer(fields) == "72"
    assert fn.score("\\boxed{72}", fields).correct is True
    assert fn.score("\\boxed{24}", fields).correct is False


def test_gsm8k_reference_with_thousands_separator_is_1234() -> None:
    fn = guide("numeric", GSM8K_REF)
    assert fn.reference_answer({"answer": "#### 1,234"}) == "1,234"
    assert fn.score("\\boxed{1234}", {"answer": "#### 1,234"}).correct is True
    assert fn.score("\\boxed{1,234}", {"answer": "#### 1,234"}).correct is True
    assert fn.score("\\boxed{123}", {"answer": "#### 1,234"}).correct is False


def test_multiline_think_answer_matches_format_rule_with_dotall() -> None:
    rule = {"name": "format", "kind": "match", "mode": "fullmatch", "flags": ["DOTALL"],
            "pattern": r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*"}
    completion = "<think>\nl1\nl2\n</think>\n<answer>9</answer>"
    assert reward(rule).score(completion, {}).passed == {"format": True}
    without_dotall = {**rule, "flags": []}
    assert reward(without_dotall).score(completion, {}).passed == {"format": False}


def test_eight_completions_cut_at_max_tokens_without_box_each_get_minus_0_1() -> None:
    fn = guide("numeric", GSM8K_REF)
    fields = {"answer": "#### 72"}
    scores = [fn.score(f"Let me think step {i} about the clips and" + " and" * 50, fields, truncated=True,
                       num_tokens=1024) for i in range(8)]
    assert [s.total for s in scores] == [pytest.approx(-0.1)] * 8
    assert all(s.contributions == {"correct": 0.0, "format": -0.1} for s in scores)
    assert all(s.correct is False and s.errors == {} for s in scores)


def test_empty_reference_is_a_reference_problem() -> None:
    fn = guide("numeric", GSM8K_REF)
    assert fn.reference_problem({"answer": ""}) == "the reference field 'answer' is empty"
    assert fn.reference_problem({"answer": "   \n"}) == "the reference field 'answer' is empty"


def test_scoring_a_row_with_an_unusable_reference_is_not_silent() -> None:
    s = guide("numeric").score("\\boxed{1}", {"answer": ""})
    assert s.passed["correct"] is False
    assert s.errors == {"correct": "the reference field 'answer' is empty"}


def _guide_extract_boxed(text: str) -> str | None:  # verbatim from the Sail guide
    match = re.search(r"\\boxed\s*\{([^{}]+)\}", text)
    return match.group(1) if match else None


def test_sail_guide_regex_pitfalls_are_fixed() -> None:
    nested = "\\boxed{\\frac{1}{2}}"
    corrected = "First \\boxed{5}. No: \\boxed{7}."
    assert _guide_extract_boxed(nested) is None  # the guide's regex finds no answer in a nested box
    assert _guide_extract_boxed(corrected) == "5"  # and grades the discarded first box
    fn = guide("numeric")
    assert fn.score(nested, {"answer": "1/2"}).correct is True
    assert fn.score(corrected, {"answer": "7"}).correct is True
    assert fn.score(corrected, {"answer": "5"}).correct is False


# --------------------------------------------------------------------------------------- references


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({}, "the row has no field 'answer' (its fields: none)"),
        ({"answer": None, "q": "x"}, "the row has no field 'answer' (its fields: answer, q)"),
        ({"answer": "no marker"}, ("no answer found in the reference field 'answer' ('no marker'): expected the "
                                  "text after the last '####'")),
        ({"answer": "#### seventy"}, ("the reference answer 'seventy' (the reference field 'answer') is not a "
                                     "number, but the rule compares numerically (compare: numeric)")),
    ],
)
def test_reference_problems_in_plain_words(fields: dict, problem: str) -> None:
    assert guide("numeric", GSM8K_REF).reference_problem(fields) == problem


def test_reference_from_another_field_and_non_string_values() -> None:
    rule = answer_rule("numeric")
    rule["reference"] = {"field": "target", "extract": {"from": "whole"}}
    fn = reward(rule)
    assert fn.score("\\boxed{12}", {"target": 12}).correct is True  # JSON numbers are fine
    assert fn.reference_problem({"answer": "12"}) == "the row has no field 'target' (its fields: answer)"


def test_several_answer_rules_name_the_rule_in_problems() -> None:
    a = answer_rule("numeric")
    b = {**answer_rule("normalized"), "name": "exact_text"}
    fn = reward(a, b)
    assert fn.reference_problem({"answer": "abc"}) == (
        "rule 'correct': the reference answer 'abc' (the reference field 'answer') is not a number, but the rule "
        "compares numerically (compare: numeric)"
    )


# --------------------------------------------------------------------------------------- rules and totals


def test_weights_pass_fail_scores_and_clip() -> None:
    fn = reward(
        {"name": "a", "kind": "termination", "weight": 2.0},
        {"name": "b", "kind": "match", "pattern": "yes", "pass_score": 0.5, "fail_score": -1.0},
        {"name": "c", "kind": "length", "unit": "chars", "max": 5, "fail_score": -0.25},
        clip=[-1.0, 2.25],
    )
    s = fn.score("yes", {})
    assert s.contributions == {"a": 2.0, "b": 0.5, "c": 0.0}
    assert s.total == 2.25  # 2.5 clipped
    s = fn.score("no, not at all", {}, truncated=True)
    assert s.contributions == {"a": 0.0, "b": -1.0, "c": -0.25}
    assert s.total == -1.0  # -1.25 clipped
    assert s.correct is None and fn.correct_rule is None


def test_negated_match_and_search_vs_fullmatch() -> None:
    fn = reward({"name": "no_chinese", "kind": "match", "pattern": r"\p{Han}", "negate": True},
                {"name": "only_number", "kind": "match", "pattern": r"\d+", "mode": "fullmatch"},
                {"name": "has_yes", "kind": "match", "pattern": "YES", "flags": ["IGNORECASE"]})
    assert fn.score("42", {}).passed == {"no_chinese": True, "only_number": True, "has_yes": False}
    assert fn.score("yes 42 \u4e2d", {}).passed == {"no_chinese": False, "only_number": False, "has_yes": True}


def test_length_in_tokens_needs_the_token_count() -> None:
    fn = reward({"name": "short", "kind": "length", "min": 2, "max": 10})
    assert fn.score("x", {}, num_tokens=5).passed == {"short": True}
    assert fn.score("x", {}, num_tokens=11).passed == {"short": False}
    s = fn.score("x", {})
    assert s.passed == {"short": False}
    assert s.errors == {"short": "this length rule counts tokens but the completion's token count was not given"}


def test_rule_names_default_to_kind_and_correct_rule() -> None:
    fn = reward({"kind": "termination"}, answer_rule(), {**answer_rule(), "name": "other"})
    assert fn.rule_names == ["termination", "correct", "other"]
    assert fn.correct_rule == "correct"
    fn = reward(answer_rule(), {**answer_rule(), "name": "other"}, correct_rule="other")
    assert fn.correct_rule == "other"
    assert fn.score("\\boxed{1}", {"answer": "1"}).correct is True


# --------------------------------------------------------------------------------------- safety


def test_catastrophic_regex_fails_and_counts_one_timeout() -> None:
    fn = reward({"name": "evil", "kind": "match", "pattern": "(a+)+$"}, regex_timeout_s=0.05)
    s = fn.score("a" * 5000 + "b", {})
    assert s.passed == {"evil": False}
    assert s.timeouts == 1
    fn = reward({"name": "evil", "kind": "match", "pattern": "(a|aa)+$"}, regex_timeout_s=0.05)
    s = fn.score("a" * 30 + "b", {})
    assert (s.passed, s.timeouts) == ({"evil": False}, 1)


def test_negated_rule_that_times_out_fails_rather_than_passes() -> None:
    fn = reward({"name": "evil", "kind": "match", "pattern": "(a|aa)+$", "negate": True}, regex_timeout_s=0.05)
    s = fn.score("a" * 30 + "b", {})
    assert (s.passed, s.timeouts) == ({"evil": False}, 1)


def test_regex_extractor_timeout_counts_and_fails() -> None:
    rule = {"name": "correct", "kind": "answer", "extract": {"from": "regex", "pattern": "((a|aa)+)$"},
            "compare": "exact"}
    s = reward(rule, regex_timeout_s=0.05).score("a" * 30 + "b", {"answer": "a"})
    assert (s.passed, s.timeouts) == ({"correct": False}, 1)


def test_math_compare_time_limit_counts_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    class SlowMathVerify:
        @staticmethod
        def parse(text: str, **kw):
            return [text]

        @staticmethod
        def verify(gold, pred, **kw):
            time.sleep(5)
            return True

    monkeypatch.setattr(answers, "_math_verify", SlowMathVerify)
    fn = reward(answer_rule("math"), math_timeout_s=0.05)
    s = fn.score("\\boxed{x}", {"answer": "x"})
    assert (s.passed, s.timeouts, s.correct) == ({"correct": False}, 1, False)


def test_score_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    fn = guide()

    def boom(*a, **k):
        raise RuntimeError("kaput")

    monkeypatch.setattr(fn._checks[0], "passes", boom)
    s = fn.score("\\boxed{1}", {"answer": "1"})
    assert s.passed == {"correct": False, "format": True}
    assert s.errors == {"correct": "the rule raised RuntimeError: kaput"}


# --------------------------------------------------------------------------------------- words


def test_explain_the_guide_formula() -> None:
    assert guide("numeric", GSM8K_REF).explain() == [
        ("correct: +1 if the last \\boxed{...} answer in the completion equals the reference answer (the text "
        "after the last '####' in field 'answer') as a number (a unit word after the number is ignored: '7 apples' "
        "counts as 7); otherwise 0."),
        ("format: 0 if all of: the completion has an answer (the last \\boxed{...} answer); the completion "
        "ended cleanly (stop sequence or end of turn, not cut off at max_tokens); otherwise -0.1."),
        "total = correct + format (from -0.1 to 1).",
        "'correct' (logged each step) is the fraction of completions that pass 'correct'.",
    ]


def test_explain_other_rules_and_clip() -> None:
    fn = reward({"name": "think", "kind": "match", "pattern": "<think>.*</think>", "flags": ["DOTALL"],
                 "weight": 0.5},
                {"name": "short", "kind": "length", "unit": "chars", "max": 200, "fail_score": -1},
                clip=[-1, 1])
    assert fn.explain() == [
        "think: +0.5 if the completion contains a match of '<think>.*</think>' (flags DOTALL); otherwise 0.",
        "short: 0 if the completion is at most 200 chars long; otherwise -1.",
        "total = think + short, clipped to [-1, 1] (from -1 to 0.5).",
    ]


def test_trace_says_why() -> None:
    _, traces = guide("numeric", GSM8K_REF).trace("I think \\boxed{71}", {"answer": "#### 72"}, truncated=True)
    assert [(t.name, t.passed, t.contribution, t.why) for t in traces] == [
        ("correct", False, 0.0, "answer '71' does not match reference '72'"),
        ("format", False, -0.1, "answer '71'; cut off at max_tokens"),
    ]
