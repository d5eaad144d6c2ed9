"""The python tool's code run in a Sailbox (``environment.sandbox: sail``), through ``sail.tinker.TinkerSandbox``.

:class:`SailboxPythonTool` is the built-in ``python`` tool with the same arguments, result and tool errors as the
worker one (:mod:`sailrl.runtime.tools.python_tool`), except where the code runs: each call is one fresh ``python3``
process in a Sailbox, started by ``TinkerSandbox.run_command`` (the cookbook's sandbox interface, which sail
0.17.1 implements on a Sailbox). The snippet's runner is :mod:`sailrl.runtime.sandbox.snippet`'s own source, sent in the
command with the snippet base64-encoded, so the last-expression rule and the error text are the same in both
sandboxes.

One Sailbox per run: created on the first call (``Sailbox.create`` on the prebuilt Debian base, whose stock
``python3`` needs no image build, in the app ``$SAIL_APP`` or ``sailrl``), shared by every episode, terminated by
:meth:`SailboxPythonTool.aclose` when the run ends. Calls share its file system (each runs in its own
``mktemp -d`` folder); nothing else carries over between them.

Bounded, and never a hang: the Sailbox's start is awaited at most :data:`CREATE_TIMEOUT_S` seconds (a start that
answers later is terminated when it does); each command gets the tool's ``timeout_s`` on the Sailbox and at most
:data:`SLACK_S` more on this side (a Sail that does not answer is a ``sandbox`` tool error); its output is cut at
``max_output_chars``; memory is capped inside the Sailbox (``RLIMIT_AS`` of the python3 process, as in a worker).
Every Sail failure -- a start refused or timed out, a command the service could not run, a Sailbox that was
terminated (the next call starts a new one; so does the :data:`MAX_SANDBOX_ERRORS`-th failed call in a row) --
is a tool error of kind ``sandbox`` that the model reads and
``episode/tool_errors`` counts. After :data:`MAX_START_FAILURES` failed starts the tool stops trying for the run
and answers each call with the last start's error at once.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import os
import shlex
import uuid
from typing import Any

import sail
from sail.errors import SailError
from sail.tinker import TinkerSandbox
from tinker_cookbook.sandbox.sandbox_interface import SandboxTerminatedError
from tinker_cookbook.tool_use import ToolInput, ToolResult, simple_tool_result

from sailrl.runtime.sandbox import snippet
from sailrl.runtime.tools.python_tool import SPEC, SnippetOutcome, check_code, describe_outcome, snippet_error

__all__ = ["CREATE_TIMEOUT_S", "MAX_SANDBOX_ERRORS", "MAX_START_FAILURES", "SLACK_S", "SailboxPythonTool",
           "remote_command", "sail_key_problem"]

#: Seconds the Sailbox's start may take before the call is a tool error.
CREATE_TIMEOUT_S = 180.0
#: Seconds a command may take on this side beyond its own limit (the round trips, the kill on a timeout).
SLACK_S = 30.0
#: Failed starts after which the tool stops starting Sailboxes for the run.
MAX_START_FAILURES = 3
#: Consecutive calls the Sailbox could not run after which it is replaced by a new one.
MAX_SANDBOX_ERRORS = 2
#: App the Sailboxes are created in when ``SAIL_APP`` is unset.
DEFAULT_APP = "sailrl"


def sail_key_problem() -> str | None:
    """Why the Sail sandbox cannot be used from this process's environment, or None (the key itself is never
    shown). The sail SDK also reads ``~/.sail`` credentials (``sail auth login``)."""
    if os.environ.get("SAIL_API_KEY"):
        return None
    home = os.environ.get("SAIL_HOME") or os.path.join(os.path.expanduser("~"), ".sail")
    if os.path.isdir(home) and os.listdir(home):
        return None
    return ("SAIL_API_KEY is not set, and the python tool's code runs in a Sailbox. Export SAIL_API_KEY (or run "
            "`sail auth login`), or set environment.sandbox: worker to run it on this machine")


_RUNNER_TAIL = '''
def _limit_memory(mb):
    import resource
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + mb * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (OSError, ValueError):
        pass


import base64, os
_limit_memory({memory_mb})
sys.exit(main(base64.b64decode("{code}").decode("utf-8")))
'''


def remote_command(code: str, memory_mb: int) -> str:
    """The shell command that runs ``code`` in a Sailbox: a fresh folder, then ``python3 -c`` with
    :mod:`sailrl.runtime.sandbox.snippet`'s source, a memory cap and the snippet (base64, so no quoting can break it)."""
    source = inspect.getsource(snippet) + _RUNNER_TAIL.format(
        memory_mb=int(memory_mb), code=base64.b64encode(code.encode("utf-8")).decode("ascii"))
    return 'cd "$(mktemp -d)" && exec python3 -c ' + shlex.quote(source)


