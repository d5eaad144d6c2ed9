"""PromptBuilder: sandboxed strict templates, the renderer's tokens and stop sequences, warm-up examples.

Uses the offline byte tokenizer (``transformers.ByT5Tokenizer(extra_ids=0)``) with tinker_cookbook's role_colon
renderer, the pair the embedded backend uses for ``sailrl/tiny`` (shared/NOTES.md).
"""

from __future__ import annotations

import pytest
from tinker_cookbook.renderers import get_renderer
from transformers import ByT5Tokenizer

from sailrl.runtime.prompts import PromptBuilder, PromptError, render_template, template_variables
from sailrl.spec.schema import PromptSpec


@pytest.fixture(scope="module")
def tokenizer():
    return ByT5Tokenizer(extra_ids=0)


@pytest.fixture(scope="module")
def renderer(tokenizer):
    return get_renderer("role_colon", tokenizer)


ROW = {"question": "3+4", "answer": "7", "_index": 12}


def test_messages_with_system(renderer):
    b = PromptBuilder(PromptSpec(system="Answer with digits only.", user="{{ question }}=?"), renderer)
    assert b.messages(ROW) == [
        {"role": "system", "content": "Answer with digits only."},
        {"role": "user", "content": "3+4=?"},
    ]
    assert b.variables == {"question"}


def test_model_input_is_the_renderers_prompt(renderer, tokenizer):
    b = PromptBuilder(PromptSpec(user="What is {{ question }}?"), renderer)
    mi = b.model_input(ROW)
    assert tokenizer.decode(mi.to_ints()) == "User: What is 3+4?\n\nAssistant:"
    assert mi.to_ints() == renderer.build_generation_prompt([{"role": "user", "content": "What is 3+4?"}]).to_ints()
    assert b.stop_sequences() == ["\n\nUser:"]


def test_missing_field_is_an_error_not_an_empty_string(renderer):
    b = PromptBuilder(PromptSpec(user="{{ question }} {{ hint }}"), renderer, field_names=["question", "hnit"])
    with pytest.raises(PromptError) as err:
        b.messages(ROW)
    assert str(err.value) == ("row 12: prompt.user uses {{ hint }} but the row has no field 'hint' -- did you mean "
                              "'hnit'? (fields: hnit, question)")
    assert err.value.row_index == 12 and err.value.field == "hint" and err.value.template == "prompt.user"


def test_null_field_is_an_error(renderer):
    b = PromptBuilder(PromptSpec(system="{{ question }}", user="x"), renderer)
    with pytest.raises(PromptError) as err:
        b.messages({"question": None, "_index": 3})
    assert str(err.value) == "row 3: field 'question' is empty (null), and prompt.system uses {{ question }}"


def test_attribute_of_a_field_that_is_missing_is_an_error():
    with pytest.raises(PromptError, match=r"prompt.user: 'dict object' has no attribute 'b'"):
        render_template("{{ meta.b }}", {"meta": {"a": 1}})


def test_sandbox_blocks_python_internals():
    with pytest.raises(PromptError, match="sandbox forbids"):
        render_template("{{ question.__class__.__mro__ }}", {"question": "x"})


def test_template_logic_and_globals():
    src = "{% for i in range(2) %}{{ question }};{% endfor %}{% if hint %}{{ hint }}{% endif %}"
    assert template_variables(src) == {"question", "hint"}
    assert render_template(src, {"question": "q", "hint": "h"}) == "q;q;h"


def test_syntax_error_is_a_prompt_error():
    with pytest.raises(PromptError, match=r"prompt.user is not a valid template: .* \(line 1\)"):
        render_template("{{ question ", {"question": "q"})


def test_supervised_example_weights_only_the_completion(renderer, tokenizer):
    b = PromptBuilder(PromptSpec(user="{{ question }}=?"), renderer)
    model_input, weights = b.supervised_example(ROW, "{{ answer }}")
    tokens = model_input.to_ints()
    assert tokenizer.decode(tokens) == "User: 3+4=?\n\nAssistant: 7\n\nUser:"
    assert len(weights) == len(tokens)
    trained = [t for t, w in zip(tokens, weights.tolist(), strict=True) if w == 1.0]
    assert tokenizer.decode(trained) == " 7\n\nUser:"
    prompt_len = b.model_input(ROW).length
    assert weights[:prompt_len].sum().item() == 0.0


def test_supervised_datum_shifts_targets(renderer):
    b = PromptBuilder(PromptSpec(user="{{ question }}=?"), renderer)
    model_input, weights = b.supervised_example(ROW, "{{ answer }}")
    datum = b.supervised_datum(ROW, "{{ answer }}")
    tokens = model_input.to_ints()
    assert datum.model_input.to_ints() == tokens[:-1]
    assert datum.loss_fn_inputs["target_tokens"].to_torch().tolist() == tokens[1:]
    assert datum.loss_fn_inputs["weights"].to_torch().tolist() == weights.tolist()[1:]


def test_warmup_completion_template_missing_field(renderer):
    b = PromptBuilder(PromptSpec(user="{{ question }}"), renderer)
    with pytest.raises(PromptError, match=r"training.warmup.completion uses \{\{ solution \}\}"):
        b.supervised_example(ROW, "{{ solution }}")


def test_builder_without_renderer_only_renders_messages():
    b = PromptBuilder(PromptSpec(user="{{ question }}"))
    assert b.messages(ROW) == [{"role": "user", "content": "3+4"}]
    with pytest.raises(RuntimeError, match="without a renderer"):
        b.model_input(ROW)
