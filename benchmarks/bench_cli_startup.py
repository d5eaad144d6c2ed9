"""Wall time of ``sailrl --help``, ``sailrl validate QUICKSTART`` and ``sailrl studio --help``, per process start.

Usage: ``python benchmarks/bench_cli_startup.py [REPS] [OTHER_PKG_DIR]``

Each arm runs ``python -m sailrl ...`` in a fresh interpreter. With ``OTHER_PKG_DIR`` (a folder holding a
``sailrl`` package laid out as installed: ``sailrl/{spec,compiler,runtime}`` inside it, e.g. from ``git archive``
plus three symlinks) the same commands also run against that tree (``PYTHONPATH=OTHER_PKG_DIR``), arms interleaved
in rotating order, the same repetitions each; the median and the ratio ``this / other`` are printed. Also printed:
whether torch / transformers / datasets / tinker were imported (``python -X importtime``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = str(ROOT / "spec" / "examples" / "quickstart.yaml")
COMMANDS = {"--help": ["--help"], "validate": ["validate", QUICKSTART], "studio --help": ["studio", "--help"]}
WATCH = ("torch", "transformers", "datasets", "tinker", "tinker_cookbook", "rich", "starlette")


def _env(pkg: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pkg:
        env["PYTHONPATH"] = pkg
    return env


def once(args: list[str], pkg: str | None) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sailrl", *args], env=_env(pkg), cwd="/tmp", check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def heavy_imported(args: list[str], pkg: str | None) -> list[str]:
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "sailrl", *args], env=_env(pkg), cwd="/tmp",
                         capture_output=True, text=True, check=False).stderr
    top = {line.rsplit("|", 1)[-1].strip() for line in out.splitlines() if line.startswith("import time:")}
    return [w for w in WATCH if w in top]


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    other = sys.argv[2] if len(sys.argv) > 2 else None
    arms = [("this", None)] + ([("other", other)] if other else [])
    print(f"load {os.getloadavg()[0]:.2f}; {reps} reps per arm, arms interleaved in rotating order, 1 warm-up each")
    for name, args in COMMANDS.items():
        times: dict[str, list[float]] = {a: [] for a, _ in arms}
        for _, pkg in arms:
            once(args, pkg)  # warm-up: the file cache
        for i in range(reps):
            order = arms[i % len(arms):] + arms[:i % len(arms)]
            for arm, pkg in order:
                times[arm].append(once(args, pkg))
        med = {a: statistics.median(t) for a, t in times.items()}
        line = "  ".join(f"{a} {med[a] * 1000:.0f} ms (heavy: {','.join(heavy_imported(args, p)) or 'none'})"
                         for a, p in arms)
        ratio = f"  this/other {med['this'] / med['other']:.3f}" if other else ""
        print(f"sailrl {name:14s} {line}{ratio}")


if __name__ == "__main__":
    main()
