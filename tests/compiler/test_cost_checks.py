"""Validate-time budget checks (compiler/cost_checks.py): missing prices and a budget below one step, located."""

from __future__ import annotations

import pytest

from sailrl.compiler.cost_checks import check_costs
from sailrl.spec.errors import SpecErrors
from sailrl.spec.loader import parse_spec_text


def validate_text(text: str, filename: str):
    """The whole validation stage (schema + semantic checks) on ``text``; raises SpecErrors."""
    try:
        from sailrl.compiler.validate import validate_text as stage
    except ImportError:  # the stage is compiler.checks.check_spec after the loader's schema pass
        from sailrl.compiler.checks import check_spec

        loaded, errors = parse_spec_text(text, filename)
        errors = errors + check_spec(loaded)
        if errors:
            raise SpecErrors(errors, text) from None
        return loaded
    return stage(text, filename=filename)

SPEC = """\
name: budget
model: {{name: {model}, renderer: {renderer}}}
dataset: {{source: rows.jsonl, fields: [question, answer]}}
prompt: {{user: '{{{{ question }}}}'}}
reward:
  rules:
    - {{name: correct, kind: answer, compare: numeric}}
training:
  groups_per_step: 16
  group_size: 4
  max_cost_usd: {budget}
sampling: {{sampler: {sampler}, max_tokens: 1024}}
{extra}"""


def load(budget: float, *, sampler: str = "tinker", model: str = "Qwen/Qwen3-8B", renderer: str = "qwen3",
         extra: str = ""):
    text = SPEC.format(budget=budget, sampler=sampler, model=model, renderer=renderer, extra=extra)
    return validate_text(text, "budget.yaml")


def errors(**kw) -> list:
    with pytest.raises(SpecErrors) as info:
        load(**kw)
    return info.value.errors


# One step: 64 rollouts x 1024 sampled at $0.60/M + 64 x 1023 trained at $0.44/M = $0.06812928.
ONE_STEP = (64 * 1024 * 0.60 + 64 * 1023 * 0.44) / 1e6


def test_a_budget_below_one_step_is_an_error_that_states_the_estimate():
    assert ONE_STEP == pytest.approx(0.06812928)
    [err] = errors(budget=0.05)
    assert (err.line, err.column, err.key_path, err.code) == (11, 17, "training.max_cost_usd", "S242")
    assert err.message == (
        "the budget $0.05 is below the estimated cost of one step, up to $0.06813 (16 groups x 4 rollouts, each "
        "sampling and training up to max_tokens=1024 tokens; prompt tokens not counted): the run would stop "
        "before its first step")
    assert err.hint.startswith("Raise training.max_cost_usd above $0.06813, or lower sampling.max_tokens")


def test_a_budget_above_one_step_validates():
    assert load(budget=0.07).spec.training.max_cost_usd == 0.07


def test_a_budget_needs_every_price_the_run_pays():
    [err] = errors(budget=5, sampler="sail")
    assert (err.key_path, err.line, err.code) == ("training.max_cost_usd", 11, "S241")
    assert err.message == (
        "a budget needs a price for everything the run pays for, and for model 'Qwen/Qwen3-8B' with the sail "
        "sampler these are unknown: pricing.sail.balanced.input (Sail's input (prompt) price for the balanced "
        "window); pricing.sail.balanced.output (Sail's output (sampled tokens) price for the balanced window)")
    assert "pricing:\n  sail:\n    balanced:\n      input: <USD per million tokens>\n" \
           "      output: <USD per million tokens>" in err.hint
    [kimi] = errors(budget=5, model="moonshotai/Kimi-K2.6", renderer="kimi_k26")
    assert "these are unknown: pricing.tinker.train (Tinker's training price)" in kimi.message


def test_prices_written_in_the_spec_satisfy_the_budget():
    extra = "pricing:\n  sail:\n    balanced: {input: 1.0, output: 4.0}\n"
    assert load(budget=1.0, sampler="sail", extra=extra).spec.pricing.sail.balanced.output == 4.0
    # 64 x 1024 x $4/M + 64 x 1023 x $0.44/M = $0.29095168
    [err] = errors(budget=0.2, sampler="sail", extra=extra)
    assert "the budget $0.2 is below the estimated cost of one step, up to $0.291 (" in err.message


def test_the_local_backend_needs_no_prices():
    assert load(budget=0.01, sampler="local", model="sailrl/tiny", renderer="role_colon").spec is not None


def test_budget_errors_come_with_the_other_errors_of_the_file():
    text = SPEC.format(budget=0.05, sampler="tinker", model="Qwen/Qwen3-8B", renderer="qwen3",
                       extra="output: {log_rollouts: -1}\n")
    with pytest.raises(SpecErrors) as info:
        validate_text(text, "budget.yaml")
    keys = sorted(e.key_path for e in info.value.errors)
    assert keys == ["output.log_rollouts", "training.max_cost_usd"]


def test_budget_checks_read_their_sections_when_the_whole_spec_is_rejected():
    text = SPEC.format(budget=0.05, sampler="tinker", model="Qwen/Qwen3-8B", renderer="qwen3",
                       extra="output: {log_rollouts: -1}\n")
    loaded, schema_errors = parse_spec_text(text, "budget.yaml")
    assert loaded.spec is None and [e.key_path for e in schema_errors] == ["output.log_rollouts"]
    [err] = check_costs(loaded)
    assert err.code == "S242" and "up to $0.06813" in err.message
    broken = SPEC.format(budget=0.05, sampler="tinker", model="Qwen/Qwen3-8B", renderer="qwen3",
                         extra="pricing: {tinker: {train: -1}}\n")
    loaded, _ = parse_spec_text(broken, "budget.yaml")
    assert check_costs(loaded) == []  # the schema reports the bad price; no budget verdict on top of it


def test_a_retired_window_gets_its_own_error_not_a_price_error():
    text = SPEC.format(budget=5, sampler="sail", model="Qwen/Qwen3-8B", renderer="qwen3", extra="").replace(
        "sampler: sail,", "sampler: sail, completion_window: priority,")
    loaded, _ = parse_spec_text(text, "budget.yaml")
    assert loaded.spec.sampling.completion_window == "priority"
    assert check_costs(loaded) == []
