"""Per-rollout wall time on Sail: AdaptiveSailCompleter vs the stock sail.SailTokenCompleter.

Both run against the loopback fake Sail server (tests/fakes/sail_server.py) with a fixed service time (seconds
from request to a completed response), N concurrent rollouts each, the two completers at the same time. The stock
completer polls every 20 s (sail.tinker._POLL_INTERVAL_SECONDS); ours polls after ~0.25 s with exponential
backoff to 4 s. No network, no keys.

    /tmp/venv/bin/python benchmarks/bench_sail_polling.py                 # 0.5 s, 3 s, 30 s; 8 rollouts each
    /tmp/venv/bin/python benchmarks/bench_sail_polling.py --service-times 0.5 3 --rollouts 16

The 30 s case takes about 40 s (the stock completer's third poll); the whole default run about 80 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sail
import tinker

from sailrl.runtime.sail_adapter import AdaptiveSailCompleter, PollPolicy, adapter_config_for
from tests.fakes.sail_server import FakeSailServer

ADAPTER = adapter_config_for("moonshotai/Kimi-K2.6", 32, train_attn=True, train_mlp=True, train_unembed=True)


def _kwargs(name: str) -> dict:
    return {
        "model": "moonshotai/Kimi-K2.6",
        "max_tokens": 16,
        "completion_window": "balanced",
        "tinker_lora_signed_url": "https://storage.example/archive.tar?sig=x",
        "adapter_config": ADAPTER,
        "tinker_lora_name": name,
    }


async def _timed(completer: object, tokens: list[int]) -> float:
    started = time.monotonic()
    await completer(tinker.ModelInput.from_ints(tokens), ["\n"])  # type: ignore[operator]
    return time.monotonic() - started


async def _one_service_time(server: FakeSailServer, rollouts: int, seed: int) -> dict[str, list[float]]:
    ours = AdaptiveSailCompleter(**_kwargs("bench-ours"), poll=PollPolicy(), rng=random.Random(seed))
    stock = sail.SailTokenCompleter(**_kwargs("bench-stock"))
    prompts = [[100 + i, 200 + i, 300 + i] for i in range(rollouts)]
    times = await asyncio.gather(*(_timed(ours, p) for p in prompts), *(_timed(stock, p) for p in prompts))
    return {"ours": list(times[:rollouts]), "stock": list(times[rollouts:]), "our_stats_polls": [ours.stats.polls]}


def _polls_by_completer(server: FakeSailServer) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {"bench-ours": [], "bench-stock": []}
    for response_id, record in server._responses.items():  # the fake's own bookkeeping
        out[record.payload["metadata"]["tinker_lora_name"]].append(server.polls[response_id])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--service-times", type=float, nargs="+", default=[0.5, 3.0, 30.0])
    parser.add_argument("--rollouts", type=int, default=8, help="concurrent rollouts per completer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rows = []
    for service in args.service_times:
        with FakeSailServer(service_time_s=service) as server:
            os.environ.update(SAIL_API_URL=server.url, SAIL_API_KEY="sk_bench_fake", NO_PROXY="127.0.0.1")
            sail.reset_transports()
            result = asyncio.run(_one_service_time(server, args.rollouts, args.seed))
            polls = _polls_by_completer(server)
        assert sum(polls["bench-ours"]) == result["our_stats_polls"][0]
        ours, stock = result["ours"], result["stock"]
        rows.append((service, ours, stock, polls["bench-ours"], polls["bench-stock"]))
        print(f"service {service:g} s done", file=sys.stderr)

    header = (f"{'service s':>9} | {'ours mean s':>11} {'ours max s':>10} | {'stock mean s':>12} {'stock max s':>11} | "
              f"{'stock/ours':>10} | {'polls/resp ours':>15} {'polls/resp stock':>16}")
    print(f"{args.rollouts} concurrent rollouts per completer, loopback fake Sail server, "
          f"PollPolicy() defaults (first poll 0.25 s, x2 backoff, cap 4 s, jitter 25%)")
    print(header)
    print("-" * len(header))
    for service, ours, stock, p_ours, p_stock in rows:
        ratio = statistics.mean(stock) / statistics.mean(ours)
        print(f"{service:>9g} | {statistics.mean(ours):>11.2f} {max(ours):>10.2f} | {statistics.mean(stock):>12.2f} "
              f"{max(stock):>11.2f} | {ratio:>9.1f}x | {statistics.mean(p_ours):>15.1f} "
              f"{statistics.mean(p_stock):>16.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
