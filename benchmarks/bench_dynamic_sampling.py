"""Dynamic sampling and the difficulty filter on the quickstart: steps and sampled tokens to reach `correct` 0.6.

Runs spec/examples/quickstart.yaml (embedded backend, sailrl/tiny-arith, same seed) three times, one after the
other: as it is, with ``training.dynamic_sampling: {max_extra_groups: EXTRA}``, and with that plus
``training.difficulty_filter: {degenerate_draws: 2, rest_steps: 10}``. For each it reads metrics.jsonl and prints
one table row: the first step whose rolling mean of `correct` over the last WINDOW steps (that step and the
WINDOW - 1 before it; `correct` is the share of the step's rollouts, every group it drew, that the rule passes) is
at least TARGET, the sampled tokens (``tokens_cum/sampled``) and rollouts up to that step, and for the whole run
the mean `correct` of the last WINDOW steps, sampled tokens, extra groups drawn, degenerate fraction and the
wall time of the run.

    python benchmarks/bench_dynamic_sampling.py [--steps 100] [--extra 16] [--window 5] [--target 0.6]

Results and the machine they were measured on: benchmarks/bench_dynamic_sampling.md.
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

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "spec/examples/quickstart.yaml"


def run(name: str, sets: list[str], steps: int, out: Path) -> tuple[list[dict], float]:
    """Train the quickstart with ``sets``; its metrics lines and wall seconds."""
    run_dir = out / name
    args = [sys.executable, "-m", "sailrl", "run", str(QUICKSTART), "--overwrite",
            *sum((["--set", s] for s in [f"training.steps={steps}", f"output.run_dir={run_dir}", *sets]), [])]
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()], seconds


def row(name: str, lines: list[dict], seconds: float, window: int, target: float) -> str:
    correct = [m["correct"] for m in lines]
    reached = next((i for i in range(window - 1, len(lines))
                    if sum(correct[i - window + 1:i + 1]) / window >= target), None)
    rollouts = [m.get("sampling/draws", 16.0) * 8 for m in lines]  # the quickstart: 16 groups x 8 rollouts
    if reached is None:
        at = "not reached | - | -"
    else:
        at = (f"{lines[reached]['step']} | {lines[reached]['tokens_cum/sampled']:,.0f} | "
              f"{sum(rollouts[:reached + 1]):,.0f}")
    last = sum(correct[-window:]) / window
    extra = sum(m.get("sampling/extra_groups", 0.0) for m in lines)
    degenerate = sum(m["degenerate_frac"] for m in lines) / len(lines)
    return (f"| {name} | {at} | {last:.3f} | {lines[-1]['tokens_cum/sampled']:,.0f} | {extra:,.0f} | "
            f"{degenerate:.3f} | {seconds:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--extra", type=int, default=16, help="max_extra_groups")
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.6)
    a = ap.parse_args()
    dynamic = f"training.dynamic_sampling={{max_extra_groups: {a.extra}}}"
    configs = [("plain", []), (f"dynamic_sampling (max_extra_groups {a.extra})", [dynamic]),
               ("dynamic_sampling + difficulty_filter (2 draws, 10 steps)",
                [dynamic, "training.difficulty_filter={degenerate_draws: 2, rest_steps: 10}"])]
    print(f"load average before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, sets) in enumerate(configs):
            lines, seconds = run(f"r{i}", sets, a.steps, Path(tmp))
            rows.append(row(name, lines, seconds, a.window, a.target))
            print(rows[-1], file=sys.stderr)
    print(f"load average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    print(f"| run | step where the {a.window}-step mean of `correct` reaches {a.target} | sampled tokens to then | "
          f"rollouts to then | `correct`, mean of the last {a.window} steps | sampled tokens, whole run | "
          "extra groups drawn | mean degenerate fraction | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
