"""Sampling throughput of the embedded backend against ONE batched Hugging Face ``generate`` over the whole step.

Workload per shape ``G x S x T`` (groups x group_size x max_tokens), one RL step of rollouts on the same model
(``sailrl/tiny`` by default, a fresh LoRA, so the sampler's merged weights equal the base): G prompts rendered
by the ``role_colon`` renderer (``User: a+b=?\\n\\nAssistant:``, lengths differ so prompts are padded), S samples
each, temperature 1, top_p 1, at most T new tokens, stopping at the renderer's stop string or EOS.

Arms (each gets the same warm-up runs and the same timed repetitions; every repetition runs all arms, in a
rotating order):

- ``sailrl``: G*S concurrent ``sample_async(num_samples=1)`` calls on ``LocalSamplingClient``, each with its own
  seed (what the loop's ``SamplingPolicy`` sends), coalesced into one batched generation;
- ``hf-step`` (the headline baseline): ONE ``model.generate`` call over the whole step: the G prompts
  left-padded, ``num_return_sequences=S``, ``do_sample=True``, the same temperature and top_p, ``top_k=0``
  (off, as in sailrl), ``max_new_tokens=T``, ``stop_strings`` + ``tokenizer`` and the EOS id, KV cache on
  (``use_cache=True``, transformers' default ``DynamicCache``), on the same model object;
- ``hf-group``: one such call per group (``num_return_sequences=S``); ``hf-sample``: one call per sample
  (slow; ask for it with ``--arms``).

Both sides run with the same torch intra-op threads (``--threads``; the sampler's worker thread takes the
count the service sets). Reported per shape and arm: seconds per step (min and median over the repetitions),
generated tokens (a sequence counts up to its stop string / EOS / T), tokens/s at the min, and the ratio
``arm seconds / sailrl seconds`` (min and median). ``--baseline-rev REV`` adds the arm ``sailrl@REV``: the same
sampler serving its batches with ``runtime/backends/local/engine/generation.py`` as of git revision REV (a before/after
comparison in one run). ``--profile`` adds one run per shape and sailrl arm that splits ``generate()``'s time into
the model forward, tokenizer decodes (stop-string text checks), ``_sample`` (the current code) and the rest
(bookkeeping), by timing wrappers around each.

    .venv/bin/python benchmarks/bench_local_sampling.py                       # 16x8x12 16x8x64 32x8x128
    .venv/bin/python benchmarks/bench_local_sampling.py --profile --baseline-rev d420720
    .venv/bin/python benchmarks/bench_local_sampling.py --shapes 16x8x12 --repeats 9 --arms sailrl hf-step
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import types as types_mod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from tinker import types

import sailrl.runtime.backends.local.sampling as sampling_mod
from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.local.engine import decoder as decoder_mod
from sailrl.runtime.backends.local.engine import generation as gen_mod
from sailrl.runtime.backends.models import get_renderer

ROOT = Path(__file__).resolve().parents[1]

ARMS = ("sailrl", "hf-step", "hf-group", "hf-sample")
DEFAULT_ARMS = ("sailrl", "hf-step", "hf-group")


def parse_shape(text: str) -> tuple[int, int, int]:
    g, s, t = (int(x) for x in text.lower().split("x"))
    return g, s, t


class Workload:
    """One step of G x S rollouts of at most T tokens, and the ways to run it."""

    def __init__(self, sampler: Any, renderer: Any, groups: int, samples: int, tokens: int):
        self.sampler = sampler
        self.model = sampler._batcher.engine.model  # the merged weights the sampler decodes with
        self.tok = sampler.get_tokenizer()
        self.stop = list(renderer.get_stop_sequences())
        self.groups, self.samples, self.tokens = groups, samples, tokens
        questions = [f"{g % 10}+{(g * 7) % 10}=? (#{g})" for g in range(groups)]
        self.prompts = [renderer.build_generation_prompt([{"role": "user", "content": q}]).to_ints() for q in questions]
        self.calls = 0

    # -- sailrl ------------------------------------------------------------------------------------------------
    def sailrl(self) -> list[list[int]]:
        base = 1_000 * self.calls
        self.calls += 1

        async def step() -> list[Any]:
            calls = [
                self.sampler.sample_async(
                    types.ModelInput.from_ints(p),
                    1,
                    types.SamplingParams(max_tokens=self.tokens, temperature=1.0, top_p=1.0, stop=self.stop,
                                         seed=base + g * self.samples + s),
                )
                for g, p in enumerate(self.prompts)
                for s in range(self.samples)
            ]
            return await asyncio.gather(*calls)

        return [list(r.sequences[0].tokens) for r in asyncio.run(step())]

    # -- Hugging Face generate -----------------------------------------------------------------------------------
    def _generate(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        ids, mask = gen_mod.left_padded(prompts)
        width = ids.shape[1]
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                max_new_tokens=self.tokens, num_return_sequences=n, stop_strings=self.stop, tokenizer=self.tok,
                eos_token_id=self.tok.eos_token_id, pad_token_id=self.tok.pad_token_id, use_cache=True,
            )
        return [row[width:].tolist() for row in out]

    def hf_step(self) -> list[list[int]]:
        return self._generate(self.prompts, self.samples)

    def hf_group(self) -> list[list[int]]:
        return [seq for p in self.prompts for seq in self._generate([p], self.samples)]

    def hf_sample(self) -> list[list[int]]:
        return [seq for p in self.prompts for _ in range(self.samples) for seq in self._generate([p], 1)]

    def generated(self, seqs: list[list[int]]) -> tuple[int, int]:
        """(tokens up to each sequence's stop string / EOS / T, sequences that stopped before T)."""
        total = stopped = 0
        for seq in seqs:
            n = len(seq[: self.tokens])
            for i, t in enumerate(seq[: self.tokens]):
                tail = self.tok.decode(seq[max(0, i - 40): i + 1])
                if t == self.tok.eos_token_id or any(s in tail for s in self.stop):
                    n = i + 1
                    break
            total += n
            stopped += n < self.tokens
        return total, stopped


def load_generation_at(rev: str) -> Any:
    """``runtime/backends/local/engine/generation.py`` as of git revision ``rev``, imported as a module of its own."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:runtime/backends/local/engine/generation.py"],
                            capture_output=True, text=True, check=True).stdout
    name = f"generation_at_{rev.replace('-', '_').replace('~', '_').replace('^', '_')}"
    module = types_mod.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"{rev}:runtime/backends/local/engine/generation.py", "exec"), module.__dict__)  # noqa: S102
    return module


@contextmanager
def sampler_generate(generate_fn: Callable[..., Any]) -> Iterator[None]:
    """Within the block, the sampler's batches call ``generate_fn`` instead of the current ``generate``."""
    original = sampling_mod.generate
    sampling_mod.generate = generate_fn
    try:
        yield
    finally:
        sampling_mod.generate = original


def profile_split(work: Workload, module: Any) -> tuple[float, dict[str, float]]:
    """One sailrl step served by ``module.generate``: its seconds, and their split into the model forward,
    tokenizer decodes (the stop-string text checks), ``_sample`` (where the module has it) and the rest
    (bookkeeping: stop tables, finished rows, the KV cache, building the responses)."""
    spent = {"model forward": 0.0, "tokenizer decode": 0.0}
    undo: list[Callable[[], None]] = []

    def timed(owner: Any, name: str, bucket: str) -> None:
        fn = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[bucket] = spent.get(bucket, 0.0) + time.perf_counter() - t0

        setattr(owner, name, wrapper)
        undo.append(lambda: setattr(owner, name, fn))

    tok_cls = type(work.tok)
    timed(tok_cls, "decode", "tokenizer decode")
    if hasattr(module, "_sample"):
        spent["sampling (_sample)"] = 0.0
        timed(module, "_sample", "sampling (_sample)")
    starts: list[float] = []
    hooks = [
        work.model.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter())),
        work.model.register_forward_hook(lambda *_: spent.__setitem__(
            "model forward", spent["model forward"] + time.perf_counter() - starts.pop())),
    ]
    timed(decoder_mod.FusedDecoder, "__call__", "model forward")  # the hand-written forward, where it runs
    total = [0.0]

    def generate(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return module.generate(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - t0

    try:
        with sampler_generate(generate):
            work.sailrl()
    finally:
        for hook in hooks:
            hook.remove()
        for fn in reversed(undo):
            fn()
    spent["rest (bookkeeping)"] = total[0] - sum(spent.values())
    return total[0], spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["16x8x12", "16x8x64", "32x8x128"],
                        help="GROUPSxGROUP_SIZExMAX_TOKENS")
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads for every arm")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs per arm and shape")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per arm and shape")
    parser.add_argument("--model", default="sailrl/tiny")
    parser.add_argument("--profile", action="store_true", help="split sailrl's time (one extra run per shape)")
    parser.add_argument("--baseline-rev", metavar="REV",
                        help="add an arm 'sailrl@REV': the sampler with runtime/backends/local/engine/generation.py as of git REV")
    args = parser.parse_args()
    if "sailrl" not in args.arms:
        parser.error("--arms must include sailrl (the ratios are against it)")

    torch.set_num_threads(args.threads)
    svc = LocalServiceClient(args.model, base_dir=tempfile.mkdtemp(prefix="bench-local-"), seed=0,
                             num_threads=args.threads)
    tc = svc.create_lora_training_client(args.model, rank=16, seed=1)
    sampler = tc.save_weights_and_get_sampling_client()
    renderer = get_renderer("role_colon", sampler.get_tokenizer())
    baseline = load_generation_at(args.baseline_rev) if args.baseline_rev else None
    print(f"model {args.model}, torch threads {args.threads}, warm-up {args.warmup}, repetitions {args.repeats}, "
          f"arms interleaved in rotating order; torch {torch.__version__}")

    for shape in args.shapes:
        g, s, t = parse_shape(shape)
        work = Workload(sampler, renderer, g, s, t)
        runs = {arm: getattr(work, arm.replace("-", "_")) for arm in args.arms}
        if baseline is not None:
            def baseline_arm(work: Workload = work) -> list[list[int]]:
                with sampler_generate(baseline.generate):
                    return work.sailrl()

            runs[f"sailrl@{args.baseline_rev}"] = baseline_arm
        for _ in range(args.warmup):
            for fn in runs.values():
                fn()
        times: dict[str, list[float]] = {arm: [] for arm in runs}
        produced: dict[str, list[tuple[int, int]]] = {arm: [] for arm in runs}
        order = list(runs)
        for rep in range(args.repeats):
            for arm in order[rep % len(order):] + order[: rep % len(order)]:
                t0 = time.perf_counter()
                seqs = runs[arm]()
                times[arm].append(time.perf_counter() - t0)
                produced[arm].append(work.generated(seqs))
        print(f"\n== {g} groups x {s} samples x {t} max tokens ({g * s} rollouts)")
        print(f"{'arm':<16} {'min s':>8} {'median s':>9} {'tokens':>8} {'stopped':>8} {'tokens/s':>9} "
              f"{'x sailrl (min)':>15} {'x sailrl (median)':>18}")
        ours_min, ours_med = min(times["sailrl"]), statistics.median(times["sailrl"])
        for arm in runs:
            lo, med = min(times[arm]), statistics.median(times[arm])
            tokens = statistics.mean(p[0] for p in produced[arm])
            stopped = statistics.mean(p[1] for p in produced[arm])
            print(f"{arm:<16} {lo:8.3f} {med:9.3f} {tokens:8.0f} {stopped:8.1f} {tokens / lo:9.0f} "
                  f"{lo / ours_min:15.2f} {med / ours_med:18.2f}")
        if args.profile:
            modules = {"sailrl": gen_mod} | ({f"sailrl@{args.baseline_rev}": baseline} if baseline else {})
            for arm, module in modules.items():
                total, spent = profile_split(work, module)
                print(f"{arm} time split (one run, generate() {total * 1000:.1f} ms): "
                      + ", ".join(f"{k} {v / total:.0%}" for k, v in spent.items()))


if __name__ == "__main__":
    main()
