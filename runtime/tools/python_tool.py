"""The built-in ``python`` tool: the model's snippet run isolated from the machine, bounded, its output the result.

The model calls ``python`` with ``{"code": "..."}``. The snippet runs as :func:`sailrl.runtime.sandbox.snippet.run_code`
runs it: a fresh namespace per call (nothing carries over from one call to the next), and the value of a last
expression printed as a Python shell shows it (``sum(range(10))`` alone answers ``45``). The tool's result is
what the snippet printed (stdout and stderr, in order); a snippet that prints nothing answers
:data:`NO_OUTPUT`.

Where it runs is ``environment.sandbox``:

* ``worker`` (the default): :class:`PythonTool`, each call a fresh process in its own Linux namespaces
  (:mod:`sailrl.runtime.sandbox.bubblewrap`): no keys, no file of the user's, no network, no descriptor back into the run,
  no process that outlives the call, and bounded time, memory, output, files and processes. Where that isolation
  is unavailable, a spec with the python tool is refused (``sailrl validate``: S255) -- never run unisolated.
* ``unisolated_worker``: :class:`UnisolatedPythonTool`, the snippet in a process forked from a worker
  (:class:`sailrl.runtime.sandbox.workers.WorkerPool`, ``kind: python_tool``), bounded in time, memory, output and
  processes but able to read the machine's files and reach its network, as the user running sailrl. Only for
  code you would run yourself; ``sailrl validate`` warns (W133).
* ``sail``: a Sailbox (:mod:`sailrl.runtime.tools.sailbox`).

Each failure is a *tool error* -- a tool message ``{"error": ..., "output": <what it printed before>}`` that the
model reads, with a kind counted in ``episode/tool_errors`` -- never an exception in the training loop:
``raised`` (names the exception and the snippet's line), ``timeout``, ``memory``, ``output``, ``died`` (killed
by a signal, e.g. a crash in C code, or exited without a result), ``sandbox`` (the sandbox itself failed), ``code``
(no code, or more than :data:`MAX_CODE_CHARS` characters).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from tinker_cookbook.tool_use import ToolInput, ToolResult, simple_tool_result

from sailrl.runtime.sandbox import snippet
from sailrl.runtime.sandbox.bubblewrap import DEFAULT_DISK_MB, Limits, run_isolated
from sailrl.runtime.sandbox.redact import redact
from sailrl.runtime.sandbox.workers import WorkerPool, WorkerStartError, limit_memory

__all__ = ["MAX_CODE_CHARS", "NO_OUTPUT", "SPEC", "PythonTool", "SnippetJob", "SnippetOutcome",
           "UnisolatedPythonTool", "snippet_error"]

#: The tool as the model sees it (a cookbook ``ToolSpec``).
SPEC: dict[str, Any] = {
    "name": "python",
    "description": "Run Python 3 code and read what it printed. When the last line is an expression, its value is "
                   "printed too, as in a Python shell. Each call starts afresh: define what you need in the same "
                   "call. Only the standard library.",
    "parameters": {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python code to run."}},
        "required": ["code"],
    },
}
#: Longest snippet accepted.
MAX_CODE_CHARS = 20_000
#: Largest file a snippet may write in its folder (unisolated worker).
MAX_FILE_BYTES = 16 * 2**20
#: The result of a snippet that printed nothing.
NO_OUTPUT = "(the code ran and printed nothing)"
#: Worker processes for the unisolated python tool.
POOL_SIZE = min(4, os.cpu_count() or 1)
#: Seconds the worker may take beyond the snippet's limit (the fork, the kill, the clean-up).
_SLACK_S = 2.0


def snippet_error(message: str, output: str = "") -> str:
    """A snippet's tool error as the model reads it: ``{"error": message, "output": output}``."""
    return json.dumps({"error": message, **({"output": output} if output else {})}, ensure_ascii=False)


@dataclass
class SnippetOutcome:
    """One snippet's outcome: ``content`` (the tool message) and ``error`` (None, or its kind)."""

    content: str
    error: str | None = None


# ------------------------------------------------------------------------------------------------ child side


def _in_fork(code: str, out_w: int, res_w: int, workdir: str, memory_mb: int) -> None:
    """The forked process: limits on, stdout/stderr into the pipe, run, the outcome as JSON on ``res_w``."""
    status = 3
    try:
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the worker's request pipe is not the snippet's to write into
        res_w = _only_descriptors(res_w)  # nor its reply pipe
        os.chdir(workdir)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
        limit_memory(memory_mb)
        try:
            snippet.run_code(code)
            outcome: dict[str, Any] = {"ok": True}
        except MemoryError:
            outcome = {"ok": False, "kind": "memory"}
        except BaseException as exc:  # noqa: BLE001 - the snippet's failure is the model's tool error
            outcome = {"ok": False, "kind": "raised", "message": snippet.error_text(exc)}
        try:  # what the snippet printed, out before it reports
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001 - a snippet that closed its streams
            pass
        os.write(res_w, json.dumps(outcome).encode()[:4096])
        status = 0
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        status = 4
    finally:
        os._exit(status)