def read_result(result: Any, *, max_output_chars: int) -> tuple[str | None, str, str]:
    """(error kind or None, output, message) of a ``SandboxResult`` of :func:`remote_command`."""
    metrics = getattr(result, "metrics", None) or {}
    stdout, stderr = str(result.stdout or ""), str(result.stderr or "")
    mark = stderr.rfind(snippet.ERROR_MARK)
    message = ""
    if mark >= 0:
        message = stderr[mark + len(snippet.ERROR_MARK):].strip()
        stderr = stderr[:mark].rstrip("\n")
    output = stdout + (stderr if not stdout or stdout.endswith("\n") or not stderr else "\n" + stderr)
    if metrics.get("timed_out"):
        return "timeout", output, ""
    if metrics.get("stdout_truncated") or metrics.get("stderr_truncated") or len(output) > max_output_chars:
        return "output", output, ""
    if mark >= 0:
        return ("memory" if message.startswith("MemoryError") else "raised"), output, message
    if result.exit_code == 0:
        return None, output, ""
    if result.exit_code == -1:  # the SDK's answer for a Sail error (the command did not run, or was lost)
        return "sandbox", "", (str(result.stderr or "") or "the Sailbox did not run the command")[:300]
    if result.exit_code is not None and result.exit_code > 128:
        return "died", output, f"killed by signal {result.exit_code - 128}"
    return "died", output, f"python3 exited with code {result.exit_code}"


