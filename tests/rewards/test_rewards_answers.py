"""Answer extraction and comparison (sailrl.runtime.rewards.answers): exact values for the cases users hit."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sailrl.runtime.rewards.answers import (
    Comparator,
    CompiledExtractor,
    after_marker,
    find_boxed,
    find_number,
    normalize,
    numbers_close,
    parse_number,
)
from sailrl.spec.rewards import Extractor


def ex(**kw) -> Extractor:
    return Extractor.model_validate(kw)


# ------------------------------------------------------------------------------------------------ boxed


@pytest.mark.parametrize(
    ("text", "last", "first"),
    [
        ("First try \\boxed{5}. That is wrong; the answer is \\boxed{7}.", "7", "5"),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{3}", "\\frac{1}{3}"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}} done", "\\frac{\\sqrt{2}}{2}", "\\frac{\\sqrt{2}}{2}"),
        ("so \\boxed 7.", "7.", "7."),
        ("$\\boxed 42$", "42", "42"),
        ("\\fbox{3}", "3", "3"),
        ("\\boxed {4}", "4", "4"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}", "\\{1,2\\}"),
        ("\\boxed{ 12 }", "12", "12"),
    ],
)
def test_find_boxed(text: str, last: str, first: str) -> None:
    assert find_boxed(text) == last
    assert find_boxed(text, "first") == first


@pytest.mark.parametrize("text", ["no box", "\\boxed{42", "\\boxed{}", "\\boxed{  }", "\\boxedx{3}", "\\boxed7",
                                  "ok \\boxed{1} then \\boxed{2"])
def test_find_boxed_none(text: str) -> None:
    assert find_boxed(text) is None


def test_unclosed_last_box_does_not_fall_back_to_an_earlier_one() -> None:
    # The model's final answer is broken: grading the discarded first answer would reward the wrong thing.
    assert find_boxed("\\boxed{1} no wait \\boxed{2") is None
    assert find_boxed("\\boxed{1} no wait \\boxed{2", "first") == "1"


# ------------------------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize(
    ("text", "last", "first"),
    [
        ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72", "48/2"),
        ("5-3 = 2", "2", "5"),
        ("It costs $1,000.", "1,000", "1,000"),
        ("the answer: -4", "-4", "-4"),
        ("between .5 and 2.25", "2.25", ".5"),
        ("temperature \u22123 degrees", "-3", "-3"),
    ],
)
def test_find_number(text: str, last: str, first: str) -> None:
    assert find_number(text) == last
    assert find_number(text, "first") == first


def test_find_number_none() -> None:
    assert find_number("no digits here") is None


def test_after_marker() -> None:
    assert after_marker("steps\n#### 72", "####") == "72"
    assert after_marker("#### 1\n#### 2\n", "####") == "2"
    assert after_marker("#### 1\n#### 2\n", "####", "first") == "1"
    assert after_marker("A:\n  42\n", "A:") == "42"
    assert after_marker("A: 42 because\nmore", "A:") == "42 because"
    assert after_marker("####   \n", "####") is None
    assert after_marker("nothing", "####") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("72", Fraction(72)),
        ("-3.0", Fraction(-3)),
        ("1,000", Fraction(1000)),
        ("1,234,567.5", Fraction(2469135, 2)),
        ("\\frac{1}{2}", Fraction(1, 2)),
        ("\\dfrac{2}{3}", Fraction(2, 3)),
        ("-\\frac{1}{2}", Fraction(-1, 2)),
        ("\\frac12", Fraction(1, 2)),
        ("2/3", Fraction(2, 3)),
        ("-3/4", Fraction(-3, 4)),
        ("0.5", Fraction(1, 2)),
        ("1e-3", Fraction(1, 1000)),
        ("50%", Fraction(50)),
        ("50\\%", Fraction(50)),
        ("\\$1,234.50", Fraction(2469, 2)),
        ("$18$", Fraction(18)),
        ("18 dollars", Fraction(18)),
        ("18\\text{ dollars}", Fraction(18)),
        ("5\\text{cm}", Fraction(5)),
        ("90^\\circ", Fraction(90)),
        ("7.", Fraction(7)),
        ("{5}", Fraction(5)),
        ("\u22123", Fraction(-3)),
        ("1\\,000", Fraction(1000)),
        ("1{,}000", Fraction(1000)),
    ],
)
def test_parse_number(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1,2", "12,34", "1,0000", "2a", "x=y=5", "3/0", "\\frac{1}{0}",
                                  "\\sqrt{2}", "1 or 2"])
def test_parse_number_rejects(text: str) -> None:
    assert parse_number(text) is None


def test_percent_policy_is_the_number_of_percent_never_a_fraction() -> None:
    assert parse_number("50%") == 50
    assert parse_number("50%") != Fraction(1, 2)


def test_numbers_close_tolerances() -> None:
    assert numbers_close(Fraction(1, 3), Fraction(1, 3))
    assert not numbers_close(Fraction(1, 3), Fraction("0.333"))
    assert numbers_close(Fraction(1, 3), Fraction("0.333"), abs_tol=0.001)
    assert not numbers_close(Fraction(1, 3), Fraction("0.333"), abs_tol=0.0001)
    assert numbers_close(Fraction(100), Fraction(101), rel_tol=0.01)
    assert not numbers_close(Fraction(100), Fraction(102), rel_tol=0.01)


@given(st.integers(min_value=-10**12, max_value=10**12))
def test_integers_written_with_grouped_thousands_parse_to_themselves(n: int) -> None:
    assert parse_number(f"{n:,}") == n
    assert parse_number(f"{n}") == n
    assert parse_number(f"{n}.0") == n


@given(st.integers(min_value=-999, max_value=999), st.integers(min_value=1, max_value=999))
def test_latex_and_slash_fractions_agree(a: int, b: int) -> None:
    want = Fraction(a, b)
    sign = "-" if a < 0 else ""
    assert parse_number(f"{sign}\\frac{{{abs(a)}}}{{{b}}}") == want
    assert parse_number(f"{a}/{b}") == want


# ------------------------------------------------------------------------------------------------ normalize


@pytest.mark.parametrize(
    ("text", "norm"),
    [
        ("\\text{Yes}.", "yes"),
        ("$1,000$", "1000"),
        ("\\$1,000", "1000"),
        ("1,000,00", "1,000,00"),  # not grouped by three: left alone
        ("(1,2)", "(1,2)"),
        ("\\left(1, 2\\right)", "(1,2)"),
        ("  New  York. ", "newyork"),
        ("\\dfrac{1}{3}", "\\frac{1}{3}"),
        ("x \\rightarrow y", "x\\rightarrowy"),  # \right inside \rightarrow is not stripped
    ],
)
def test_normalize(text: str, norm: str) -> None:
    assert normalize(text) == norm


# ------------------------------------------------------------------------------------------------ extractors


def test_regex_extractor_last_by_default_and_first_selectable() -> None:
    text = "Answer: 3\nAnswer: 4\n"
    assert CompiledExtractor(ex(**{"from": "regex", "pattern": r"Answer:\s*(\d+)"}), 0.1)(text) == "4"
    assert CompiledExtractor(ex(**{"from": "regex", "pattern": r"Answer:\s*(\d+)", "occurrence": "first"}),
                             0.1)(text) == "3"


def test_regex_extractor_named_group_answer_wins() -> None:
    e = CompiledExtractor(ex(**{"from": "regex", "pattern": r"(Answer|Result): (?P<answer>\d+)"}), 0.1)
    assert e("Result: 12") == "12"


def test_regex_extractor_times_out() -> None:
    e = CompiledExtractor(ex(**{"from": "regex", "pattern": r"((a|aa)+)$"}), 0.05)
    with pytest.raises(TimeoutError):
        e("a" * 30 + "b")


def test_fallback_whole() -> None:
    e = CompiledExtractor(ex(**{"from": "boxed", "fallback": "whole"}), 0.1)
    assert e(" 72 ") == "72"
    assert e("\\boxed{5} and 72") == "5"


def test_comparators() -> None:
    exact = Comparator("exact")
    assert exact.equal(exact.prepare(" 7 "), exact.prepare("7"))
    assert not exact.equal(exact.prepare("7."), exact.prepare("7"))
    norm = Comparator("normalized")
    assert norm.equal(norm.prepare("\\text{Paris}."), norm.prepare("paris"))
    assert norm.prepare("  ") is None
    num = Comparator("numeric", abs_tol=0.01)
    assert num.equal(num.prepare("3.14159"), num.prepare("3.14"))
    assert num.prepare("pi") is None


def test_math_comparator_symbolic() -> None:
    m = Comparator("math")
    assert m.equal(m.prepare("\\frac{1}{3}"), m.prepare("1/3"))
    assert m.equal(m.prepare("x^2 + 2x + 1"), m.prepare("(x+1)^2"))
    assert not m.equal(m.prepare("\\frac{1}{3}"), m.prepare("0.3"))
