"""The pre-run estimate against what a real run on the embedded backend logs (tokens_cum/<kind> in metrics.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

from sailrl.cli import main
from sailrl.runtime.planning.cost import CostModel, estimate_run, measure_token_lengths

SPEC = """\
name: cost-run
model: {name: sailrl/tiny, renderer: role_colon, lora_rank: 4}
dataset:
  source: rows.jsonl
  fields: [question, answer]
  eval: {count: 3}
prompt: {user: '{{ question }}='}
reward:
  rules:
    - {name: correct, kind: answer, extract: {from: last_number}, reference: {extract: {from: whole}}, compare: numeric}
training:
  steps: 3
  group_size: 4
  groups_per_step: 4
  eval_every: 2
  learning_rate: 1e-3
  warmup: {steps: 2, batch_size: 8, learning_rate: 1e-2}
sampling: {sampler: local, max_tokens: 6}
output: {run_dir: run}
"""


def test_a_local_run_lands_inside_the_estimate(tmp_path: Path) -> None:
    from sailrl.launch import build_spec
    from sailrl.runtime.backends.models import get_renderer, get_tokenizer
    from sailrl.runtime.data import load_rows
    from sailrl.runtime.prompts import PromptBuilder
    from sailrl.spec.loader import load_spec

    rows = [{"question": f"{a}+{b}", "answer": str(a + b)} for a in range(5) for b in range(3)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    run_dir = tmp_path / "run"
    spec = build_spec(load_spec(path).spec.resolved(), [f"output.run_dir={run_dir}"], tmp_path)
    data = load_rows(spec, tmp_path)
    prompts = PromptBuilder(spec.prompt, get_renderer("role_colon", get_tokenizer("sailrl/tiny")))
    train = measure_token_lengths(spec, data.train, prompts)
    evals = measure_token_lengths(spec, data.eval, prompts)
    est = estimate_run(spec, train.prompt, None, eval_prompt_token_lengths=evals.prompt,
                       warmup_token_lengths=train.warmup)
    assert (est.rollouts, est.eval_steps, est.eval_rows, est.warmup_steps) == (48, 1, 3, 2)

    assert main(["run", str(path), "--overwrite", "--set", f"output.run_dir={run_dir}"]) == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = lines[-1]
    actual = {k: float(last.get(f"tokens_cum/{k}") or 0.0) for k in est.tokens}
    # Prompts, eval prompts and warm-up examples follow the data order exactly.
    for kind in ("prompt", "eval_prompt", "warmup_trained"):
        assert actual[kind] == est.tokens[kind].low == est.tokens[kind].high, kind
    for kind, r in est.tokens.items():
        assert r.contains(actual[kind]), (kind, actual[kind], r)
    assert actual["sampled"] > 0 and actual["eval_sampled"] > 0
    # The logged costs are the cost model's arithmetic over the same counts (the local backend: 0).
    assert last["cost/total"] == CostModel.from_spec(spec).step_cost(last)["cost/total"] == 0.0