class SailboxPythonTool:
    """The built-in ``python`` tool in a Sailbox (see the module docstring), as a cookbook ``Tool``.

    ``timeout_s``, ``memory_mb``, ``max_output_chars``: the spec's tool entry; ``app``: the Sail app (default
    ``$SAIL_APP`` or ``sailrl``); ``size``: the Sailbox size (``s``, ``m``, ``l``)."""

    name = "python"
    description = SPEC["description"]
    parameters_schema = SPEC["parameters"]

    def __init__(self, *, timeout_s: float = 5.0, memory_mb: int = 512, max_output_chars: int = 4000,
                 app: str | None = None, size: str = "s", create_timeout_s: float = CREATE_TIMEOUT_S,
                 slack_s: float = SLACK_S) -> None:
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_output_chars = int(max_output_chars)
        self.app = app
        self.size = size
        self.create_timeout_s = float(create_timeout_s)
        self.slack_s = float(slack_s)
        self.sandbox: TinkerSandbox | None = None
        self.starts = 0
        self.start_failures = 0
        self.last_start_error = ""
        self.sandbox_errors = 0  # consecutive calls the Sailbox could not run
        self._locks: dict[Any, asyncio.Lock] = {}

    def to_spec(self) -> dict[str, Any]:
        return dict(SPEC)

    def _outcome(self, error: str | None, output: str, message: str) -> SnippetOutcome:
        if error == "sandbox":
            return SnippetOutcome(snippet_error(f"the Sailbox could not run the code: {message}"), "sandbox")
        return describe_outcome(error, output, message, timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                                max_output_chars=self.max_output_chars)

    async def _sailbox(self) -> TinkerSandbox:
        """The run's Sailbox, started on first use. Raises :class:`RuntimeError` with plain words when it cannot
        start within :data:`CREATE_TIMEOUT_S` seconds."""
        if self.sandbox is not None:
            return self.sandbox
        loop = asyncio.get_running_loop()
        lock = self._locks.setdefault(loop, asyncio.Lock())
        async with lock:
            if self.sandbox is not None:
                return self.sandbox
            if self.start_failures >= MAX_START_FAILURES:
                raise RuntimeError(f"{self.start_failures} Sailbox starts failed; the last: {self.last_start_error}")
            self.starts += 1
            task = asyncio.ensure_future(self._create())
            done, _ = await asyncio.wait({task}, timeout=self.create_timeout_s)
            if not done:
                task.add_done_callback(_terminate_late_start)
                self.start_failures += 1
                self.last_start_error = f"the Sailbox did not start within {self.create_timeout_s:g} s"
                raise RuntimeError(self.last_start_error)
            try:
                self.sandbox = TinkerSandbox(task.result())
            except (SailError, OSError, ValueError) as exc:
                self.start_failures += 1
                self.last_start_error = f"the Sailbox did not start ({_short(exc)})"
                raise RuntimeError(self.last_start_error) from None
            return self.sandbox

    async def _create(self) -> Any:
        app = await sail.App.find.aio(self.app or os.environ.get("SAIL_APP") or DEFAULT_APP, mint_if_missing=True)
        return await sail.Sailbox.create.aio(app=app, name=f"sailrl-python-{uuid.uuid4().hex[:8]}", size=self.size)

    async def call(self, arguments: dict[str, Any]) -> SnippetOutcome:
        """Run the snippet of ``arguments`` in the run's Sailbox. Never raises; bounded (see the module
        docstring)."""
        code, bad = check_code(arguments)
        if bad is not None:
            return bad
        try:
            box = await self._sailbox()
        except RuntimeError as exc:
            return self._outcome("sandbox", "", str(exc))
        command = remote_command(code, self.memory_mb)
        try:
            result = await asyncio.wait_for(
                box.run_command(command, timeout=self.timeout_s, max_output_bytes=4 * self.max_output_chars + 4),
                self.timeout_s + self.slack_s)
        except TimeoutError:
            return self._outcome("sandbox", "", f"Sail did not answer within {self.timeout_s + self.slack_s:g} s")
        except SandboxTerminatedError as exc:
            if self.sandbox is box:
                self.sandbox = None  # the next call starts a new Sailbox
            return self._outcome("sandbox", "", f"the Sailbox was terminated ({_short(exc)}); the next call "
                                 "starts a new one")
        except (SailError, OSError) as exc:
            return await self._sandbox_failed(box, _short(exc))
        error, output, message = read_result(result, max_output_chars=self.max_output_chars)
        if error == "sandbox":
            return await self._sandbox_failed(box, message)
        self.sandbox_errors = 0
        return self._outcome(error, output, message)

    async def _sandbox_failed(self, box: TinkerSandbox, message: str) -> SnippetOutcome:
        """A call the Sailbox could not run; the :data:`MAX_SANDBOX_ERRORS`-th in a row replaces the Sailbox
        (a terminated one answers so: the SDK does not always say it is gone)."""
        self.sandbox_errors += 1
        if self.sandbox_errors >= MAX_SANDBOX_ERRORS and self.sandbox is box:
            self.sandbox, self.sandbox_errors = None, 0
            try:
                await asyncio.wait_for(box.cleanup(), 30)
            except (TimeoutError, SailError, OSError, SandboxTerminatedError):
                pass
            message += "; the next call starts a new Sailbox"
        return self._outcome("sandbox", "", message)

    async def run(self, input: ToolInput) -> ToolResult:  # noqa: A002 - the cookbook's parameter name
        out = await self.call(input.arguments)
        result = simple_tool_result(out.content, call_id=input.call_id or "", name=self.name)
        if out.error:
            result.metadata["error"] = out.error
        return result

    async def aclose(self) -> None:
        """Terminate the run's Sailbox (if one was started); bounded, never raises."""
        box, self.sandbox = self.sandbox, None
        if box is None:
            return
        try:
            await asyncio.wait_for(box.cleanup(), 60)
        except (TimeoutError, SailError, OSError, SandboxTerminatedError):
            pass


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _terminate_late_start(task: asyncio.Future) -> None:
    """A Sailbox whose start answered after the tool gave up on it: terminate it, so it is not left running."""
    if task.cancelled() or task.exception() is not None:
        return
    box = task.result()
    asyncio.ensure_future(box.terminate.aio())

