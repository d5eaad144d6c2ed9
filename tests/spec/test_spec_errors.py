"""Every user error in a spec is reported in plain words at file:line:col with its key path."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.conftest import MINIMAL_SPEC

from sailrl.compiler.validate import validate_file, validate_text
from sailrl.spec.errors import SpecError, SpecErrors
from sailrl.spec.models import UnknownModelError, default_renderer
from sailrl.spec.renderers import COOKBOOK_RENDERERS, KNOWN_RENDERERS, SAILRL_RENDERERS

N = MINIMAL_SPEC.count("\n")  # lines of the minimal spec; appended sections start at line N + 1


def problems(write_spec, text: str) -> tuple[Path, list[SpecError], SpecErrors]:
    path = write_spec(text)
    with pytest.raises(SpecErrors) as info:
        validate_file(path)
    return path, info.value.errors, info.value


def only(errors: list[SpecError], key_path: str) -> SpecError:
    found = [e for e in errors if e.key_path == key_path]
    assert len(found) == 1, [(e.key_path, e.message) for e in errors]
    return found[0]


# -- schema errors -----------------------------------------------------------------------------------------

def test_unknown_key_suggests_the_field(write_spec):
    path, errors, exc = problems(write_spec, MINIMAL_SPEC + "training:\n  learnig_rate: 1e-5\n")
    err = only(errors, "training.learnig_rate")
    assert (err.file, err.line, err.column) == (str(path), N + 2, 3)
    assert err.message == "unknown key 'learnig_rate' -- did you mean 'learning_rate'?"
    assert "learning_rate" in err.hint
    text = exc.format()
    assert f"{path}:{N + 2}:3: training.learnig_rate: unknown key 'learnig_rate'" in text
    assert "  learnig_rate: 1e-5\n" in text and "^^^^^^^^^^^^" in text  # the source line and a caret under the key


def test_wrong_type_quotes_what_was_typed(write_spec):
    _, errors, _ = problems(write_spec, MINIMAL_SPEC + "training:\n  steps: abc\n  learning_rate: true\n")
    steps = only(errors, "training.steps")
    assert (steps.line, steps.column) == (N + 2, 10)
    assert steps.message == "expected a whole number, got 'abc'"
    lr = only(errors, "training.learning_rate")  # YAML true is not silently 1.0
    assert (lr.line, lr.column) == (N + 3, 18)
    assert lr.message == "expected a number, got 'true'"


def test_a_section_written_as_a_value_says_how_to_write_it(write_spec):
    _, errors, _ = problems(write_spec, MINIMAL_SPEC + "training:\n  dynamic_sampling: true\n")
    err = only(errors, "training.dynamic_sampling")
    assert (err.line, err.column, err.code) == (N + 2, 21, "S103")
    assert err.message == "expected a mapping (indented `key: value` lines), got 'true'"
    assert err.hint == ("Write it as a section of its own keys, e.g. `dynamic_sampling: {max_extra_groups: ...}`; "
                        "its keys: max_extra_groups.")
    text = MINIMAL_SPEC.replace("\nmodel:\n", "\nmodel: sailrl/tiny\nxmodel:\n", 1)
    assert text != MINIMAL_SPEC
    _, errors, _ = problems(write_spec, text)
    assert only(errors, "model").hint.startswith("Write it as a section of its own keys, e.g. `model: {name: ...}`; "
                                                 "its keys: name, renderer, lora_rank,")


def test_a_value_of_the_wrong_scalar_type_has_no_section_hint(write_spec):
    _, errors, _ = problems(write_spec, MINIMAL_SPEC + "training:\n  steps: abc\n")
    assert only(errors, "training.steps").hint is None


def test_missing_required_section(write_spec):
    text = MINIMAL_SPEC.replace("dataset:\n  source: rows.jsonl\n  fields: [question, answer]\n", "")
    path, errors, _ = problems(write_spec, text)
    err = only(errors, "dataset")
    assert (err.file, err.line, err.column) == (str(path), 1, 1)
    assert err.message == "missing required section 'dataset'"
    assert "dataset:" in err.hint


def test_missing_required_key_is_located_at_its_section(write_spec):
    text = MINIMAL_SPEC.replace("  user: '{{ question }}'\n", "  reference_field: answer\n")
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "prompt.user")
    assert err.message == "missing required key 'user'"
    assert (err.line, err.column) == (7, 1)  # the `prompt:` key


def test_unknown_rule_kind_points_at_kind(write_spec):
    text = MINIMAL_SPEC.replace("      kind: answer\n", "      kind: answr\n")
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "reward.rules.0.kind")
    assert (err.line, err.column) == (12, 13)
    assert err.message == "unknown kind 'answr' -- did you mean 'answer'?"


def test_literal_choice_suggests_closest(write_spec):
    text = MINIMAL_SPEC.replace("compare: numeric", "compare: numerc")
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "reward.rules.0.compare")
    assert err.message.startswith("must be one of 'exact', 'normalized', 'numeric' or 'math'; got 'numerc'")
    assert err.message.endswith("did you mean 'numeric'?")


# -- YAML errors -------------------------------------------------------------------------------------------

def test_yaml_syntax_error_is_located(write_spec):
    text = MINIMAL_SPEC.replace("  fields: [question, answer]\n", "  fields: [question, answer\n")
    path, errors, _ = problems(write_spec, text)
    assert len(errors) == 1
    err = errors[0]
    assert (err.file, err.line, err.column) == (str(path), 6, 11)  # the '[' that is never closed
    assert err.message == "unclosed '[': this list has no closing ']'"


def test_bad_indentation_is_a_located_syntax_error():
    with pytest.raises(SpecErrors) as info:
        validate_text("name: x\nmodel:\n  name: a\n   lora_rank: 8\n", "s.yaml")
    err = info.value.errors[0]
    assert (err.file, err.line) == ("s.yaml", 4)
    assert err.message.startswith("YAML syntax error")


def test_duplicate_key_names_both_lines(write_spec):
    _, errors, exc = problems(write_spec, MINIMAL_SPEC + "name: second-name\n")
    err = only(errors, "name")
    assert (err.line, err.column) == (N + 1, 1)
    assert err.message == "duplicate key 'name' (first written on line 1)"
    assert [(r.line, r.column) for r in err.related] == [(1, 1)]
    text = exc.format()
    assert " 1 | name: test-run" in text and f"{N + 1} | name: second-name" in text


def test_duplicate_nested_key(write_spec):
    text = MINIMAL_SPEC + "training:\n  steps: 3\n  group_size: 4\n  steps: 5\n"
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "training.steps")
    assert (err.line, err.column) == (N + 4, 3)
    assert f"first written on line {N + 2}" in err.message


def test_tab_indentation(write_spec):
    text = MINIMAL_SPEC.replace("model:\n  name: sailrl/tiny\n", "model:\n\tname: sailrl/tiny\n")
    _, errors, _ = problems(write_spec, text)
    assert len(errors) == 1
    err = errors[0]
    assert (err.line, err.column) == (3, 1)
    assert "YAML forbids tabs for indentation" in err.message
    assert "spaces" in err.hint


def test_unquoted_template_is_explained(write_spec):
    text = MINIMAL_SPEC.replace("  user: '{{ question }}'", "  user: {{ question }}")
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "prompt.user")
    assert (err.line, err.column) == (8, 9)
    assert "unquoted template" in err.message and "'{{ question }}'" in err.hint


# -- YAML 1.1 traps ----------------------------------------------------------------------------------------

def test_exponent_floats_are_floats(write_spec):
    text = MINIMAL_SPEC + (
        "training:\n  learning_rate: 1e-5\n  warmup:\n    steps: 2\n    learning_rate: 2E-5\n"
    )
    loaded = validate_file(write_spec(text))
    assert loaded.spec.training.learning_rate == 1e-5
    assert loaded.spec.training.warmup.learning_rate == 2e-5
    assert loaded.data["training"]["learning_rate"] == 1e-5  # plain data is YAML 1.2 too


def test_string_fields_keep_the_typed_text(write_spec):
    text = (
        MINIMAL_SPEC.replace("name: test-run", "name: yes")
        .replace("  source: rows.jsonl\n", "  source: rows.jsonl\n  config: 010\n  split: 1_000\n")
        + "description: NO\n"
    )
    loaded = validate_file(write_spec(text))
    spec = loaded.spec
    assert (spec.name, spec.description, spec.dataset.config, spec.dataset.split) == ("yes", "NO", "010", "1_000")
    # YAML 1.2 core values in the plain data: yes/NO/1_000 are strings, 010 is decimal ten (not octal 8)
    assert loaded.data["name"] == "yes" and loaded.data["description"] == "NO"
    assert loaded.data["dataset"]["config"] == 10 and loaded.data["dataset"]["split"] == "1_000"


# -- regular expressions -----------------------------------------------------------------------------------

RULE_APPENDIX = "    - name: fmt\n      kind: match\n      pattern: {pattern}\n"


def with_rule(pattern: str) -> str:
    return MINIMAL_SPEC.replace("sampling:\n", RULE_APPENDIX.format(pattern=pattern) + "sampling:\n")


def test_regex_that_does_not_compile_shows_the_position(write_spec):
    _, errors, exc = problems(write_spec, with_rule("'ab)cd'"))
    err = only(errors, "reward.rules.1.pattern")
    assert err.message == "this regular expression does not compile: unbalanced parenthesis at position 2"
    # line 16 is `      pattern: 'ab)cd'`: the value starts at column 16, the ')' is at column 19
    assert (err.line, err.column) == (16, 19)
    assert "ab)cd\n  ^ unbalanced parenthesis" in err.hint
    assert len([e for e in errors if e.key_path.startswith("reward.rules.1")]) == 1  # not also from the schema
    assert "16 |       pattern: 'ab)cd'" in exc.format()


def test_extractor_regex_is_checked_too(write_spec):
    text = MINIMAL_SPEC.replace("      compare: numeric\n",
                                "      compare: numeric\n      extract: {from: regex, pattern: '[0-9'}\n")
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "reward.rules.0.extract.pattern")
    assert err.message.startswith("this regular expression does not compile: unterminated character set")
    assert err.line == 14


def test_double_quoted_backslash_d_is_a_located_escape_error(write_spec):
    _, errors, _ = problems(write_spec, with_rule('"\\d+"'))
    assert len(errors) == 1
    err = errors[0]
    assert (err.line, err.column) == (16, 17)  # the backslash
    assert err.message == "'\\d' is not a valid escape inside double quotes"
    assert "single quotes" in err.hint


def test_an_escape_error_does_not_hide_the_other_problems(tmp_path):
    """Issue 18.13: after `pattern: "\\d+ please"` nothing below it was checked (group_size: 1 went unsaid)."""
    (tmp_path / "data.jsonl").write_text('{"question": "q", "answer": "1"}\n')
    text = """\
