"""Issue 18, items 18-20: reward fidelity against other projects' answer-equivalence cases.

Before: ``compare: math`` read only the last of several ``\\boxed{}`` (``\\boxed{1},\\boxed{2}`` failed against the
set {1, 2}); ``compare: numeric`` refused MATH-style thousands (``32,\\! 349``) and ``x = 11``; ``compare: math``
failed ``\\boxed{\\text{5 apples}}`` against 5 while it passed ``\\boxed{5 apples}``; and math-verify read
``1 + \\mathrm{e}`` as ``1 +`` (the number 1), so ``1 - \\mathrm{e}`` "equalled" ``1 + \\mathrm{e}``.
"""

from __future__ import annotations

import pytest

from sailrl.compiler.reward_checks import probe_answer_rule
from sailrl.compiler.validate import validate_text
from sailrl.runtime.rewards.answers import (
    Comparator,
    all_boxes,
    describe_extractor,
    find_boxed,
    is_partial_parse,
    math_parse_unlimited,
    math_text,
    parse_number,
)
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.errors import SpecErrors
from sailrl.spec.rewards import Extractor, RewardSpec


def fn_of(compare: str, **extract) -> RewardFunction:
    rule = {"name": "correct", "kind": "answer", "extract": {"from": "boxed", **extract}, "compare": compare}
    return RewardFunction.from_spec(RewardSpec.model_validate({"rules": [rule]}), "answer")


def verdict(fn: RewardFunction, completion: str, answer: str) -> bool:
    return fn.rule_verdict("correct", completion, {"answer": answer})[0]


# ------------------------------------------------------------------------------------ 18: several boxes as a set


def test_all_boxes_joins_every_box_as_a_set() -> None:
    assert all_boxes("\\boxed{1},\\boxed{2}") == "\\{1, 2\\}"
    assert all_boxes("so \\boxed{2} and \\fbox{1} and \\boxed{2}") == "\\{2, 1\\}"  # repeats once, in order
    assert all_boxes("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"  # one box: its content as it is
    assert all_boxes("\\boxed{\\boxed{3}}") == "\\boxed{3}"  # a box inside a box is the outer one's content
    assert all_boxes("\\boxed{} \\boxed{4} \\boxed{") == "4"  # empty and unclosed boxes are skipped
    assert all_boxes("no box") is None and all_boxes("\\boxed{}") is None
    assert find_boxed("\\boxed{1},\\boxed{2}", "all") == "\\{1, 2\\}"
    assert find_boxed("\\boxed{1},\\boxed{2}") == "2"  # the default is unchanged: the last box


def test_all_boxes_is_linear_on_many_unclosed_boxes() -> None:
    text = "\\boxed{" * 20_000
    assert all_boxes(text) is None  # one scan: the first unclosed box consumes the rest


@pytest.mark.parametrize(
    ("completion", "answer", "as_set", "last"),
    [
        ("The solutions are \\boxed{1},\\boxed{2}.", "\\{1, 2\\}", True, False),
        ("\\boxed{2}, \\boxed{1}", "1, 2", True, False),
        ("\\boxed{-3} and \\boxed{2}", "x=-3 \\text{ or } x=2", True, False),
        ("\\boxed{\\frac{1}{2}} and \\boxed{2}", "\\{0.5, 2\\}", True, False),
        ("\\boxed{1},\\boxed{3}", "\\{1, 2\\}", False, False),
        ("\\boxed{1},\\boxed{2},\\boxed{3}", "\\{1, 2\\}", False, False),
        ("\\boxed{7}", "7", True, True),
    ],
)
def test_occurrence_all_reads_several_boxes_as_one_set(completion: str, answer: str, as_set: bool,
                                                       last: bool) -> None:
    assert verdict(fn_of("math", occurrence="all"), completion, answer) is as_set
    assert verdict(fn_of("math"), completion, answer) is last


def test_occurrence_all_is_refused_where_it_cannot_mean_a_set() -> None:
    with pytest.raises(ValueError, match="occurrence: all .* needs from: boxed"):
        Extractor.model_validate({"from": "last_number", "occurrence": "all"})
    with pytest.raises(ValueError, match="only compare: math compares"):
        fn_of("numeric", occurrence="all")
    assert describe_extractor(Extractor.model_validate({"from": "boxed", "occurrence": "all"})) == \
        "every \\boxed{...} answer, read as one set"


def test_occurrence_all_in_a_spec_is_one_located_line() -> None:
    text = """\
name: t
model: {name: sailrl/tiny}
dataset: {source: data.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}'}
reward:
  rules:
    - {name: correct, kind: answer, extract: {from: boxed, occurrence: all}, compare: numeric}
"""
    with pytest.raises(SpecErrors) as info:
        validate_text(text, "spec.yaml")
    errors = info.value.errors
    assert len(errors) == 1 and errors[0].line == 7, errors
    assert "set compare: math" in str(errors[0])


# ------------------------------------------------------------------------------------ 19: numeric


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("32,\\! 349", 32349),  # MATH's own answers write thousands like this
        ("32,\\!349", 32349),
        ("1,\\!234,\\!567", 1234567),
        ("\\$1,\\! 000", 1000),
        ("x = 11", 11),
        ("x=11", 11),
        ("y = \\frac{1}{2}", 0.5),
        ("x_1 = -3", -3),
        ("\\text{5 apples}", 5),
        ("5 apples", 5),
    ],
)
def test_numeric_reads_latex_thousands_and_named_answers(text: str, value: float) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["32,\\! 34", "x = y = 3", "x == 3", "ab = 3", "5 = 5"])
def test_numeric_still_refuses_what_is_not_one_number(text: str) -> None:
    assert parse_number(text) is None


