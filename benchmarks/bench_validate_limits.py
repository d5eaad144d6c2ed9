"""Time and peak memory of the validation stage on hostile inputs, against a normal spec in the same run.

Each case is validated in-process (``sailrl.compiler.validate.problems``, what ``sailrl validate`` runs after
reading the file), interleaved over the repetitions so that all cases share warm-up and machine load. Printed per
case: min and median seconds, the ratio of the median to the normal spec's median, Python's peak allocation
(``tracemalloc``, one extra run) and the problem codes found.

    python benchmarks/bench_validate_limits.py [REPETITIONS]
"""

from __future__ import annotations

import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "spec" / "examples" / "quickstart.yaml"


def _bomb() -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def cases() -> dict[str, str]:
    base = QUICKSTART.read_text(encoding="utf-8")

    def template(t: str) -> str:
        return base.replace(base[base.index("  user:"):base.index("\n", base.index("  user:"))], f"  user: '{t}'")

    return {
        "quickstart (normal)": base,
        "alias bomb 2.6 KB": _bomb(),
        "flow nesting 5,000": base + "description: " + "[" * 5000 + "]" * 5000 + "\n",
        "form feed in a comment": base.replace("# ", "#\x0c ", 1),
        "model.name 300 bytes": base.replace("name: sailrl/tiny", "name: " + "a" * 300, 1),
        "integer 5,000 digits": base + "extra: " + "9" * 5000 + "\n",
        "unknown keys 8,000": base.replace("model:\n", "model:\n" + "".join(f"  k{i}: 1\n" for i in range(8000)), 1),
        "scalar 50 MB (text)": base + "description: '" + "x" * (50 * 1024 * 1024) + "'\n",
        "regex nesting 600": base.replace("  rules:\n", "  rules:\n    - name: deep\n      kind: match\n"
                                          "      pattern: '" + "(" * 600 + ")" * 600 + "'\n", 1),
        "template nested loops": template("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                                          "{% endfor %}"),
        "template 9**(n*10**8)": template("{{ 9**(question|length*10**8) }}"),
        "template center(10**8)": template("{{ question.center(100000000) }}"),
        "template 300 filters": template("{{ question" + "|upper" * 300 + " }}"),
    }


def main() -> None:
    from sailrl.compiler.validate import problems

    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    inputs = cases()
    times: dict[str, list[float]] = {k: [] for k in inputs}
    codes: dict[str, list[str]] = {}
    for _ in range(reps):
        for name, text in inputs.items():
            start = time.perf_counter()
            _, found = problems(text, "bench.yaml", path=QUICKSTART)
            times[name].append(time.perf_counter() - start)
            codes[name] = sorted({e.code for e in found})
    base = statistics.median(times["quickstart (normal)"])
    print(f"{'case':26s} {'min s':>7s} {'median s':>9s} {'x normal':>9s} {'peak MiB':>9s}  codes")
    for name, text in inputs.items():
        tracemalloc.start()
        problems(text, "bench.yaml", path=QUICKSTART)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        med = statistics.median(times[name])
        print(f"{name:26s} {min(times[name]):7.3f} {med:9.3f} {med / base:9.1f} {peak:9.1f}  {' '.join(codes[name])}")


if __name__ == "__main__":
    main()
