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

from sailrl.runtime.sail import AdaptiveSailCompleter, PollPolicy, adapter_config_for
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
    assert (p.adaptive, p.scouts, p.min_interval_s, p.dense_fraction, p.due_max_interval_s) == (True, 2, 0.025,
                                                                                               0.05, 1.0)
    assert p.response_deadline_s == 1200.0 and p.max_polls is None and p.max_attempts == 3
    # scouts together: every 25 ms, then 5% of the elapsed time
    assert [p.dense_interval(e) for e in (0.0, 0.5, 2.0, 30.0)] == [0.025, 0.025, 0.1, 1.5]
    # past the estimate: 25 ms doubling to 1 s, and at most 5% of the elapsed time once that is longer
    assert [p.due_interval(2.0, n) for n in range(8)] == [0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert p.due_interval(100.0, 20) == 5.0
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
    assert policy.stats.service_estimate_s is not None and 0.4 <= policy.stats.service_estimate_s < 0.6
    assert policy.stats.completed == 12 and policy.stats.polls == sum(polls)


def test_a_rollout_created_after_the_estimate_polls_at_it(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.service_time_s = 0.3
    policy = completer(PollPolicy(min_interval_s=0.02, first_poll_s=60.0, max_interval_s=60.0))
    asyncio.run(step(policy, 2))
    estimate = policy.stats.service_estimate_s
    assert estimate is not None and 0.3 <= estimate < 0.5
    polls_before = fake_sail_server.total_polls
    wall, _ = asyncio.run(step(policy, 1))  # a later call (e.g. a retry): no scout slot, no sparse wait
    assert fake_sail_server.total_polls - polls_before <= 2
    assert 0.3 <= wall < estimate + 0.3


def test_a_rollout_slower_than_the_estimate_is_seen_within_dense_polls(fake_sail_server: FakeSailServer) -> None:
    """Rollouts past the estimate poll densely (20 ms doubling here): a rollout 0.3 s slower than the estimate is
    seen a few dense polls after it finishes, not a sparse interval (60 s here) later."""
    fake_sail_server.service_time_s = 0.2
    policy = completer(PollPolicy(min_interval_s=0.02, first_poll_s=60.0, max_interval_s=60.0))

    async def two() -> list[float]:
        started = time.monotonic()

        async def one(i: int) -> float:
            await policy(tinker.ModelInput.from_ints([i + 1, 2]), ["\n"])
            return time.monotonic() - started

        first = asyncio.ensure_future(one(0))
        await asyncio.sleep(0.05)  # the first response is created with 0.2 s of service ...
        fake_sail_server.service_time_s = 0.5  # ... the second with 0.5 s
        second = asyncio.ensure_future(one(1))
        return [await first, await second]

    first_end, second_end = asyncio.run(two())
    assert 0.2 <= first_end < 0.45
    # created ~0.05 s in, done 0.5 s later; by then the 20 ms doubling has reached 0.32 s at most
    assert 0.55 <= second_end < 0.55 + 0.45, second_end
    # a scout until the first finished (every ~40 ms, taking turns), then the estimate and the doubling: ~10 polls
    assert fake_sail_server.polls["resp_000002"] <= 16


def test_a_fixed_poller_polls_every_interval(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.service_time_s = 0.5
    policy = completer(PollPolicy.fixed(0.2))
    wall, _ = asyncio.run(step(policy, 4))
    assert sorted(fake_sail_server.polls.values()) == [3, 3, 3, 3]  # at 0.2, 0.4 (in progress), 0.6 s
    assert 0.6 <= wall < 0.6 + 0.3


def test_the_deadline_bounds_the_dense_tail(fake_sail_server: FakeSailServer) -> None:
    """A response that never finishes, in a step whose other response finished: polled densely, then the deadline
    ends the attempt (no retry: max_attempts 1)."""
    fake_sail_server.service_time_s = 0.05
    policy = completer(PollPolicy(min_interval_s=0.02, response_deadline_s=0.6, max_attempts=1))
    asyncio.run(step(policy, 1))
    fake_sail_server.service_time_s = float("inf")
    started = time.monotonic()
    with pytest.raises(Exception, match="timeout: response resp_000002 not finished after 0.6 s"):
        asyncio.run(step(policy, 1))
    assert 0.6 <= time.monotonic() - started < 0.6 + 0.5
    # 25 ms doubling from the estimate: about 6 polls in 0.6 s, not one per 20 ms
    assert 3 <= fake_sail_server.polls["resp_000002"] <= 9
