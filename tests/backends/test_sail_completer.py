"""AdaptiveSailCompleter vs the real sail.SailTokenCompleter, both against the loopback fake Sail server.

No network, no keys: the real sail SDK is pointed at 127.0.0.1 by the `fake_sail_server` fixture.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import time
from types import SimpleNamespace
from typing import Any

import pytest
import sail
import sail.tinker as sail_tinker
import tinker
from hypothesis import given, settings
from hypothesis import strategies as st
from sail.errors import InferenceHTTPError, InvalidArgumentError
from tinker_cookbook.completers import TokenCompleter, TokensWithLogprobs

from sailrl.runtime.backends.sail import (
    AdaptiveSailCompleter,
    PollPolicy,
    SailRequestRejected,
    SailRolloutError,
    adapter_config_for,
    completion_window_problem,
    make_sail_policy,
)
from tests.fakes.sail_server import FakeSailServer, Sample  # the fixture itself comes from tests/conftest.py

ADAPTER = adapter_config_for("moonshotai/Kimi-K2.6", 32, train_attn=True, train_mlp=True, train_unembed=True)
SIGNED_URL = "https://storage.example/tinker/run-1/sampler_weights/step-3/archive.tar?X-Sig=abc%2Fdef"
KWARGS: dict[str, Any] = {
    "model": "moonshotai/Kimi-K2.6",
    "max_tokens": 4,
    "temperature": 0.7,
    "top_p": 0.9,
    "completion_window": "balanced",
    "tinker_lora_signed_url": SIGNED_URL,
    "adapter_config": ADAPTER,
    "tinker_lora_name": "run-1-step-3",
}
FAST = PollPolicy(
    min_interval_s=0.01, first_poll_s=0.02, max_interval_s=0.05, retry_base_s=0.01, retry_max_s=0.02,
    response_deadline_s=5.0, request_timeout_s=5.0,
)
PROMPT = [11, 12, 13, 14, 15, 16]


def prompt(tokens: list[int] = PROMPT) -> tinker.ModelInput:
    return tinker.ModelInput.from_ints(tokens)


def ours(**overrides: Any) -> AdaptiveSailCompleter:
    kwargs = {**KWARGS, "poll": FAST, "rng": random.Random(0), **overrides}
    return AdaptiveSailCompleter(**kwargs)


def stock(**overrides: Any) -> sail.SailTokenCompleter:
    return sail.SailTokenCompleter(**{**KWARGS, **overrides})


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------------------------
# same request, same parsing
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop", [["\n\nUser:"], [7, 9], 13, ("a", "b"), None])
def test_payload_is_identical_to_the_stock_completer(fake_sail_server: FakeSailServer, stop: Any) -> None:
    run(stock()(prompt(), stop=stop))
    run(ours()(prompt(), stop=stop))
    stock_body, our_body = fake_sail_server.payloads
    assert our_body == stock_body
    expected = {
        "model": "moonshotai/Kimi-K2.6",
        "input": "<raw token prompt; ignored when raw_prompt_tokens is set>",
        "raw_prompt_tokens": PROMPT,
        "max_output_tokens": 4,
        "temperature": 0.7,
        "top_p": 0.9,
        "background": True,
        "include": ["message.output_text.logprobs"],
        "metadata": {
            "completion_window": "balanced",
            "lora": SIGNED_URL,
            "tinker_adapter_config": (
                '{"alpha_pattern":{},"auto_mapping":null,"base_model_name_or_path":"moonshotai/Kimi-K2.6",'
                '"bias":"none","fan_in_fan_out":false,"inference_mode":true,"init_lora_weights":true,'
                '"lora_alpha":32,"lora_dropout":0.0,"modules_to_save":null,"peft_type":"LORA","r":32,'
                '"rank_pattern":{},"target_modules":["down_proj","gate_proj","kv_a_proj_with_mqa","kv_b_proj",'
                '"lm_head","o_proj","q_a_proj","q_b_proj","up_proj"],"task_type":"CAUSAL_LM"}'
            ),
            "tinker_lora_name": "run-1-step-3",
        },
    }
    if stop is not None:
        expected["stop"] = {13: [13], ("a", "b"): ["a", "b"]}.get(stop, stop) if not isinstance(stop, list) else stop
    assert our_body == expected
    assert ours().build_payload(prompt(), stop) == expected
    # Same headers too (auth, client id), apart from per-connection ones.
    posts = [r for r in fake_sail_server.requests if r.method == "POST"]
    assert posts[0].headers["authorization"] == posts[1].headers["authorization"] == "Bearer sk_test_fake_sail_server"
    assert posts[0].headers["x-sail-client"] == posts[1].headers["x-sail-client"]
    assert "idempotency-key" not in posts[0].headers and "idempotency-key" not in posts[1].headers


def test_payload_identical_with_named_lora_extra_metadata_and_no_logprobs(fake_sail_server: FakeSailServer) -> None:
    variant = {"tinker_lora_signed_url": None, "adapter_config": None, "tinker_lora_name": None,
               "lora": "my-uploaded-lora", "metadata": {"experiment": "e1"}, "request_logprobs": False}
    a = run(stock(**variant)(prompt(), stop=["\n"]))
    b = run(ours(**variant)(prompt(), stop=["\n"]))
    stock_body, our_body = fake_sail_server.payloads
    assert our_body == stock_body
    assert our_body["metadata"] == {"experiment": "e1", "completion_window": "balanced", "lora": "my-uploaded-lora"}
    assert "include" not in our_body
    assert a == b == TokensWithLogprobs(tokens=[16, 15, 14, 13], maybe_logprobs=None, stop_reason="length")


def test_parsing_matches_the_stock_completer(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.sampler = lambda tokens, payload: Sample([5, 900, 2], [-0.5, -1.25, 0.0], "stop")
    a = run(stock()(prompt(), stop=["\n"]))
    b = run(ours()(prompt(), stop=["\n"]))
    assert a == b == TokensWithLogprobs(tokens=[5, 900, 2], maybe_logprobs=[-0.5, -1.25, 0.0], stop_reason="stop")
    fake_sail_server.sampler = lambda tokens, payload: Sample([1, 2, 3, 4], [-0.1, -0.2, -0.3, -0.4], "length")
    fake_sail_server.final_statuses = ["incomplete", "incomplete"]
    a = run(stock()(prompt(), stop=None))
    b = run(ours()(prompt(), stop=None))
    assert a == b == TokensWithLogprobs(tokens=[1, 2, 3, 4], maybe_logprobs=[-0.1, -0.2, -0.3, -0.4],
                                        stop_reason="length")


def test_is_a_token_completer_with_the_sdk_constructor() -> None:
    assert isinstance(ours(), TokenCompleter) and isinstance(ours(), sail.SailTokenCompleter)
    stock_params = set(inspect.signature(sail.SailTokenCompleter.__init__).parameters) - {"poll_timeout"}
    our_params = set(inspect.signature(AdaptiveSailCompleter.__init__).parameters)
    assert stock_params <= our_params, f"sail added constructor arguments: {stock_params - our_params}"


def test_per_call_max_tokens_lowers_max_output_tokens(fake_sail_server: FakeSailServer) -> None:
    result = run(ours(max_tokens=10)(prompt(), ["\n"], max_tokens=2))
    assert fake_sail_server.payloads[0]["max_output_tokens"] == 2
    assert result.tokens == [16, 15] and result.stop_reason == "length"
    run(ours(max_tokens=3)(prompt(), ["\n"], max_tokens=50))
    assert fake_sail_server.payloads[1]["max_output_tokens"] == 3


@pytest.mark.parametrize("window", ["priority", "15m", "asap", ""])
def test_completion_window_refused_like_the_sdk(window: str) -> None:
    with pytest.raises(InvalidArgumentError) as stock_error:
        stock(completion_window=window)
    with pytest.raises(InvalidArgumentError) as our_error:
        ours(completion_window=window)
    assert str(our_error.value) == str(stock_error.value)
    assert completion_window_problem(window) == str(stock_error.value)
    if window in {"priority", "15m"}:
        assert "retired" in str(our_error.value) and "'balanced' or 'flex'" in str(our_error.value)


def test_accepted_completion_windows() -> None:
    assert completion_window_problem("balanced") is None
    assert completion_window_problem("flex") is None


def test_sdk_argument_checks_are_kept() -> None:
    with pytest.raises(InvalidArgumentError, match="adapter_config is required"):
        ours(adapter_config=None)
    with pytest.raises(InvalidArgumentError, match="mutually exclusive"):
        ours(lora="x")
    with pytest.raises(InvalidArgumentError, match="max_tokens must be positive"):
        ours(max_tokens=0)


# ------------------------------------------------------------------------------------------------------
# polling
# ------------------------------------------------------------------------------------------------------


def test_polls_until_completed_and_counts(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.service_time_s = 0.3
    completer = ours()
    result = run(completer(prompt(), ["\n"]))
    assert result.tokens == [16, 15, 14, 13]
    polls = fake_sail_server.polls["resp_000001"]
    assert polls >= 3  # a lone rollout is a scout: polled every 0.01-0.015 s until 0.3 s
    assert completer.stats.polls == polls
    metrics = completer.stats.as_metrics()
    assert metrics["sail/completed"] == 1.0 and metrics["sail/attempts"] == 1.0
    assert metrics["sail/polls_per_response"] == float(polls)
    assert metrics["sail/retries"] == 0.0 and metrics["sail/failed"] == 0.0
    assert metrics["sail/mean_wall_s"] >= 0.3


def test_stock_completer_with_a_short_interval_agrees(fake_sail_server: FakeSailServer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sail_tinker, "_POLL_INTERVAL_SECONDS", 0.05)
    fake_sail_server.service_time_s = 0.12
    a = run(stock()(prompt(), ["\n"]))
    b = run(ours()(prompt(), ["\n"]))
    assert a == b
    assert fake_sail_server.polls["resp_000001"] >= 2


def test_concurrent_rollouts(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.service_time_s = 0.1
    completer = ours()

    async def many() -> list[TokensWithLogprobs]:
        return await asyncio.gather(*(completer(prompt([i, i + 1, i + 2]), ["\n"]) for i in range(8)))

    results = run(many())
    assert [r.tokens for r in results] == [[i + 2, i + 1, i] for i in range(8)]
    assert completer.stats.completed == 8 and completer.stats.attempts == 8
    assert completer.stats.polls == fake_sail_server.total_polls


# ------------------------------------------------------------------------------------------------------
# faults
# ------------------------------------------------------------------------------------------------------


def test_http_500_on_create_is_retried(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.fail_request("POST", 1, 500)
    fake_sail_server.fail_request("POST", 2, 503)
    completer = ours()
    result = run(completer(prompt(), ["\n"]))
    assert result.tokens == [16, 15, 14, 13]
    assert fake_sail_server.count("POST") == 3
    assert completer.stats.retries == 2 and completer.stats.attempts == 1
    assert completer.stats.failure_reasons == {"HTTP 500 on create": 1, "HTTP 503 on create": 1}
    # The stock completer gives up on the first 500.
    fake_sail_server.fail_request("POST", 4, 500)
    with pytest.raises(InferenceHTTPError):
        run(stock()(prompt(), ["\n"]))


def test_http_500_on_a_poll_keeps_polling_the_same_response(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.service_time_s = 0.1
    fake_sail_server.fail_request("GET", 1, 500)
    completer = ours()
    assert run(completer(prompt(), ["\n"])).tokens == [16, 15, 14, 13]
    assert completer.stats.poll_errors == 1 and completer.stats.attempts == 1 and completer.stats.retries == 0
    assert fake_sail_server.count("POST") == 1


@pytest.mark.parametrize("status", ["failed", "expired", "cancelled"])
def test_failed_status_then_success(fake_sail_server: FakeSailServer, status: str) -> None:
    fake_sail_server.final_statuses = [status]
    completer = ours()
    assert run(completer(prompt(), ["\n"])).tokens == [16, 15, 14, 13]
    assert completer.stats.attempts == 2 and completer.stats.retries == 1
    assert completer.stats.failure_reasons == {f"status {status}": 1}
    first, second = fake_sail_server.payloads
    assert first == second  # the retry sends the same request


def test_persistent_failure_raises_after_bounded_attempts(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.final_statuses = ["failed"] * 5
    completer = ours(poll=PollPolicy(**{**FAST.__dict__, "max_attempts": 3}))
    with pytest.raises(SailRolloutError) as info:
        run(completer(prompt(), ["\n"]))
    err = info.value
    assert err.attempts == 3 and err.reason == "status failed: injected failed"
    assert err.response_ids == ["resp_000001", "resp_000002", "resp_000003"]
    assert "after 3 attempt(s)" in str(err)
    assert fake_sail_server.count("POST") == 3
    assert completer.stats.failed == 1 and completer.stats.retries == 2 and completer.stats.completed == 0


def test_never_completing_response_times_out_within_the_deadline(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.service_time_s = math.inf
    policy = PollPolicy(**{**FAST.__dict__, "response_deadline_s": 0.3, "max_attempts": 2})
    completer = ours(poll=policy)
    started = time.monotonic()
    with pytest.raises(SailRolloutError) as info:
        run(completer(prompt(), ["\n"]))
    elapsed = time.monotonic() - started
    assert info.value.reasons[0].startswith("timeout: response resp_000001 not finished after 0.3 s")
    assert len(info.value.reasons) == 2
    assert 0.6 <= elapsed < 0.6 + 1.5  # two deadlines plus one short retry delay, not the SDK's 20 minutes


def test_max_polls_bounds_a_response(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.service_time_s = math.inf
    completer = ours(poll=PollPolicy(**{**FAST.__dict__, "max_polls": 3, "max_attempts": 1}))
    with pytest.raises(SailRolloutError, match="3 polls"):
        run(completer(prompt(), ["\n"]))
    assert fake_sail_server.polls == {"resp_000001": 3}


def test_response_lost_404_gets_a_new_request(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.fail_request("GET", 1, 404)
    completer = ours()
    assert run(completer(prompt(), ["\n"])).tokens == [16, 15, 14, 13]
    assert completer.stats.attempts == 2 and fake_sail_server.count("POST") == 2


def test_malformed_output_is_retried_then_reported(fake_sail_server: FakeSailServer) -> None:
    fake_sail_server.sampler = lambda tokens, payload: Sample([1, 2], [-0.1], "stop")  # lengths differ
    completer = ours(poll=PollPolicy(**{**FAST.__dict__, "max_attempts": 2}))
    with pytest.raises(SailRolloutError, match="token_ids and logprobs lengths do not match"):
        run(completer(prompt(), ["\n"]))
    assert completer.stats.failure_reasons == {"malformed output": 2}
    assert completer.stats.malformed == 2 and completer.stats.as_metrics()["sail/malformed"] == 2.0


@pytest.mark.parametrize("status", [400, 401, 403])
def test_client_errors_are_not_retried(fake_sail_server: FakeSailServer, status: int) -> None:
    fake_sail_server.fail_request("POST", 1, status)
    completer = ours()
    with pytest.raises(SailRequestRejected) as info:
        run(completer(prompt(), ["\n"]))
    assert not isinstance(info.value, SailRolloutError)  # the loop must not silently drop every group
    assert info.value.status_code == status and f"HTTP {status}" in str(info.value)
    assert fake_sail_server.count("POST") == 1 and completer.stats.rejected == 1


def test_missing_api_key_is_a_plain_rejection(fake_sail_server: FakeSailServer, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Any) -> None:
    monkeypatch.delenv("SAIL_API_KEY")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.sail credentials either
    sail.reset_transports()
    with pytest.raises(SailRequestRejected, match="SAIL_API_KEY"):
        run(ours()(prompt(), ["\n"]))
    assert fake_sail_server.count("POST") == 0


def test_make_sail_policy(fake_sail_server: FakeSailServer) -> None:
    policy = make_sail_policy(
        model="moonshotai/Kimi-K2.6", signed_url=SIGNED_URL, adapter_config=ADAPTER, lora_name="run-1-step-3",
        max_tokens=4, temperature=0.7, top_p=0.9, completion_window="balanced", poll=FAST,
        vocab_size=259, poll_deadline_s=30,
    )
    assert policy.vocab_size == 259
    assert policy.poll.response_deadline_s == 30 and policy.poll.min_interval_s == FAST.min_interval_s
    default = make_sail_policy(
        model="m", signed_url=SIGNED_URL, adapter_config=ADAPTER, lora_name="x", max_tokens=4, temperature=1.0,
        top_p=1.0, completion_window="balanced",
    )
    assert default.vocab_size is None and default.poll == PollPolicy() and default.poll.response_deadline_s == 1200
    run(policy(prompt(), ["\n"]))
    run(stock()(prompt(), ["\n"]))
    assert fake_sail_server.payloads[0] == fake_sail_server.payloads[1]
    with pytest.raises(InvalidArgumentError, match="retired"):
        make_sail_policy(
            model="m", signed_url=SIGNED_URL, adapter_config=ADAPTER, lora_name="x", max_tokens=4,
            temperature=1.0, top_p=1.0, completion_window="priority",
        )


class _Captured(Exception):
    pass


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 200_000), min_size=1, max_size=20),
    stop=st.one_of(st.none(), st.integers(0, 1000), st.lists(st.text(min_size=1, max_size=5), max_size=3),
                   st.lists(st.integers(0, 1000), max_size=3)),
    max_tokens=st.integers(1, 4096),
    temperature=st.floats(0, 2),
    top_p=st.floats(0.01, 1),
    window=st.sampled_from(["balanced", "flex"]),
    name=st.one_of(st.none(), st.text(max_size=12)),
    logprobs=st.booleans(),
)
def test_build_payload_equals_what_the_sdk_sends(tokens: list[int], stop: Any, max_tokens: int,
                                                  temperature: float, top_p: float, window: str,
                                                  name: str | None, logprobs: bool) -> None:
    """Property: for any inputs, build_payload == the kwargs the SDK's __call__ hands to responses.create."""
    seen: dict[str, Any] = {}

    async def fake_create(**kwargs: Any) -> Any:
        seen.update(kwargs)
        raise _Captured

    fake_inference = SimpleNamespace(responses=SimpleNamespace(create=SimpleNamespace(aio=fake_create)))
    settings_ = {**KWARGS, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                 "completion_window": window, "tinker_lora_name": name, "request_logprobs": logprobs}
    original = sail_tinker.inference
    sail_tinker.inference = fake_inference  # the module global the SDK's __call__ uses
    try:
        with pytest.raises(_Captured):
            asyncio.run(sail.SailTokenCompleter(**settings_)(prompt(tokens), stop=stop))
    finally:
        sail_tinker.inference = original
    sdk_body = {k: v for k, v in seen.items() if k not in {"voyage", "timeout"}}
    assert ours(**settings_).build_payload(prompt(tokens), stop) == sdk_body
