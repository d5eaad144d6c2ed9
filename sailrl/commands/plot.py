"""``sailrl plot RUN_DIR [-o PNG]``: reward (total, per rule, eval) and the degenerate and truncated fractions per
step."""

from __future__ import annotations

import argparse
import sys

from sailrl.plot import plot_run
from sailrl.runtime.rundir.directory import METRICS_FILE, PLOT_FILE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding metrics.jsonl")
    p.add_argument("-o", "--output", metavar="PNG", help="output image (default: RUN_DIR/reward.png)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    run_dir = Path(args.run_dir)
    if not (run_dir / METRICS_FILE).exists():
        print(f"error: {run_dir / 'metrics.jsonl'} not found: is {run_dir} a sailrl run directory?", file=sys.stderr)
        return 1
    out = Path(args.output) if args.output else run_dir / PLOT_FILE
    try:
        plot_run(run_dir, out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
