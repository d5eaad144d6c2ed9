"""The validation stage: one pass, root causes once, warnings that do not fail, codes, and the shared tables."""

from __future__ import annotations

import pytest
from tests.conftest import MINIMAL_SPEC

from sailrl.cli import main
from sailrl.compiler.validate import problems, validate_file, validate_text
from sailrl.spec.codes import CODES, code_of
from sailrl.spec.errors import SpecError, SpecErrors
from sailrl.spec.loader import dedupe, load_spec, load_spec_text

N = MINIMAL_SPEC.count("\n")


def errors_of(text: str) -> list[SpecError]:
    with pytest.raises(SpecErrors) as info:
        validate_text(text, "s.yaml")
    return info.value.errors


def with_rule(rule: str) -> str:
    return MINIMAL_SPEC.replace("sampling:\n", rule + "sampling:\n")


EXAMPLES = """\
examples:
  - completion: 'so \\boxed{2}'
    fields: {answer: '2'}
    expect_total: 1
  - completion: 'so \\boxed{3}'
    fields: {answer: '2'}
    expect: {correct: 0}
"""

# -- stages ------------------------------------------------------------------------------------------------


def test_the_loader_does_yaml_and_schema_only_and_validate_does_everything(write_spec):
    path = write_spec(MINIMAL_SPEC + "training:\n  group_size: 1\n")
    assert load_spec(path).spec.training.group_size == 1  # the schema allows it
    with pytest.raises(SpecErrors) as info:
        validate_file(path)
    assert [e.code for e in info.value.errors] == ["S214"]


def test_validate_text_returns_warnings_on_the_loaded_spec(write_spec):
    loaded = validate_file(write_spec(MINIMAL_SPEC + "training:\n  learning_rate: 1e5\n"))
    assert [(w.code, w.key_path, w.severity) for w in loaded.warnings] == [
        ("W101", "training.learning_rate", "warning")]


# -- 14.8: templates are rendered on an example row in the runtime's sandbox ---------------------------------

@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ lipsum(n=100000) }}", "{{ 9**(question|length*10**8) }}", "{{ \"a\" * 10**8 }}",
    "{{ question.center(100000000) }}", "{{ \"%100000000d\"|format(1) }}",
])
def test_templates_that_would_hang_a_run_fail_validation_at_the_template(template):
    found = errors_of(MINIMAL_SPEC.replace("'{{ question }}'", f"'{template}'"))
    (err,) = found
    assert (err.code, err.key_path, err.line) == ("S208", "prompt.user", 8)
    assert err.message.startswith("on an example row, prompt.user ")


@pytest.mark.parametrize("template,name", [
    ("{{ question.__class__.__mro__ }}", "__class__"), ("{{ cycler.__init__.__globals__ }}", "__init__"),
    ("{{ self._TemplateReference__context }}", "_TemplateReference__context"),
    ("{{ question[\"__class__\"] }}", "__class__"),
])
def test_forbidden_attributes_are_located_errors_at_validate(template, name):
    (err,) = errors_of(MINIMAL_SPEC.replace("'{{ question }}'", f"'{template}'"))
    assert err.code == "S207" and err.line == 8 and f"uses '{name}'" in err.message
    assert err.column == 9 + 1 + template.index(name)  # at the name, inside the quotes that start at column 9


def test_a_forbidden_call_found_only_by_rendering_is_reported_too():
    (err,) = errors_of(MINIMAL_SPEC.replace("'{{ question }}'", "'{{ range.__call__ }}'"))
    assert err.code == "S207"


