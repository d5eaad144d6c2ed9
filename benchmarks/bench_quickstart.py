"""The quickstart end to end (``sailrl run spec/examples/quickstart.yaml``): wall and CPU seconds per arm, interleaved.

Each repetition runs every arm once, in a rotating order, each in a fresh process and run directory. A process's
CPU time (user + sys, the parent's ``os.times()`` children totals) is about what a quiet machine's wall time would
be for this single-threaded run, so it carries over a busy machine better than the wall time. Also printed: the
run's ``correct`` figure.

Arms:
- ``shared``: the shipped learner and sampler (the hand-written forward of ``runtime.local.decoder``; each RL
  group's prompt runs once in a shared-prefix forward pass, the completions after it in passes of like lengths
  where that pays: ``trainer.length_batches``);
- ``one-length``: the same with every group's completions in one pass, padded to the longest
  (``runtime.local.trainer.PASS_COST`` made huge);
- ``one-pass``: the same with ``runtime.local.trainer.shared_prefixes`` turned off (every datum's full sequence in
  one right-padded pass, as before the shared-prefix pass);
- ``module-stack``: the shipped learner and sampler running the model's own transformers / peft forward instead of
  the hand-written one (``runtime.local.decoder``);
- ``start-up``: the same spec with ``training.steps=1`` (imports, loading, compiling, one step).

    .venv/bin/python benchmarks/bench_quickstart.py --reps 2
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec" / "examples" / "quickstart.yaml"
CODE = """
import sys
import sailrl.runtime.backends.local.engine.trainer as trainer
if sys.argv[1] == "one-pass":
    trainer.shared_prefixes = lambda tokens, *_: None
if sys.argv[1] == "one-length":
    trainer.PASS_COST = 10**18
if sys.argv[1] == "module-stack":
    import sailrl.runtime.backends.local.engine.decoder as decoder
    decoder.supports = lambda model: False
from sailrl.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run(arm: str, run_dir: Path) -> tuple[float, str]:
    """One run of ``arm`` in a fresh process: (wall seconds, the printed ``correct`` figure)."""
    args = ["run", str(SPEC), "--set", f"output.run_dir={run_dir}"]
    if arm == "start-up":
        args += ["--set", "training.steps=1"]
    t0 = time.perf_counter()
    variant = arm if arm in ("one-pass", "one-length", "module-stack") else "shared"
    proc = subprocess.run([sys.executable, "-c", CODE, variant, *args], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{arm} failed ({proc.returncode}):\n{out[-2000:]}")
    found = re.search(r"correct \(mean of first 5 steps -> last 5\): ([0-9.]+ -> [0-9.]+)", out)
    return wall, found.group(1) if found else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=["shared", "module-stack", "one-length", "one-pass", "start-up"],
                        choices=["shared", "module-stack", "one-length", "one-pass", "start-up"])
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-quickstart-"))
    print(f"load average {os.getloadavg()[0]:.2f}; arms {args.arms}, {args.reps} repetitions, rotating order")
    results: dict[str, list[tuple[float, float, str]]] = {arm: [] for arm in args.arms}
    for rep in range(args.reps):
        order = args.arms[rep % len(args.arms):] + args.arms[: rep % len(args.arms)]
        for arm in order:
            before = os.times()
            wall, figure = run(arm, base / f"{arm}-{rep}")
            after = os.times()
            cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
            results[arm].append((wall, cpu, figure))
            print(f"  rep {rep} {arm:<9} wall {wall:7.1f} s  cpu {cpu:6.1f} s  correct {figure}  "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    print(f"\n{'arm':<10} {'wall min':>9} {'wall med':>9} {'cpu min':>8} {'cpu med':>8}  correct")
    for arm, rows in results.items():
        walls, cpus = [r[0] for r in rows], [r[1] for r in rows]
        print(f"{arm:<10} {min(walls):9.1f} {statistics.median(walls):9.1f} {min(cpus):8.1f} "
              f"{statistics.median(cpus):8.1f}  {sorted({r[2] for r in rows})}")
    if "shared" in results and "one-pass" in results:
        cs = statistics.median(r[1] for r in results["shared"])
        co = statistics.median(r[1] for r in results["one-pass"])
        print(f"one-pass / shared CPU (median): {co / cs:.2f}x")
    if "shared" in results and "one-length" in results:
        cs = statistics.median(r[1] for r in results["shared"])
        cl = statistics.median(r[1] for r in results["one-length"])
        print(f"one-length / shared CPU (median): {cl / cs:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
