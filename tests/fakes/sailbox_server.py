"""A loopback fake of Sail's Sailbox API, as sail 0.17.1's client (its Rust core) calls it for
``sail.tinker.TinkerSandbox``, for the python tool's ``environment.sandbox: sail``.

The wire format, as the SDK sends and reads it (every request carries ``Authorization: Bearer <SAIL_API_KEY>``):

- ``POST /v1/apps/find`` ``{name, mint_if_missing}`` -> ``{id, name}``;
- ``POST /v1/sailboxes`` ``{app_id, image: {base: "BASE_IMAGE_DEBIAN"}, name, ingress_ports, visibility,
  volume_mounts, size?}`` -> ``{sailbox_id, id, name, status: "running"}``;
- ``POST /v1/sailboxes/{id}/exec`` ``{command: ["/bin/bash", "-lc", CMD], timeout, idempotency_key, env, ...}``
  -> a stream of JSON lines (NDJSON): ``{"type": "started", "exec_request_id"}``, then ``{"type": "stdout" |
  "stderr", "seq": n, "data": <base64>}`` (``seq`` counts each stream's chunks from 1), then ``{"type": "exit",
  "return_code", "timed_out", "stdout_seq", "stderr_seq", "stdout_total_bytes", "stderr_total_bytes"}``;
- ``POST /v1/sailboxes/{id}/exec/-/wait?exec_request_id=`` -> ``{status, stdout, stderr, return_code,
  timed_out}`` (the SDK asks only when the stream's totals do not add up);
- ``POST /v1/sailboxes/{id}/exec/-/cancel?exec_request_id=`` ``{force}`` -> ``{}`` (after a timed-out command);
- ``POST /v1/sailboxes/{id}/terminate`` ``{}`` -> ``{}``.

Commands really run here, on the test machine: ``/bin/bash -lc CMD`` in a fresh temporary folder with the
request's timeout (exit code 124 and ``timed_out`` past it), so a test drives the real SDK and the real command.

Knobs (plain attributes): ``create_errors`` (how many of the next creates answer HTTP 500), ``create_delay_s``
(seconds before a create answers), ``exec_errors`` (how many of the next execs answer HTTP 500),
``exec_hang_s`` (an exec answers ``started`` and then nothing for this many seconds; 0 = off), ``gone`` (the
Sailbox ids that answer 404 ``sailbox not found``: a terminated one; what the real service answers for one is
not documented, and the SDK reports this one as a plain Sail error, exit code -1). Records: ``requests`` (method, path,
JSON body), ``created`` / ``terminated`` (Sailbox ids), ``commands`` (each exec's command line).
Listens on 127.0.0.1 only, on a free port; ``close()`` stops it and wakes any hanging answer.
"""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tests.fakes.sail_server import point_sail_sdk_at

#: Bytes per stdout/stderr chunk of an exec's stream.
CHUNK_BYTES = 1024


