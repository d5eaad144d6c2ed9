"""Wall time of one step's judge calls: judged on the event loop beside the other rules (what StepScorer does)
vs judged inside the scoring threads (the obvious alternative: ``RewardFunction.score`` calls the judge itself,
blocking, in each of :data:`sailrl.runtime.rewards.scoring.SCORING_THREADS` worker threads).

Run:  python benchmarks/bench_judge.py [--rollouts 64] [--service-s 0.2] [--repeats 3]

A loopback Sail server (``tests.fakes.sail_server``, its own thread) answers ``POST /v1/chat/completions`` after
``--service-s`` seconds, through the real ``sail.inference`` SDK. Each arm scores ``--rollouts`` distinct
completions (no cache hits) with one judge rule and one match rule, on a fresh RewardFunction (so the run's cache
is empty), the same warm-up (one step each, not timed) and ``--repeats`` interleaved repetitions; it prints each
arm's median seconds per step and the ratio. The load average is printed with the results.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sailrl.runtime.rewards.judge import SailChatClient  # noqa: E402
from sailrl.runtime.rewards.rules import RewardFunction  # noqa: E402
from sailrl.runtime.rewards.scoring import StepScorer, _executor  # noqa: E402
from sailrl.spec.rewards import RewardSpec  # noqa: E402
from tests.fakes.sail_server import FakeSailServer  # noqa: E402

RULES = {"rules": [
    {"name": "polite", "kind": "judge", "rubric": "The reply answers {{ question }} politely.",
     "judge": {"model": "judge-m", "sampler": "sail", "timeout_s": 30, "retries": 0}},
    {"name": "x", "kind": "match", "pattern": "reply"},
], "step_budget_s": 600}


def fresh() -> RewardFunction:
    fn = RewardFunction.from_spec(RewardSpec.model_validate(RULES), "answer")
    fn.judges["polite"].connect(SailChatClient("judge-m"))
    return fn


async def on_the_loop(n: int, tag: str) -> float:
    fn, scorer = fresh(), None
    scorer = StepScorer(fn)
    t0 = time.perf_counter()
    await asyncio.gather(*(scorer.score(f"reply {tag} {i}", {"question": "q"}) for i in range(n)))
    return time.perf_counter() - t0


async def in_threads(n: int, tag: str) -> float:
    fn = fresh()
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    # judged=None: the judge rule calls its judge inside RewardFunction.score, in the scoring thread
    await asyncio.gather(*(loop.run_in_executor(_executor(), lambda i=i: fn.score(f"reply {tag} {i}",
                                                                                  {"question": "q"}))
                           for i in range(n)))
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--service-s", type=float, default=0.2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with FakeSailServer(chat_delay_s=args.service_s) as server:
        os.environ.update(SAIL_API_URL=server.url, SAIL_API_KEY="sk_bench", NO_PROXY="127.0.0.1")
        import sail

        sail.reset_transports()
        arms = {"loop (StepScorer)": on_the_loop, "threads (blocking in score)": in_threads}
        times: dict[str, list[float]] = {k: [] for k in arms}
        for name, arm in arms.items():  # warm-up, not timed
            asyncio.run(arm(args.rollouts, f"warm-{name}"))
        for r in range(args.repeats):  # interleaved
            for name, arm in arms.items():
                times[name].append(asyncio.run(arm(args.rollouts, f"{r}-{name}")))
        calls = len(server.chat_payloads)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.rollouts} rollouts, judge service {args.service_s:g} s, {args.repeats} repeats, "
          f"{calls} judge calls served; load average {os.getloadavg()[0]:.2f}")
    for k, v in times.items():
        print(f"  {k:28s} median {med[k]:.3f} s/step  (all: {', '.join(f'{x:.3f}' for x in v)})")
    a, b = med["loop (StepScorer)"], med["threads (blocking in score)"]
    print(f"  threads / loop = {b / a:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