@pytest.mark.parametrize("compare", ["numeric", "math"])
@pytest.mark.parametrize("completion", ["\\boxed{5 apples}", "\\boxed{\\text{5 apples}}", "\\boxed{5\\text{ apples}}",
                                        "\\boxed{\\textbf{5 apples.}}"])
def test_a_unit_word_is_one_rule_inside_a_text_wrapper_or_not(compare: str, completion: str) -> None:
    fn = fn_of(compare)
    assert verdict(fn, completion, "5") is True
    assert verdict(fn, completion, "6") is False


# ------------------------------------------------------------------------------------ 20: partial parses


@pytest.mark.parametrize(
    ("wrong", "right"),
    [
        ("1 - \\mathrm{e}", "1 + \\mathrm{e}"),
        ("1 - \\mathrm{ex}", "1 + \\mathrm{ex}"),
        ("2\\pi - \\mathrm{e}", "2\\pi + \\mathrm{e}"),
        ("x - \\mathrm{e}", "x + \\mathrm{e}"),
        ("a - \\mathrm{b}", "a + \\mathrm{b}"),
        ("3 - \\mathrm{i}", "3 + \\mathrm{i}"),
        ("\\frac{1}{2} - \\operatorname{e}", "\\frac{1}{2} + \\operatorname{e}"),
    ],
)
def test_a_wrong_answer_never_passes_on_a_prefix(wrong: str, right: str) -> None:
    fn = fn_of("math")
    assert verdict(fn, f"\\boxed{{{wrong}}}", right) is False
    assert verdict(fn, f"\\boxed{{{right}}}", wrong) is False


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("1 + \\mathrm{e}", "e + 1"),  # \mathrm{e} is Euler's e, as a bare e is
        ("\\mathrm{e}^{x}", "e^x"),
        ("2\\pi - \\mathrm{e}", "2\\pi - e"),
        ("\\mathrm{d}x", "dx"),
        ("5\\,\\mathrm{cm}", "5"),  # a unit after a number is still dropped
    ],
)
def test_upright_letters_read_as_the_letter(answer: str, reference: str) -> None:
    assert verdict(fn_of("math"), f"\\boxed{{{answer}}}", reference) is True


def test_math_text_and_partial_parse_detection() -> None:
    assert math_text("1 + \\mathrm{e}") == "1 + e"
    assert math_text("\\text{5 apples}") == "5\\text{ apples}"
    assert math_text("\\text{Monday}") == "\\text{Monday}"
    assert is_partial_parse([1, "1 +"]) and is_partial_parse(["x \\cdot"]) and is_partial_parse([1, "y =\\,"])
    assert not is_partial_parse([5, "5\\,"]) and not is_partial_parse([1, "1"]) and not is_partial_parse([])
    assert math_parse_unlimited("1 + \\mathrm{ex}") == []  # only "1 +" would parse: unreadable, not 1
    assert math_parse_unlimited("x^2 + \\text{const}") == []


def test_a_prefix_parse_is_unreadable_in_the_math_worker_too() -> None:
    import threading

    comparator = Comparator("math", math_timeout_s=5.0)
    result: dict[str, object] = {}

    def score() -> None:  # off the main thread: compared in the math worker process
        ref = comparator.prepare("1 + \\mathrm{e}")
        try:
            result["equal"] = comparator.equal(ref, comparator.prepare("1 - \\mathrm{e}"))
        except Exception as exc:  # noqa: BLE001
            result["error"] = exc

    t = threading.Thread(target=score)
    t.start()
    t.join(120)
    assert result == {"equal": False}


def test_validate_probes_math_rules_for_a_dropped_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    fn = fn_of("math")
    assert probe_answer_rule(fn, "correct", []) == []
    # What the probe catches: a math-verify that reads `42 + \mathrm{xy}` as `42 +` (the behaviour before the fix).
    from sailrl.runtime.rewards import answers

    monkeypatch.setattr(answers, "is_partial_parse", lambda parsed: False)
    monkeypatch.setattr(answers, "math_text", lambda text: text)
    gamed = probe_answer_rule(fn_of("math"), "correct", [])
    labels = {label for label, _ in gamed}
    assert "the right answer plus a term the parser could drop" in labels, gamed


def test_the_first_math_answer_does_not_pay_for_imports_inside_its_time_limit() -> None:
    """Under load (12 on 2 cores) the first comparison timed out: math-verify (about 2 s to import) and sympy's
    lazily imported physics.units (0.6 s, on the first simplify) were imported inside the 2 s limit."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from sailrl.runtime.rewards import answers\n"
            "seen = []\n"
            "real = answers._time_limit\n"
            "def spy(seconds):\n"
            "    seen.append(('math_verify' in sys.modules, 'sympy.physics.units' in sys.modules))\n"
            "    return real(seconds)\n"
            "answers._time_limit = spy\n"
            "c = answers.Comparator('math')\n"
            "assert c.equal(c.prepare('x^2 + 2x + 1'), c.prepare('(x+1)^2'))\n"
            "print(seen)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[(True, True), (True, True), (True, True)]"