@dataclass
class FakeSailboxServer:
    create_errors: int = 0
    create_delay_s: float = 0.0
    exec_errors: int = 0
    exec_hang_s: float = 0.0
    gone: set[str] = field(default_factory=set)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._results: dict[str, dict[str, Any]] = {}
        self._closing = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> FakeSailboxServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                fake._handle(self)

            do_GET = do_DELETE = do_POST  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-sailbox", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # -- answers -----------------------------------------------------------------------------------
    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.send_response(status)
        h.send_header("content-type", content_type)
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        try:
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a test of its own time limit)
            pass

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        n = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(n) if n else b""
        body = json.loads(raw) if raw else None
        url = urlparse(h.path)
        parts = url.path.strip("/").split("/")
        with self._lock:
            self.requests.append((h.command, url.path, body))
        if h.headers.get("authorization", "") != "Bearer sk_test_fake_sail_server":
            return self._send(h, 401, {"error": {"type": "unauthorized", "message": "bad key"}})
        if url.path == "/v1/apps/find":
            return self._send(h, 200, {"id": "app_fake", "name": body["name"]})
        if url.path == "/v1/sailboxes" and h.command == "POST":
            return self._create(h, body)
        if len(parts) >= 4 and parts[:2] == ["v1", "sailboxes"]:
            box = parts[2]
            if box in self.gone:
                return self._send(h, 404, {"error": {"type": "not_found", "message": f"sailbox {box} not found"}})
            tail = parts[3:]
            if tail == ["exec"]:
                return self._exec(h, box, body)
            if tail[:2] == ["exec", "-"] and len(tail) == 3:
                if tail[2] == "cancel":
                    return self._send(h, 200, {})
                if tail[2] == "wait":
                    rid = parse_qs(url.query).get("exec_request_id", [""])[0]
                    return self._send(h, 200, self._results.get(rid, {"status": "completed", "stdout": "",
                                                                      "stderr": "", "return_code": 0,
                                                                      "timed_out": False}))
            if tail == ["terminate"]:
                with self._lock:
                    self.terminated.append(box)
                    self.gone.add(box)
                return self._send(h, 200, {})
        return self._send(h, 404, {"error": {"type": "not_found", "message": f"no route {h.command} {url.path}"}})

    def _create(self, h: BaseHTTPRequestHandler, body: Any) -> None:
        if self.create_delay_s:
            self._closing.wait(self.create_delay_s)
        with self._lock:
            if self.create_errors > 0:
                self.create_errors -= 1
                return self._send(h, 500, {"error": {"type": "internal", "message": "no capacity (fake)"}})
            box = f"sb_fake{len(self.created) + 1}"
            self.created.append(box)
        return self._send(h, 200, {"sailbox_id": box, "id": box, "name": body.get("name", ""), "status": "running"})

    def _exec(self, h: BaseHTTPRequestHandler, box: str, body: Any) -> None:
        command = body["command"]
        with self._lock:
            self.commands.append(command[-1])
            rid = f"exec_{len(self.commands)}"
            if self.exec_errors > 0:
                self.exec_errors -= 1
                return self._send(h, 500, {"error": {"type": "internal", "message": "exec failed (fake)"}})
        if self.exec_hang_s:
            started = (json.dumps({"type": "started", "exec_request_id": rid}) + "\n").encode()
            h.send_response(200)
            h.send_header("content-type", "application/x-ndjson")
            h.send_header("content-length", str(len(started) + 10_000))  # more is promised, never sent
            h.end_headers()
            h.wfile.write(started)
            h.wfile.flush()
            self._closing.wait(self.exec_hang_s)
            return None
        timeout = body.get("timeout")
        timed_out = False
        with tempfile.TemporaryDirectory(prefix="fake-sailbox-") as cwd:
            try:
                done = subprocess.run(command, cwd=cwd, capture_output=True, timeout=timeout, check=False)
                out, err, code = done.stdout, done.stderr, done.returncode
            except subprocess.TimeoutExpired as exc:
                out, err, code, timed_out = exc.stdout or b"", exc.stderr or b"", 124, True
        lines = [{"type": "started", "exec_request_id": rid}]
        seqs = {}
        for stream, data in (("stdout", out), ("stderr", err)):
            chunks = [data[i:i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)]
            for i, chunk in enumerate(chunks, 1):
                lines.append({"type": stream, "seq": i, "data": base64.b64encode(chunk).decode()})
            seqs[stream] = len(chunks)
        lines.append({"type": "exit", "return_code": code, "timed_out": timed_out, "stdout_seq": seqs["stdout"],
                      "stderr_seq": seqs["stderr"], "stdout_total_bytes": len(out), "stderr_total_bytes": len(err)})
        self._results[rid] = {"status": "completed", "stdout": out.decode("utf-8", "replace"),
                              "stderr": err.decode("utf-8", "replace"), "return_code": code, "timed_out": timed_out}
        data = b"".join((json.dumps(line) + "\n").encode() for line in lines)
        return self._send(h, 200, data, "application/x-ndjson")


@pytest.fixture
def fake_sailbox_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSailboxServer]:
    """A started `FakeSailboxServer` with the sail SDK pointed at it (``SAIL_API_URL`` and ``SAILBOX_API_URL``,
    a dummy key); stopped and the SDK reset at teardown."""
    import sail

    server = FakeSailboxServer().start()
    try:
        point_sail_sdk_at(server.url, monkeypatch)
        monkeypatch.setenv("SAILBOX_API_URL", server.url)
        sail.reset_transports()
        yield server
    finally:
        server.close()
        sail.reset_transports()
