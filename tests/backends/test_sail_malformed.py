"""Malformed Sail answers are a counted, bounded rollout failure (sail/malformed), never a stall or a bad group.

Each case goes through the real sail SDK against the loopback fake: a body that does not parse (a NaN logprob),
token ids outside the vocabulary, empty completions, count mismatches, oversized arrays.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from typing import Any

import pytest
import tinker

from sailrl.runtime.backends.sail import AdaptiveSailCompleter, PollPolicy, SailRolloutError, adapter_config_for
from sailrl.runtime.backends.sail.completer import _check_completion, _Malformed
from tests.fakes.sail_server import FakeSailServer, Sample

ADAPTER = adapter_config_for("sailrl/tiny", 8, train_attn=True, train_mlp=True, train_unembed=True)
POLL = PollPolicy(min_interval_s=0.01, retry_base_s=0.01, retry_max_s=0.02, response_deadline_s=60.0,
                  request_timeout_s=5.0, max_attempts=2)


def completer(**overrides: Any) -> AdaptiveSailCompleter:
    kwargs = {"model": "sailrl/tiny", "max_tokens": 4, "tinker_lora_signed_url": "file:///ckpt.tar",
              "adapter_config": ADAPTER, "poll": POLL, "rng": random.Random(0), "vocab_size": 259, **overrides}
    return AdaptiveSailCompleter(**kwargs)


def sample_once(policy: AdaptiveSailCompleter) -> Any:
    return asyncio.run(policy(tinker.ModelInput.from_ints([5, 6, 7]), ["\n"]))


def body(block: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {"id": "resp_000001", "status": status, "output": [{"type": "message", "content": [block]}]}


@pytest.mark.parametrize(
    ("sample", "reason"),
    [
        (Sample([7, 10**9], [-0.1, -0.2]), "token id 1000000000 at position 1 is outside the vocabulary [0, 259)"),
        (Sample([-5, 7], [-0.1, -0.2]), "token id -5 at position 0 is outside the vocabulary [0, 259)"),
        (Sample([259], [-0.1]), "token id 259 at position 0 is outside the vocabulary [0, 259)"),
        (Sample([], [], "stop"), "empty completion (no token ids, no text, stop_reason 'stop')"),
        (Sample([1, 2], [-0.1]), "Sail response token_ids and logprobs lengths do not match"),
        (Sample([1, 2], [-0.1, -0.2, -0.3]), "Sail response token_ids and logprobs lengths do not match"),
        (Sample([1, 2, 3, 4, 5], [-0.1] * 5), "5 entries in token_ids, more than max_output_tokens=4"),
        (Sample([1, 2], None), "logprobs were requested but the answer has none for its 2 tokens"),
    ],
)
def test_malformed_completions_are_retried_then_fail_the_rollout(fake_sail_server: FakeSailServer, sample: Sample,
                                                                reason: str) -> None:
    fake_sail_server.sampler = lambda tokens, payload: sample
    policy = completer()
    with pytest.raises(SailRolloutError) as info:
        sample_once(policy)
    assert info.value.reasons == [f"malformed output: {reason}"] * 2
    assert info.value.attempts == 2 and fake_sail_server.count("POST") == 2
    stats = policy.stats
    assert stats.malformed == 2 and stats.failed == 1 and stats.completed == 0
    assert stats.failure_reasons == {"malformed output": 2}
    assert stats.as_metrics()["sail/malformed"] == 2.0


def test_vocabulary_check_needs_the_vocab_size_but_negative_ids_are_always_refused(
        fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.sampler = lambda tokens, payload: Sample([10**9], [-0.1])
    assert sample_once(completer(vocab_size=None)).tokens == [10**9]  # no size given: the caller's to check
    fake_sail_server.sampler = lambda tokens, payload: Sample([-5], [-0.1])
    with pytest.raises(SailRolloutError, match=r"token id -5 at position 0 is outside the vocabulary \[0, \.\.\.\)"):
        sample_once(completer(vocab_size=None))


def test_a_nan_logprob_body_fails_the_attempt_at_once_instead_of_polling_for_20_minutes(
        fake_sail_server: FakeSailServer) -> None:
    """JSON has no NaN: the SDK cannot parse the answer and reports a synthetic HTTP 503 (after its own 3 GETs).
    It used to count as a transient poll error: polled again until the 20-minute deadline, three times over."""
    fake_sail_server.sampler = lambda tokens, payload: Sample([1, 2], [math.nan, -0.5])
    policy = completer()
    started = time.monotonic()
    with pytest.raises(SailRolloutError) as info:
        sample_once(policy)
    assert time.monotonic() - started < 10
    # the body read again with Python's parser (which reads NaN) names the field, not "the answer is not JSON"
    assert info.value.reasons == ["malformed output: logprob nan at position 0 is not a finite number"] * 2
    assert policy.stats.malformed == 2 and policy.stats.poll_errors == 0
    assert fake_sail_server.count("POST") == 2


def test_an_unparseable_poll_then_a_good_retry(fake_sail_server: FakeSailServer) -> None:
    for n in (1, 2, 3):  # the SDK tries each GET 3 times before it reports the body
        fake_sail_server.answer_raw("GET", n, b'{"id": "resp_000001", "status": "completed", "output": [')
    policy = completer()
    result = sample_once(policy)
    assert result.tokens == [7, 6, 5] and result.maybe_logprobs == [-0.1, -0.2, -0.3]
    assert policy.stats.malformed == 1 and policy.stats.retries == 1 and policy.stats.completed == 1


def test_an_answer_without_a_status_is_malformed(fake_sail_server: FakeSailServer) -> None:
    for n in (1, 2):
        fake_sail_server.answer_raw("GET", n, json.dumps({"id": f"resp_00000{n}", "output": []}).encode())
    with pytest.raises(SailRolloutError, match="malformed output: poll answer has no status"):
        sample_once(completer())


def test_a_create_answer_that_is_not_json_is_malformed(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.answer_raw("POST", 1, b"<html>502 Bad Gateway</html>")
    policy = completer()
    assert sample_once(policy).tokens == [7, 6, 5]
    assert policy.stats.malformed == 1
    assert list(policy.stats.failure_reasons) == ["malformed output"]


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ({"token_ids": [1, 2], "logprobs": [{"logprob": -0.1}, {"logprob": math.nan}]},
         "logprob nan at position 1 is not a finite number"),
        ({"token_ids": [1], "logprobs": [{"logprob": -math.inf}]}, "logprob -inf at position 0 is not a finite number"),
        ({"token_ids": [True, 2], "logprobs": [{"logprob": -0.1}, {"logprob": -0.2}]},
         "token id True at position 0 is outside the vocabulary [0, 259)"),
        ({"token_ids": [1.0]}, "Sail response token_ids[0] is not an integer"),
        ({"token_ids": list(range(10**6))}, "1000000 entries in token_ids, more than max_output_tokens=4"),
        ({"logprobs": [{"token_id": 1, "logprob": -0.1}] * 10**6},
         "1000000 entries in logprobs, more than max_output_tokens=4"),
        ({"token_ids": [], "text": ""}, "empty completion (no token ids, no text, stop_reason None)"),
    ],
)
def test_check_completion_refuses(block: dict[str, Any], reason: str) -> None:
    """Checks on answers the SDK's JSON parser may never deliver (it rejects NaN and out-of-range numbers)."""
    with pytest.raises(_Malformed) as info:
        _check_completion(body({"type": "output_text", **block}), max_tokens=4, vocab_size=259,
                          logprobs_requested=True)
    assert info.value.reason == f"malformed output: {reason}"