name: t
model: {name: sailrl/tiny}
dataset: {source: data.jsonl, fields: [question, answer]}
prompt: {user: '{{ questoin }}'}
reward:
  rules:
    - name: polite
      kind: match
      pattern: "\\d+ please"
    - name: other
      kind: match
      pattern: "\\w+ \\s"
training:
  group_size: 1
"""
    with pytest.raises(SpecErrors) as info:
        validate_text(text, str(tmp_path / "spec.yaml"), path=tmp_path / "spec.yaml")
    found = [(e.code, e.line, e.column) for e in info.value.errors]
    assert found == [("S206", 4, 20), ("S012", 9, 17), ("S012", 12, 17), ("S214", 14, 15)], found
    assert "'\\w' is not a valid escape" in info.value.errors[2].message


def test_an_escape_error_in_a_value_with_a_single_quote_still_reports_what_came_before(tmp_path):
    text = "name: t\ntraining:\n  group_size: 1\nprompt: {user: \"it's \\d\"}\n"
    with pytest.raises(SpecErrors) as info:
        validate_text(text, str(tmp_path / "spec.yaml"), path=tmp_path / "spec.yaml")
    codes = [e.code for e in info.value.errors]
    assert "S012" in codes and "S214" in codes, codes


def test_double_quoted_backslash_b_became_a_backspace(write_spec):
    _, errors, _ = problems(write_spec, with_rule('"\\bcat\\b"'))
    err = only(errors, "reward.rules.1.pattern")
    assert (err.line, err.column) == (16, 16)
    assert "'\\b' into a control character (U+0008)" in err.message
    assert "single quotes" in err.hint
    assert len([e for e in errors if e.key_path.startswith("reward.rules.1")]) == 1


def test_single_quoted_word_boundary_is_fine(write_spec):
    loaded = validate_file(write_spec(with_rule("'\\bcat\\b'")))
    assert loaded.spec.reward.rules[1].pattern == "\\bcat\\b"


# -- templates ---------------------------------------------------------------------------------------------

def test_template_that_does_not_parse(write_spec):
    text = MINIMAL_SPEC.replace("  user: '{{ question }}'\n", "  user: |\n    Question:\n    {{ question }\n")
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "prompt.user")
    assert err.message.startswith("this Jinja template does not parse")
    assert (err.line, err.column) == (10, 5)  # the template's second line, inside the block scalar


def test_template_with_an_undeclared_field(write_spec):
    text = MINIMAL_SPEC.replace("'{{ question }}'", "'Q: {{ questoin }}'")
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "prompt.user")
    assert err.message == "the template uses 'questoin', which is not a dataset field -- did you mean 'question'?"
    assert (err.line, err.column) == (8, 16)
    assert "question, answer" in err.hint


def test_system_and_warmup_templates_are_checked(write_spec):
    text = MINIMAL_SPEC.replace("  user:", "  system: 'You are {{ persona }}'\n  user:") + (
        "training:\n  warmup:\n    steps: 1\n    completion: '{{ answr }}'\n"
    )
    _, errors, _ = problems(write_spec, text)
    assert "'persona'" in only(errors, "prompt.system").message
    assert only(errors, "training.warmup.completion").message.endswith("did you mean 'answer'?")


def test_undeclared_fields_are_not_checked_without_dataset_fields(write_spec):
    text = MINIMAL_SPEC.replace("  fields: [question, answer]\n", "").replace("{{ question }}", "{{ anything }}")
    assert validate_file(write_spec(text)).spec.prompt.user == "{{ anything }}"


def test_fields_mapping_declares_its_keys(write_spec):
    text = MINIMAL_SPEC.replace("[question, answer]", "{question: problem, answer: solution}")
    assert validate_file(write_spec(text)).spec.dataset.fields == {"question": "problem", "answer": "solution"}


# -- sampling, training, model -----------------------------------------------------------------------------

@pytest.mark.parametrize("window", ["priority", "asap", "15m"])
def test_retired_completion_windows(write_spec, window):
    _, errors, _ = problems(write_spec, MINIMAL_SPEC + f"  completion_window: {window}\n")
    err = only(errors, "sampling.completion_window")
    assert (err.line, err.column) == (N + 1, 22)
    assert f"completion_window '{window}'" in err.message and "use 'balanced' or 'flex'" in err.message


def test_unknown_completion_window(write_spec):
    _, errors, _ = problems(write_spec, MINIMAL_SPEC + "  completion_window: flexible\n")
    err = only(errors, "sampling.completion_window")
    assert err.message == "completion_window must be 'balanced' or 'flex', got 'flexible' -- did you mean 'flex'?"


@pytest.mark.parametrize("size", [1, 0])
def test_group_size_below_two_trains_nothing(write_spec, size):
    _, errors, _ = problems(write_spec, MINIMAL_SPEC + f"training:\n  group_size: {size}\n")
    err = only(errors, "training.group_size")
    assert (err.line, err.column) == (N + 2, 15)
    assert err.message == f"group_size must be at least 2, got {size}"
    assert "advantage is zero, so nothing trains" in err.hint


def test_num_substeps_must_divide_groups_per_step(write_spec):
    text = MINIMAL_SPEC + "training:\n  groups_per_step: 16\n  num_substeps: 3\n"
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "training.num_substeps")
    assert (err.line, err.column) == (N + 3, 17)
    assert err.message.startswith("num_substeps (3) must divide groups_per_step (16)")
    assert "1, 2, 4, 8, 16" in err.hint


def test_resume_from_a_sampler_checkpoint(write_spec):
    text = MINIMAL_SPEC + "training:\n  resume_from: tinker://run-1/sampler_weights/000007\n"
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "training.resume_from")
    assert (err.line, err.column) == (N + 2, 16)
    assert "sampler checkpoint" in err.message
    assert "save_state" in err.hint and "weights/" in err.hint and "init_from" in err.hint


def test_resume_from_a_state_checkpoint_is_fine(write_spec):
    text = MINIMAL_SPEC + "training:\n  resume_from: tinker://run-1/weights/000007\n"
    assert validate_file(write_spec(text)).spec.training.resume_from == "tinker://run-1/weights/000007"


def test_unknown_renderer_lists_the_known_ones(write_spec):
    text = MINIMAL_SPEC.replace("  name: sailrl/tiny\n", "  name: sailrl/tiny\n  renderer: qwen4\n")
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "model.renderer")
    assert (err.line, err.column) == (4, 13)
    assert err.message == "unknown renderer 'qwen4' -- did you mean 'qwen3'?"
    assert all(name in err.hint for name in ("role_colon", "kimi_k26", "llama3"))


@pytest.mark.parametrize("rank,ok", [(1, True), (64, True), (12, False), (0, False), (-4, False)])
def test_lora_rank_power_of_two(write_spec, rank, ok):
    text = MINIMAL_SPEC.replace("  name: sailrl/tiny\n", f"  name: sailrl/tiny\n  lora_rank: {rank}\n")
    if ok:
        assert validate_file(write_spec(text)).spec.model.lora_rank == rank
        return
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "model.lora_rank")
    assert (err.line, err.column) == (4, 14)
    assert err.message == f"LoRA rank must be a positive power of two, got {rank}"


def test_unknown_model_without_renderer(write_spec):
    text = MINIMAL_SPEC.replace("name: sailrl/tiny", "name: someorg/some-model").replace("sampler: local",
                                                                                          "sampler: tinker")
    _, errors, _ = problems(write_spec, text)
    err = only(errors, "model.name")
    assert "set model.renderer" in err.message


def test_a_hub_id_on_the_embedded_backend_needs_no_renderer(write_spec):
    # Issue 18.11: the embedded backend loads it with transformers and uses the tokenizer's chat template.
    text = MINIMAL_SPEC.replace("name: sailrl/tiny", "name: someorg/some-model")
    assert "sampler: local" in text
    loaded = validate_file(write_spec(text))  # no error at all
    assert not [e for e in loaded.warnings if e.code == "S212"]


def test_default_renderer():
    assert default_renderer("sailrl/tiny") == "role_colon"
    assert default_renderer("moonshotai/Kimi-K2.6") == "kimi_k26"
    assert default_renderer("Qwen/Qwen3-8B") == "qwen3"
    with pytest.raises(UnknownModelError, match="set model.renderer"):
        default_renderer("someorg/some-model")


def test_default_renderer_for_a_local_model_directory(tmp_path):
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert default_renderer(str(tmp_path / "my-model")) == "chat_template"
    assert default_renderer("my-model", base_dir=tmp_path) == "chat_template"
    (tmp_path / "plain").mkdir()  # a tokenizer without a chat template: the user must name a renderer
    with pytest.raises(UnknownModelError, match="'plain' has no chat template.*set model.renderer"):
        default_renderer("plain", base_dir=tmp_path)


def test_known_renderers_match_installed_tinker_cookbook():
    """KNOWN_RENDERERS is static (importing tinker_cookbook.renderers imports torch); fail when it drifts."""
    import importlib.util

    origin = importlib.util.find_spec("tinker_cookbook").submodule_search_locations[0]
    source = (Path(origin) / "renderers" / "__init__.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    func = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "get_renderer")
    names = {
        node.comparators[0].value
        for node in ast.walk(func)
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "name"
        and isinstance(node.ops[0], ast.Eq) and isinstance(node.comparators[0], ast.Constant)
    }
    assert len(names) > 20
    assert names == set(COOKBOOK_RENDERERS)
    assert set(KNOWN_RENDERERS) == names | set(SAILRL_RENDERERS) and not names & set(SAILRL_RENDERERS)
    assert len(KNOWN_RENDERERS) == len(set(KNOWN_RENDERERS))


# -- all together ------------------------------------------------------------------------------------------

def test_every_problem_of_a_file_is_reported_together(write_spec):
    text = (
        MINIMAL_SPEC.replace("  name: sailrl/tiny\n", "  name: sailrl/tiny\n  renderer: qwen4\n")
        .replace("'{{ question }}'", "'{{ questoin }}'")
        + "training:\n  learnig_rate: 1e-5\n  group_size: 1\n  steps: abc\n"
        + "  completion_window: priority\n"
    )
    path, errors, exc = problems(write_spec, text)
    got = [(e.line, e.key_path) for e in errors]
    assert got == [
        (4, "model.renderer"),
        (9, "prompt.user"),
        (N + 3, "training.learnig_rate"),
        (N + 4, "training.group_size"),
        (N + 5, "training.steps"),
        (N + 6, "training.completion_window"),
    ]
    assert f"{len(errors)} problems in {path}." in exc.format()
    assert exc.format().index("model.renderer") < exc.format().index("training.steps")  # sorted by line
