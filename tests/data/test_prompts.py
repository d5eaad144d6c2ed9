"""PromptBuilder: sandboxed strict templates, the renderer's tokens and stop sequences, warm-up examples.

Uses the offline byte tokenizer (``transformers.ByT5Tokenizer(extra_ids=0)``) with tinker_cookbook's role_colon
renderer, the pair the embedded backend uses for ``sailrl/tiny``.
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


# -- limits: no template hangs a run or exhausts memory ------------------------------------------------------

HANGING = {
    "nested range loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "lipsum": "{{ lipsum(n=100000) }}",
    "power": "{{ 9**(n*10**8) }}",
    "repetition": "{{ 'a' * 10**8 }}",
    "center method": "{{ question.center(100000000) }}",
    "center filter": "{{ question|center(100000000) }}",
    "percent format filter": "{{ '%100000000d'|format(1) }}",
    "percent operator": "{{ '%100000000d' % 1 }}",
    "str.format width": "{{ '{:>100000000}'.format(1) }}",
    "concat doubling": "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ ns.s }}",
    "plus doubling": "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}{{ ns.s }}",
    "loops over long strings": "{% for c in 'a' * 1000000 %}{% for d in 'b' * 1000000 %}{% endfor %}{% endfor %}",
    "list repetition": "{{ (range(100000)|list) * 100000 }}",
    "batch": "{{ range(10)|batch(1000000000, 'x')|list }}",
    "recursive macro": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "filter chain": "{{ question" + "|upper" * 300 + " }}",
}


@pytest.mark.parametrize("source", HANGING.values(), ids=HANGING.keys())
def test_runaway_templates_stop_within_their_limits(source):
    import time

    from sailrl.runtime.prompts import RENDER_TIMEOUT_S

    start = time.perf_counter()
    with pytest.raises(PromptError) as err:
        render_template(source, {"question": "q", "n": 3}, row_index=4)
    assert time.perf_counter() - start < RENDER_TIMEOUT_S + 0.5
    assert err.value.kind == "limit" and str(err.value).startswith("row 4: prompt.user ")


def test_limit_messages_state_the_limit():
    with pytest.raises(PromptError, match=r"'\*' would build a text of about 100,000,000 characters \(the limit is "
                                          r"2,000,000\)"):
        render_template("{{ 'a' * 10**8 }}", {})
    with pytest.raises(PromptError, match=r"took longer than 0.5 s to render \(templates are limited to 0.5 s a row\)"):
        render_template("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", {})
    with pytest.raises(PromptError, match=r"'\*\*' would build a number of about 95,424,251 digits"):
        render_template("{{ 9**(10**8) }}", {})


@pytest.mark.parametrize("source", ["{{ question.__class__ }}", "{{ cycler.__init__.__globals__ }}",
                                    "{{ ''['__class__'] }}", "{{ self._TemplateReference__context }}"])
def test_sandbox_refusals_are_forbidden_errors(source):
    with pytest.raises(PromptError) as err:
        render_template(source, {"question": "x"})
    assert err.value.kind == "forbidden" and "sandbox forbids" in str(err.value)


def test_ordinary_templates_still_render():
    src = ("{% for i in range(3) %}{{ loop.index }}{{ question }};{% endfor %}{{ 'ab' ~ question }} "
           "{{ '%s-%d'|format('a', 3) }} {{ '{} {}'.format(1, 2) }} {{ [1, 2]|join(',') }} {{ question * 3 }} "
           "{{ 2 ** 10 }} {{ question|center(7) }}|")
    assert render_template(src, {"question": "q"}) == "1q;2q;3q;abq a-3 1 2 1,2 qqq 1024    q   |"


def test_a_long_field_is_fine_and_the_output_cap_is_two_million_characters():
    from sailrl.runtime.prompts import MAX_RENDER_CHARS

    doc = "word " * 300_000  # 1.5 M characters of real data
    assert len(render_template("{{ doc }}", {"doc": doc})) == len(doc)
    with pytest.raises(PromptError, match="renders more than 2,000,000 characters"):
        render_template("{{ doc }}{{ doc }}", {"doc": doc})
    assert MAX_RENDER_CHARS == 2_000_000


def test_prompt_error_is_a_user_error_and_a_value_error():
    from sailrl.spec.errors import DataError, SailrlError

    assert issubclass(PromptError, DataError) and issubclass(PromptError, ValueError)
    assert issubclass(PromptError, SailrlError)
