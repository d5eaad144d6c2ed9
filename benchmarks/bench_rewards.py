"""Rewards per second of RewardFunction.score on one core, for realistic GSM8K-like completions.

Run:  python benchmarks/bench_rewards.py [--n 10000] [--math-n 500]

Completions are a few hundred characters of worked arithmetic ending (mostly) in \\boxed{N}; references are
GSM8K-style ("... <<48/2=24>>24 ...\\n#### N"), 8 completions per reference as in a group. Rule sets:

* guide-numeric: the Sail guide's ``correct - 0.1 * (1 - format)`` with GSM8K references compared as numbers
* guide-normalized: the guide as written (reference: boxed or whole text, normalized compare)
* regex: a DOTALL <think>...</think> match rule plus a regex extractor ``Answer: (...)``, normalized
* math: the guide's rules with compare: math (math-verify; measured on --math-n completions)

Target (issue 3): >= 20,000 rewards/s for the regex and numeric rule sets.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sailrl.runtime.rewards import RewardFunction
from sailrl.spec.rewards import RewardSpec

FORMAT = {"name": "format", "kind": "all_of", "pass_score": 0.0, "fail_score": -0.1,
          "checks": [{"kind": "has_answer", "extract": {"from": "boxed"}}, {"kind": "termination"}]}


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


def bench(name: str, data: list[tuple[str, dict, bool]], repeats: int) -> tuple[float, float, float]:
    """(best rewards per CPU second, best per wall second, over ``repeats`` runs; mean reward).

    CPU time is the headline because other processes on a shared machine inflate wall time.
    """
    fn = RewardFunction.from_spec(RewardSpec.model_validate(rules(name)), "answer")
    for text, fields, truncated in data[:50]:  # warm lazy imports
        fn.score(text, fields, truncated=truncated)
    best = best_wall = 0.0
    total = 0.0
    for _ in range(repeats):
        fn = RewardFunction.from_spec(RewardSpec.model_validate(rules(name)), "answer")  # cold reference cache
        t0, w0 = time.process_time(), time.perf_counter()
        total = 0.0
        for text, fields, truncated in data:
            total += fn.score(text, fields, truncated=truncated).total
        dt, dw = time.process_time() - t0, time.perf_counter() - w0
        best, best_wall = max(best, len(data) / dt), max(best_wall, len(data) / dw)
    return best, best_wall, total / len(data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--math-n", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    data = make_data(args.n)
    mean_len = sum(len(t) for t, _, _ in data) / len(data)
    print(f"{len(data)} completions, mean {mean_len:.0f} chars, 8 per reference, one core, "
          f"best of {args.repeats} (rewards per CPU second)")
    for name in ("guide-numeric", "guide-normalized", "regex"):
        rate, wall, mean = bench(name, data, args.repeats)
        flag = "ok" if rate >= 20_000 else "BELOW TARGET 20,000/s"
        print(f"{name:17s} {rate:10,.0f} rewards/s CPU ({wall:,.0f}/s wall)  mean reward {mean:+.3f}  {flag}")
    rate, wall, mean = bench("math", data[: args.math_n], 1)
    print(f"{'math':17s} {rate:10,.0f} rewards/s CPU ({wall:,.0f}/s wall)  mean reward {mean:+.3f}  "
          f"on {args.math_n} completions")


if __name__ == "__main__":
    main()
