"""Issue 14.1: every comparison is bounded in time and size; numbers beyond the exponent range are rejected.

The timings asserted here are far above the bounded code's cost (milliseconds) and far below the unbounded code's
(seconds to forever), so they hold on a busy machine.
"""

from __future__ import annotations

import re
import time
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from sailrl.compiler.validate import validate_text
from sailrl.runtime.rewards import answers
from sailrl.runtime.rewards.answers import MAX_ANSWER_CHARS, MAX_EXPONENT, normalize, number_problem, parse_number
from sailrl.runtime.rewards.rules import MAX_COMPLETION_CHARS, MAX_REFERENCE_CHARS, RewardFunction
from sailrl.spec.rewards import RewardSpec


def reward(*rules: dict, **kw) -> RewardFunction:
    return RewardFunction.from_spec(RewardSpec.model_validate({"rules": list(rules), **kw}), "answer")


NUMERIC = {"name": "correct", "kind": "answer", "extract": {"from": "boxed"}, "compare": "numeric"}


def timed(fn, *args, **kw):
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------- huge exponents


def test_a_huge_exponent_in_a_completion_fails_at_once_with_the_reason() -> None:
    # Before: Fraction('1e10000000') built a 10-million-digit integer (6 s); 1e100000000 never finished.
    fn = reward(NUMERIC)
    for text in ("\\boxed{1e10000000}", "\\boxed{1e100000000}", "\\boxed{-2.5E+99999999999}"):
        s, seconds = timed(fn.score, text, {"answer": "1"})
        assert seconds < 0.5, (text, seconds)
        assert s.passed == {"correct": False}
        answer = text[len("\\boxed{"):-1]
        assert s.reasons["correct"] == (
            f"answer '{answer}' is out of range (compare: numeric reads exponents up to +-1000)")


def test_a_huge_exponent_as_a_reference_is_a_reference_problem_found_at_once() -> None:
    fn = reward(NUMERIC)
    problem, seconds = timed(fn.reference_problem, {"answer": "1e10000000"})
    assert seconds < 0.5
    assert problem == ("the reference answer '1e10000000' (the reference field 'answer') is out of range "
                       "(compare: numeric reads exponents up to +-1000)")


def test_validate_scores_a_huge_exponent_example_at_once() -> None:
    text = """\
name: t
model: {name: sailrl/tiny, renderer: role_colon}
dataset: {source: data.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}'}
reward:
  rules:
    - {name: correct, kind: answer, extract: {from: boxed}, compare: numeric}
examples:
  - {completion: '\\boxed{1e10000000}', fields: {answer: '1'}, expect: {correct: 0}}
  - {completion: '\\boxed{1e1000}', fields: {answer: '10e999'}, expect: {correct: 1}}
"""
    loaded, seconds = timed(validate_text, text, "spec.yaml")
    assert seconds < 5  # the whole validation stage; before: 6 s for this one example
    assert [w.code for w in loaded.warnings] == []


def test_numbers_within_the_exponent_range_compare_exactly_by_value() -> None:
    assert parse_number(f"1e{MAX_EXPONENT}") == 10**MAX_EXPONENT
    assert parse_number("1e400") == parse_number("10e399") == 10**400  # beyond float, still exact
    assert parse_number(f"1e-{MAX_EXPONENT}") == Fraction(1, 10**MAX_EXPONENT)
    assert parse_number("-2.5e3") == -2500
    assert parse_number("1e00000000000000000000003") == 1000  # leading zeros are still a small exponent
    assert parse_number(f"1e{MAX_EXPONENT + 1}") is None
    assert parse_number(f"1e-{MAX_EXPONENT + 1}") is None
    assert number_problem(f"1e{MAX_EXPONENT + 1}") == (
        "is out of range (compare: numeric reads exponents up to +-1000)")
    fn = reward({**NUMERIC, "rel_tol": 0.01})
    assert fn.score("\\boxed{1.001e500}", {"answer": "1e500"}).correct is True
    assert fn.score("\\boxed{1.1e500}", {"answer": "1e500"}).correct is False


def test_an_answer_over_the_length_cap_is_not_compared() -> None:
    long_number = "1" * (MAX_ANSWER_CHARS + 1)
    assert parse_number(long_number) is None
    assert number_problem(long_number) == ("is 1,001 characters long; compare: numeric reads answers of at most "
                                           "1,000 characters")
    assert parse_number("1" * MAX_ANSWER_CHARS) == int("1" * MAX_ANSWER_CHARS)
    s = reward(NUMERIC).score("\\boxed{" + long_number + "}", {"answer": "1"})
    assert s.passed == {"correct": False} and "1,001 characters long" in s.reasons["correct"]


def test_unicode_digits_that_int_cannot_read_are_not_numbers() -> None:
    assert parse_number("\u00b2") is None  # '²'.isdigit() is True but int('²') raises
    assert parse_number("\u0661\u0662") == 12  # Arabic-Indic digits are decimal digits


# ------------------------------------------------------------------------------------------- nested \text


def test_deeply_nested_text_wrappers_take_linear_time() -> None:
    # Before: one regex pass per nesting level, quadratic: 10k levels took 6-8 s.
    n = 10_000
    nested = "\\text{" * n + "X" + "}" * n
    out, seconds = timed(normalize, nested)
    assert out == "x" and seconds < 0.5
    value, seconds = timed(parse_number, "\\text{" * 140 + "7" + "}" * 140)  # 981 characters
    assert value == 7 and seconds < 0.5
    s, seconds = timed(reward({**NUMERIC, "compare": "normalized"}).score, "\\boxed{" + nested + "}", {"answer": "x"})
    assert s.correct is True and seconds < 1


