"""Worst-case scoring times for adversarial completions and references (issue 14.1 / 14.2).

Run:  python benchmarks/bench_rewards_adversarial.py [--baseline DIR] [--limit 30]

Each case scores one adversarial input (or one step of them) and reports the wall time, best of ``--repeats``
(1 for the step-sized cases). With ``--baseline DIR`` (a ``sailrl`` tree laid out as installed, e.g. the code
before these bounds) the single-input cases also run on that tree, one subprocess each, killed after
``--limit`` seconds. Cases:

* numeric: ``\\boxed{1e10000000}`` / ``\\boxed{1e100000000}`` as a completion (compare: numeric); the same text
  as a reference (``reference_problem``, what loading the data does)
* nested: ``\\text{`` x 10,000 around an answer, compare: normalized and numeric
* long: a 200,000-character completion (the cap) under boxed / last_number / after_marker / regex extractors
* math: answers math-verify finds slow, scored from a thread (the worker process, killed when it overruns)
* python: a python rule that never returns, and one that swallows the alarm (killed after the grace period)
* step: 128 completions x 3 regex rules that each run into their 0.1 s limit, through ``StepScorer`` with the
  default budget (60 s) and with ``step_budget_s: 5``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "--arm-path" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--arm-path") + 1])
else:
    sys.path.insert(0, str(ROOT))

from sailrl.runtime.rewards.rules import RewardFunction  # noqa: E402
from sailrl.spec.rewards import RewardSpec  # noqa: E402


def _fn(rules: list[dict], spec_dir: str | None = None, **kw: object) -> RewardFunction:
    spec = RewardSpec.model_validate({"rules": rules, **kw})
    return RewardFunction.from_spec(spec, "answer", spec_dir) if spec_dir else RewardFunction.from_spec(spec, "answer")


def answer(extract: dict, compare: str) -> dict:
    return {"name": "correct", "kind": "answer", "extract": extract, "compare": compare}


NESTED = "\\text{" * 10_000 + "7" + "}" * 10_000
LONG = ("Step: 12 + 30 = 42, so we add 1,000 more. Answer: " * 4000)[:199_980] + "\\boxed{42}"
SINGLE = {
    "numeric 1e10000000": ([answer({"from": "boxed"}, "numeric")], "\\boxed{1e10000000}", {"answer": "1"}),
    "numeric 1e100000000": ([answer({"from": "boxed"}, "numeric")], "\\boxed{1e100000000}", {"answer": "1"}),
    "reference 1e10000000": ([answer({"from": "boxed"}, "numeric")], None, {"answer": "1e10000000"}),
    "nested normalized": ([answer({"from": "boxed"}, "normalized")], "\\boxed{" + NESTED + "}", {"answer": "7"}),
    "nested numeric": ([answer({"from": "boxed"}, "numeric")], "\\boxed{" + NESTED + "}", {"answer": "7"}),
    "long boxed": ([answer({"from": "boxed"}, "numeric")], LONG, {"answer": "42"}),
    "long last_number": ([answer({"from": "last_number"}, "numeric")], LONG, {"answer": "42"}),
    "long after_marker": ([answer({"from": "after_marker", "marker": "Answer:"}, "normalized")], LONG,
                          {"answer": "x"}),
    "long regex": ([answer({"from": "regex", "pattern": r"Answer:\s*(.+?)\s*$", "flags": ["MULTILINE"]},
                           "normalized")], LONG, {"answer": "x"}),
    "long whole normalized": ([answer({"from": "whole"}, "normalized")], LONG, {"answer": "x"}),
}
MATH = ["\\boxed{(x+1)^{40}}", "\\boxed{2^{2^{2^{2^{2}}}}}", "\\boxed{\\sin(x)^{20}+\\cos(x)^{20}}",
        "\\boxed{" + "+".join(f"x^{{{k}}}" for k in range(120)) + "}"]


def run_single(name: str) -> float:
    rules, text, fields = SINGLE[name]
    fn = _fn(rules)
    t0 = time.perf_counter()
    if text is None:
        fn.reference_problem(fields)
    else:
        fn.score(text, fields)
    return time.perf_counter() - t0


def in_thread(fn: RewardFunction, text: str, fields: dict) -> tuple[float, object]:
    out: dict[str, object] = {}

    def work() -> None:
        t0 = time.perf_counter()
        out["score"] = fn.score(text, fields)
        out["s"] = time.perf_counter() - t0

    th = threading.Thread(target=work)
    th.start()
    th.join()
    return float(out["s"]), out["score"]  # type: ignore[arg-type]


def step(budget: float | None) -> tuple[float, int, int]:
    from sailrl.runtime.rewards.scoring import StepScorer

    rules = [{"name": f"evil{i}", "kind": "match", "pattern": "(a|aa)+$"} for i in range(3)]
    fn = _fn(rules, **({"step_budget_s": budget} if budget else {}))

    async def go() -> list:
        scorer = StepScorer(fn)
        return await asyncio.gather(*(scorer.score("a" * 30 + "b", {}) for _ in range(128)))

    t0 = time.perf_counter()
    scores = asyncio.run(go())
    return time.perf_counter() - t0, sum(s.timeouts for s in scores), sum(s.budget_exceeded for s in scores)


def baseline_single(baseline: str, name: str, limit: float) -> str:
    me = str(Path(__file__).resolve())
    try:
        out = subprocess.run([sys.executable, me, "--single", name, "--arm-path", baseline], capture_output=True,
                             text=True, timeout=limit, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return f"> {limit:g} s (killed)"
    if out.returncode != 0:
        return "error: " + (out.stderr.strip().splitlines() or ["?"])[-1][:60]
    return f"{json.loads(out.stdout)['seconds']:.3f} s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", metavar="DIR")
    ap.add_argument("--limit", type=float, default=30.0, help="seconds before a baseline case is killed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--single", help=argparse.SUPPRESS)
    ap.add_argument("--arm-path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.single:
        print(json.dumps({"seconds": run_single(args.single)}))
        return
    print(f"{'case':26s} {'current':>10s}" + (f"  {'baseline':>20s}" if args.baseline else ""))
    for name in SINGLE:
        best = min(run_single(name) for _ in range(args.repeats))
        line = f"{name:26s} {best:8.3f} s"
        if args.baseline:
            line += f"  {baseline_single(args.baseline, name, args.limit):>20s}"
        print(line, flush=True)
    fn = _fn([answer({"from": "boxed"}, "math")])
    in_thread(fn, "\\boxed{1}", {"answer": "1"})  # start the math worker
    for text in MATH:
        seconds, score = in_thread(fn, text, {"answer": "x^2+1"})
        print(f"{'math ' + text[7:27]:26s} {seconds:8.3f} s  (thread -> worker; {score.reasons['correct'][:50]})")
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "evil.py").write_text(
            "import time\n\ndef forever(c, f):\n    while True:\n        pass\n\n"
            "def stubborn(c, f):\n    while True:\n        try:\n            time.sleep(10)\n"
            "        except BaseException:\n            pass\n", encoding="utf-8")
        for func in ("forever", "stubborn"):
            fn = _fn([{"name": func, "kind": "python", "function": f"evil:{func}", "timeout_s": 1.0}], folder)
            fn.score("warm", {})  # the first call also starts the worker
            worst = 0.0
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                s = fn.score("x", {})
                worst = max(worst, time.perf_counter() - t0)
            print(f"{'python ' + func:26s} {worst:8.3f} s  (worst of {args.repeats}, timeout_s 1; {s.reasons[func]})")
    for budget in (None, 5.0):
        seconds, timeouts, over = step(budget)
        label = f"step 128x3 budget {budget or 60:g} s"
        print(f"{label:26s} {seconds:8.3f} s  ({timeouts} regex timeouts, {over} rules past the budget)")


if __name__ == "__main__":
    main()