def test_templates_render_on_the_examples_fields():
    text = MINIMAL_SPEC.replace("'{{ question }}'", "'{{ question }} {{ (answer|int) * 10**7 * \"ab\" }}'") + (
        "examples:\n  - completion: 'so \\boxed{2}'\n    fields: {question: 'q', answer: '2'}\n    expect_total: 1\n")
    (err,) = errors_of(text)  # with the example's answer (2) the text is 40 M characters: over the limit
    assert err.code == "S208" and "would build a text of about 40,000,000 characters" in err.message
    # with placeholder values ('answer' | int == 0) the same template renders fine
    assert validate_text(text.split("examples:")[0], "s.yaml").spec is not None


def test_errors_that_depend_on_real_row_values_are_left_to_the_data_checks():
    ok = MINIMAL_SPEC.replace("'{{ question }}'", "'{{ question.text }} {{ question|int + 1 }}'")
    assert validate_text(ok, "s.yaml").spec is not None


# -- 14.12: suggestions, root causes once, one pass -----------------------------------------------------------

def test_a_reference_field_suggests_the_answer_field_not_the_closest_spelling():
    text = MINIMAL_SPEC.replace("      compare: numeric\n", "      compare: numeric\n      reference: {field: solution}\n")
    (err,) = errors_of(text)
    assert err.code == "S219" and err.message == "'solution' is not a dataset field -- did you mean 'answer'?"


def test_a_typo_of_a_field_still_wins_over_the_preferred_field():
    text = MINIMAL_SPEC.replace("      compare: numeric\n", "      compare: numeric\n      reference: {field: questoin}\n")
    (err,) = errors_of(text)
    assert err.message.endswith("did you mean 'question'?")


def test_one_bad_regex_is_one_problem_and_its_examples_are_skipped_with_one_note():
    text = with_rule("    - name: fmt\n      kind: match\n      pattern: 'ab(c'\n") + EXAMPLES + (
        "  - completion: 'x'\n    fields: {answer: '2'}\n    expect: {fmt: 1}\n")
    found = errors_of(text)
    assert [(e.code, e.key_path) for e in found] == [("S201", "reward.rules.1.pattern"), ("W104", "examples")]
    assert found[1].message == ("2 of 3 worked examples (number 1, 3) were not scored: they expect a score of rule "
                                "'fmt' or the total, and that rule has problems (listed here)")


def test_examples_of_valid_rules_are_scored_in_the_same_pass_as_other_problems():
    text = MINIMAL_SPEC + "training:\n  group_size: 1\n" + EXAMPLES.replace("expect_total: 1", "expect_total: 0")
    found = errors_of(text)
    assert [(e.code, e.key_path) for e in found] == [("S214", "training.group_size"),
                                                      ("S301", "examples.0.expect_total")]


def test_a_syntax_error_is_reported_with_everything_checkable_before_it():
    text = MINIMAL_SPEC.replace("  user: '{{ question }}'\n", "  user: '{{ questoin }}'\n") + (
        "training:\n  group_size: 1\n  steps: [1, 2\n")
    found = errors_of(text)
    assert [(e.code, e.line) for e in found] == [("S206", 8), ("S214", N + 2), ("S013", N + 3)]


def test_a_syntax_error_does_not_invent_missing_sections():
    text = "name: x\nmodel:\n  name: sailrl/tiny\n  lora_rank: [8\n" + MINIMAL_SPEC.split("dataset:", 1)[1]
    found = errors_of(text)
    assert [e.code for e in found] == ["S013"]


# -- 14.13 and the new keys: warnings and semantic checks -----------------------------------------------------

@pytest.mark.parametrize("line,key", [
    ("training:\n  learning_rate: 1e5\n", "training.learning_rate"),
    ("training:\n  kl_penalty_coef: 5\n", "training.kl_penalty_coef"),
    ("training:\n  group_size: 512\n", "training.group_size"),
    ("training:\n  warmup: {steps: 1, learning_rate: 3.0}\n", "training.warmup.learning_rate"),
    ("model_rank", "model.lora_rank"),
    ("sampling_temperature", "sampling.temperature"),
])
def test_values_outside_their_usual_range_are_warnings(write_spec, capsys, line, key):
    text = MINIMAL_SPEC
    if line == "model_rank":
        text = text.replace("  name: sailrl/tiny\n", "  name: sailrl/tiny\n  lora_rank: 512\n")
    elif line == "sampling_temperature":
        text += "  temperature: 0\n"
    else:
        text += line
    path = write_spec(text)
    assert main(["validate", str(path), "--color", "never"]) == 0
    out, err = capsys.readouterr()
    assert out == f"ok: {path} (1 warning)\n"
    assert f": warning: {key}: " in err and "is outside its usual range" in err and "= code: W101" in err


