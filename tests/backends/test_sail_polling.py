"""The poll schedule a step's rollouts share (PollPolicy + AdaptiveSailCompleter), against the loopback fake Sail.

Timing assertions keep wide margins (the build machines are shared); the exact schedule is asserted on
`PollPolicy`'s own functions.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
import tinker

from sailrl.runtime.backends.sail import AdaptiveSailCompleter, PollPolicy, adapter_config_for
from tests.fakes.sail_server import FakeSailServer

ADAPTER = adapter_config_for("moonshotai/Kimi-K2.6", 32, train_attn=True, train_mlp=True, train_unembed=True)
KWARGS: dict[str, Any] = {
    "model": "moonshotai/Kimi-K2.6", "max_tokens": 4, "completion_window": "balanced",
    "tinker_lora_signed_url": "https://storage.example/a.tar?sig=1", "adapter_config": ADAPTER,
    "tinker_lora_name": "run-1-step-0",
}


def completer(poll: PollPolicy) -> AdaptiveSailCompleter:
    return AdaptiveSailCompleter(**KWARGS, poll=poll, rng=random.Random(0))


async def step(policy: AdaptiveSailCompleter, n: int) -> tuple[float, list[float]]:
    """Run n concurrent rollouts; (step wall, each rollout's end) in seconds from the start."""
    started = time.monotonic()

    async def one(i: int) -> float:
        await policy(tinker.ModelInput.from_ints([i + 1, 2, 3]), ["\n"])
        return time.monotonic() - started

    ends = await asyncio.gather(*(one(i) for i in range(n)))
    return max(ends), list(ends)


# ------------------------------------------------------------------------------------------------------
# the schedule's functions
# ------------------------------------------------------------------------------------------------------


def test_default_schedule_values() -> None:
    p = PollPolicy()
    assert (p.adaptive, p.scouts, p.min_interval_s, p.dense_fraction, p.due_interval_s) == (True, 2, 0.025, 0.05,
                                                                                           1.0)
    assert (p.tail_fraction, p.tail_min, p.overdue_fraction) == (0.1, 2, 0.1)
    assert p.response_deadline_s == 1200.0 and p.max_polls is None and p.max_attempts == 3
    # scouts together, and rollouts in the step's tail: every 25 ms, then 5% of the elapsed time
    assert [p.dense_interval(e) for e in (0.0, 0.5, 2.0, 30.0)] == [0.025, 0.025, 0.1, 1.5]
    assert [p.due_interval(e, True, 0.9) for e in (0.5, 2.0, 30.0)] == [0.025, 0.1, 1.5]
    # past the estimate, outside the tail: 1 s (less up to 25% jitter), 5% of the elapsed time once that is longer
    assert [p.due_interval(e, False, 0.0) for e in (0.5, 2.0, 30.0, 100.0)] == [1.0, 1.0, 1.5, 5.0]
    assert p.due_interval(2.0, False, 0.5) == pytest.approx(1.0 * (1 - 0.25 * 0.5))
    # sparse: 2 s, then half the elapsed time, capped at 60 s, shortened by up to 25% jitter
    assert [p.sparse_interval(e, 0.0) for e in (0.0, 3.0, 10.0, 1000.0)] == [2.0, 2.0, 5.0, 60.0]
    assert p.sparse_interval(10.0, 0.5) == pytest.approx(5.0 * (1 - 0.25 * 0.5))
    assert [p.retry_delay(n, 0.0) for n in (1, 2, 3, 10)] == [1.0, 2.0, 4.0, 30.0]


def test_fixed_policy_is_a_plain_poller() -> None:
    p = PollPolicy.fixed(1.0)
    assert not p.adaptive
    assert [p.sparse_interval(e, u) for e, u in ((0, 0.9), (5, 0.1), (500, 0.5))] == [1.0, 1.0, 1.0]
    assert PollPolicy.fixed(0.5, max_attempts=1).max_attempts == 1


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"jitter": 1.0}, "jitter"),
        ({"min_interval_s": 0}, "min_interval_s must be a finite number > 0"),
        ({"response_deadline_s": float("inf")}, "response_deadline_s must be a finite number > 0"),
        ({"dense_fraction": -0.1}, "dense_fraction"),
        ({"scouts": -1}, "scouts"),
        ({"tail_min": -1}, "tail_min"),
        ({"tail_fraction": 1.5}, "tail_fraction"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_polls": 0}, "max_polls"),
        ({"retry_base_s": -1}, "retry delays"),
    ],
)
def test_out_of_range_values_are_refused(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PollPolicy(**bad)


# ------------------------------------------------------------------------------------------------------
# a step's rollouts share the schedule
# ------------------------------------------------------------------------------------------------------


def test_the_step_learns_the_service_time_from_its_first_final_response(fake_sail_server: FakeSailServer) -> None:
    """Non-scouts never poll on their own (first sparse poll after 60 s) yet finish right after the service time:
    the scouts' first final response wakes them, and they poll once, at their creation + the estimate."""
    fake_sail_server.service_time_s = 0.4
    policy = completer(PollPolicy(min_interval_s=0.02, dense_fraction=0.0, first_poll_s=60.0, max_interval_s=60.0))
    wall, ends = asyncio.run(step(policy, 12))
    assert wall < 0.4 + 0.3, ends
    assert min(ends) >= 0.4
    polls = sorted(fake_sail_server.polls.values())
    # 10 rollouts polled once or twice (the estimate, maybe one dense poll after a late creation) ...
    assert all(1 <= n <= 2 for n in polls[:10]), polls
    # ... the two scouts together about every 20 ms until 0.4 s: ~20 polls between them, not ~40
    assert 12 <= polls[10] + polls[11] <= 32, polls
    # measured from when the create answer arrived, so it can be a little under the 0.4 s the server counts
    assert policy.stats.service_estimate_s is not None and 0.35 <= policy.stats.service_estimate_s < 0.6
    assert policy.stats.completed == 12 and policy.stats.polls == sum(polls)


def test_a_rollout_created_after_the_estimate_polls_at_it(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.service_time_s = 0.3
    policy = completer(PollPolicy(min_interval_s=0.02, first_poll_s=60.0, max_interval_s=60.0))
    asyncio.run(step(policy, 2))
    estimate = policy.stats.service_estimate_s
    assert estimate is not None and 0.25 <= estimate < 0.5
    polls_before = fake_sail_server.total_polls
    wall, _ = asyncio.run(step(policy, 1))  # a later call (e.g. a retry): no scout slot, no sparse wait
    assert fake_sail_server.total_polls - polls_before <= 2
    assert 0.3 <= wall < estimate + 0.3


def test_a_rollout_slower_than_the_estimate_is_seen_within_dense_polls(fake_sail_server: FakeSailServer) -> None:
    """A rollout 0.3 s slower than the estimate, alone unfinished (the step's tail), polls every max(20 ms, 5% of its
    elapsed time): it is seen right after it finishes, not a sparse interval (60 s here) later."""
    policy = completer(PollPolicy(min_interval_s=0.02, first_poll_s=60.0, max_interval_s=60.0))

    async def two() -> list[float]:
        started = time.monotonic()

        async def one(i: int) -> float:
            await policy(tinker.ModelInput.from_ints([i + 1, 2]), ["\n"])
            return time.monotonic() - started

        first = asyncio.ensure_future(one(0))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(one(1))
        return [await first, await second]

    fake_sail_server.service_times = [0.2, 0.5]
    first_end, second_end = asyncio.run(two())
    assert 0.2 <= first_end < 0.45
    # created ~0.05 s in, done 0.5 s later, seen within a few dense polls
    assert 0.55 <= second_end < 0.55 + 0.45, second_end
    # a scout until the first finished (every ~40 ms, taking turns), then (alone: the step's tail) every 20-25 ms
    assert fake_sail_server.polls["resp_000002"] <= 40


def test_rollouts_that_just_miss_the_estimate_poll_again_densely(fake_sail_server: FakeSailServer) -> None:
    """The first response sets a ~0.30 s estimate; the other nine take 0.32 s, so their polls at the estimate miss
    while all nine are unfinished (not the step's tail). Being within 10% of the estimate past it, they poll again
    every dense interval and are seen at ~0.33 s, not a 0.75-1 s due interval later (>= 1.05 s)."""
    policy = completer(PollPolicy(min_interval_s=0.01, first_poll_s=60.0, max_interval_s=60.0))
    fake_sail_server.service_times = [0.3] + [0.32] * 9  # by creation order
    _, ends = asyncio.run(step(policy, 10))
    assert 0.25 <= policy.stats.service_estimate_s < 0.4  # client-side stamps: can be a little off 0.3
    assert all(0.30 <= e < 0.75 for e in ends[1:]), ends  # client-side stamps: a few ms off the service's 0.32 s
    late = [n for rid, n in fake_sail_server.polls.items() if rid != "resp_000001"]
    assert max(late) <= 40 and sorted(late)[len(late) // 2] <= 4, late  # a scout's share; the rest 1 + about 2


def test_a_fixed_poller_polls_every_interval(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.service_time_s = 0.5
    policy = completer(PollPolicy.fixed(0.2))
    wall, _ = asyncio.run(step(policy, 4))
    assert sorted(fake_sail_server.polls.values()) == [3, 3, 3, 3]  # at 0.2, 0.4 (in progress), 0.6 s
    assert 0.6 <= wall < 0.6 + 0.3


def test_the_deadline_bounds_the_dense_tail(fake_sail_server: FakeSailServer) -> None:
    """A response that never finishes, alone in the step's tail after the estimate: polled every 20 ms, then the
    deadline ends the attempt (no retry: max_attempts 1)."""
    fake_sail_server.service_time_s = 0.05
    policy = completer(PollPolicy(min_interval_s=0.02, dense_fraction=0.0, response_deadline_s=0.6, max_attempts=1))
    asyncio.run(step(policy, 1))
    fake_sail_server.service_time_s = float("inf")
    started = time.monotonic()
    with pytest.raises(Exception, match="timeout: response resp_000002 not finished after 0.6 s"):
        asyncio.run(step(policy, 1))
    assert 0.6 <= time.monotonic() - started < 0.6 + 0.5
    assert 10 <= fake_sail_server.polls["resp_000002"] <= 0.6 / 0.02 + 1


def test_outside_the_tail_rollouts_past_the_estimate_poll_about_once_a_second(fake_sail_server: FakeSailServer
                                                                              ) -> None:
    """One quick response sets a 0.1 s estimate; the ten slow ones (1.4 s) poll at the estimate, then every
    0.75-1 s (not 20 ms apart) while more than the tail's 2 are unfinished."""
    policy = completer(PollPolicy(min_interval_s=0.02, first_poll_s=60.0, max_interval_s=60.0))

    async def run() -> list[float]:
        started = time.monotonic()

        async def one(i: int) -> float:
            await policy(tinker.ModelInput.from_ints([i + 1, 2]), ["\n"])
            return time.monotonic() - started

        quick = asyncio.ensure_future(one(0))
        while not fake_sail_server.count("POST"):
            await asyncio.sleep(0.005)
        slow = [asyncio.ensure_future(one(i)) for i in range(1, 11)]
        return [await quick] + [await t for t in slow]

    fake_sail_server.service_times = [0.1] + [1.4] * 10  # by creation order
    ends = asyncio.run(run())
    assert ends[0] < 0.6 and all(1.4 <= e < 1.4 + 1.3 for e in ends[1:]), ends
    slow_polls = [n for rid, n in fake_sail_server.polls.items() if rid != "resp_000001"]
    # the scout's share (every ~40 ms until 0.1 s) + the estimate + about one per second: not 70 each
    assert max(slow_polls) <= 12 and sum(slow_polls) <= 10 * 4 + 8, slow_polls


def test_the_step_s_last_rollouts_are_polled_densely(fake_sail_server: FakeSailServer) -> None:
    """Nine rollouts finish at 0.3 s, one straggler at 1.0 s: alone unfinished, it is in the step's tail and
    polled every 5% of its elapsed time, so it is seen within ~0.05 s, not a second later."""
    policy = completer(PollPolicy(min_interval_s=0.02))

    async def run() -> list[float]:
        started = time.monotonic()

        async def one(i: int) -> float:
            await policy(tinker.ModelInput.from_ints([i + 1, 2]), ["\n"])
            return time.monotonic() - started

        quick = [asyncio.ensure_future(one(i)) for i in range(9)]
        while fake_sail_server.count("POST") < 9:
            await asyncio.sleep(0.005)
        straggler = asyncio.ensure_future(one(9))
        return [await t for t in quick] + [await straggler]

    fake_sail_server.service_times = [0.3] * 9 + [1.0]
    ends = asyncio.run(run())
    assert all(e < 0.3 + 0.3 for e in ends[:9]), ends
    assert 1.0 <= ends[9] < 1.1 + 0.25, ends
