"""What a python-tool call costs in its sandbox (bubblewrap namespaces, the default) against the unisolated worker.

Run:  python benchmarks/bench_python_tool.py [--reps 60] [--warmup 5]

Each arm calls the built-in python tool as an episode does (``PythonTool.call`` / ``UnisolatedPythonTool.call``)
on the same snippets: a bare expression (``6 * 7``: the fixed cost of a call), and a small computation that
imports from the standard library and prints. The arms alternate call by call (interleaved), after the same
warm-up; the table gives each arm's median and min in milliseconds and the sandbox's added median per call.

What the unisolated worker does per call: fork a process from a warm worker (the interpreter already loaded),
run, report over a pipe. What the sandbox does per call: start ``bwrap`` (namespaces, mounts), start a fresh
``python3 -I -S``, run, exit. So the difference is mostly the interpreter's start; state the CPU and the load
with the figures (``benchmarks/bench_python_tool.md``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from sailrl.runtime.sandbox.bubblewrap import sandbox_problem
from sailrl.runtime.tools.python_tool import PythonTool, UnisolatedPythonTool

SNIPPETS = {
    "expression": "6 * 7",
    "stdlib": "import json, math, statistics\nxs = [math.sqrt(i) for i in range(1000)]\n"
              "print(json.dumps({'mean': round(statistics.mean(xs), 6)}))",
}


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor() or "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    return f"{name}, {os.cpu_count()} cores, AVX-512: {'avx512f' in info}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    problem = sandbox_problem()
    if problem:
        raise SystemExit(f"the sandbox is unavailable here: {problem}")
    arms = {"sandbox": PythonTool(timeout_s=5, memory_mb=512), "unisolated": UnisolatedPythonTool(timeout_s=5)}
    print(f"CPU: {_cpu()}; load before: {os.getloadavg()[0]:.2f}; euid {os.geteuid()}")
    for name, code in SNIPPETS.items():
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        for i in range(args.warmup + args.reps):
            for arm, tool in arms.items():
                t0 = time.perf_counter()
                out = tool.call({"code": code})
                dt = time.perf_counter() - t0
                assert out.error is None, (arm, out.content)
                if i >= args.warmup:
                    times[arm].append(dt * 1000)
        med = {arm: statistics.median(v) for arm, v in times.items()}
        print(f"{name:>10}: " + "  ".join(f"{arm} median {med[arm]:.1f} ms (min {min(times[arm]):.1f})"
                                           for arm in arms)
              + f"  -> the sandbox adds {med['sandbox'] - med['unisolated']:+.1f} ms a call "
                f"({med['sandbox'] / med['unisolated']:.2f}x)")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
