"""Pricing (spec/pricing.py), per-step cost and the budget's next-step estimate, the pre-run estimate (runtime/planning/cost.py)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from sailrl.runtime.data import rows_for_step
from sailrl.runtime.planning.cost import (
    CostModel,
    Range,
    billing,
    completion_range,
    drawn_length_sum,
    estimate_run,
    fmt_usd,
)
from sailrl.spec.errors import SpecErrors
from sailrl.spec.loader import load_spec_text
from sailrl.spec.pricing import TINKER_PRICES, PricingSpec, resolve_price
from sailrl.spec.schema import Spec, json_schema

BASE = {
    "name": "cost-test",
    "model": {"name": "Qwen/Qwen3-8B", "renderer": "qwen3"},
    "dataset": {"source": "rows.jsonl", "fields": ["question", "answer"]},
    "prompt": {"user": "{{ question }}"},
    "reward": {"rules": [{"name": "correct", "kind": "answer", "compare": "numeric"}]},
}


def make_spec(**sections) -> Spec:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return Spec.model_validate(data)


# ------------------------------------------------------------------------------------------------ pricing
def test_every_listed_price_has_a_source_a_date_and_is_called_an_estimate():
    assert set(TINKER_PRICES) == {"Qwen/Qwen3-8B", "moonshotai/Kimi-K2.6"}
    for model, p in TINKER_PRICES.items():
        assert p.source.startswith("https://")
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", p.read_on)
        assert "estimate" in p.describe(model)
    described = json_schema()["$defs"]["PricingSpec"]["properties"]["tinker"]["description"]
    assert "Qwen/Qwen3-8B: train $0.44, prefill $0.195, sample $0.6 per million tokens; estimate, source " \
           "https://tinker-docs.thinkingmachines.ai/tinker/models/models_and_pricing/, read 2026-12-01" in described
    assert "moonshotai/Kimi-K2.6: prefill $5.15, sample $12.81 per million tokens (train: not published there)" \
        in described


def test_a_price_in_the_spec_overrides_the_listed_estimate_for_the_run_model():
    empty = PricingSpec()
    listed = resolve_price(empty, "Qwen/Qwen3-8B", ("tinker", "train"))
    assert (listed.usd_per_mtok, listed.origin) == (0.44, "estimate")
    assert "read 2026-12-01" in listed.source
    written = resolve_price(PricingSpec.model_validate({"tinker": {"train": 0.5}}), "Qwen/Qwen3-8B",
                            ("tinker", "train"))
    assert (written.usd_per_mtok, written.origin) == (0.5, "spec")
    assert resolve_price(empty, "moonshotai/Kimi-K2.6", ("tinker", "train")).origin == "unknown"
    assert resolve_price(empty, "meta-llama/Llama-3.1-8B", ("tinker", "sample")).usd_per_mtok is None
    sail = PricingSpec.model_validate({"sail": {"flex": {"input": 0.3, "output": 1.2}}})
    assert resolve_price(sail, "any", ("sail", "flex", "output")).usd_per_mtok == 1.2
    assert resolve_price(sail, "any", ("sail", "balanced", "output")).origin == "unknown"
    assert resolve_price(sail, "any", ("local",)).usd_per_mtok == 0.0
    with pytest.raises(KeyError):
        resolve_price(sail, "any", ("sail", "priority", "input"))


BAD_PRICES = """\
name: t
model: {name: Qwen/Qwen3-8B, renderer: qwen3}
dataset: {source: rows.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}'}
reward:
  rules:
    - {name: correct, kind: answer, compare: numeric}
pricing:
  tinker: {train: -1, prefill: cheap, sample: .inf}
  sail:
    priority: {input: 1}