def test_zero_means_off_for_the_kl_penalty():
    assert validate_text(MINIMAL_SPEC + "training:\n  kl_penalty_coef: 0\n", "s.yaml").warnings == []


def test_kl_discount_without_kl_penalty_is_a_warning():
    loaded = validate_text(MINIMAL_SPEC + "training:\n  kl_discount_factor: 0.9\n", "s.yaml")
    (w,) = loaded.warnings
    assert (w.code, w.key_path, w.line) == ("W102", "training.kl_discount_factor", N + 2)
    assert "kl_penalty_coef is not set (0): it has no effect" in w.message


def test_lr_warmup_steps_must_be_fewer_than_steps():
    (err,) = errors_of(MINIMAL_SPEC + "training:\n  steps: 10\n  lr_warmup_steps: 10\n")
    assert (err.code, err.key_path, err.line, err.column) == ("S226", "training.lr_warmup_steps", N + 3, 20)
    assert err.message.startswith("lr_warmup_steps (10) must be fewer than training.steps (10)")
    (err,) = errors_of(MINIMAL_SPEC + "training:\n  lr_warmup_steps: 7\n")  # the default steps: 7
    assert "training.steps (7)" in err.message


@pytest.mark.parametrize("value,message", [
    ("1.5", "expected a whole number, got '1.5'"), ("two", "expected a whole number, got 'two'"),
    ("-1", "must be at least 0, got '-1'"),
])
def test_max_steps_off_policy_must_be_a_whole_number_from_zero(value, message):
    (err,) = errors_of(MINIMAL_SPEC + f"training:\n  max_steps_off_policy: {value}\n")
    assert (err.key_path, err.line, err.column, err.message) == ("training.max_steps_off_policy", N + 2, 25, message)


def test_a_negative_kl_penalty_is_plain_words():
    (err,) = errors_of(MINIMAL_SPEC + "training:\n  kl_penalty_coef: -0.1\n")
    assert (err.code, err.message) == ("S107", "must be at least 0, got '-0.1'")


def test_max_tokens_not_below_the_context_window_is_a_warning():
    loaded = validate_text(MINIMAL_SPEC + "  max_tokens: 5000\n", "s.yaml")
    (w,) = loaded.warnings
    assert w.code == "W103" and "(4,096 tokens" in w.message and w.key_path == "sampling.max_tokens"


def test_a_warning_is_not_repeated_where_the_same_key_has_an_error():
    (err,) = errors_of(MINIMAL_SPEC + "training:\n  group_size: 1\n")
    assert err.code == "S214"


# -- codes ----------------------------------------------------------------------------------------------------

def test_every_problem_has_a_code_and_the_report_shows_it():
    text = MINIMAL_SPEC.replace("  name: sailrl/tiny\n", "  name: sailrl/tiny\n  renderer: qwen4\n") + (
        "training:\n  learnig_rate: 1e-5\n  steps: abc\n")
    with pytest.raises(SpecErrors) as info:
        validate_text(text, "s.yaml")
    assert [e.code for e in info.value.errors] == ["S211", "S101", "S103"]
    report = info.value.format()
    assert "  = code: S211 unknown-renderer\n" in report and "   = code: S101 unknown-key\n" in report
    assert code_of("unknown-key") is CODES["S101"] and code_of("S101").name == "unknown-key"


