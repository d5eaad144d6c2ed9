"""How close the pre-run estimate (``sailrl.runtime.planning.cost.estimate_run``) comes to what a run then logs.

Run:  python benchmarks/bench_cost_estimate.py [--steps 20] [--sample 8] [--arms quickstart,no-warmup,max32]

For each arm, the committed quickstart spec (spec/examples/quickstart.yaml) with ``--set`` overrides:

1. measures every training row's prompt length and warm-up datum length (as the run renders them);
2. samples ``--sample`` groups of group_size completions from the base policy (fresh LoRA, as ``sailrl preflight
   --sample`` does) for their lengths and degenerate fraction;
3. estimates the run twice: from the sampled completion lengths, and without them (1 token to max_tokens);
4. runs it (``sailrl run`` in this process, embedded backend) while counting tokens at the backend's boundary
   (every ``sample_async`` request's prompt and sampled tokens, every ``forward_backward_async`` datum), and
   reads ``tokens_cum/<kind>`` from the run's metrics.jsonl;
5. prints, per kind, the actual count, the estimated range and whether the actual lies inside, and the error of
   the expected value; the cost as if billed at Qwen/Qwen3-8B's listed Tinker prices (sampler tinker), since the
   embedded backend itself costs $0.

Arms: ``quickstart`` (the committed 150-step warm-up, then RL), ``no-warmup`` (RL from the random base),
``max32`` (quickstart with sampling.max_tokens=32).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPEC = Path(__file__).resolve().parents[1] / "spec" / "examples" / "quickstart.yaml"
ARMS = {
    "quickstart": [],
    "no-warmup": ["training.warmup.steps=0"],
    "max32": ["sampling.max_tokens=32"],
}
KINDS = ("prompt", "sampled", "trained", "warmup_trained")
PRICED_AS = "Qwen/Qwen3-8B"


def build(overrides: list[str]) -> Any:
    from sailrl.launch import build_spec
    from sailrl.spec.loader import load_spec

    loaded = load_spec(SPEC)
    return build_spec(loaded.spec.resolved(), overrides, SPEC.parent)


async def sample_base_policy(spec: Any, rows: list[dict], prompts: Any, renderer: Any, groups: int,
                             store: Path) -> tuple[list[int], tuple[int, int]]:
    """(completion lengths, (degenerate groups, groups)) of ``groups`` groups sampled from a fresh LoRA on the
    local backend."""
    from sailrl.runtime.backends.backend import open_backend
    from sailrl.runtime.rewards.rules import RewardFunction
    from sailrl.runtime.rollouts.rollout import RuleGroupBuilder, SamplingPolicy, rollout_groups

    m, s = spec.model, spec.sampling
    backend = open_backend(spec, sampler="local", checkpoint_dir=store)
    tc = await backend.service_client.create_lora_training_client_async(
        base_model=m.name, rank=m.lora_rank, seed=m.seed, train_mlp=m.train_mlp, train_attn=m.train_attn,
        train_unembed=m.train_unembed)
    path = (await (await tc.save_weights_for_sampler_async("bench-base")).result_async()).path
    client = await backend.service_client.create_sampling_client_async(model_path=path)
    policy = SamplingPolicy(client, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, seed=12345)
    reward_fn = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field)
    stop = s.stop or prompts.stop_sequences()
    builders = [RuleGroupBuilder(row=r, model_input=prompts.model_input(r), stop=stop, renderer=renderer,
                                 reward_fn=reward_fn, group_size=spec.training.group_size) for r in rows[:groups]]
    batch = await rollout_groups(policy, builders)
    lengths = [len(tr.ac.tokens) for g in batch.groups for traj in g.trajectories_G for tr in traj.transitions]
    degenerate = sum(1 for g in batch.groups if len({float(r) for r in g.get_total_rewards()}) == 1)
    return lengths, (degenerate, len(batch.groups))


class BoundaryCounter:
    """Counts tokens where the backend would bill them: sampling requests and forward_backward datums."""

    def __init__(self) -> None:
        self.prompt = self.sampled = self.trained = self.warmup_trained = 0

    @contextlib.contextmanager
    def patched(self):
        from sailrl.runtime.backends.local.sampling import LocalSamplingClient
        from sailrl.runtime.backends.local.training import LocalTrainingClient

        sample_async = LocalSamplingClient.sample_async
        forward_backward_async = LocalTrainingClient.forward_backward_async
        counter = self

        async def counted_sample(self, prompt, num_samples, sampling_params, *args, **kwargs):
            result = await sample_async(self, prompt, num_samples, sampling_params, *args, **kwargs)
            counter.prompt += prompt.length * num_samples
            counter.sampled += sum(len(seq.tokens) for seq in result.sequences)
            return result

        async def counted_fb(self, data, loss_fn, *args, **kwargs):
            n = sum(d.model_input.length for d in data)
            if loss_fn == "cross_entropy":
                counter.warmup_trained += n
            else:
                counter.trained += n
            return await forward_backward_async(self, data, loss_fn, *args, **kwargs)

        with mock.patch.object(LocalSamplingClient, "sample_async", counted_sample), \
                mock.patch.object(LocalTrainingClient, "forward_backward_async", counted_fb):
            yield self

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in KINDS}


def priced_copy(spec: Any) -> Any:
    """``spec`` sampled on Tinker with Qwen/Qwen3-8B's prices (the local backend itself is free)."""
    return spec.model_copy(update={
        "model": spec.model.model_copy(update={"name": PRICED_AS}),
        "sampling": spec.sampling.model_copy(update={"sampler": "tinker"}),
    })