"""


def test_bad_prices_are_located_plain_errors():
    with pytest.raises(SpecErrors) as info:
        load_spec_text(BAD_PRICES, "bad.yaml")
    got = {(e.line, e.column, e.key_path): e for e in info.value.errors}
    assert got[(9, 19, "pricing.tinker.train")].message == (
        "a price cannot be negative (USD per million tokens), got -1: write 0 or more")
    assert got[(9, 32, "pricing.tinker.prefill")].message == "expected a number, got 'cheap'"
    assert got[(9, 47, "pricing.tinker.sample")].message == (
        "a price must be a finite number of USD per million tokens, got inf")
    window = got[(11, 5, "pricing.sail.priority")]
    assert window.message == "unknown key 'priority' in pricing.sail"
    assert window.hint == "Keys allowed here: balanced, flex."
    assert len(info.value.errors) == 4


# ------------------------------------------------------------------------------------------------ billing
def test_who_bills_which_kind():
    assert billing("tinker", "flex") == {
        "trained": ("tinker", "train"), "warmup_trained": ("tinker", "train"), "reference": ("tinker", "prefill"),
        "prompt": ("tinker", "prefill"), "eval_prompt": ("tinker", "prefill"),
        "sampled": ("tinker", "sample"), "eval_sampled": ("tinker", "sample"),
        "judge_prompt": ("judge", "input"), "judge_output": ("judge", "output"),  # judges: at pricing.judge
        "teacher": ("tinker", "prefill")}  # method distill: at the teacher model's prefill price
    sail = billing("sail", "flex")
    assert sail["prompt"] == sail["eval_prompt"] == ("sail", "flex", "input")
    assert sail["sampled"] == sail["eval_sampled"] == ("sail", "flex", "output")
    assert sail["trained"] == ("tinker", "train") and sail["reference"] == ("tinker", "prefill")
    assert set(billing("local", "balanced").values()) == {("local",), ("judge", "input"), ("judge", "output")}
    with pytest.raises(ValueError, match="unknown sampler 'modal'"):
        billing("modal", "flex")


# ------------------------------------------------------------------------------------------------ step cost
def test_step_cost_is_tokens_times_price():
    cm = CostModel.from_spec(make_spec(sampling={"sampler": "tinker"}))
    out = cm.step_cost({"tokens/prompt": 1000, "tokens/sampled": 2000, "tokens/trained": 2900,
                        "tokens_cum/prompt": 3000, "tokens_cum/sampled": 6000, "tokens_cum/trained": 8700,
                        "reward/total": 0.5})
    assert out["cost/prompt"] == pytest.approx(1000 * 0.195 / 1e6)
    assert out["cost/sampled"] == pytest.approx(2000 * 0.60 / 1e6)
    assert out["cost/trained"] == pytest.approx(2900 * 0.44 / 1e6)
    assert out["cost/step"] == pytest.approx(0.000195 + 0.0012 + 0.001276)
    assert out["cost/total"] == pytest.approx(3 * (0.000195 + 0.0012 + 0.001276))
    assert set(out) == {"cost/prompt", "cost/sampled", "cost/trained", "cost/step", "cost/total"}


def test_an_unknown_price_gives_none_never_zero():
    cm = CostModel.from_spec(make_spec(sampling={"sampler": "sail", "completion_window": "balanced"}))
    out = cm.step_cost({"tokens/prompt": 1000, "tokens/sampled": 0, "tokens/trained": 2900,
                        "tokens_cum/prompt": 1000, "tokens_cum/trained": 2900})
    assert out["cost/prompt"] is None  # Sail's balanced input price is not known
    assert out["cost/sampled"] == 0.0  # nothing sampled costs nothing
    assert out["cost/trained"] == pytest.approx(2900 * 0.44 / 1e6)  # Tinker trains a Sail run
    assert out["cost/step"] is None and out["cost/total"] is None
    assert [p.spec_key for p in cm.missing_prices()] == ["pricing.sail.balanced.input", "pricing.sail.balanced.output"]
    priced = CostModel.from_spec(make_spec(sampling={"sampler": "sail", "completion_window": "balanced"},
                                           pricing={"sail": {"balanced": {"input": 1.0, "output": 4.0}}}))
    assert priced.step_cost({"tokens/prompt": 1000, "tokens/sampled": 500})["cost/step"] == pytest.approx(0.003)
    assert "cost/total" not in priced.step_cost({"tokens/prompt": 1000})


def test_the_local_backend_costs_zero():
    spec = make_spec(model={"name": "sailrl/tiny", "renderer": "role_colon"}, sampling={"sampler": "local"})
    out = CostModel.from_spec(spec).step_cost({"tokens/prompt": 10**6, "tokens/sampled": 10**6,
                                               "tokens_cum/sampled": 10**7})
    assert out == {"cost/prompt": 0.0, "cost/sampled": 0.0, "cost/step": 0.0, "cost/total": 0.0}


# ------------------------------------------------------------------------------------------------ budget
def tinker_spec(**training) -> Spec:
    return make_spec(sampling={"sampler": "tinker", "max_tokens": 100},
                     training={"groups_per_step": 2, "group_size": 4, **training})


def test_before_any_step_the_estimate_is_the_step_upper_bound():
    cm = CostModel.from_spec(tinker_spec(), prompt_token_lengths=[50, 10, 30])
    # 2 longest prompts (50 + 30) x 4 rollouts; 8 rollouts x 100 sampled; datums prompt + 99.
    assert cm.step_token_bound(1) == {"prompt": 320.0, "sampled": 800.0, "trained": 320.0 + 8 * 99}
    expected = (320 * 0.195 + 800 * 0.60 + (320 + 792) * 0.44) / 1e6
    assert cm.step_upper_bound(1) == pytest.approx(expected)
    assert cm.next_step_estimate([]) == pytest.approx(expected)
    no_prompts = CostModel.from_spec(tinker_spec())
    assert no_prompts.step_token_bound(1) == {"prompt": 0.0, "sampled": 800.0, "trained": 792.0}


def test_next_step_estimate_is_the_largest_of_the_last_five_steps():
    cm = CostModel.from_spec(tinker_spec())
    history = [{"step": 0, "tokens/prompt": 900, "tokens/sampled": 900, "tokens/trained": 900}]  # outside the window
    history += [{"step": i, "tokens/prompt": 100 + i, "tokens/sampled": 200 - i, "tokens/trained": 300}
                for i in range(1, 6)]
    expected = (105 * 0.195 + 199 * 0.60 + 300 * 0.44) / 1e6
    assert cm.next_step_estimate(history) == pytest.approx(expected)
    # a skipped (all-degenerate) step trains nothing; the estimate still covers a step that trains
    history.append({"step": 6, "tokens/prompt": 100, "tokens/sampled": 100, "tokens/trained": 0})
    assert cm.next_step_estimate(history) == pytest.approx((105 * 0.195 + 198 * 0.60 + 300 * 0.44) / 1e6)


def test_next_step_estimate_is_capped_by_the_bound_and_adds_eval_on_eval_steps():
    spec = make_spec(sampling={"sampler": "tinker", "max_tokens": 100},
                     dataset={"eval": {"count": 2}},
                     training={"groups_per_step": 2, "group_size": 4, "eval_every": 3})
    cm = CostModel.from_spec(spec, prompt_token_lengths=[50, 10, 30], eval_prompt_token_lengths=[7, 9])
    history = [{"step": 0, "tokens/prompt": 100, "tokens/sampled": 5000, "tokens/trained": 200},
               {"step": 1, "tokens/prompt": 100, "tokens/sampled": 10, "tokens/trained": 200}]
    # step 2 is an eval step ((2 + 1) % 3 == 0) with no eval logged yet: the eval bound (16 prompt + 2 x 100).
    assert cm.next_step_estimate(history) == pytest.approx(
        (100 * 0.195 + 800 * 0.60 + 200 * 0.44 + 16 * 0.195 + 200 * 0.60) / 1e6)
    history += [{"step": 2, "tokens/prompt": 100, "tokens/sampled": 10, "tokens/trained": 200,
                 "tokens/eval_prompt": 16, "tokens/eval_sampled": 30}]
    assert cm.next_step_estimate(history) == pytest.approx((100 * 0.195 + 800 * 0.60 + 200 * 0.44) / 1e6)
    assert cm.next_step_estimate(history, step=6) == pytest.approx(
        (100 * 0.195 + 800 * 0.60 + 200 * 0.44 + 16 * 0.195 + 30 * 0.60) / 1e6)


def test_next_step_estimate_is_none_without_prices():
    cm = CostModel.from_spec(make_spec(model={"name": "moonshotai/Kimi-K2.6", "renderer": "kimi_k26"},
                                       sampling={"sampler": "tinker"}))
    assert cm.next_step_estimate([]) is None
    assert cm.next_step_estimate([{"step": 0, "tokens/prompt": 1, "tokens/sampled": 1, "tokens/trained": 1}]) is None


# ------------------------------------------------------------------------------------------------ estimate
def test_prompt_tokens_follow_the_data_order_exactly():
    lengths = [5, 7, 11, 13, 17]
    drawn = sum(sum(rows_for_step(lengths, step, 3, 3)) for step in range(4))  # what the loop draws
    assert drawn_length_sum(lengths, 12, 3) == Range(drawn, drawn, drawn)
    assert drawn_length_sum(lengths, 10, 3).low == 2 * sum(lengths)
    sample = drawn_length_sum([10, 20, 30], 100, 0, total_rows=1000)  # lengths of 3 rows out of 1000
    se = statistics.stdev([10, 20, 30]) / 3 ** 0.5 * (997 / 999) ** 0.5
    assert (sample.low, sample.expected, sample.high) == pytest.approx((100 * (20 - 2 * se), 2000, 100 * (20 + 2 * se)))


def test_completion_range_from_samples_or_max_tokens():
    r, how = completion_range(list(range(1, 11)), 64)
    assert (r.low, r.high, r.expected) == pytest.approx((1.9, 9.1, 5.5))  # the 10th / 90th percentiles
    assert how == "10 sampled completions: 10th-90th percentile 1.9-9.1 tokens, mean 5.5"
    # Mostly cut at max_tokens: both percentiles are 12, below them the mean 11.5; the range widens to
    # mean - 2 standard errors, and stays at most max_tokens.
    capped = [12] * 30 + [2, 6]
    se = statistics.stdev(capped) / len(capped) ** 0.5
    r, _ = completion_range(capped, 12)
    assert (r.low, r.high, r.expected) == pytest.approx((11.5 - 2 * se, 12.0, 11.5))
    clipped, _ = completion_range([100, 100], 64)
    assert clipped == Range(64.0, 64.0, 64.0)
    assert completion_range(None, 64) == (Range(1.0, 64.0, None), "not sampled: 1 to max_tokens (64) tokens each")


def test_estimate_of_a_whole_run():
    spec = make_spec(sampling={"sampler": "tinker", "max_tokens": 10},
                     dataset={"eval": {"count": 1}},
                     training={"steps": 4, "groups_per_step": 3, "group_size": 2, "eval_every": 2,
                               "kl_penalty_coef": 0.01, "warmup": {"steps": 2, "batch_size": 4}})
    prompts = [5, 7, 11, 13, 17]
    e = estimate_run(spec, prompts, [2, 4, 6, 8], eval_prompt_token_lengths=[9, 3],
                     warmup_token_lengths=[8, 9, 10, 11, 12], degenerate_groups=(2, 6))
    comp = statistics.quantiles([2, 4, 6, 8], n=10, method="inclusive")  # 2.6 ... 7.4
    se = statistics.stdev([2, 4, 6, 8]) / 2  # the mean 5 -/+ 2 SE is wider: 2.42 .. 7.58
    lo, hi, mean = min(comp[0], 5 - 2 * se), max(comp[-1], 5 + 2 * se), 5.0
    assert (lo, hi) == pytest.approx((5 - 2 * se, 5 + 2 * se))
    seed = 0
    prompt = 2 * sum(sum(rows_for_step(prompts, s, 3, seed)) for s in range(4))
    rollouts = 4 * 3 * 2
    assert e.rollouts == 24 and e.eval_steps == 2 and e.eval_rows == 2 and e.warmup_steps == 2
    assert e.tokens["prompt"] == Range(prompt, prompt, prompt)
    assert (e.tokens["sampled"].low, e.tokens["sampled"].high, e.tokens["sampled"].expected) == pytest.approx(
        (rollouts * lo, rollouts * hi, rollouts * mean))
    # trained: 0 if every group is degenerate; at most every rollout trained at the high length; expected
    # 1 - (2 + 1) / (6 + 2) = 62.5% of the rollouts (2 of 6 sampled groups were degenerate) at the mean length.
    assert e.tokens["trained"].low == 0
    assert e.tokens["trained"].high == pytest.approx(prompt + rollouts * (hi - 1))
    assert e.tokens["trained"].expected == pytest.approx(0.625 * (prompt + rollouts * (mean - 1)))
    assert e.tokens["reference"].high == pytest.approx(prompt + rollouts * hi)
    assert e.tokens["reference"].expected == pytest.approx(0.625 * (prompt + rollouts * mean))
    every_group_degenerate = estimate_run(spec, prompts, [2, 4, 6, 8], degenerate_groups=(6, 6))
    assert every_group_degenerate.tokens["trained"].expected == pytest.approx(
        0.125 * (prompt + rollouts * (mean - 1)))  # Laplace: 1 - 7/8, not 0
    assert e.tokens["eval_prompt"] == Range(24.0, 24.0, 24.0)  # 2 eval steps x (9 + 3)
    assert e.tokens["eval_sampled"].high == pytest.approx(4 * hi)
    warm = sum(sum(rows_for_step([8, 9, 10, 11, 12], i, 4, seed + 7919)) for i in range(2))
    assert e.tokens["warmup_trained"] == Range(warm, warm, warm)
    price = {"prompt": 0.195, "sampled": 0.60, "trained": 0.44, "reference": 0.195, "eval_prompt": 0.195,
             "eval_sampled": 0.60, "warmup_trained": 0.44}
    high = sum(e.tokens[k].high * price[k] / 1e6 for k in price)
    assert e.total_usd is not None and e.total_usd.high == pytest.approx(high)
    assert e.total_usd.low <= e.total_usd.expected <= e.total_usd.high
    assert e.missing_prices == [] and e.unmeasured == []
    assert e.step_upper_usd == pytest.approx(CostModel.from_spec(spec, prompt_token_lengths=prompts).step_upper_bound(1))


def test_estimate_without_measurements_says_what_it_leaves_out():
    spec = make_spec(model={"name": "moonshotai/Kimi-K2.6", "renderer": "kimi_k26"},
                     sampling={"sampler": "sail", "max_tokens": 100},
                     training={"steps": 3, "groups_per_step": 2, "group_size": 4, "max_cost_usd": 1.0})
    e = estimate_run(spec, None)
    assert "prompt" not in e.tokens and e.unmeasured == ["prompt"]
    assert e.tokens["sampled"] == Range(24.0, 2400.0, None)
    assert e.cost["sampled"] is None and e.total_usd is None
    assert [p.spec_key for p in e.missing_prices] == [
        "pricing.sail.balanced.input", "pricing.sail.balanced.output", "pricing.tinker.train"]
    text = "\n".join(e.render())
    assert "3 RL steps x 2 groups x 4 rollouts = 24 rollouts" in text
    assert "prompt   not measured" in text
    assert "total (without prompt): 24 - 4,776 tokens, cost unknown (prices missing)" in text
    assert ("Unknown prices (add them under pricing:, in USD per million tokens, to see the cost): "
            "pricing.sail.balanced.input, pricing.sail.balanced.output, pricing.tinker.train.") in text
    assert "Budget (training.max_cost_usd): $1.00." in text
    d = e.as_dict()
    assert d["tokens"]["sampled"] == {"low": 24.0, "high": 2400.0, "expected": None}
    assert d["missing_prices"][2] == "pricing.tinker.train"


def test_local_estimate_is_free():
    spec = make_spec(model={"name": "sailrl/tiny", "renderer": "role_colon"},
                     sampling={"sampler": "local", "max_tokens": 12}, training={"steps": 2})
    e = estimate_run(spec, [10, 12])
    assert e.total_usd == Range(0.0, 0.0, None)
    assert "local backend: free" in "\n".join(e.render())


def test_usd_formatting():
    assert [fmt_usd(x) for x in (0, 1234.567, 0.068128, 0.0000123)] == ["$0", "$1,234.57", "$0.06813", "$1.2e-05"]


def test_explain_shows_the_estimate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from sailrl.cli import main

    (tmp_path / "rows.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    spec = tmp_path / "spec.yaml"
    spec.write_text("""\
