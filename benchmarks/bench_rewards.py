"""Rewards per second of RewardFunction.score, for realistic GSM8K-like completions.

Run:  python benchmarks/bench_rewards.py [--n 10000] [--math-n 500] [--repeats 3]
      python benchmarks/bench_rewards.py --baseline DIR [--rounds 5]

Completions are a few hundred characters of worked arithmetic ending (mostly) in \\boxed{N}; references are
GSM8K-style ("... <<48/2=24>>24 ...\\n#### N"), 8 completions per reference as in a group. Rule sets:

* guide-numeric: the Sail guide's ``correct - 0.1 * (1 - format)`` with GSM8K references compared as numbers
* guide-normalized: the guide as written (reference: boxed or whole text, normalized compare)
* regex: a DOTALL <think>...</think> match rule plus a regex extractor ``Answer: (...)``, normalized
* math: the guide's rules with compare: math (math-verify; measured on --math-n completions)

Each in-process arm is timed in the main thread (rewards per CPU second, best of ``--repeats``). The paths the
training loop takes are timed too, in wall time (they use other threads and processes):

* step-scorer: guide-numeric through ``StepScorer.score`` (asyncio + the scoring thread pool), all at once
* math-worker: the math rule set scored from a thread, i.e. through the math worker process
* python: a ``kind: python`` rule (a two-line function) through its worker processes

``--baseline DIR`` compares this tree with another one (DIR holds a ``sailrl`` package laid out as installed:
``DIR/sailrl/{runtime,spec,compiler}``): the in-process arms run in subprocesses, alternating baseline and
current for ``--rounds`` rounds with the same data and repetitions; it prints min and median of each and the
ratio current / baseline of the medians.

Target (issue 3): >= 20,000 rewards/s for the regex and numeric rule sets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "--arm-path" in sys.argv:  # a baseline tree goes first, before this repository
    sys.path.insert(0, sys.argv[sys.argv.index("--arm-path") + 1])
else:
    sys.path.insert(0, str(ROOT))

from sailrl.runtime.rewards.rules import RewardFunction  # noqa: E402
from sailrl.spec.rewards import RewardSpec  # noqa: E402

FORMAT = {"name": "format", "kind": "all_of", "pass_score": 0.0, "fail_score": -0.1,
          "checks": [{"kind": "has_answer", "extract": {"from": "boxed"}}, {"kind": "termination"}]}
IN_PROCESS = ("guide-numeric", "guide-normalized", "regex")


def rules(name: str) -> dict:
    if name == "guide-numeric":
        return {"rules": [{"name": "correct", "kind": "answer", "extract": {"from": "boxed"},
                           "reference": {"extract": {"from": "after_marker", "marker": "####"}},
                           "compare": "numeric"}, FORMAT]}
    if name == "guide-normalized":
        return {"rules": [{"name": "correct", "kind": "answer", "extract": {"from": "boxed"},
                           "reference": {"extract": {"from": "boxed", "fallback": "whole"}},
                           "compare": "normalized"}, FORMAT]}
    if name == "regex":
        return {"rules": [
            {"name": "correct", "kind": "answer", "extract": {"from": "regex", "pattern": r"Answer:\s*([^\n]+)"},
             "reference": {"extract": {"from": "after_marker", "marker": "####"}}, "compare": "normalized"},
            {"name": "think", "kind": "match", "pattern": r"^<think>.*?</think>", "flags": ["DOTALL"],
             "pass_score": 0.0, "fail_score": -0.1},
        ]}
    if name == "math":
        return {"rules": [{"name": "correct", "kind": "answer", "extract": {"from": "boxed"},
                           "reference": {"extract": {"from": "after_marker", "marker": "####"}},
                           "compare": "math"}, FORMAT]}
    if name == "python":
        return {"rules": [{"name": "style", "kind": "python", "function": "bench_rule:score"}]}
    raise ValueError(name)


def make_data(n: int, seed: int = 0) -> list[tuple[str, dict, bool]]:
    rng = random.Random(seed)
    names = ["Natalia", "Weng", "Betty", "Julie", "James", "Mark", "Albert", "Ken"]
    items = ["clips", "dollars", "pages", "letters", "flowers", "pizzas", "marbles", "apples"]
    out = []
    fields: dict = {}
    answer = 0
    for i in range(n):
        if i % 8 == 0:  # a new problem every group of 8 rollouts
            a, b = rng.randint(2, 999), rng.randint(2, 99)
            answer = a + a * b
            fields = {"answer": f"{names[i % 8]} sold {a}*{b} = <<{a}*{b}={a * b}>>{a * b} {items[i % 8]} in May.\n"
                                f"So {a}+{a * b} = <<{a}+{a * b}={answer}>>{answer} altogether.\n"
                                f"#### {answer:,}"}
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        steps = " ".join(
            f"Step {k}: {rng.choice(names)} has {rng.randint(1, 500)} {rng.choice(items)}, and "
            f"{a} x {b} = {a * b}, so we add {rng.randint(1, 99)} more." for k in range(rng.randint(3, 6))
        )
        roll = rng.random()
        guess = answer if roll < 0.5 else answer + rng.randint(1, 9)
        if roll < 0.85:
            text = f"<think>\nLet me work it out.\n{steps}\n</think>\n{steps[:80]}\nAnswer: {guess}\n" \
                   f"The final answer is \\boxed{{{guess:,}}}."
            truncated = False
        else:  # cut off at max_tokens, no box
            text = f"<think>\n{steps} and then {steps}"
            truncated = True
        out.append((text, fields, truncated))
    return out


def _fn(name: str, spec_dir: str | None = None) -> RewardFunction:
    spec = RewardSpec.model_validate(rules(name))
    return RewardFunction.from_spec(spec, "answer", spec_dir) if spec_dir else RewardFunction.from_spec(spec, "answer")


def bench(name: str, data: list[tuple[str, dict, bool]], repeats: int) -> tuple[float, float, float]:
    """(best rewards per CPU second, best per wall second, over ``repeats`` runs; mean reward).

    CPU time is the headline because other processes on a shared machine inflate wall time.
    """
    fn = _fn(name)
    for text, fields, truncated in data[:50]:  # warm lazy imports
        fn.score(text, fields, truncated=truncated)
    best = best_wall = 0.0
    total = 0.0
    for _ in range(repeats):
        fn = _fn(name)  # cold reference cache
        t0, w0 = time.process_time(), time.perf_counter()
        total = 0.0
        for text, fields, truncated in data:
            total += fn.score(text, fields, truncated=truncated).total
        dt, dw = time.process_time() - t0, time.perf_counter() - w0
        best, best_wall = max(best, len(data) / dt), max(best_wall, len(data) / dw)
    return best, best_wall, total / len(data)


def bench_step_scorer(data: list[tuple[str, dict, bool]]) -> tuple[float, float]:
    """(rewards per wall second, mean reward) of guide-numeric through StepScorer, every completion at once."""
    from sailrl.runtime.rewards.scoring import StepScorer

    fn = _fn("guide-numeric")

    async def run() -> list:
        scorer = StepScorer(fn, budget_s=3600)
        return await asyncio.gather(*(scorer.score(t, f, truncated=tr) for t, f, tr in data))

    asyncio.run(run())  # warm: threads started
    w0 = time.perf_counter()
    scores = asyncio.run(run())
    return len(data) / (time.perf_counter() - w0), sum(s.total for s in scores) / len(scores)


def bench_in_thread(name: str, data: list[tuple[str, dict, bool]], spec_dir: str | None = None
                    ) -> tuple[float, float]:
    """(rewards per wall second, mean reward) scoring from a non-main thread (worker processes for math/python)."""
    fn = _fn(name, spec_dir)
    out: dict[str, float] = {}

    def work() -> None:
        for text, fields, truncated in data[:20]:  # warm: start the worker process(es)
            fn.score(text, fields, truncated=truncated)
        w0 = time.perf_counter()
        total = sum(fn.score(t, f, truncated=tr).total for t, f, tr in data)
        out["rate"] = len(data) / (time.perf_counter() - w0)
        out["mean"] = total / len(data)

    th = threading.Thread(target=work)
    th.start()
    th.join()
    return out["rate"], out["mean"]


def compare(baseline: str, args: argparse.Namespace) -> None:
    """Interleave subprocess runs of the in-process arms: baseline tree vs this tree."""
    me = str(Path(__file__).resolve())
    common = ["--n", str(args.n), "--repeats", str(args.repeats), "--single"]
    runs: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for arm, extra in (("baseline", ["--arm-path", baseline]), ("current", [])):
            out = subprocess.run([sys.executable, me, *common, *extra], capture_output=True, text=True, check=True,
                                 cwd=tempfile.gettempdir())
            for name, rate in json.loads(out.stdout.strip().splitlines()[-1]).items():
                runs.setdefault((arm, name), []).append(rate)
    print(f"{args.rounds} alternating rounds, {args.n} completions, best of {args.repeats} per round "
          "(rewards per CPU second)")
    print(f"{'rule set':17s} {'baseline min':>13s} {'median':>9s} {'current min':>12s} {'median':>9s} {'ratio':>6s}")
    for name in IN_PROCESS:
        b, c = runs[("baseline", name)], runs[("current", name)]
        ratio = statistics.median(c) / statistics.median(b)
        print(f"{name:17s} {min(b):13,.0f} {statistics.median(b):9,.0f} {min(c):12,.0f} "
              f"{statistics.median(c):9,.0f} {ratio:6.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--math-n", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", metavar="DIR", help="compare with the sailrl tree in DIR (see the docstring)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--arm-path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline:
        compare(args.baseline, args)
        return
    data = make_data(args.n)
    if args.single:
        print(json.dumps({name: bench(name, data, args.repeats)[0] for name in IN_PROCESS}))
        return
    mean_len = sum(len(t) for t, _, _ in data) / len(data)
    print(f"{len(data)} completions, mean {mean_len:.0f} chars, 8 per reference, one core, "
          f"best of {args.repeats} (rewards per CPU second)")
    for name in IN_PROCESS:
        rate, wall, mean = bench(name, data, args.repeats)
        flag = "ok" if rate >= 20_000 else "BELOW TARGET 20,000/s"
        print(f"{name:17s} {rate:10,.0f} rewards/s CPU ({wall:,.0f}/s wall)  mean reward {mean:+.3f}  {flag}")
    rate, wall, mean = bench("math", data[: args.math_n], 1)
    print(f"{'math':17s} {rate:10,.0f} rewards/s CPU ({wall:,.0f}/s wall)  mean reward {mean:+.3f}  "
          f"on {args.math_n} completions")
    print("training-loop paths (wall time):")
    rate, mean = bench_step_scorer(data)
    print(f"{'step-scorer':17s} {rate:10,.0f} rewards/s wall  mean reward {mean:+.3f}  (guide-numeric, StepScorer)")
    rate, mean = bench_in_thread("math", data[: args.math_n])
    print(f"{'math-worker':17s} {rate:10,.0f} rewards/s wall  mean reward {mean:+.3f}  on {args.math_n} completions")
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "bench_rule.py").write_text(
            "def score(completion, fields):\n    return 1.0 if '\\\\boxed' in completion else -1.0\n", encoding="utf-8")
        n = min(args.n, 2000)
        rate, mean = bench_in_thread("python", data[:n], folder)
    print(f"{'python':17s} {rate:10,.0f} rewards/s wall  mean reward {mean:+.3f}  on {n} completions")


if __name__ == "__main__":
    main()
