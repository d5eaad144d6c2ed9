"""Tools the model may call in an episode: a Python function next to the spec, run in worker processes.

A spec names a tool as ``function: module:function`` (``tools:lookup`` is the function ``lookup`` in
``tools.py`` next to the spec; a dotted module is a package folder, as for python reward rules). The function's
file is imported only in worker processes (:class:`sailrl.runtime.sandbox.workers.WorkerPool`, ``kind: tool``), never in
the run's own process. There the function is wrapped in tinker_cookbook's :class:`~tinker_cookbook.tool_use.
FunctionTool`, so its schema (name, the docstring as the description, the parameters' type hints and defaults
as a JSON Schema) and the checking of the model's arguments are the cookbook's ``@tool``'s.

The function returns text, a number or JSON-able data (turned into JSON); a function that returns nothing gives
what it printed. Every call is bounded; each of these becomes a *tool error* -- a tool message to the model
that says what went wrong (``{"error": ...}``, as the cookbook's ``error_tool_result`` writes it) and a counted
``tool_errors`` metric -- never an exception in the training loop:

* the arguments do not fit the parameters (the cookbook's validation);
* the function raises (the message names the file and line);
* it runs past ``timeout_s`` (the worker interrupts it with SIGALRM; one that does not stop is killed
  :data:`~sailrl.runtime.sandbox.workers.GRACE_S` seconds later and replaced);
* it allocates more than ``memory_mb`` (the worker's address-space limit, Linux);
* it returns or prints more than ``max_output_chars`` characters, or returns something that is not JSON-able.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import json
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sailrl.runtime.rewards.python_rules import (
    IMPORT_TIMEOUT_S,
    _exc_text,
    _LoadError,
    _user_frame,
    describe,
    file_version,
    import_user_module,
    module_file,
    split_ref,
)
from sailrl.runtime.sandbox.redact import redact
from sailrl.runtime.sandbox.workers import PoolCache, WorkerPool, WorkerStartError, _Alarm, _TimeLimit, limit_memory
from sailrl.spec.errors import SailrlError

__all__ = ["POOL_SIZE", "ToolFunction", "ToolOutcome"]

#: Worker processes per tool file.
POOL_SIZE = min(4, os.cpu_count() or 1)
#: Seconds a worker may take to build one function's schema (the module is already imported).
_LOAD_TIMEOUT_S = 10.0


# ------------------------------------------------------------------------------------------------ child side


class _TooMuchOutput(SailrlError):
    pass


class _BoundedText(io.StringIO):
    """stdout during a call: raises :class:`_TooMuchOutput` past ``limit`` characters."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def write(self, s: str) -> int:
        if self.tell() + len(s) > self.limit:
            raise _TooMuchOutput
        return super().write(s)


