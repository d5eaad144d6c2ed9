"""The loopback Sail emulator itself: its listen backlog, its out-of-process endpoints and its policy samplers."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import tinker

from sailrl.runtime.backends.sail import AdaptiveSailCompleter, PollPolicy, adapter_config_for, signed_checkpoint_url
from tests.fakes.sail_server import (
    LISTEN_BACKLOG,
    FakeSailServer,
    Sample,
    fixed_policy_sampler,
    local_checkpoint_clients,
    policy_sampler,
)

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = adapter_config_for("sailrl/tiny", 4, train_attn=True, train_mlp=True, train_unembed=True)
POLL = PollPolicy(min_interval_s=0.01, response_deadline_s=30.0, request_timeout_s=30.0, max_attempts=1)


def _connected_within(port: int, n: int, seconds: float) -> int:
    """Open ``n`` non-blocking connections to 127.0.0.1:port; how many complete their handshake in ``seconds``.

    A listening socket whose accept queue is full drops the SYN, so such a connect stays in progress."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            socks.append(s)
        deadline = time.monotonic() + seconds
        pending, connected = set(socks), 0
        while pending and time.monotonic() < deadline:
            _, writable, _ = select.select([], list(pending), [], max(deadline - time.monotonic(), 0))
            for s in writable:
                pending.discard(s)
                connected += s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        return connected
    finally:
        for s in socks:
            s.close()


def test_the_backlog_holds_256_pending_connections() -> None:
    """64 concurrent rollouts connecting at once must not overflow the listen queue (Python's default backlog
    of 5 did: each dropped SYN is retried after 1-31 s, which looked like Sail's service time)."""
    assert LISTEN_BACKLOG == 256
    server = FakeSailServer().listen()  # listening, not accepting: connections wait in the backlog
    try:
        port = int(server.url.rsplit(":", 1)[1])
        assert _connected_within(port, 256, 2.0) == 256
    finally:
        server.close()
    # The same probe against a backlog of 5 shows what the test guards against.
    small = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    small.bind(("127.0.0.1", 0))
    small.listen(5)
    try:
        assert _connected_within(small.getsockname()[1], 64, 0.5) < 64
    finally:
        small.close()


def test_connections_queued_before_serving_are_answered(fake_sail_server: FakeSailServer) -> None:
    server = FakeSailServer().listen()
    try:
        result: list[Any] = []
        thread = threading.Thread(target=lambda: result.append(urllib.request.urlopen(
            f"{server.url}/_fake/stats", timeout=10).read()))
        thread.start()
        time.sleep(0.2)  # the request waits in the backlog
        server.start()
        thread.join(timeout=10)
        assert json.loads(result[0]) == {"posts": 0, "polls": {}, "created_at": {}, "service_s": {}}
    finally:
        server.close()


def test_a_slow_sampler_does_not_hold_up_other_requests(fake_sail_server: FakeSailServer) -> None:
    release = threading.Event()

    def slow(tokens: list[int], payload: dict[str, Any]) -> Sample:
        if tokens[0] == 1:
            release.wait(timeout=10)
        return Sample([3], [-0.5])

    fake_sail_server.sampler = slow
    policy = AdaptiveSailCompleter(model="m", max_tokens=4, poll=POLL)

    async def both() -> list[float]:
        started = time.monotonic()

        async def one(first: int) -> float:
            await policy(tinker.ModelInput.from_ints([first, 2]), None)
            return time.monotonic() - started

        slow_one = asyncio.ensure_future(one(1))
        fast = await one(2)  # answered while the other poll's sample is still being drawn
        release.set()
        return [fast, await slow_one]

    fast, slow_end = asyncio.run(both())
    assert fast < 2.0 and slow_end >= fast