def _only_descriptors(keep: int) -> int:
    """Close every descriptor but 0, 1, 2 and ``keep`` (moved to 3); the new number of ``keep``."""
    os.dup2(keep, 3)
    os.closerange(4, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1 << 16)
    return 3


class SnippetJob:
    """The unisolated worker's side (``kind: python_tool``): each ``run`` request forks a process for its snippet,
    which may not start processes (``RLIMIT_NPROC`` 0, not binding root) nor write files over
    :data:`MAX_FILE_BYTES`, runs in an empty temporary folder and holds no descriptor of the worker's; answers
    ``{"result": "ok", "output", "error", "message"}``."""

    def __init__(self, init: dict[str, Any]) -> None:
        self.info: dict[str, Any] = {}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        code = str(req["code"])
        limit_s = float(req["snippet_timeout_s"])
        max_chars = int(req["limits"]["max_output_chars"])
        cap = 4 * max_chars + 4  # bytes read before the output is certainly too long
        workdir = tempfile.mkdtemp(prefix="sailrl-python-")
        out_r, out_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            pid = os.fork()
            if pid == 0:
                os.close(out_r)
                os.close(res_r)
                _in_fork(code, out_w, res_w, workdir, int(req["limits"]["memory_mb"]))
            os.close(out_w)
            os.close(res_w)
            out, res, error = bytearray(), bytearray(), None
            deadline = time.monotonic() + limit_s
            open_fds = {out_r, res_r}
            while open_fds:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    error = "timeout"
                    break
                ready, _, _ = select.select(list(open_fds), [], [], wait)
                for fd in ready:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        open_fds.discard(fd)
                    elif fd == out_r:
                        out += chunk
                    elif len(res) < 8192:
                        res += chunk
                if len(out) > cap:
                    error = "output"
                    break
            if error is not None:
                os.kill(pid, signal.SIGKILL)
            _, wstatus = os.waitpid(pid, 0)
        finally:
            for fd in (out_r, res_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(workdir, ignore_errors=True)
        text = bytes(out).decode("utf-8", "replace")
        if error is None and len(text) > max_chars:
            error = "output"
        if error is not None:
            return {"result": "ok", "error": error, "output": text[:max_chars]}
        try:
            outcome = json.loads(bytes(res).decode()) if res else None
        except ValueError:
            outcome = None
        if outcome is None:
            sig = -os.waitstatus_to_exitcode(wstatus) if os.WIFSIGNALED(wstatus) else None
            return {"result": "ok", "error": "died", "output": text,
                    "message": f"killed by signal {signal.Signals(sig).name}" if sig else "exited without a result"}
        if outcome["ok"]:
            return {"result": "ok", "error": None, "output": text}
        return {"result": "ok", "error": outcome["kind"], "output": text, "message": outcome.get("message", "")}


# ------------------------------------------------------------------------------------------------ parent side


def describe_outcome(error: str | None, output: str, message: str, *, timeout_s: float, memory_mb: int,
                     max_output_chars: int) -> SnippetOutcome:
    """The tool message for one snippet's outcome (shared by every sandbox), with no secret of this process's
    environment in it (:func:`~sailrl.runtime.sandbox.redact.redact`)."""
    output, message = redact(output), redact(message)
    if error is None:
        return SnippetOutcome(output if output.strip() else NO_OUTPUT)
    words = {
        "raised": f"the code raised {message}",
        "timeout": f"the code ran longer than {timeout_s:g} s and was stopped",
        "memory": f"the code used more than its memory limit ({memory_mb} MiB)",
        "output": f"the code printed more than {max_output_chars} characters and was stopped",
        "died": f"the code's process died ({message})" if message else "the code's process died",
    }.get(error, message or error)
    return SnippetOutcome(snippet_error(words, output[:max_output_chars]), error)


def check_code(arguments: dict[str, Any]) -> tuple[str | None, SnippetOutcome | None]:
    """(the snippet, None) or (None, the tool error for arguments without usable code)."""
    code = arguments.get("code") if isinstance(arguments, dict) else None
    if not isinstance(code, str) or not code.strip():
        return None, SnippetOutcome(snippet_error('call python with {"code": "<Python code>"}'), "code")
    if len(code) > MAX_CODE_CHARS:
        return None, SnippetOutcome(snippet_error(f"the code is {len(code)} characters; at most {MAX_CODE_CHARS}"),
                                    "code")
    return code, None


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> WorkerPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkerPool({"kind": "python_tool", "job": "sailrl.runtime.tools.python_tool:SnippetJob"}, size=POOL_SIZE, start_timeout_s=60)
        return _POOL


class _SnippetTool:
    """What both local python tools share as a cookbook :class:`~tinker_cookbook.tool_use.Tool`: the declaration,
    and ``run``, which calls the subclass's blocking ``call`` off the event loop."""

    name = "python"
    description = SPEC["description"]
    parameters_schema = SPEC["parameters"]

    def to_spec(self) -> dict[str, Any]:
        return dict(SPEC)

    def call(self, arguments: dict[str, Any]) -> SnippetOutcome:
        raise NotImplementedError

    async def run(self, input: ToolInput) -> ToolResult:  # noqa: A002 - the cookbook's parameter name
        out = await asyncio.to_thread(self.call, input.arguments)
        result = simple_tool_result(out.content, call_id=input.call_id or "", name=self.name)
        if out.error:
            result.metadata["error"] = out.error
        return result


class PythonTool(_SnippetTool):
    """The built-in ``python`` tool, each call isolated in its own Linux namespaces (:mod:`sailrl.runtime.sandbox.bubblewrap`),
    as a cookbook :class:`~tinker_cookbook.tool_use.Tool`. ``timeout_s``, ``memory_mb``, ``max_output_chars``,
    ``disk_mb``, ``network``: the spec's tool entry."""

    def __init__(self, *, timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 4000,
                 disk_mb: int = DEFAULT_DISK_MB, network: bool = False) -> None:
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_chars = int(max_output_chars)
        self.limits = Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                             max_output_chars=self.max_output_chars, disk_mb=int(disk_mb), network=bool(network))

    def call(self, arguments: dict[str, Any]) -> SnippetOutcome:
        """Run the snippet of ``arguments`` in a fresh sandbox. Never raises; bounded by ``timeout_s`` plus half
        a second."""
        code, bad = check_code(arguments)
        if bad is not None:
            return bad
        try:
            found = run_isolated(code, self.limits)
        except (OSError, RuntimeError) as exc:  # bwrap could not start, or isolation is unavailable here
            return SnippetOutcome(snippet_error(f"the python tool's sandbox could not start: {exc}"), "sandbox")
        if found.error == "sandbox":
            return SnippetOutcome(snippet_error(f"the python tool's sandbox failed: {found.message}"), "sandbox")
        return describe_outcome(found.error, found.output, found.message, timeout_s=self.timeout_s,
                                memory_mb=self.memory_mb, max_output_chars=self.max_output_chars)


