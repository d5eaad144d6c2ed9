"""Wall time of `sailrl validate` and `sailrl compile` (target < 1 s each), as a user runs them.

Each command runs as a fresh process (interpreter start and imports included), N times; the median and max are
printed, with the in-process time of load + check + render for comparison, and whether torch was imported.

    python benchmarks/bench_cli.py [N]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS = ["spec/examples/quickstart.yaml", "spec/examples/gsm8k.yaml", "spec/examples/sail_guide.yaml"]


def wall(cmd: list[str], n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    out = Path(tempfile.mkdtemp()) / "script.py"
    print(f"{'command':58s} {'median s':>9s} {'max s':>7s}")
    for spec in SPECS:
        for label, cmd in (
            ("validate", [sys.executable, "-m", "sailrl", "validate", spec]),
            ("compile", [sys.executable, "-m", "sailrl", "compile", spec, "-o", str(out)]),
        ):
            t = wall(cmd, n)
            print(f"sailrl {label:8s} {spec:43s} {statistics.median(t):9.3f} {max(t):7.3f}")
    t = wall([sys.executable, "-c", "pass"], n)
    print(f"{'python -c pass (interpreter start, for reference)':58s} {statistics.median(t):9.3f} {max(t):7.3f}")

    sys.path.insert(0, str(ROOT))
    from sailrl.commands.compile import compile_spec

    compile_spec(SPECS[1], str(out))  # warm imports
    t0 = time.perf_counter()
    for _ in range(20):
        compile_spec(SPECS[1], str(out))
    print(f"in-process load+check+render of gsm8k.yaml: {(time.perf_counter() - t0) / 20 * 1000:.1f} ms")
    print(f"torch imported by compile: {'torch' in sys.modules}")


if __name__ == "__main__":
    main()
