"""The Sail poll tail: one step of N concurrent rollouts per poller, against the loopback fake Sail server.

Arms (one step at a time, in a rotating order per repetition, the same warm-up and repetitions for each):

- ``stock``: ``sail.SailTokenCompleter`` (polls at once, then every 20 s: ``sail.tinker._POLL_INTERVAL_SECONDS``);
- ``fixed-1s``: ``AdaptiveSailCompleter(poll=PollPolicy.fixed(1.0))``, a plain poller every 1 s;
- ``adaptive``: ``AdaptiveSailCompleter()`` with the default ``PollPolicy`` (scouts, a service-time estimate
  shared by the step's rollouts, dense polls when the last rollouts are due).

One fake server (``tests/fakes/sail_server.py``) serves the whole run from its own process (``--in-process``: a
thread of this one), like a long-lived endpoint whose connections stay open across steps; every step runs on
one event loop, like the steps of a run, after ``--warmup`` untimed steps per arm at 0.5 s. Every response takes
exactly the service time S on the server (from its creation to its first poll that sees it completed), or with
``--spread F`` a time drawn uniformly from [S (1 - F), S].

Reported per service time and arm: the step's wall time (first create sent to last rollout returned; median and
max over repetitions, and the largest ratio to the step's slowest service time), per-rollout wall time (mean and
max over all rollouts), polls per response (mean and max), when the step's last response was created on the
server (max) and the tail, (step wall - that) / slowest service time: the part the poller controls. The goals
checked at the end: adaptive step wall <= 1.15x the slowest service time, and adaptive polls per response
<= 1.5x fixed-1s's at service times <= 30 s. No network, no keys.

    .venv/bin/python benchmarks/bench_sail_polling.py                        # 0.5 2 3 30 s, 64 rollouts, 3 reps
    .venv/bin/python benchmarks/bench_sail_polling.py --service-times 0.5 2 --reps 2 --arms fixed-1s adaptive
    .venv/bin/python benchmarks/bench_sail_polling.py --service-times 5 30 --spread 0.8 --arms fixed-1s adaptive

The stock arm takes about 20 s per step below 20 s of service and 40 s at 30 s; the default run ~9 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sail
import tinker

from sailrl.runtime.backends.sail import AdaptiveSailCompleter, PollPolicy, adapter_config_for
from tests.fakes.sail_server import FakeSailServer

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = adapter_config_for("moonshotai/Kimi-K2.6", 32, train_attn=True, train_mlp=True, train_unembed=True)
ARMS = ("stock", "fixed-1s", "adaptive")
KWARGS = {
    "model": "moonshotai/Kimi-K2.6",
    "max_tokens": 16,
    "completion_window": "balanced",
    "tinker_lora_signed_url": "https://storage.example/archive.tar?sig=x",
    "adapter_config": ADAPTER,
    "tinker_lora_name": "bench",
}


def make_completer(arm: str) -> object:
    if arm == "stock":
        return sail.SailTokenCompleter(**KWARGS)
    if arm == "fixed-1s":
        return AdaptiveSailCompleter(**KWARGS, poll=PollPolicy.fixed(1.0))
    if arm == "adaptive":
        return AdaptiveSailCompleter(**KWARGS)
    raise ValueError(arm)


@dataclass
class Step:
    wall_s: float
    rollout_s: list[float]
    polls: list[int]
    create_spread_s: float  # last response created on the server - step start
    slowest_s: float  # the longest service time among the step's responses


@dataclass
class Cell:
    steps: list[Step] = field(default_factory=list)


class _ServerProcess:
    """A `FakeSailServer` in its own process (``python -m tests.fakes.sail_server``), so its handlers do not share
    this interpreter's lock with the rollouts being measured; ``/_fake/stats`` and ``/_fake/config`` reach it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.sail_server"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise RuntimeError("the fake Sail server process did not start")

    def _call(self, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method="POST" if data else "GET",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def stats(self) -> dict:
        return self._call("/_fake/stats")

    def set_service_time(self, seconds: float | tuple[float, float]) -> None:
        self._call("/_fake/config", {"service_time_s": list(seconds) if isinstance(seconds, tuple) else seconds})

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class _ServerThread:
    """The same fake on a thread of this process (``--in-process``)."""

    def __init__(self) -> None:
        self.server = FakeSailServer().start()
        self.url = self.server.url

    def stats(self) -> dict:
        s = self.server
        return {"posts": s.count("POST"), "polls": dict(s.polls), "created_at": s.created_at(),
                "service_s": {rid: r.service_time_s for rid, r in s._responses.items()}}

    def set_service_time(self, seconds: float | tuple[float, float]) -> None:
        self.server.service_time_s = seconds

    def close(self) -> None:
        self.server.close()


async def _one_step(arm: str, rollouts: int) -> tuple[float, list[float], float]:
    completer = make_completer(arm)
    prompts = [[100 + i, 200 + i, 300 + i] for i in range(rollouts)]
    started = time.monotonic()

    async def one(tokens: list[int]) -> float:
        await completer(tinker.ModelInput.from_ints(tokens), ["\n"])  # type: ignore[operator]
        return time.monotonic() - started

    ends = await asyncio.gather(*(one(p) for p in prompts))
    return max(ends), list(ends), started


async def _steps(server: _ServerProcess | _ServerThread, plan: list[tuple[float, str]], rollouts: int,
                 spread: float) -> list[Step]:
    """Run ``plan`` ((service time, arm) per step) on one event loop, like the steps of one run."""
    out = []
    for service_s, arm in plan:
        server.set_service_time((service_s * (1 - spread), service_s) if spread else service_s)
        before = server.stats()
        wall, ends, started = await _one_step(arm, rollouts)
        after = server.stats()
        new = [rid for rid in after["polls"] if rid not in before["polls"]]
        assert after["posts"] - before["posts"] == rollouts, "a rollout was retried: not like for like"
        out.append(Step(wall_s=wall, rollout_s=ends, polls=[after["polls"][rid] for rid in new],
                        create_spread_s=max(after["created_at"][rid] for rid in new) - started,
                        slowest_s=max(after["service_s"][rid] for rid in new)))
        print(f"service {service_s:g} s, {arm}: step {wall:.3f} s", file=sys.stderr)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service-times", type=float, nargs="+", default=[0.5, 2.0, 3.0, 30.0])
    parser.add_argument("--rollouts", type=int, default=64, help="concurrent rollouts per step")
    parser.add_argument("--reps", type=int, default=3, help="timed steps per service time and arm")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per arm first (at 0.5 s service)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--spread", type=float, default=0.0,
                        help="draw each response's service time uniformly from [S * (1 - spread), S] (0: all S)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the fake server on a thread of this process instead of its own process")
    args = parser.parse_args()

    plan = [(0.5, arm) for _ in range(args.warmup) for arm in args.arms]
    for service in args.service_times:
        for rep in range(args.reps):
            shift = rep % len(args.arms)
            plan += [(service, arm) for arm in args.arms[shift:] + args.arms[:shift]]
    server = _ServerThread() if args.in_process else _ServerProcess()
    try:
        os.environ.update(SAIL_API_URL=server.url, SAIL_API_KEY="sk_bench_fake", NO_PROXY="127.0.0.1")
        sail.reset_transports()
        steps = asyncio.run(_steps(server, plan, args.rollouts, args.spread))
    finally:
        server.close()
    cells: dict[tuple[float, str], Cell] = {}
    for (service, arm), step in list(zip(plan, steps, strict=True))[args.warmup * len(args.arms):]:
        cells.setdefault((service, arm), Cell()).steps.append(step)

    where = "in this process" if args.in_process else "own process"
    spread = f", service times uniform in [S x {1 - args.spread:g}, S]" if args.spread else ""
    print(f"{args.rollouts} concurrent rollouts per step, loopback fake Sail server ({where}), {args.reps} "
          f"repetitions after {args.warmup} warm-up step(s) per arm{spread}")
    header = (f"{'service s':>9} {'arm':>9} | {'step med s':>10} {'step max s':>10} {'max/slowest':>11} | "
              f"{'rollout mean s':>14} {'rollout max s':>13} | {'polls/resp mean':>15} {'max':>5} | "
              f"{'last create s':>13} {'tail/slowest':>12}")
    print(header)
    print("-" * len(header))
    verdicts = []
    for service in args.service_times:
        for arm in args.arms:
            steps = cells[(service, arm)].steps
            walls = [s.wall_s for s in steps]
            rollout = [x for s in steps for x in s.rollout_s]
            polls = [p for s in steps for p in s.polls]
            print(f"{service:>9g} {arm:>9} | {statistics.median(walls):>10.3f} {max(walls):>10.3f} "
                  f"{max(s.wall_s / s.slowest_s for s in steps):>10.2f}x | "
                  f"{statistics.mean(rollout):>14.3f} {max(rollout):>13.3f} | "
                  f"{statistics.mean(polls):>15.2f} {max(polls):>5d} | "
                  f"{max(s.create_spread_s for s in steps):>13.3f} "
                  f"{max((s.wall_s - s.create_spread_s) / s.slowest_s for s in steps):>11.2f}x")
        if "adaptive" in args.arms:
            ours = cells[(service, "adaptive")].steps
            ratio = max(s.wall_s / s.slowest_s for s in ours)
            verdicts.append(f"service {service:g} s: adaptive step wall max {ratio:.3f}x the slowest service time "
                            f"({'ok' if ratio <= 1.15 else 'OVER'} 1.15x)")
            if "fixed-1s" in args.arms and service <= 30:
                mean_polls = statistics.mean(p for s in ours for p in s.polls)
                base = statistics.mean(p for s in cells[(service, "fixed-1s")].steps for p in s.polls)
                verdicts.append(f"service {service:g} s: adaptive polls/response {mean_polls:.2f} = "
                                f"{mean_polls / base:.2f}x fixed-1s's {base:.2f} "
                                f"({'ok' if mean_polls <= 1.5 * base else 'OVER'} 1.5x)")
    print()
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