def test_check_completion_accepts_a_good_answer_and_an_empty_token_list_with_text() -> None:
    good = body({"type": "output_text", "token_ids": [1, 258], "logprobs": [{"logprob": -0.1}, {"logprob": 0.0}],
                 "stop_reason": "length"})
    assert _check_completion(good, max_tokens=2, vocab_size=259, logprobs_requested=True) == (
        [1, 258], [-0.1, 0.0], "length")
    with_text = body({"type": "output_text", "token_ids": [], "text": "ok", "stop_reason": "stop"})
    assert _check_completion(with_text, max_tokens=2, vocab_size=259, logprobs_requested=True) == ([], None, "stop")


def test_failure_reasons_are_bounded_in_size(fake_sail_server: FakeSailServer) -> None:
    for n in range(1, 9):  # the SDK's 3 GETs and sailrl's one read of the body, per attempt
        fake_sail_server.answer_raw("GET", n, b"[" * 100_000)
    with pytest.raises(SailRolloutError) as info:
        sample_once(completer())
    assert all(len(r) <= 300 for r in info.value.reasons)
    assert len(str(info.value)) < 1000


@pytest.mark.parametrize(("status", "reason"), [
    (7, "poll answer has status 7, none of cancelled, canceled, completed, expired, failed, in_progress, "
        "incomplete, queued (response resp_000001)"),
    ("weird", "poll answer has status 'weird', none of cancelled, canceled, completed, expired, failed, "
              "in_progress, incomplete, queued (response resp_000001)"),
])
def test_a_status_sail_never_answers_is_malformed_not_polled_again(fake_sail_server: FakeSailServer, status: Any,
                                                                  reason: str) -> None:
    fake_sail_server.answer_raw("GET", 1, json.dumps({"id": "resp_000001", "status": status}).encode())
    policy = completer()
    assert sample_once(policy).tokens == [7, 6, 5]  # the retry's answer is good
    assert policy.stats.malformed == 1 and policy.stats.failure_reasons == {"malformed output": 1}
    assert fake_sail_server.count("GET") == 2  # the bad answer was not polled again


