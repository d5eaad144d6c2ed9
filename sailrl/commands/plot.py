"""``sailrl plot RUN_DIR [-o PNG]``: reward (total, per rule, eval) and the degenerate and truncated fractions per
step.

``-o`` names a ``.png`` file (exit 2 otherwise: matplotlib would write another name, ``runs`` -> ``runs.png``). It
replaces only a PNG, an earlier plot: any other file there (data, a spec), a folder, a link or a pipe is refused
(exit 1), so the command deletes nothing it did not write and never blocks on a pipe.
"""

from __future__ import annotations

import argparse
import stat
import sys
from pathlib import Path

from sailrl.plot import plot_run
from sailrl.runtime.rundir.directory import METRICS_FILE, PLOT_FILE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding metrics.jsonl")
    p.add_argument("-o", "--output", metavar="PNG", help="output image (default: RUN_DIR/reward.png)")


#: The first bytes of every PNG file.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def output_problem(out: Path) -> str | None:
    """Why ``out`` may not be written (it exists and is not a regular PNG file), or None."""
    try:
        mode = out.lstat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{out} cannot be checked ({exc.strerror or exc})"
    if stat.S_ISLNK(mode):
        return f"{out} is a symbolic link: name the PNG file itself"
    if not stat.S_ISREG(mode):
        return f"{out} exists and is not a file: name a PNG file to write"
    try:
        with out.open("rb") as f:
            head = f.read(len(PNG_SIGNATURE))
    except OSError as exc:
        return f"{out} cannot be read ({exc.strerror or exc})"
    if head != PNG_SIGNATURE:
        return f"{out} exists and is not a PNG: sailrl plot replaces only an earlier plot; name another file"
    return None


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not (run_dir / METRICS_FILE).exists():
        print(f"error: {run_dir / 'metrics.jsonl'} not found: is {run_dir} a sailrl run directory?", file=sys.stderr)
        return 1
    out = Path(args.output) if args.output else run_dir / PLOT_FILE
    if out.suffix.lower() != ".png":
        print(f"sailrl plot: error: -o {args.output}: the plot is a PNG: name a file ending in .png", file=sys.stderr)
        return 2
    problem = output_problem(out)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    try:
        plot_run(run_dir, out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