class UnisolatedPythonTool(_SnippetTool):
    """The built-in ``python`` tool in a process forked from a worker (``environment.sandbox: unisolated_worker``:
    not isolated from the machine), as a cookbook :class:`~tinker_cookbook.tool_use.Tool`. ``timeout_s``,
    ``memory_mb``, ``max_output_chars``: the spec's tool entry."""

    def __init__(self, *, timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 4000,
                 **_: Any) -> None:
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_chars = int(max_output_chars)

    def call(self, arguments: dict[str, Any]) -> SnippetOutcome:
        """Run the snippet of ``arguments`` in a worker. Never raises; bounded by ``timeout_s`` plus a few
        seconds (the worker's start on its first call aside)."""
        code, bad = check_code(arguments)
        if bad is not None:
            return bad
        limits = {"memory_mb": self.memory_mb, "max_output_chars": self.max_output_chars}
        try:
            reply = _pool().call({"op": "run", "code": code, "snippet_timeout_s": self.timeout_s, "limits": limits},
                                 self.timeout_s + _SLACK_S)
        except WorkerStartError as exc:
            return SnippetOutcome(snippet_error(f"the python tool cannot start: {exc}"), "died")
        except Exception as exc:  # noqa: BLE001 - e.g. a snippet too large to send
            return SnippetOutcome(snippet_error(f"the code could not be sent to the worker ({exc})"), "died")
        if reply.get("result") != "ok":
            kind = "timeout" if reply.get("result") == "timeout" else "died"
            return describe_outcome(kind, "", str(reply.get("message", "")), timeout_s=self.timeout_s,
                                    memory_mb=self.memory_mb, max_output_chars=self.max_output_chars)
        return describe_outcome(reply.get("error"), str(reply.get("output", "")), str(reply.get("message", "")),
                                timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                                max_output_chars=self.max_output_chars)