def test_an_answer_for_another_response_is_malformed(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.answer_raw("GET", 1, json.dumps(body({"type": "output_text", "token_ids": [1],
                                                           "logprobs": [{"logprob": -0.1}]}) | {
        "id": "resp_999999"}).encode())
    policy = completer()
    assert sample_once(policy).tokens == [7, 6, 5]
    assert policy.stats.malformed == 1


PARSEABLE_FAULTS = [
    b"null", b"[]", b'"text"', b"{}", b'{"id": "resp_000001", "status": 7}', b'{"status": "weird"}',
    b'{"status": "completed"}', b'{"id": "resp_999999", "status": "completed"}', b"",
]
UNPARSEABLE_FAULTS = [  # the SDK GETs such a body 3 times before it reports it; sailrl reads it once more
    b"<html>502</html>", b"\xff\xfe", b'{"status": "completed", "output": [',
    b'{"status": "completed", "output": [{"type": "message", "content": [{"type": "output_text", "token_ids": [1], '
    b'"logprobs": [{"logprob": NaN}]}]}]}',
]


def test_every_injected_fault_is_counted_once(fake_sail_server: FakeSailServer) -> None:
    """16 faults among 24 rollouts, one at the first poll of each faulty rollout: sail/malformed is 16."""
    rng = random.Random(7)
    faulty = set(rng.sample(range(24), 16))
    get = 0  # the GETs the fake has answered so far: one per good poll, 1 or 3 + 1 per fault
    for i in range(24):
        if i in faulty:
            if rng.random() < 0.5:
                get += 1
                fake_sail_server.answer_raw("GET", get, rng.choice(PARSEABLE_FAULTS))
            else:
                bad = rng.choice(UNPARSEABLE_FAULTS)
                for _ in range(3):
                    get += 1
                    fake_sail_server.answer_raw("GET", get, bad)
                get += 1
                fake_sail_server.answer_raw("GET", get, bad)  # sailrl's own read of it
        get += 1  # the rollout's good poll (its retry's, after a fault)
    policy = completer()

    async def many() -> list[Any]:
        return [await policy(tinker.ModelInput.from_ints([5, 6, 7]), ["\n"]) for _ in range(24)]

    results = asyncio.run(many())
    assert all(r.tokens == [7, 6, 5] for r in results)
    assert fake_sail_server.count("GET") == get
    assert policy.stats.as_metrics()["sail/malformed"] == 16.0
    assert policy.stats.failure_reasons == {"malformed output": 16} and policy.stats.poll_errors == 0
    assert policy.stats.retries == 16