def run_arm(name: str, overrides: list[str], sample_groups: int, workdir: Path) -> dict[str, Any]:
    from sailrl.cli import main
    from sailrl.runtime.backends.models import get_renderer, get_tokenizer
    from sailrl.runtime.data import load_rows
    from sailrl.runtime.planning.cost import CostModel, estimate_run, measure_token_lengths
    from sailrl.runtime.prompts import PromptBuilder
    from sailrl.spec.models import default_renderer

    run_dir = workdir / name
    overrides = [*overrides, f"output.run_dir={run_dir}"]
    spec = build(overrides)
    rows = load_rows(spec, SPEC.parent)
    renderer = get_renderer(spec.model.renderer or default_renderer(spec.model.name), get_tokenizer(spec.model.name))
    prompts = PromptBuilder(spec.prompt, renderer)
    t0 = time.perf_counter()
    lengths = measure_token_lengths(spec, rows.train, prompts)
    completions, degenerate = asyncio.run(
        sample_base_policy(spec, rows.train, prompts, renderer, sample_groups, workdir / f"{name}-store"))
    t_measure = time.perf_counter() - t0
    priced = priced_copy(spec)
    sampled_est = estimate_run(priced, lengths.prompt, completions, warmup_token_lengths=lengths.warmup,
                               degenerate_groups=degenerate)
    bound_est = estimate_run(priced, lengths.prompt, None, warmup_token_lengths=lengths.warmup)

    counter = BoundaryCounter()
    t0 = time.perf_counter()
    with counter.patched():
        args = ["run", str(SPEC), "--overwrite"] + sum((["--set", o] for o in overrides), [])
        rc = main(args)
    t_run = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"arm {name}: sailrl run exited {rc}")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    logged = {k: float(lines[-1].get(f"tokens_cum/{k}") or 0.0) for k in KINDS}
    boundary = counter.as_dict()
    actual_cost = CostModel.from_spec(priced).step_cost({f"tokens_cum/{k}": v for k, v in logged.items()})
    return {"arm": name, "overrides": overrides[:-1], "rc": rc, "seconds_run": round(t_run, 1),
            "seconds_measure_and_sample": round(t_measure, 1), "sampled_completions": len(completions),
            "base_degenerate_groups": list(degenerate), "logged": logged, "boundary": boundary,
            "actual_cost_usd": actual_cost["cost/total"],
            "estimate_sampled": sampled_est.as_dict(), "estimate_bound": bound_est.as_dict()}


def _err(expected: float | None, actual: float) -> str:
    if expected is None:
        return "   n/a"
    if actual == 0:
        return "   n/a" if expected else "  +0.0%"
    return f"{100 * (expected - actual) / actual:+6.1f}%"


def report(result: dict[str, Any]) -> list[str]:
    out = [f"== arm {result['arm']} ({' '.join(result['overrides']) or 'committed spec'}): run "
           f"{result['seconds_run']} s; {result['sampled_completions']} base-policy completions, degenerate groups "
           f"{result['base_degenerate_groups'][0]}/{result['base_degenerate_groups'][1]}"]
    same = result["logged"] == {k: float(v) for k, v in result["boundary"].items()}
    out.append(f"   metrics.jsonl tokens_cum == backend boundary counts: {same} "
               f"(logged {result['logged']}, boundary {result['boundary']})")
    for label in ("estimate_sampled", "estimate_bound"):
        est = result[label]
        out.append(f"   {label}: {est['completions']}")
        out.append(f"   {'kind':15s} {'actual':>10s} {'low':>12s} {'high':>12s} {'expected':>12s}  inside  error")
        for kind in KINDS:
            r = est["tokens"].get(kind)
            if r is None:
                continue
            actual = result["logged"][kind]
            inside = r["low"] - 1e-6 <= actual <= r["high"] + 1e-6
            exp = r["expected"]
            out.append(f"   {kind:15s} {actual:10,.0f} {r['low']:12,.0f} {r['high']:12,.0f} "
                       f"{'' if exp is None else f'{exp:,.0f}':>12s}  {str(inside):6s} {_err(exp, actual)}")
        c = est["total_usd"]
        actual = result["actual_cost_usd"]
        inside = c["low"] - 1e-12 <= actual <= c["high"] + 1e-12
        out.append(f"   {'cost (USD)':15s} {actual:10.5f} {c['low']:12.5f} {c['high']:12.5f} "
                   f"{'' if c['expected'] is None else format(c['expected'], '.5f'):>12s}  {str(inside):6s} "
                   f"{_err(c['expected'], actual)}   (priced as {PRICED_AS} on Tinker)")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="RL steps per arm (training.steps)")
    p.add_argument("--sample", type=int, default=8, help="base-policy groups sampled for completion lengths")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms: " + ", ".join(ARMS))
    p.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-cost-") as tmp:
        for arm in args.arms.split(","):
            overrides = [f"training.steps={args.steps}", *ARMS[arm]]
            results.append(run_arm(arm, overrides, args.sample, Path(tmp)))
    for r in results:
        print("\n".join(report(r)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
