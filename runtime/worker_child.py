"""The child side of :class:`sailrl.runtime.workers.WorkerPool`: ``python -P -m sailrl.runtime.worker_child``.

It reads the ``init`` frame, loads its job (``math``: math-verify, :class:`_MathJob`; ``python``: a python reward
rule, :class:`sailrl.runtime.python_rules.PythonJob`; ``tool``: a tool of an environment,
:class:`sailrl.runtime.tools.ToolJob`; ``python_tool``: the built-in python tool's snippets,
:class:`sailrl.runtime.python_tool.SnippetJob`) and answers requests under the time limit, output capture and
memory limit that :mod:`sailrl.runtime.workers` defines. Its own module so that the pool (which the jobs' modules
import) imports none of them.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from sailrl.runtime.workers import (
    _Alarm,
    _Capture,
    _encode,
    _read_frame,
    _short_exc,
    _TimeLimit,
    limit_memory,
)


class _MathJob:
    """math-verify in the child: ``parse`` (is the text readable?) and ``equal`` (reference vs answer)."""

    def __init__(self, init: dict[str, Any]) -> None:
        # answers pulls in spec.rewards and pydantic: 0.4 s of every worker's start (python -X importtime)
        # lazy: a worker loads only its own job's module
        from sailrl.runtime import answers

        answers._mv()  # import math-verify (sympy) now, not in the first request's time limit
        self.answers = answers
        self.cache: dict[str, list[Any]] = {}
        self.info: dict[str, Any] = {}

    def _parse(self, text: str, timeout_s: float) -> list[Any]:
        hit = self.cache.get(text)
        if hit is not None:
            return hit
        with _TimeLimit(timeout_s):
            parsed = self.answers.math_parse_unlimited(text)
        if len(self.cache) >= 4096:
            self.cache.clear()
        self.cache[text] = parsed
        return parsed

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        t = float(req["timeout_s"]) / 3  # up to three math-verify steps share the request's limit
        try:
            if req["op"] == "parse":
                return {"result": "ok" if self._parse(req["text"], t) else "unreadable"}
            ref = self._parse(req["ref"], t)
            if not ref:
                return {"result": "ref_unreadable"}
            pred = self._parse(req["pred"], t)
            if not pred:
                return {"result": "pred_unreadable"}
            with _TimeLimit(t):
                ok = self.answers.math_equal_unlimited(ref, pred)
            return {"result": "equal" if ok else "unequal"}
        except _Alarm:
            return {"result": "timeout"}
        except Exception as exc:  # noqa: BLE001 - a math-verify bug fails this comparison only
            return {"result": "error", "message": _short_exc(exc)}



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
        if init.get("kind") == "math":
            job: Any = _MathJob(init)
        elif init.get("kind") == "python":
            from sailrl.runtime.python_rules import PythonJob  # lazy: a worker loads only its own job's module

            job = PythonJob(init)
        elif init.get("kind") == "tool":
            from sailrl.runtime.tools import ToolJob  # lazy: a worker loads only its own job's module

            job = ToolJob(init)
        elif init.get("kind") == "python_tool":
            from sailrl.runtime.python_tool import SnippetJob  # lazy: a worker loads only its own job's module

            job = SnippetJob(init)
        else:
            send({"ok": False, "error": "bad_kind", "message": f"unknown worker kind {init.get('kind')!r}"})
            return
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
    # (sailrl.runtime.workers._Alarm, ...) are the ones this loop catches.
    from sailrl.runtime.worker_child import _child_main as _main

    _main()