_OLD_WRAPPER = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")


def _old_unwrap(s: str, sep: str = "") -> str:
    """The quadratic implementation this replaced: substitute innermost wrappers until nothing changes."""
    prev = None
    while prev != s:
        prev, s = s, _OLD_WRAPPER.sub(sep + r"\1", s)
    return s


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["\\text{", "\\mathrm {", "\\textbf{", "{", "}", "a", "7", " ", "\\", "$"]),
                max_size=30), st.sampled_from(["", " "]))
def test_linear_unwrap_equals_the_old_substitution(tokens: list[str], sep: str) -> None:
    s = "".join(tokens)
    assert answers._unwrap_text(s, sep) == _old_unwrap(s, sep)


def test_adversarial_number_texts_stay_fast() -> None:
    cap = MAX_ANSWER_CHARS
    texts = [
        ("1 / " * cap)[:cap], ("( " * cap)[:cap] + "/ 2", "1" + " " * (cap - 3) + "/x", ("1 a" * cap)[:cap],
        ("{" * (cap // 2)) + "5" + ("}" * (cap // 2 - 1)), ("\\frac{" * 300)[:cap], ("1,000" * 200)[:cap],
        "-" * cap, ("9" * (cap - 5)) + "e1000", "\\$" * (cap // 2),
    ]
    for text in texts:  # milliseconds each; a quadratic step would take minutes on the 100k-character texts
        seconds = min(timed(parse_number, text)[1] for _ in range(3))
        assert seconds < 0.5, (text[:30], seconds)
        seconds = min(timed(normalize, text * 100)[1] for _ in range(3))
        assert seconds < 2.0, (text[:30], seconds)


# ------------------------------------------------------------------------------------------- size caps


def test_a_completion_over_the_cap_fails_every_rule_that_reads_it() -> None:
    fn = reward(NUMERIC, {"name": "has_x", "kind": "match", "pattern": "x"},
                {"name": "finished", "kind": "termination"},
                {"name": "short", "kind": "length", "unit": "chars", "max": 10, "pass_score": 0, "fail_score": -1})
    text = "x" * MAX_COMPLETION_CHARS + "\\boxed{1}"
    s, seconds = timed(fn.score, text, {"answer": "1"})
    assert seconds < 0.5
    assert s.passed == {"correct": False, "has_x": False, "finished": True, "short": False}
    assert s.contributions == {"correct": 0.0, "has_x": 0.0, "finished": 1.0, "short": -1.0}
    why = "the completion is 200,009 characters long; the rules read at most 200,000"
    assert s.reasons["correct"] == why and s.reasons["has_x"] == why
    assert s.errors == {"correct": why, "has_x": why}
    assert fn.score("x" * MAX_COMPLETION_CHARS, {"answer": "1"}).passed["has_x"] is True  # at the cap: read


def test_a_reference_over_the_cap_is_a_reference_problem() -> None:
    fn = reward(NUMERIC)
    assert fn.reference_problem({"answer": "1" + " " * MAX_REFERENCE_CHARS}) == (
        "the reference field 'answer' is 100,001 characters long; answer rules read at most 100,000")
    assert fn.reference_problem({"answer": 10**5000}) == (
        "the reference field 'answer' holds a number too long to read")


def test_reasons_are_capped_at_200_characters() -> None:
    fn = reward({"name": "m", "kind": "match", "pattern": "y" * 300},
                {"name": "tidy", "kind": "all_of", "checks": [{"kind": "has_answer"}, {"kind": "termination"},
                                                              {"kind": "length", "unit": "chars", "max": 1}]})
    s = fn.score("\\boxed{" + "z" * 500 + "} and more", {}, truncated=True)
    assert all(len(r) <= 200 for r in s.reasons.values())
    assert s.reasons["m"] == "no match of '" + "y" * 57 + "...'"


def test_a_regex_that_timed_out_only_because_its_thread_waited_is_retried():
    """The regex module's limit is wall-clock: on a busy machine a trivial pattern can pass 0.1 s without running.
    Counted in this thread's CPU time instead, such a wait is retried, so the run's rewards do not depend on load;
    a pattern that really uses its CPU time still fails."""
    import time

    import pytest
    import regex

    from sailrl.runtime.rewards.answers import REGEX_TRIES, cpu_time_limited

    calls = []

    def starved_once(timeout):
        calls.append(timeout)
        if len(calls) == 1:
            time.sleep(0.12)  # the thread waits (no CPU) past the wall-clock limit
            raise TimeoutError("regex timed out")
        return "7"

    assert cpu_time_limited(starved_once, 0.1) == "7" and len(calls) == 2
    slow = regex.compile(r"(a|aa)+$")
    with pytest.raises(TimeoutError):
        cpu_time_limited(lambda t: slow.search("a" * 5000 + "b", timeout=t), 0.05)

    def always_starved(timeout):
        time.sleep(0.02)
        raise TimeoutError("regex timed out")

    started = time.perf_counter()
    with pytest.raises(TimeoutError):
        cpu_time_limited(always_starved, 0.01)
    assert time.perf_counter() - started < REGEX_TRIES * 0.05  # bounded in wall time too