def test_the_server_in_its_own_process_reports_and_takes_its_service_time() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.sail_server", "--service-time", "0.25"], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()

        def call(path: str, body: dict | None = None) -> dict:
            data = json.dumps(body).encode() if body is not None else None
            req = urllib.request.Request(f"{url}{path}", data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as answer:
                return json.loads(answer.read())

        created = call("/v1/responses", {"raw_prompt_tokens": [1, 2], "max_output_tokens": 2})
        assert created["status"] == "in_progress"
        assert call(f"/v1/responses/{created['id']}")["status"] == "in_progress"  # 0.25 s not over yet
        assert call("/_fake/config", {"service_time_s": 0.0}) == {"service_time_s": 0.0}
        second = call("/v1/responses", {"raw_prompt_tokens": [1, 2], "max_output_tokens": 2})
        done = call(f"/v1/responses/{second['id']}")
        assert done["status"] == "completed" and done["output"][0]["content"][0]["token_ids"] == [2, 1]
        stats = call("/_fake/stats")
        assert stats["posts"] == 2 and stats["polls"] == {"resp_000001": 1, "resp_000002": 1}
        assert set(stats["created_at"]) == {"resp_000001", "resp_000002"}
        assert stats["service_s"] == {"resp_000001": 0.25, "resp_000002": 0.0}
        assert call("/_fake/config", {"service_time_s": [0.1, 0.3]}) == {"service_time_s": [0.1, 0.3]}
        for _ in range(5):
            call("/v1/responses", {"raw_prompt_tokens": [1], "max_output_tokens": 1})
        drawn = list(call("/_fake/stats")["service_s"].values())[2:]
        assert len(drawn) == 5 and all(0.1 <= x <= 0.3 for x in drawn) and len(set(drawn)) == 5
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=20) == 0


# ------------------------------------------------------------------------------------------------------
# samplers backed by a Tinker-interface sampling client (the embedded backend)
# ------------------------------------------------------------------------------------------------------


@pytest.fixture
def local_checkpoint(tmp_path: Path) -> tuple[Any, str]:
    from sailrl.runtime.backends.local import LocalServiceClient

    service = LocalServiceClient("sailrl/tiny", base_dir=tmp_path / "ckpt", seed=0)
    trainer = service.create_lora_training_client(base_model="sailrl/tiny", rank=4, seed=3)
    path = trainer.save_weights_for_sampler(name="step-000000").result().path
    return service, path


def _learner_logprobs(client: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    logprobs = client.compute_logprobs(tinker.ModelInput.from_ints(prompt + tokens)).result()
    return [float(x) for x in logprobs[len(prompt):]]


PROMPT = list(b"User: 2+3=\n\nAssistant:")


def test_policy_sampler_returns_the_signed_checkpoints_own_tokens_and_logprobs(
        fake_sail_server: FakeSailServer, local_checkpoint: tuple[Any, str]) -> None:
    service, path = local_checkpoint
    url = asyncio.run(signed_checkpoint_url(service, path, None))
    assert url.startswith("file://") and url.endswith("/sampler_weights/step-000000.tar")
    client_for = local_checkpoint_clients(service)
    fake_sail_server.sampler = policy_sampler(client_for)
    policy = AdaptiveSailCompleter(model="sailrl/tiny", max_tokens=6, tinker_lora_signed_url=url,
                                   adapter_config=ADAPTER, poll=POLL, vocab_size=259)
    out = asyncio.run(policy(tinker.ModelInput.from_ints(PROMPT), None))
    assert 1 <= len(out.tokens) <= 6 and all(0 <= t < 259 for t in out.tokens)
    learner = service.create_sampling_client(model_path=path)
    assert out.maybe_logprobs == pytest.approx(_learner_logprobs(learner, PROMPT, out.tokens), abs=1e-4)
    assert client_for({"metadata": {"lora": url}}) is client_for({"metadata": {"lora": url}})  # one per checkpoint
    with pytest.raises(ValueError, match="is not a checkpoint archive under"):
        client_for({"metadata": {"lora": "https://storage.example/x.tar"}})


def test_fixed_policy_sampler_serves_another_policy_whatever_the_request_names(
        fake_sail_server: FakeSailServer, local_checkpoint: tuple[Any, str], tmp_path: Path) -> None:
    from sailrl.runtime.backends.local import LocalServiceClient

    service, path = local_checkpoint
    url = asyncio.run(signed_checkpoint_url(service, path, None))
    other = LocalServiceClient("sailrl/tiny", base_dir=tmp_path / "other", seed=1)  # other random base weights
    other_client = other.create_sampling_client(base_model="sailrl/tiny")
    fake_sail_server.sampler = fixed_policy_sampler(other_client)
    policy = AdaptiveSailCompleter(model="sailrl/tiny", max_tokens=6, tinker_lora_signed_url=url,
                                   adapter_config=ADAPTER, poll=POLL, vocab_size=259)
    out = asyncio.run(policy(tinker.ModelInput.from_ints(PROMPT), None))
    learner = service.create_sampling_client(model_path=path)
    assert out.maybe_logprobs == pytest.approx(_learner_logprobs(other_client, PROMPT, out.tokens), abs=1e-4)
    mismatch = [abs(a - b) for a, b in zip(out.maybe_logprobs, _learner_logprobs(learner, PROMPT, out.tokens),
                                           strict=True)]
    assert max(mismatch) > 0.05  # not the learner's logprobs: what the on-policy check must notice
