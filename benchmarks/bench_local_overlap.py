"""Embedded backend: sampling a step's batch WHILE the previous step trains, against one after the other.

What the loop's bounded off-policy mode (``training.max_steps_off_policy: 1``) can gain on the local backend. At
the quickstart shape (``sailrl/tiny``, LoRA rank 16, 16 groups x 8 rollouts, at most 12 tokens, the
``role_colon`` stop string, temperature 1), each step does the same work in both modes:

- save the weights as a sampler checkpoint (``save_weights_for_sampler``) and open a sampler on it
  (``create_sampling_client(model_path=...)``);
- sample the batch: 128 concurrent ``sample_async(num_samples=1)`` calls, each seeded;
- train: one ``forward_backward`` (``importance_sampling`` on the 128 prompt+completion datums, advantages
  +-1) and one ``optim_step`` (Adam, lr 1e-3).

``sequential`` (K=0): save -> sample -> train, step after step. ``overlapped`` (K=1): step n trains on the batch
sampled from checkpoint n-1 while the batch of step n+1 is sampled from checkpoint n (the backend's sampling
worker runs while its training worker trains); its timing leaves out the first batch of a run, which nothing can
overlap (steady state). Every repetition runs both modes for ``--steps`` steps, in a rotating order, after the same
warm-up. Reported: seconds per step and steps per minute (min and median over the
repetitions), the ratio overlapped / sequential, and the sampling and training phase times of the sequential
mode (their sum over their max is the most overlap can give).

    .venv/bin/python benchmarks/bench_local_overlap.py                 # 4 repetitions x 6 steps per mode
    .venv/bin/python benchmarks/bench_local_overlap.py --threads 1 --repeats 6 --steps 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tinker import types

from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.models import get_renderer


class Step:
    """The per-step work of one mode, on one training client."""

    def __init__(self, svc: Any, tc: Any, groups: int, samples: int, tokens: int):
        self.svc, self.tc = svc, tc
        tok = tc.get_tokenizer()
        renderer = get_renderer("role_colon", tok)
        self.stop = list(renderer.get_stop_sequences())
        self.prompts = [renderer.build_generation_prompt([{"role": "user", "content": f"{g % 10}+{g // 10}="}])
                        for g in range(groups)]
        self.samples, self.tokens = samples, tokens
        self.saves = 0
        self.timings: dict[str, list[float]] = {"sample": [], "train": []}

    async def sampler(self) -> Any:
        self.saves += 1
        fut = await self.tc.save_weights_for_sampler_async(f"bench-{self.saves:05d}")
        path = (await fut.result_async()).path
        return await self.svc.create_sampling_client_async(model_path=path)

    async def sample(self, sampler: Any) -> list[tuple[list[int], Any]]:
        t0 = time.perf_counter()
        seed = 1000 * self.saves
        calls = [
            sampler.sample_async(p, 1, types.SamplingParams(max_tokens=self.tokens, temperature=1.0, stop=self.stop,
                                                            seed=seed + k))
            for k, p in enumerate(p for p in self.prompts for _ in range(self.samples))
        ]
        results = await asyncio.gather(*calls)
        self.timings["sample"].append(time.perf_counter() - t0)
        prompts = [p for p in self.prompts for _ in range(self.samples)]
        return [(p.to_ints(), r.sequences[0]) for p, r in zip(prompts, results, strict=True)]

    async def train(self, batch: list[tuple[list[int], Any]]) -> None:
        t0 = time.perf_counter()
        data = []
        for i, (prompt, seq) in enumerate(batch):
            tokens = prompt + list(seq.tokens)
            n_prompt, n = len(prompt), len(tokens) - 1
            logprobs = torch.zeros(n)
            logprobs[n_prompt - 1:] = torch.tensor(list(seq.logprobs))
            advantages = torch.zeros(n)
            advantages[n_prompt - 1:] = 1.0 if i % 2 else -1.0
            data.append(types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": types.TensorData.from_torch(torch.tensor(tokens[1:])),
                                "logprobs": types.TensorData.from_torch(logprobs),
                                "advantages": types.TensorData.from_torch(advantages)},
            ))
        fb = await self.tc.forward_backward_async(data, "importance_sampling")
        opt = await self.tc.optim_step_async(types.AdamParams(learning_rate=1e-3))
        await fb.result_async()
        await opt.result_async()
        self.timings["train"].append(time.perf_counter() - t0)

    async def sequential(self, steps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            await self.train(await self.sample(await self.sampler()))
        return time.perf_counter() - t0

    async def overlapped(self, steps: int) -> float:
        """Seconds of ``steps`` steady-state steps; the first batch (sampled before any step can overlap, once
        per run) is not timed."""
        sampler = await self.sampler()
        batch = await self.sample(sampler)
        sampler = await self.sampler()
        t0 = time.perf_counter()
        for _ in range(steps):
            batch, _ = await asyncio.gather(self.sample(sampler), self.train(batch))
            sampler = await self.sampler()
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--steps", type=int, default=6, help="steps per mode and repetition")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each mode")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads the workers share (default: the service's, 1 for sailrl/tiny)")
    args = parser.parse_args()

    svc = LocalServiceClient(base_dir=tempfile.mkdtemp(prefix="bench-overlap-"), seed=0, num_threads=args.threads)
    tc = svc.create_lora_training_client("sailrl/tiny", rank=16, seed=1)
    work = Step(svc, tc, args.groups, args.samples, args.tokens)
    modes = {"sequential": work.sequential, "overlapped": work.overlapped}
    for _ in range(args.warmup):
        for run in modes.values():
            asyncio.run(run(args.steps))
    per_step: dict[str, list[float]] = {m: [] for m in modes}
    work.timings = {"sample": [], "train": []}
    order = list(modes)
    for rep in range(args.repeats):
        for mode in order[rep % 2:] + order[: rep % 2]:
            before = {k: len(v) for k, v in work.timings.items()}
            per_step[mode].append(asyncio.run(modes[mode](args.steps)) / args.steps)
            if mode == "overlapped":  # keep the phase times of the sequential mode only
                for k in work.timings:
                    del work.timings[k][before[k]:]
    svc.close("success")

    print(f"{args.groups} groups x {args.samples} samples x {args.tokens} tokens, sailrl/tiny LoRA r16, "
          f"torch threads {svc._backend.threads.total} (half each while both workers run), "
          f"{args.repeats} repetitions x {args.steps} steps per mode, warm-up {args.warmup} run(s) per mode, "
          f"torch {torch.__version__}")
    print(f"{'mode':<11} {'s/step min':>10} {'s/step median':>14} {'steps/min (min)':>16} {'steps/min (median)':>19}")
    for mode, times in per_step.items():
        lo, med = min(times), statistics.median(times)
        print(f"{mode:<11} {lo:10.3f} {med:14.3f} {60 / lo:16.1f} {60 / med:19.1f}")
    ratio_min = min(per_step["sequential"]) / min(per_step["overlapped"])
    ratio_med = statistics.median(per_step["sequential"]) / statistics.median(per_step["overlapped"])
    print(f"overlapped / sequential steps per minute: {ratio_min:.2f}x (min), {ratio_med:.2f}x (median)")
    s_med, t_med = statistics.median(work.timings["sample"]), statistics.median(work.timings["train"])
    print(f"sequential phases (median): sample {s_med:.3f} s, train {t_med:.3f} s; "
          f"(sample + train) / max = {(s_med + t_med) / max(s_med, t_med):.2f}x is the most overlap can give")


if __name__ == "__main__":
    main()