name: explain-cost
model: {name: Qwen/Qwen3-8B, renderer: qwen3}
dataset: {source: rows.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}'}
reward:
  rules:
    - {name: correct, kind: answer, compare: numeric}
training: {steps: 2, groups_per_step: 2, group_size: 2}
sampling: {sampler: tinker, max_tokens: 5}
""")
    assert main(["explain", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "Estimated cost of 'explain-cost' (tinker sampler, Qwen/Qwen3-8B): 2 RL steps x 2 groups x 2 rollouts" in out
    # 8 rollouts x 1..5 sampled at $0.60/M; trained 8 x 0..4 at $0.44/M
    assert "sampled  8 - 40" in out and "$4.8e-06 - $2.4e-05" in out
    assert "total (without prompt): 8 - 72 tokens, $4.8e-06 - $3.8e-05" in out
    assert "One RL step costs at most $1.9e-05" in out


def test_explain_of_a_distillation_says_distillation_step_and_of_sft_where_tokens_are_measured(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from sailrl.cli import main

    (tmp_path / "rows.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    common = """\
model: {name: sailrl/tiny-arith, renderer: role_colon}
dataset: {source: rows.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}='}
sampling: {sampler: local, max_tokens: 5}
"""
    (tmp_path / "d.yaml").write_text("name: d\nmethod: distill\ndistill: {teacher: {name: sailrl/tiny-arith}}\n"
                                     "training: {steps: 2, groups_per_step: 2, group_size: 2}\n" + common)
    assert main(["explain", str(tmp_path / "d.yaml")]) == 0
    out = capsys.readouterr().out
    assert "One distillation step costs at most $0 (every completion at max_tokens, every group trained)." in out
    assert "One RL step" not in out
    (tmp_path / "s.yaml").write_text("name: s\nmethod: sft\ntraining: {steps: 2}\n" + common)
    assert main(["explain", str(tmp_path / "s.yaml")]) == 0
    assert ("Note: the conversations' tokens are not counted (the data was not measured: `sailrl preflight SPEC` "
            "measures them); the run logs them per step (tokens/trained, cost/step).") in capsys.readouterr().out
