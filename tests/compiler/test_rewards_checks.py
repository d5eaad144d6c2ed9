"""`examples:` checked at validate time (sailrl.compiler.reward_checks), located, with a rule|expected|got table."""

from __future__ import annotations

import textwrap

import pytest

from sailrl.compiler.reward_checks import check_reward_examples, is_example_error
from sailrl.compiler.validate import validate_text
from sailrl.spec.errors import SpecErrors

HEAD = """\
name: t
model: {name: sailrl/tiny, renderer: role_colon}
dataset: {source: data.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}'}
reward:
  rules:
    - name: correct
      kind: answer
      extract: {from: boxed}
      reference: {extract: {from: after_marker, marker: '####'}}
      compare: numeric
    - name: format
      kind: all_of
      checks:
        - kind: has_answer
        - kind: termination
      pass_score: 0
      fail_score: -0.1
"""


def errors_of(text: str) -> list:
    with pytest.raises(SpecErrors) as info:
        validate_text(text, "spec.yaml")
    return info.value.errors


def test_agreeing_examples_pass_validation() -> None:
    text = HEAD + textwrap.dedent("""\
        examples:
          - completion: 'so \\boxed{72}'
            fields: {answer: "48/2 = <<48/2=24>>24\\n#### 72"}
            expect: {correct: 1, format: 0}
            expect_total: 1
          - completion: 'cut off'
            truncated: true
            fields: {answer: '#### 72'}
            expect_total: -0.1
        """)
    loaded = validate_text(text, "spec.yaml")
    assert check_reward_examples(loaded) == []


def test_disagreeing_example_is_located_with_a_table() -> None:
    text = HEAD + textwrap.dedent("""\
        examples:
          - completion: 'First \\boxed{5}, no: \\boxed{7}'
            fields: {answer: '#### 7'}
            expect: {correct: 1}
          - completion: 'First \\boxed{5}, no: \\boxed{7}'
            fields: {answer: '#### 5'}
            expect: {correct: 1, format: 0}
        """)
    errs = errors_of(text)
    assert len(errs) == 1
    e = errs[0]
    assert (e.line, e.column, e.key_path) == (25, 14, "examples.1.expect.correct")
    assert e.message == (
        "example 2 does not score as expected:\n"
        "  rule    | expected | got | why\n"
        "  correct | 1        | 0   | fail: answer '7' does not match reference '5'  <-- differs\n"
        "  format  | 0        | 0   | pass: answer '7'; ended cleanly\n"
        "  total   | -        | 0   |"
    )
    assert is_example_error(e)


def test_wrong_total_points_at_expect_total() -> None:
    text = HEAD + textwrap.dedent("""\
        examples:
          - completion: 'no box at all'
            fields: {answer: '#### 7'}
            expect_total: 0
        """)
    (e,) = errors_of(text)
    assert e.key_path == "examples.0.expect_total"
    assert e.line == 22
    assert "  total   | 0        | -0.1 |   <-- differs" in e.message


def test_unknown_rule_empty_expectation_and_bad_reference() -> None:
    text = HEAD + textwrap.dedent("""\
        examples:
          - completion: 'x'
            fields: {answer: '#### 7'}
            expect: {corect: 0}
          - completion: 'x'
            fields: {answer: '#### 7'}
          - completion: '\\boxed{7}'
            fields: {answer: ''}
            expect_total: 1
        """)
    errs = errors_of(text)
    assert [(e.key_path, e.message) for e in errs] == [
        ("examples.0.expect.corect",
         "example 1 expects a score for rule 'corect', but no rule has that name -- did you mean 'correct'?"),
        ("examples.1", "example 2 expects nothing, so it checks nothing"),
        ("examples.2.fields", "example 3: the reference field 'answer' is empty"),
    ]


def test_pattern_that_never_matches_an_example_meant_to_pass_is_reported_with_the_fix() -> None:
    text = HEAD.replace("reward:\n  rules:\n", textwrap.dedent("""\
        reward:
          rules:
            - name: think
              kind: match
              pattern: '^<think>.*</think>'
              weight: 0.2
        """)) + textwrap.dedent("""\
        examples:
          - completion: "<think>\\nl1\\nl2\\n</think>\\n\\\\boxed{72}"
            fields: {answer: '#### 72'}
            expect: {think: 0.2, correct: 1}
        """)
    errs = errors_of(text)
    pattern_err = next(e for e in errs if e.key_path == "reward.rules.0.pattern")
    assert pattern_err.line == 9
    assert pattern_err.message == (
        "rule 'think': the pattern '^<think>.*</think>' matches none of the 1 example(s) that expect the rule "
        "to pass"
    )
    assert pattern_err.hint.startswith("With flags: [DOTALL] it matches")
    assert is_example_error(pattern_err)
    assert any(e.key_path == "examples.0.expect.think" for e in errs)


def test_regex_extractor_that_never_finds_an_answer_is_reported() -> None:
    text = HEAD.replace("extract: {from: boxed}", "extract: {from: regex, pattern: 'answer is (\\d+)'}") + \
        textwrap.dedent("""\
        examples:
          - completion: 'The Answer is 7 \\boxed{7}'
            fields: {answer: '#### 7'}
            expect: {correct: 1}
        """)
    errs = errors_of(text)
    e = next(e for e in errs if e.key_path.endswith("extract.pattern"))
    assert e.key_path == "reward.rules.0.extract.pattern"
    assert "With flags: [IGNORECASE] it matches" in e.hint


def test_example_errors_only_run_on_a_valid_spec() -> None:
    text = HEAD.replace("compare: numeric", "compare: numerical") + textwrap.dedent("""\
        examples:
          - completion: 'x'
            fields: {answer: '#### 7'}
            expect_total: 5
        """)
    errs = errors_of(text)
    # The broken rule is reported; the example that expects the total is not scored (one W104 warning says so).
    assert not any(is_example_error(e) and not e.is_warning for e in errs)
    assert [e.code for e in errs if e.is_warning] == ["W104"]