def test_problems_are_deduplicated_by_location_and_code_not_by_wording():
    a = SpecError("s.yaml", 3, 5, "x", "one wording", code="S109")
    b = SpecError("s.yaml", 3, 5, "x", "another wording", code="S109")
    c = SpecError("s.yaml", 3, 5, "x", "one wording", code="S201")
    assert dedupe([a, b, c]) == [a, c]


def test_a_pattern_error_is_reported_once_though_the_schema_and_the_check_both_see_it():
    _, found = problems(with_rule("    - name: fmt\n      kind: match\n      pattern: 'ab)c'\n"), "s.yaml")
    assert [(e.code, e.key_path) for e in found] == [("S201", "reward.rules.1.pattern")]


def test_the_yaml_loader_alone_reports_yaml_and_schema_problems():
    with pytest.raises(SpecErrors) as info:
        load_spec_text("name: x\nname: y\n", "s.yaml")
    assert sorted(e.code for e in info.value.errors) == ["S015", "S102", "S102", "S102"]


# -- 13.4: one home for each fact ----------------------------------------------------------------------------

def test_the_tables_live_in_the_spec_layer_and_the_stages_use_them():
    import typing

    from sailrl.compiler import checks
    from sailrl.spec import constants, rewards

    assert typing.get_args(rewards.RegexFlag) == constants.REGEX_FLAGS
    assert checks.LOCAL_DATA_SUFFIXES is constants.LOCAL_DATA_SUFFIXES
    assert checks.COMPLETION_WINDOWS is constants.COMPLETION_WINDOWS
    assert checks.RETIRED_WINDOWS is constants.RETIRED_WINDOWS


def test_did_you_mean_prefers_what_fits_the_place():
    from sailrl.spec.messages import did_you_mean, did_you_mean_text

    assert did_you_mean("solution", ["question", "answer"]) == "question"  # spelling alone
    assert did_you_mean("solution", ["question", "answer"], preferred=["answer"]) == "answer"
    assert did_you_mean("questoin", ["question", "answer"], preferred=["answer"]) == "question"  # a typo wins
    assert did_you_mean("zzz", ["question"]) is None
    assert did_you_mean_text("lerning_rate", ["learning_rate"]) == " -- did you mean 'learning_rate'?"
    assert did_you_mean_text("zzz", ["question"]) == ""


def test_every_place_that_makes_a_spec_error_sets_a_known_code():
    """Static: each SpecError(...) / loaded.error(...) call in the package passes code= with a code of the table."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    missing = []
    for folder in ("spec", "compiler", "runtime", "sailrl"):
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                makes = (isinstance(func, ast.Name) and func.id == "SpecError") or (
                    isinstance(func, ast.Attribute) and func.attr == "error" and (
                        (isinstance(func.value, ast.Name) and func.value.id == "loaded")
                        or (isinstance(func.value, ast.Attribute) and func.value.attr == "loaded")))
                if not makes:
                    continue
                code = next((k.value for k in node.keywords if k.arg == "code"), None)
                if code is None:
                    missing.append(f"{path.relative_to(root)}:{node.lineno}: no code=")
                elif isinstance(code, ast.Constant) and code.value not in CODES:
                    missing.append(f"{path.relative_to(root)}:{node.lineno}: unknown code {code.value!r}")
    assert not missing, "\n".join(missing)


def test_a_sampler_checkpoint_is_refused_as_resume_from_and_as_init_from():
    for key in ("resume_from", "init_from"):
        text = MINIMAL_SPEC.replace("sampling:\n", f"training:\n  {key}: tinker://run-1/sampler_weights/final\n"
                                                  "sampling:\n")
        s216 = [e for e in errors_of(text) if e.code == "S216"]
        assert [e.key_path for e in s216] == [f"training.{key}"]
        assert "sampling only" in s216[0].message and "weights/" in s216[0].hint
