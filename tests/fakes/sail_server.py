"""A loopback fake of Sail's background Responses API, for tests and benchmarks.

It implements the two endpoints `sail.SailTokenCompleter` uses (wire format of sail 0.17.1):

- ``POST /v1/responses`` with ``{model, input, raw_prompt_tokens, max_output_tokens, temperature, top_p, stop?,
  background: true, include?, metadata?}`` -> ``{id, object: "response", status: "in_progress"}``;
- ``GET /v1/responses/{id}`` -> the response, ``in_progress`` until its service time has passed, then its final
  status (``completed`` by default) with ``output[0].content[0]`` = ``{type: "output_text", token_ids,
  logprobs: [{token_id, logprob}], stop_reason}`` (``logprobs`` only when ``include`` asks for
  ``message.output_text.logprobs``).

Knobs (plain attributes, may be changed between requests): ``service_time_s`` (seconds from creation until a
response is final; ``math.inf`` = never; a ``(low, high)`` pair draws each response's time uniformly from that
range, seeded, so a run repeats), ``service_times`` (a queue of service times, one per created response, used
before ``service_time_s``), ``sampler`` (prompt tokens + payload -> `Sample`; called once per
response, on a worker thread, so a slow sampler does not hold up other requests), ``final_statuses``
(a queue of final statuses, one per created response, e.g. ``["failed", "completed"]``; empty -> ``completed``),
``http_errors`` (``{("POST", n): 500}`` answers the n-th POST, 1-based, with that HTTP status; see `fail_request`)
and ``raw_answers`` (``{("GET", n): (200, b"...")}`` answers the n-th GET with those bytes; see `answer_raw`).
Records: ``requests`` (every request, in order), ``payloads`` (bodies of the POSTs that created a response),
``polls`` (GET count per response id), `created_at` (when each response was created), ``handler_errors``
(exceptions raised while answering; those requests got HTTP 500). For a server in another process,
``GET /_fake/stats`` answers ``{posts, polls, created_at, service_s}`` as JSON and ``POST /_fake/config`` with
``{"service_time_s": x}`` (or ``[low, high]``) sets the service time of the responses created after it.

Chat completions (what ``sail.inference.chat.completions.create`` sends, used by ``kind: judge`` rules):
``POST /v1/chat/completions`` with ``{model, messages, max_tokens, temperature}`` -> ``{id, object:
"chat.completion", model, choices: [{index: 0, message: {role: "assistant", content}, finish_reason: "stop"}],
usage: {prompt_tokens, completion_tokens, total_tokens}}`` (tokens counted as whitespace-separated words). Knobs:
``chat_answer`` (payload -> the answer's content, called on a worker thread; default `yes_judge`),
``chat_models`` (the models it serves; None = any; another model is answered HTTP 404 ``model_not_found``),
``chat_delay_s`` (seconds before answering; waited on the server's loop, so concurrent requests wait together). Records: ``chat_payloads`` (every chat request body, in order).

Samplers: `echo_sampler` (the default: the prompt reversed, exact logprobs for assertions); `policy_sampler(
sampling_client_for)` samples each response from a Tinker-interface sampling client that
``sampling_client_for(payload)`` returns (e.g. `local_checkpoint_clients(service_client)`, which reads the
signed URL in ``metadata.lora`` and opens the embedded backend's checkpoint behind it, so the rollouts come from
the policy being trained, with its logprobs); `fixed_policy_sampler(sampling_client)` always samples from one
given client whatever checkpoint the request names -- a *different* policy, as when Sail serves the base model
or a stale checkpoint.

It is an aiohttp server (HTTP/1.1 keep-alive, like a real endpoint) on an asyncio loop in a daemon thread,
listening on 127.0.0.1 only, on a free port, with a backlog of `LISTEN_BACKLOG` (256) pending connections:
Python's usual default of 5 drops connections when 64 rollouts connect at once, and each dropped SYN costs the
client a 1-31 s retransmit that looks like service time. `close()` (or the fixture's teardown) stops it.
The pytest fixture `fake_sail_server` points the real sail SDK at it (``SAIL_API_URL``, a dummy
``SAIL_API_KEY``, proxies off) and resets the SDK's cached configuration before and after.
``python -m tests.fakes.sail_server --service-time 0.5`` serves one in its own process (it prints its URL, then
serves until stdin closes), so a benchmark's client does not share an interpreter with it.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest

__all__ = [
    "LISTEN_BACKLOG",
    "FakeSailServer",
    "RecordedRequest",
    "Sample",
    "echo_sampler",
    "fake_sail_server",
    "fixed_policy_sampler",
    "local_checkpoint_clients",
    "point_sail_sdk_at",
    "policy_sampler",
    "yes_judge",
]

#: Pending connections the listening socket holds (``socketserver``'s ``request_queue_size``).
LISTEN_BACKLOG = 256

_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@dataclass(frozen=True)
class Sample:
    """One scripted generation: token ids, their logprobs (or None to omit them) and the stop reason."""

    tokens: list[int]
    logprobs: list[float] | None
    stop_reason: str = "stop"


Sampler = Callable[[list[int], dict[str, Any]], Sample]


def echo_sampler(prompt_tokens: list[int], payload: dict[str, Any]) -> Sample:
    """The default sampler: the prompt reversed, cut to ``max_output_tokens``.

    Token i gets logprob ``-(i + 1) / 10``; the stop reason is ``"length"`` when the cut removed tokens,
    else ``"stop"``. Deterministic, so tests can assert exact values.
    """
    limit = int(payload.get("max_output_tokens", len(prompt_tokens)))
    reversed_tokens = list(reversed(prompt_tokens))
    tokens = reversed_tokens[:limit]
    logprobs = [-(i + 1) / 10 for i in range(len(tokens))]
    return Sample(tokens, logprobs, "length" if len(reversed_tokens) > limit else "stop")


def policy_sampler(sampling_client_for: Callable[[dict[str, Any]], Any]) -> Sampler:
    """A sampler that samples each response from ``sampling_client_for(payload)``, a Tinker-interface sampling client.

    The request's ``max_output_tokens``, ``temperature``, ``top_p`` and ``stop`` become ``tinker.SamplingParams``;
    one sample of ``raw_prompt_tokens`` is drawn with ``client.sample(...).result()`` and returned with its own
    tokens, logprobs and stop reason.
    """
    import tinker

    def sample(prompt_tokens: list[int], payload: dict[str, Any]) -> Sample:
        client = sampling_client_for(payload)
        params = tinker.SamplingParams(
            max_tokens=int(payload["max_output_tokens"]), temperature=float(payload.get("temperature", 1.0)),
            top_p=float(payload.get("top_p", 1.0)), stop=payload.get("stop"),
        )
        result = client.sample(prompt=tinker.ModelInput.from_ints(prompt_tokens), num_samples=1,
                               sampling_params=params).result()
        seq = result.sequences[0]
        return Sample(list(seq.tokens), list(seq.logprobs) if seq.logprobs is not None else None, seq.stop_reason)

    return sample


def fixed_policy_sampler(sampling_client: Any) -> Sampler:
    """A sampler that samples from ``sampling_client`` for every request, ignoring the checkpoint it names.

    Stands for Sail serving another policy than the one trained (the base model, a stale checkpoint): pass a
    sampling client of that policy (e.g. the embedded backend's ``create_sampling_client(base_model=...)``).
    """
    return policy_sampler(lambda payload: sampling_client)


def local_checkpoint_clients(service_client: Any) -> Callable[[dict[str, Any]], Any]:
    """``payload -> sampling client`` for the embedded backend's signed URLs (for `policy_sampler`).

    The embedded backend (``sailrl.runtime.backends.local.LocalServiceClient``) signs ``local://<run>/<kind>/<name>`` as
    the ``file://`` URL of ``<base_dir>/<run>/<kind>/<name>.tar``; this maps ``metadata.lora`` back to that
    checkpoint path and returns ``service_client.create_sampling_client(model_path=...)``'s client, one per
    checkpoint. Raises ValueError for a URL that is not a tar under the service's ``base_dir``.
    """
    base = Path(service_client.base_dir).resolve()
    clients: dict[str, Any] = {}
    lock = threading.Lock()

    def client_for(payload: dict[str, Any]) -> Any:
        url = str((payload.get("metadata") or {}).get("lora", ""))
        parsed = urllib.parse.urlparse(url)
        path = Path(urllib.parse.unquote(parsed.path)).resolve()
        if parsed.scheme != "file" or path.suffix != ".tar" or base not in path.parents:
            raise ValueError(f"metadata.lora {url!r} is not a checkpoint archive under {base}")
        tinker_path = "local://" + path.relative_to(base).as_posix().removesuffix(".tar")
        with lock:
            if tinker_path not in clients:
                clients[tinker_path] = service_client.create_sampling_client(model_path=tinker_path)
            return clients[tinker_path]

    return client_for


def yes_judge(payload: dict[str, Any]) -> str:
    """A chat answer that always grades yes."""
    return "The completion meets the rubric. <score>yes</score>"


@dataclass
class RecordedRequest:
    method: str
    path: str
    body: dict[str, Any] | None
    headers: dict[str, str]
    at: float  # time.monotonic() when received


@dataclass
class _Response:
    id: str
    payload: dict[str, Any]
    created_at: float
    service_time_s: float
    final_status: str
    sample: Sample | None = None
    sample_lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class FakeSailServer:
    """A fake Sail Responses endpoint on 127.0.0.1; see the module docstring for knobs and records."""

    service_time_s: float | tuple[float, float] = 0.0
    service_times: list[float] = field(default_factory=list)
    sampler: Sampler = echo_sampler
    final_statuses: list[str] = field(default_factory=list)
    http_errors: dict[tuple[str, int], int] = field(default_factory=dict)
    raw_answers: dict[tuple[str, int], tuple[int, bytes]] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    payloads: list[dict[str, Any]] = field(default_factory=list)
    polls: dict[str, int] = field(default_factory=dict)
    #: Exceptions raised while answering (e.g. a sampler that failed); each such request got HTTP 500.
    handler_errors: list[BaseException] = field(default_factory=list)
    chat_answer: Callable[[dict[str, Any]], str] = yes_judge
    chat_models: set[str] | None = None
    chat_delay_s: float = 0.0
    chat_payloads: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._responses: dict[str, _Response] = {}
        self._counts = {"POST": 0, "GET": 0}
        self._rng = random.Random(0)  # draws service times from a (low, high) range
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def listen(self) -> FakeSailServer:
        """Bind and listen with a backlog of `LISTEN_BACKLOG` without answering yet (`start` also answers)."""
        if self._sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.listen(LISTEN_BACKLOG)
            self._sock = sock
        return self

    def start(self) -> FakeSailServer:
        """Listen (if not yet) and answer requests on a daemon thread; returns once it answers."""
        self.listen()
        if self._thread is None:
            ready = threading.Event()
            failure: list[BaseException] = []
            self._thread = threading.Thread(target=self._serve, args=(ready, failure), name="fake-sail",
                                            daemon=True)
            self._thread.start()
            ready.wait(timeout=30)
            if failure:
                raise RuntimeError("the fake Sail server did not start") from failure[0]
        return self

    def close(self) -> None:
        if self._thread is not None and self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=10)
        self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        if self._sock is None:
            raise RuntimeError("FakeSailServer is not started")
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def _serve(self, ready: threading.Event, failure: list[BaseException]) -> None:
        from aiohttp import web

        async def main() -> None:
            self._stop = asyncio.Event()
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._aiohttp_handler)
            runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
            await runner.setup()
            assert self._sock is not None
            await web.SockSite(runner, self._sock, backlog=LISTEN_BACKLOG).start()
            ready.set()
            try:
                await self._stop.wait()
            finally:
                await runner.cleanup()

        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(main())
        except BaseException as exc:  # noqa: BLE001 -- reported by start()
            failure.append(exc)
            ready.set()
        finally:
            self._loop.close()

    async def _aiohttp_handler(self, request: Any) -> Any:
        from aiohttp import web

        raw = await request.read()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            status, data = self._handle(request.method, request.path, body, headers)
            if request.path == "/v1/chat/completions" and self.chat_delay_s and status == 200:
                await asyncio.sleep(self.chat_delay_s)  # on the loop: any number of requests wait at once
            if callable(data):  # a sample to draw: off the server's loop, it may block on a model
                data = await asyncio.get_running_loop().run_in_executor(None, data)
        except Exception as exc:  # noqa: BLE001 -- recorded for the test, answered as a server error
            with self._lock:
                self.handler_errors.append(exc)
            status, data = 500, {"error": {"type": "server_error", "message": f"{type(exc).__name__}: {exc}"}}
        encoded = data if isinstance(data, bytes) else json.dumps(data).encode()
        return web.Response(status=status, body=encoded, content_type="application/json")

    # -- scripting helpers -------------------------------------------------------------------------
    def fail_request(self, method: str, n: int, status: int = 500) -> None:
        """Answer the n-th (1-based) request of ``method`` ("POST" or "GET") with HTTP ``status``."""
        self.http_errors[(method.upper(), n)] = status

    def answer_raw(self, method: str, n: int, body: bytes, status: int = 200) -> None:
        """Answer the n-th (1-based) request of ``method`` with HTTP ``status`` and exactly ``body``."""
        self.raw_answers[(method.upper(), n)] = (status, body)

    @property
    def total_polls(self) -> int:
        with self._lock:
            return sum(self.polls.values())

    def count(self, method: str) -> int:
        """How many requests of ``method`` arrived (including those answered with an injected error)."""
        with self._lock:
            return self._counts[method.upper()]

    def created_at(self) -> dict[str, float]:
        """``time.monotonic()`` at which each response was created, by response id."""
        with self._lock:
            return {rid: r.created_at for rid, r in self._responses.items()}

    # -- request handling (on the server's loop) ---------------------------------------------------
    def _handle(self, method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
        """(status, JSON data | raw bytes | a callable that returns the data, run off the loop)."""
        now = time.monotonic()
        if path.startswith("/_fake/"):
            return self._admin(method, path, body)
        with self._lock:
            self.requests.append(RecordedRequest(method, path, body if isinstance(body, dict) else None,
                                                 headers, now))
            self._counts[method] = self._counts.get(method, 0) + 1
            injected = self.http_errors.get((method, self._counts[method]))
            if injected is not None:
                return injected, {"error": {"type": "server_error", "message": f"injected HTTP {injected}"}}
            raw = self.raw_answers.get((method, self._counts[method]))
            if raw is not None:
                return raw
            if method == "POST" and path == "/v1/responses":
                return self._create(body, now)
            if method == "POST" and path == "/v1/chat/completions":
                return self._chat(body)
            match = re.fullmatch(r"/v1/responses/([A-Za-z0-9_\-]+)", path)
            if not (method == "GET" and match):
                return 404, {"error": {"type": "not_found", "message": f"no route {method} {path}"}}
            record = self._responses.get(match.group(1))
            if record is None:
                return 404, {"error": {"type": "not_found", "message": f"no response {match.group(1)}"}}
            self.polls[record.id] += 1
        return self._retrieve(record, now)

    def _admin(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """``/_fake/stats`` and ``/_fake/config``: not recorded, not counted, never failed on purpose."""
        with self._lock:
            if method == "GET" and path == "/_fake/stats":
                return 200, {"posts": self._counts["POST"], "polls": dict(self.polls),
                             "created_at": {rid: r.created_at for rid, r in self._responses.items()},
                             "service_s": {rid: r.service_time_s for rid, r in self._responses.items()}}
            if method == "POST" and path == "/_fake/config" and isinstance(body, dict):
                value = body.get("service_time_s", self.service_time_s)
                self.service_time_s = (float(value[0]), float(value[1])) if isinstance(value, list) else float(value)
                return 200, {"service_time_s": value}
        return 404, {"error": {"type": "not_found", "message": f"no route {method} {path}"}}

    def _create(self, body: Any, now: float) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or not isinstance(body.get("raw_prompt_tokens"), list):
            return 400, {"error": {"type": "invalid_request", "message": "raw_prompt_tokens is required"}}
        response_id = f"resp_{len(self._responses) + 1:06d}"
        final = self.final_statuses.pop(0) if self.final_statuses else "completed"
        service = self.service_times.pop(0) if self.service_times else self.service_time_s
        if isinstance(service, tuple):
            service = self._rng.uniform(*service)
        self._responses[response_id] = _Response(response_id, body, now, float(service), final)
        self.payloads.append(body)
        self.polls[response_id] = 0
        return 200, {"id": response_id, "object": "response", "status": "in_progress", "model": body.get("model")}

    def _chat(self, body: Any) -> tuple[int, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body.get("model"):
            return 400, {"error": {"type": "invalid_request_error", "message": "model and messages are required"}}
        model = str(body["model"])
        if self.chat_models is not None and model not in self.chat_models:
            return 404, {"error": {"type": "not_found_error", "code": "model_not_found",
                                   "message": f"The model '{model}' does not exist or is not served"}}
        self.chat_payloads.append(body)
        n = len(self.chat_payloads)

        def answer() -> dict[str, Any]:
            content = self.chat_answer(body)
            prompt = sum(len(str(m.get("content", "")).split()) for m in body["messages"] if isinstance(m, dict))
            out = len(content.split())
            return {"id": f"chatcmpl_{n:06d}", "object": "chat.completion", "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}}

        return 200, answer

    def _retrieve(self, record: _Response, now: float) -> tuple[int, Any]:
        base = {"id": record.id, "object": "response", "model": record.payload.get("model")}
        if math.isinf(record.service_time_s) or now - record.created_at < record.service_time_s:
            return 200, {**base, "status": "in_progress", "output": []}
        if record.final_status in {"failed", "cancelled", "expired"}:
            return 200, {**base, "status": record.final_status, "output": [],
                         "error": {"code": "server_error", "message": f"injected {record.final_status}"}}
        if record.sample is not None:
            return 200, self._completed(record, base)

        def draw() -> dict[str, Any]:
            with record.sample_lock:  # sampled once per response, even when two polls race
                if record.sample is None:
                    record.sample = self.sampler(list(record.payload["raw_prompt_tokens"]), record.payload)
            return self._completed(record, base)

        return 200, draw

    @staticmethod
    def _completed(record: _Response, base: dict[str, Any]) -> dict[str, Any]:
        sample = record.sample
        assert sample is not None
        block: dict[str, Any] = {"type": "output_text", "text": "", "token_ids": list(sample.tokens),
                                 "stop_reason": sample.stop_reason}
        wants_logprobs = "message.output_text.logprobs" in (record.payload.get("include") or [])
        if sample.logprobs is not None and wants_logprobs:
            block["logprobs"] = [{"token_id": t, "logprob": lp}
                                 for t, lp in zip(sample.tokens, sample.logprobs, strict=False)]
            # A count mismatch is part of what tests script: extra logprobs are kept, without token ids.
            block["logprobs"] += [{"logprob": lp} for lp in sample.logprobs[len(sample.tokens):]]
        out = {**base, "status": record.final_status,
               "output": [{"type": "message", "role": "assistant", "content": [block]}],
               "usage": {"input_tokens": len(record.payload["raw_prompt_tokens"]),
                         "output_tokens": len(sample.tokens)}}
        if record.final_status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        return out


def point_sail_sdk_at(url: str, env: Any) -> None:
    """Point the real sail SDK at ``url`` with a dummy key, proxies off; ``env`` is pytest's monkeypatch.

    The SDK resolves its configuration once per process, so this also calls ``sail.reset_transports()``.
    """
    import sail

    env.setenv("SAIL_API_URL", url)
    env.setenv("SAIL_API_KEY", "sk_test_fake_sail_server")
    env.delenv("SAIL_MODE", raising=False)
    for name in _PROXY_VARS:
        env.delenv(name, raising=False)
    env.setenv("NO_PROXY", "127.0.0.1,localhost")
    env.setenv("no_proxy", "127.0.0.1,localhost")
    sail.reset_transports()


@pytest.fixture
def fake_sail_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSailServer]:
    """A started `FakeSailServer` with the sail SDK pointed at it; stopped and the SDK reset at teardown."""
    import sail

    server = FakeSailServer().start()
    try:
        point_sail_sdk_at(server.url, monkeypatch)
        yield server
    finally:
        server.close()
        # Drop the cached config now; monkeypatch restores the environment right after this fixture.
        sail.reset_transports()


def _main() -> int:
    """Serve a `FakeSailServer` in this process: print its URL, serve until stdin closes."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="Serve the loopback fake of Sail's Responses API.")
    parser.add_argument("--service-time", type=float, default=0.0, help="seconds until a response is final")
    args = parser.parse_args()
    with FakeSailServer(service_time_s=args.service_time) as server:
        print(server.url, flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
