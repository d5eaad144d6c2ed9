"""A loopback fake of Sail's background Responses API, for tests and benchmarks.

It implements the two endpoints `sail.SailTokenCompleter` uses (wire format measured against sail 0.17.1, see
shared/NOTES.md, "Sail SDK"):

- ``POST /v1/responses`` with ``{model, input, raw_prompt_tokens, max_output_tokens, temperature, top_p, stop?,
  background: true, include?, metadata?}`` -> ``{id, object: "response", status: "in_progress"}``;
- ``GET /v1/responses/{id}`` -> the response, ``in_progress`` until its service time has passed, then its final
  status (``completed`` by default) with ``output[0].content[0]`` = ``{type: "output_text", token_ids,
  logprobs: [{token_id, logprob}], stop_reason}`` (``logprobs`` only when ``include`` asks for
  ``message.output_text.logprobs``).

Knobs (plain attributes, may be changed between requests): ``service_time_s`` (seconds from creation until a
response is final; ``math.inf`` = never), ``sampler`` (prompt tokens + payload -> `Sample`), ``final_statuses``
(a queue of final statuses, one per created response, e.g. ``["failed", "completed"]``; empty -> ``completed``)
and ``http_errors`` (``{("POST", n): 500}`` answers the n-th POST, 1-based, with that HTTP status).
Records: ``requests`` (every request, in order), ``payloads`` (bodies of the POSTs that created a response),
``polls`` (GET count per response id).

It listens on 127.0.0.1 only, on a free port, in a daemon thread; `close()` (or the fixture's teardown) stops it.
The pytest fixture `fake_sail_server` points the real sail SDK at it (``SAIL_API_URL``, a dummy
``SAIL_API_KEY``, proxies off) and resets the SDK's cached configuration before and after.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import pytest

__all__ = [
    "FakeSailServer",
    "RecordedRequest",
    "Sample",
    "echo_sampler",
    "fake_sail_server",
    "point_sail_sdk_at",
]

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


@dataclass
class FakeSailServer:
    """A fake Sail Responses endpoint on 127.0.0.1; see the module docstring for knobs and records."""

    service_time_s: float = 0.0
    sampler: Sampler = echo_sampler
    final_statuses: list[str] = field(default_factory=list)
    http_errors: dict[tuple[str, int], int] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    payloads: list[dict[str, Any]] = field(default_factory=list)
    polls: dict[str, int] = field(default_factory=dict)
    #: Exceptions raised while answering (e.g. BrokenPipeError when a client gave up on a poll mid-answer).
    handler_errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._responses: dict[str, _Response] = {}
        self._counts = {"POST": 0, "GET": 0}
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> FakeSailServer:
        handler = type("_BoundHandler", (_Handler,), {"fake": self})
        self._httpd = _QuietServer(("127.0.0.1", 0), handler)
        self._httpd.fake = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-sail", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("FakeSailServer is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # -- scripting helpers -------------------------------------------------------------------------
    def fail_request(self, method: str, n: int, status: int = 500) -> None:
        """Answer the n-th (1-based) request of ``method`` ("POST" or "GET") with HTTP ``status``."""
        self.http_errors[(method.upper(), n)] = status

    @property
    def total_polls(self) -> int:
        with self._lock:
            return sum(self.polls.values())

    def count(self, method: str) -> int:
        """How many requests of ``method`` arrived (including those answered with an injected error)."""
        with self._lock:
            return self._counts[method.upper()]

    # -- request handling (called from handler threads) -------------------------------------------
    def _handle(self, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str]
                ) -> tuple[int, dict[str, Any]]:
        now = time.monotonic()
        with self._lock:
            self.requests.append(RecordedRequest(method, path, body, headers, now))
            self._counts[method] = self._counts.get(method, 0) + 1
            injected = self.http_errors.get((method, self._counts[method]))
            if injected is not None:
                return injected, {"error": {"type": "server_error", "message": f"injected HTTP {injected}"}}
            if method == "POST" and path == "/v1/responses":
                return self._create(body, now)
            match = re.fullmatch(r"/v1/responses/([A-Za-z0-9_\-]+)", path)
            if method == "GET" and match:
                return self._retrieve(match.group(1), now)
        return 404, {"error": {"type": "not_found", "message": f"no route {method} {path}"}}

    def _create(self, body: dict[str, Any] | None, now: float) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or not isinstance(body.get("raw_prompt_tokens"), list):
            return 400, {"error": {"type": "invalid_request", "message": "raw_prompt_tokens is required"}}
        response_id = f"resp_{len(self._responses) + 1:06d}"
        final = self.final_statuses.pop(0) if self.final_statuses else "completed"
        self._responses[response_id] = _Response(response_id, body, now, self.service_time_s, final)
        self.payloads.append(body)
        self.polls[response_id] = 0
        return 200, {"id": response_id, "object": "response", "status": "in_progress", "model": body.get("model")}

    def _retrieve(self, response_id: str, now: float) -> tuple[int, dict[str, Any]]:
        record = self._responses.get(response_id)
        if record is None:
            return 404, {"error": {"type": "not_found", "message": f"no response {response_id}"}}
        self.polls[response_id] += 1
        base = {"id": response_id, "object": "response", "model": record.payload.get("model")}
        if math.isinf(record.service_time_s) or now - record.created_at < record.service_time_s:
            return 200, {**base, "status": "in_progress", "output": []}
        if record.final_status in {"failed", "cancelled", "expired"}:
            return 200, {**base, "status": record.final_status, "output": [],
                         "error": {"code": "server_error", "message": f"injected {record.final_status}"}}
        if record.sample is None:
            record.sample = self.sampler(list(record.payload["raw_prompt_tokens"]), record.payload)
        sample = record.sample
        block: dict[str, Any] = {"type": "output_text", "text": "", "token_ids": list(sample.tokens),
                                 "stop_reason": sample.stop_reason}
        wants_logprobs = "message.output_text.logprobs" in (record.payload.get("include") or [])
        if sample.logprobs is not None and wants_logprobs:
            block["logprobs"] = [{"token_id": t, "logprob": lp} for t, lp in zip(sample.tokens, sample.logprobs, strict=False)]
        out = {**base, "status": record.final_status,
               "output": [{"type": "message", "role": "assistant", "content": [block]}],
               "usage": {"input_tokens": len(record.payload["raw_prompt_tokens"]),
                         "output_tokens": len(sample.tokens)}}
        if record.final_status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        return 200, out


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 drops SYNs under concurrent rollouts (a 1 s TCP retransmit each).
    request_queue_size = 256
    fake: FakeSailServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Record instead of printing a traceback: clients legitimately hang up mid-answer (cancelled polls)."""
        import sys

        exc = sys.exc_info()[1]
        if exc is not None:
            self.fake.handler_errors.append(exc)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeSailServer  # set on the bound subclass
    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive threads at shutdown

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: dict[str, Any] | None = None
        if raw:
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                body = None
        path = self.path.split("?", 1)[0]
        status, data = self.fake._handle(method, path, body, {k.lower(): v for k, v in self.headers.items()})
        encoded = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(encoded)))
        self.end_headers()
        self.wfile.write(encoded)

    def do_POST(self) -> None:  # http.server's naming
        self._serve("POST")

    def do_GET(self) -> None:
        self._serve("GET")

    def log_message(self, format: str, *args: Any) -> None:  # silence the default stderr log
        return


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
