"""The child side of :class:`sailrl.runtime.sandbox.workers.WorkerPool`: ``python -P -m sailrl.runtime.sandbox.worker_child``.

It reads the ``init`` frame, loads the job class it names (``init["job"]``, ``module:Class``: math-verify,
:class:`sailrl.runtime.rewards.answers.MathJob`; a python reward rule,
:class:`sailrl.runtime.rewards.python_rules.PythonJob`; a tool of an environment,
:class:`sailrl.runtime.tools.functions.ToolJob`; the built-in python tool's snippets,
:class:`sailrl.runtime.tools.python_tool.SnippetJob`) and answers requests under the time limit, output capture and
memory limit that :mod:`sailrl.runtime.sandbox.workers` defines. The jobs are named, not imported, so that the sandbox package
(which the jobs' modules import) imports none of them.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import Any

from sailrl.runtime.sandbox.workers import (
    WorkerStartError,
    _Alarm,
    _Capture,
    _encode,
    _read_frame,
    _short_exc,
    limit_memory,
)


def _job_class(init: dict[str, Any]) -> type:
    """The class ``init["job"]`` names (``module:Class``, a module of sailrl's runtime): the pool's creator says
    which job its children load, so this loop imports none of the jobs' modules."""
    module, _, name = str(init.get("job", "")).partition(":")
    if not module.startswith("sailrl.runtime.") or not name:
        raise WorkerStartError(f"unknown worker job {init.get('job')!r}", reason="bad_kind")
    return getattr(importlib.import_module(module), name)


def _child_main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    proto_out = os.dup(1)
    capture = _Capture()  # print() in loaded code is captured per call, never written into the protocol
    for stream in (sys.stdout, sys.stderr):  # flushed at each line, so a call's output is whole when it returns
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)
    inp = sys.stdin.buffer.fileno()

    def send(obj: Any) -> None:
        data = _encode(obj)
        view = memoryview(data)
        while view:
            n = os.write(proto_out, view)
            view = view[n:]

    init = _read_frame(inp)
    if init is None:
        return
    try:
        job: Any = _job_class(init)(init)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides what to say
        reason = getattr(exc, "reason", "error")
        send({"ok": False, "error": reason, "message": str(exc) if reason != "error" else _short_exc(exc)})
        return
    if init.get("memory_mb") is not None:
        limit = limit_memory(float(init["memory_mb"]))
        job.info = {**job.info, "memory_limit": limit}
    output, printed, lines = capture.take()
    send({"ok": True, **job.info, **({"output": output, "output_bytes": printed, "output_lines": lines}
                                     if printed else {})})
    while True:
        req = _read_frame(inp)
        if req is None:
            return
        try:
            reply = job.handle(req)
        except _Alarm:
            reply = {"result": "timeout"}
        except MemoryError:
            reply = {"result": "memory"}
        output, printed, lines = capture.take()
        if printed:
            reply = {**reply, "output": output, "output_bytes": printed, "output_lines": lines}
        send(reply)


if __name__ == "__main__":
    # Run the child from the module under its real name, so that the classes the loaded jobs import
    # (sailrl.runtime.sandbox.workers._Alarm, ...) are the ones this loop catches.
    from sailrl.runtime.sandbox.worker_child import _child_main as _main

    _main()
