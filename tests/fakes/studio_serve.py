"""A live studio for browser tests: the real app (``build_app``) on uvicorn, on a free loopback port bound the way
``sailrl studio`` binds it, in a daemon thread; stopped and its socket closed on exit."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from sailrl.studio.app import build_app


@contextmanager
def serve_studio(studio: Any, token: str, *, wrap: Callable[[Any], Any] | None = None) -> Iterator[tuple[str, Any]]:
    """``(base URL, the ASGI app served)``; ``wrap`` (e.g. a request recorder) wraps the app before it is served."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    app = build_app(studio, token=token, host="127.0.0.1", port=port)
    if wrap is not None:
        app = wrap(app)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