@contextlib.contextmanager
def _memory_limit(mb: int):
    """Lets the block allocate about ``mb`` MiB more address space (:func:`~sailrl.runtime.sandbox.workers.limit_memory`),
    then puts the limit back; no-op off Linux."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if limit_memory(mb) is None:
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


class ToolJob:
    """The worker side (``kind: tool``): import the file once, then ``load`` (a function's ToolSpec) and ``call``
    requests. Raises :class:`_LoadError` with a reason when the file cannot be imported."""

    def __init__(self, init: dict[str, Any]) -> None:
        # lazy: only tool workers pay for the cookbook's import; the run's own process never imports the user file
        from tinker_cookbook.tool_use import FunctionTool, ToolInput, error_tool_result, simple_tool_result

        self._FunctionTool, self._ToolInput = FunctionTool, ToolInput
        self._error, self._ok = error_tool_result, simple_tool_result
        self.root, self.rel, self.module = import_user_module(init["spec_dir"], init["module"], init.get("frozen"))
        self.tools: dict[str, Any] = {}
        self.info: dict[str, Any] = {"file": self.rel}

    def _build(self, func: str, limits: dict[str, Any]) -> Any:
        fn = getattr(self.module, func, None)
        label = f"{self.rel}:{func}"
        if fn is None:
            raise _LoadError("missing_function", f"{self.rel} has no function '{func}'")
        if not inspect.isfunction(fn):
            raise _LoadError("not_callable", f"{label} is a {type(fn).__name__}, not a def function")
        if inspect.iscoroutinefunction(fn):
            raise _LoadError("signature", f"{label} is an async def; write a plain def")
        params = inspect.signature(fn).parameters.values()
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY) for p in params):
            raise _LoadError("signature", f"{label} takes *args, **kwargs or positional-only parameters; the model "
                             "passes named arguments, so name each parameter")
        untyped = [p.name for p in params if p.annotation is inspect.Parameter.empty]
        if untyped:
            raise _LoadError("signature", f"{label}: parameter {', '.join(untyped)} has no type hint; the model "
                             f"learns each argument's type from it (e.g. {untyped[0]}: str)")
        max_chars = int(limits["max_output_chars"])
        error, ok, root = self._error, self._ok, self.root

        @functools.wraps(fn)
        def run(**kwargs: Any) -> Any:
            out = _BoundedText(max_chars)
            try:
                with contextlib.redirect_stdout(out), _memory_limit(int(limits["memory_mb"])):
                    value = fn(**kwargs)
            except _TooMuchOutput:
                return error(f"the tool printed more than {max_chars} characters", name=func, error_type="output")
            except MemoryError:
                return error(f"the tool used more than its memory limit ({limits['memory_mb']} MiB)",
                             name=func, error_type="memory")
            except _Alarm:
                raise
            except BaseException as exc:  # noqa: BLE001 - the user's exception is the model's tool error
                return error(f"the tool raised {_exc_text(exc)}{_user_frame(exc, root)}", name=func,
                             error_type="raised")
            try:
                text = out.getvalue() if value is None else _as_text(value)
            except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: data nested ~1000 deep
                return error(f"the tool returned a {type(value).__name__} that is not text or JSON ({exc})",
                             name=func, error_type="result")
            if len(text) > max_chars:
                return error(f"the tool's result is {len(text)} characters; at most {max_chars}", name=func,
                             error_type="output")
            return ok(text, name=func)

        try:
            tool = self._FunctionTool(run)
            tool.to_spec()
        except Exception as exc:  # noqa: BLE001 - a type hint pydantic cannot turn into a schema
            raise _LoadError("signature", f"{label}: its parameters' type hints cannot be described to the model "
                             f"({_exc_text(exc)})") from None
        return tool

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        import asyncio  # lazy: the child's own loop for the cookbook's async Tool.run

        func = req["function"]
        tool = self.tools.get(func)
        if tool is None:
            try:
                tool = self._build(func, req["limits"])
            except _LoadError as exc:
                return {"result": "unloadable", "error": exc.reason, "message": str(exc)}
            self.tools[func] = tool
        if req["op"] == "load":
            return {"result": "ok", "spec": json.loads(json.dumps(tool.to_spec()))}
        limit = _TimeLimit(float(req["timeout_s"]))
        try:
            with limit:
                result = asyncio.run(tool.run(self._ToolInput(arguments=req["arguments"],
                                                              call_id=req.get("call_id"))))
        except _Alarm:
            return {"result": "timeout"}
        if limit.fired:
            return {"result": "timeout"}
        content = result.messages[0]["content"] if result.messages else ""
        return {"result": "ok", "content": content if isinstance(content, str) else str(content),
                "error": result.metadata.get("error")}


# ------------------------------------------------------------------------------------------------ parent side


@dataclass
class ToolOutcome:
    """One call's outcome: ``content`` (the tool message's text) and ``error`` (None, or a short kind:
    ``validation_failed``, ``raised``, ``timeout``, ``memory``, ``output``, ``result``, ``died``, ``unloadable``)."""

    content: str
    error: str | None = None


_POOLS = PoolCache()


def error_text(message: str) -> str:
    """A tool error's message as the model reads it (the cookbook's ``error_tool_result`` shape)."""
    return json.dumps({"error": message})


class ToolFunction:
    """A ``function:`` tool next to ``spec_dir``, loaded and called in worker processes (one pool per file
    version). ``limits``: ``timeout_s``, ``memory_mb``, ``max_output_chars`` (the spec's tool entry)."""

    def __init__(self, spec_dir: Path | str, ref: str, *, timeout_s: float = 5.0, memory_mb: int = 512,
                 max_output_chars: int = 4000, env: list[str] | None = None) -> None:
        self.spec_dir = Path(spec_dir).resolve()
        self.env = list(env or [])
        self.ref = ref
        self.module, self.function = split_ref(ref)
        self.name = self.function
        self.label = describe(ref)
        self.timeout_s = float(timeout_s)
        self.limits = {"memory_mb": int(memory_mb), "max_output_chars": int(max_output_chars)}
        self._spec: dict[str, Any] | None = None

    def _pool(self) -> WorkerPool:
        path = module_file(self.spec_dir, self.module)
        version, frozen = file_version(path, self.spec_dir)
        key = (str(self.spec_dir), self.module, tuple(self.env), str(path), version)
        return _POOLS.get(key, key[:3], lambda: WorkerPool(
            {"kind": "tool", "job": "sailrl.runtime.tools.functions:ToolJob", "spec_dir": str(self.spec_dir), "module": self.module,
             **({"frozen": frozen} if frozen is not None else {})},
            size=POOL_SIZE, start_timeout_s=IMPORT_TIMEOUT_S + 30, cwd=str(self.spec_dir), env_names=self.env))

    def load(self) -> tuple[dict[str, Any] | None, tuple[str, str] | None]:
        """(the tool's ToolSpec: name, description, parameters) or (None, (code, plain words)). Bounded in time."""
        if self._spec is not None:
            return self._spec, None
        if module_file(self.spec_dir, self.module) is None:
            want = self.module.replace(".", "/") + ".py"
            return None, ("missing_module", f"there is no file {want} next to the spec (in {self.spec_dir})")
        try:
            reply = self._pool().call({"op": "load", "function": self.function, "limits": self.limits},
                                      _LOAD_TIMEOUT_S)
        except WorkerStartError as exc:
            return None, (exc.reason, str(exc))
        except Exception as exc:  # noqa: BLE001 - e.g. the interpreter cannot be started
            return None, ("died", f"the worker process could not start ({_exc_text(exc)})")
        if reply.get("result") == "ok":
            self._spec = reply["spec"]
            return self._spec, None
        if reply.get("result") == "unloadable":
            return None, (str(reply.get("error", "error")), str(reply.get("message", "")))
        if reply.get("result") == "timeout":
            return None, ("timeout", f"loading {self.label} took longer than {_LOAD_TIMEOUT_S:g} s")
        return None, (str(reply.get("result")), str(reply.get("message", "")))

    def call(self, arguments: dict[str, Any], call_id: str | None = None) -> ToolOutcome:
        """Run the tool on ``arguments`` in a worker within ``timeout_s``. Never raises."""
        try:
            reply = self._pool().call({"op": "call", "function": self.function, "limits": self.limits,
                                       "arguments": arguments, "call_id": call_id}, self.timeout_s)
        except WorkerStartError as exc:
            return ToolOutcome(error_text(f"the tool cannot be loaded: {exc}"), "unloadable")
        except Exception as exc:  # noqa: BLE001 - arguments that cannot be sent
            return ToolOutcome(error_text(f"the tool could not be called: {_exc_text(exc)}"), "died")
        result = reply.get("result")
        if result == "ok":  # a key the tool printed or returned never reaches the model's next prompt
            return ToolOutcome(redact(str(reply.get("content", ""))), reply.get("error"))
        if result == "timeout":
            return ToolOutcome(error_text(f"the tool took longer than {self.timeout_s:g} s and was stopped"),
                               "timeout")
        if result == "unloadable":
            return ToolOutcome(error_text(str(reply.get("message", "the tool cannot be loaded"))), "unloadable")
        return ToolOutcome(error_text(str(reply.get("message") or "the tool's worker process stopped")), "died")
