"""``kind: python`` reward rules: a function in a Python file next to the spec, run in worker processes.

The rule names it as ``function: module:function``. ``module`` is a file next to the spec: ``rewards`` is
``<spec dir>/rewards.py``; a dotted name is a package folder (``pkg.scoring`` is ``<spec dir>/pkg/scoring.py`` or
``<spec dir>/pkg/scoring/__init__.py``). The spec's folder is put first on the worker's ``sys.path`` (so the
file can import its neighbours) and is its working directory.

The contract (checked by ``sailrl validate``, enforced while scoring):

* signature: ``fn(completion: str, fields: dict) -> float | dict[str, float]``. ``completion`` is the text the
  rules read (``reward.text``); ``fields`` is a copy of the dataset row (its field names -> values), so changing
  it changes nothing. ``inspect.signature(fn).bind(completion, fields)`` must succeed; ``async def`` is refused.
* result: a finite number (``bool``, ``int``, ``float``, numpy scalars), or a dict of at most
  :data:`MAX_SUBSCORES` named finite numbers (names of at most :data:`SUBSCORE_NAME_CHARS` characters), whose
  sum is the value. Anything else fails the rule with the reason.
* time: each call may take ``timeout_s`` seconds (the rule's key, default 1). The worker interrupts the
  function at the limit (SIGALRM); a function that does not stop is killed :data:`GRACE_S` seconds later and its
  worker replaced. Loading the file may take :data:`IMPORT_TIMEOUT_S` seconds.
* memory: a worker may allocate ``memory_mb`` MiB (the rule's key, default :data:`DEFAULT_MEMORY_MB`) beyond
  what importing the file took (``RLIMIT_AS``, Linux); past it the allocation raises ``MemoryError`` and the
  call fails the rule with that reason.
* output: what a call prints is captured in its worker (never written to the run's terminal directly): the first
  :data:`~sailrl.runtime.sandbox.workers.MAX_OUTPUT_BYTES` come back with the result (``PythonResult.output``) and the
  rest is counted; a run shows the first lines of each step, prefixed with the rule's name, and a count of the
  rest (:class:`sailrl.runtime.rewards.scoring.StepScorer`).
* an exception, a timeout or a bad result fails the rule (its fail score), is counted and gives the reason
  with the file and line; it is never raised into the training loop.

Workers (:class:`sailrl.runtime.sandbox.workers.WorkerPool`, up to :data:`POOL_SIZE` processes per file) import the
file once and serve every function of it; one pool per file version (path, size, modification time) is shared by
the process, so an edited file is loaded afresh (the studio and ``sailrl rewards`` follow edits this way).

A run freezes its code instead (:func:`freeze_files`): each rule's and tool's file is read once when the run
opens, its sha256 goes into ``config.json``, and its workers -- a replaced one included -- run that text, so the
reward cannot change mid-run; a change on disk is ignored with one warning. Workers get no environment variable
of the run's but an allowlist (:func:`sailrl.runtime.sandbox.workers.worker_environment`) and the names the rule lists in
``env:``, so no key reaches a rule that does not ask for it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.abc
import importlib.util
import inspect
import math
import numbers
import os
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sailrl.runtime.sandbox.workers import GRACE_S, PoolCache, WorkerPool, WorkerStartError, _Alarm, _TimeLimit
from sailrl.spec.errors import SailrlError

__all__ = [
    "DEFAULT_MEMORY_MB",
    "GRACE_S",
    "IMPORT_TIMEOUT_S",
    "MAX_SUBSCORES",
    "POOL_SIZE",
    "SUBSCORE_NAME_CHARS",
    "PythonFunction",
    "PythonResult",
    "file_version",
    "freeze_files",
    "freeze_spec_code",
    "module_file",
    "split_ref",
]

#: Seconds a worker may take to import the rule's file.
IMPORT_TIMEOUT_S = 30.0
#: Most named sub-scores one call may return.
MAX_SUBSCORES = 32
#: Longest sub-score name.
SUBSCORE_NAME_CHARS = 64
#: MiB a rule's worker may allocate beyond what importing its file took (the rule's ``memory_mb`` default).
DEFAULT_MEMORY_MB = 1024
#: Worker processes per python function.
POOL_SIZE = min(4, os.cpu_count() or 1)


def split_ref(ref: str) -> tuple[str, str]:
    """``"pkg.mod:fn"`` -> ``("pkg.mod", "fn")`` (``ref`` as ``sailrl.spec.rewards.FUNCTION_REF`` checks it)."""
    module, _, func = ref.partition(":")
    return module, func


def module_file(spec_dir: Path, module: str) -> Path | None:
    """The file ``module`` names next to the spec (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``), or None."""
    base = Path(spec_dir).joinpath(*module.split("."))
    for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def describe(ref: str) -> str:
    """``"rewards:score"`` -> ``"rewards.py:score"`` (the file and function, as a user finds them)."""
    module, func = split_ref(ref)
    return f"{module.replace('.', '/')}.py:{func}"


# ------------------------------------------------------------------------------------------------ child side


class _LoadError(SailrlError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _user_frame(exc: BaseException, root: Path) -> str:
    """`` (at rewards.py:12)`` for the innermost traceback frame inside ``root``, else ``""``."""
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            rel = Path(frame.filename).resolve().relative_to(root)
        except (ValueError, OSError):
            continue
        where = f" (at {rel.as_posix()}:{frame.lineno})"
    return where


def _exc_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= 140 else text[:137] + "..."


class _FrozenFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the modules of the spec's folder from the text a run froze (:func:`freeze_spec_code`), so a worker
    that starts mid-run -- a replacement after a timeout -- runs the same code as the first."""

    def __init__(self, modules: dict[str, list[Any]]) -> None:
        self.modules = modules  # name -> [path, text, is_package]

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        found = self.modules.get(fullname)
        if found is None:
            return None
        spec = importlib.util.spec_from_loader(fullname, self, origin=found[0], is_package=bool(found[2]))
        if spec is not None:
            spec.has_location = True
        return spec

    def create_module(self, spec: Any) -> Any:
        return None

    def exec_module(self, module: Any) -> None:
        path, text, _ = self.modules[module.__name__]
        module.__file__ = path
        exec(compile(text, path, "exec"), module.__dict__)  # noqa: S102 - the user's own trusted rule file


def import_user_module(spec_dir: str | Path, module: str,
                       frozen: dict[str, list[Any]] | None = None) -> tuple[Path, str, Any]:
    """Import ``module`` from the file next to the spec, in a worker: ``(spec folder, file relative to it, the
    module)``; with ``frozen`` (module name -> [path, text, is package], :func:`file_version`), the spec folder's
    modules as a run froze them, served by :class:`_FrozenFinder`, and the folder itself not on ``sys.path``, so
    nothing of it is read from disk.
    Raises :class:`_LoadError` with a reason (missing file, an import that raises or overruns
    ``IMPORT_TIMEOUT_S``, a name shadowed by an installed module). Python rules and user tools load this way."""
    root = Path(spec_dir).resolve()
    path = module_file(root, module)
    if path is None:
        want = module.replace(".", "/") + ".py"
        raise _LoadError("missing_module", f"there is no file {want} next to the spec (in {root})")
    rel = path.resolve().relative_to(root).as_posix()
    if frozen is None:
        sys.path.insert(0, str(root))
    else:
        sys.meta_path.insert(0, _FrozenFinder(frozen))
    try:
        with _TimeLimit(IMPORT_TIMEOUT_S):
            mod = importlib.import_module(module)
    except _Alarm:
        raise _LoadError("import_error", f"importing {rel} took longer than {IMPORT_TIMEOUT_S:g} s") from None
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the user's file is reported, not raised
        raise _LoadError("import_error", f"importing {rel} raised {_exc_text(exc)}{_user_frame(exc, root)}") from None
    loaded_from = Path(getattr(mod, "__file__", "") or "").resolve()
    if loaded_from != path.resolve():
        raise _LoadError("shadowed", f"the name '{module}' is taken by the installed module {loaded_from}, so "
                         f"{rel} is never loaded: rename {rel} (and the function: key)")
    return root, rel, mod


class PythonJob:
    """The child side: import the module once (raising _LoadError with a reason), then answer ``load`` (check one
    function) and ``call`` requests."""

    def __init__(self, init: dict[str, Any]) -> None:
        self.root, self.rel, self.module = import_user_module(init["spec_dir"], init["module"], init.get("frozen"))
        self.functions: dict[str, Any] = {}
        self.info: dict[str, Any] = {"file": self.rel}

    def _function(self, func: str) -> tuple[Any, dict[str, Any]]:
        """The function and its info, or raises _LoadError."""
        mod = self.module
        label = f"{self.rel}:{func}"
        fn = getattr(mod, func, None)
        if fn is None:
            names = [n for n, v in vars(mod).items() if callable(v) and not n.startswith("_")
                     and getattr(v, "__module__", None) == mod.__name__]
            # lazy: spec.messages pulls in pydantic (~0.2 s); a worker child needs it only for this message
            from sailrl.spec.messages import did_you_mean_text

            hint = did_you_mean_text(func, names) or (
                f" (its functions: {', '.join(sorted(names)[:8])})" if names else "")
            raise _LoadError("missing_function", f"{self.rel} has no function '{func}'{hint}")
        if not callable(fn):
            raise _LoadError("not_callable", f"{label} is a {type(fn).__name__}, not a function")
        if inspect.iscoroutinefunction(fn):
            raise _LoadError("signature", f"{label} is an async def; write a plain def {func}(completion, fields)")
        try:
            sig: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
        if sig is not None:
            try:
                sig.bind("", {})
            except TypeError as exc:
                raise _LoadError("signature", f"{label}{sig} cannot be called as {func}(completion, fields) "
                                 f"({exc}); write def {func}(completion, fields):") from None
        line = getattr(getattr(fn, "__code__", None), "co_firstlineno", None)
        return fn, {"signature": f"{func}{sig}" if sig is not None else func, "line": line}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        func = req["function"]
        fn = self.functions.get(func)
        if fn is None:
            try:
                fn, info = self._function(func)
            except _LoadError as exc:
                return {"result": "unloadable", "error": exc.reason, "message": str(exc)}
            self.functions[func] = fn
            if req["op"] == "load":
                return {"result": "ok", **info}
        if req["op"] == "load":
            return {"result": "ok"}
        limit = _TimeLimit(float(req["timeout_s"]))
        try:
            with limit:
                value = fn(req["completion"], req["fields"])
        except _Alarm:
            return {"result": "timeout"}
        except MemoryError as exc:
            return {"result": "memory", "message": _user_frame(exc, self.root)}
        except BaseException as exc:  # noqa: BLE001 - the user's exception fails the rule, with its line
            if limit.fired:
                return {"result": "timeout"}
            return {"result": "error", "message": f"raised {_exc_text(exc)}{_user_frame(exc, self.root)}"}
        if limit.fired:  # the function caught the alarm and went on
            return {"result": "timeout"}
        return _check_result(value)


def _finite(value: Any) -> float | None:
    if isinstance(value, numbers.Real):
        try:
            f = float(value)
        except (TypeError, ValueError, OverflowError):
            return None
        return f if math.isfinite(f) else None
    return None


def _check_result(value: Any) -> dict[str, Any]:
    if isinstance(value, numbers.Real):
        f = _finite(value)
        if f is None:
            return {"result": "error", "message": f"returned {value!r}; return a finite number"}
        return {"result": "ok", "value": f, "subscores": None}
    if isinstance(value, dict):
        if not value:
            return {"result": "error", "message": "returned an empty dict; return a number or named numbers"}
        if len(value) > MAX_SUBSCORES:
            return {"result": "error", "message": f"returned {len(value)} sub-scores; at most {MAX_SUBSCORES}"}
        subs: dict[str, float] = {}
        for k, v in value.items():
            if not isinstance(k, str) or not k or len(k) > SUBSCORE_NAME_CHARS or "/" in k:
                return {"result": "error", "message": f"returned a sub-score named {str(k)[:40]!r}; names are "
                        f"non-empty strings of at most {SUBSCORE_NAME_CHARS} characters without '/'"}
            f = _finite(v)
            if f is None:
                return {"result": "error", "message": f"returned {str(v)[:40]!r} for sub-score '{k}'; "
                        "return finite numbers"}
            subs[k] = f
        return {"result": "ok", "value": math.fsum(subs.values()), "subscores": subs}
    shown = type(value).__name__
    return {"result": "error",
            "message": f"returned a {shown}; return a number or a dict of named numbers, e.g. {{'style': 0.5}}"}


# ------------------------------------------------------------------------------------------------ parent side


@dataclass
class PythonResult:
    """One call's outcome. value: the number (sum of ``subscores`` when a dict came back), None on failure.
    problem: why it failed (plain words). timed_out: the failure was the time limit. output: what the call
    printed (its first :data:`~sailrl.runtime.sandbox.workers.MAX_OUTPUT_BYTES`), output_bytes / output_lines: how much it
    printed."""

    value: float | None
    subscores: dict[str, float] | None = None
    problem: str | None = None
    timed_out: bool = False
    output: str = ""
    output_bytes: int = 0
    output_lines: int = 0


_POOLS = PoolCache()
#: Largest user code file a run freezes (a rule file is a few kilobytes).
MAX_CODE_FILE_BYTES = 4 * 2**20
#: Files a run froze: resolved path -> (sha256, text, (size, mtime) when read).
_FROZEN: dict[str, tuple[str, str, tuple[int, int]]] = {}
#: Frozen files found changed on disk, already warned about: path -> the (size, mtime) last checked.
_SEEN_CHANGED: dict[str, tuple[int, int]] = {}
#: The modules a run froze, by spec folder: folder -> {module name: resolved path}.
_FROZEN_MODULES: dict[str, dict[str, str]] = {}
_FROZEN_LOCK = threading.Lock()


def freeze_files(paths: list[Path]) -> dict[str, str]:
    """Read each user code file once and have every worker of this process run that text from now on (a run's
    rules and tools: the reward cannot change mid-run). Returns ``{path: sha256}`` for ``config.json``. Raises
    OSError for a file that cannot be read, ValueError for one over :data:`MAX_CODE_FILE_BYTES` or not UTF-8."""
    found: dict[str, str] = {}
    for path in paths:
        real = str(Path(path).resolve())
        with open(real, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read(MAX_CODE_FILE_BYTES + 1)
        if len(data) > MAX_CODE_FILE_BYTES:
            raise ValueError(f"{path} is over {MAX_CODE_FILE_BYTES // 2**20} MiB; a rule or tool file is a few "
                             "kilobytes")
        sha = hashlib.sha256(data).hexdigest()
        with _FROZEN_LOCK:
            _FROZEN[real] = (sha, data.decode("utf-8"), (st.st_size, st.st_mtime_ns))
        found[str(path)] = sha
    return found


def _imported_names(path: Path, package: str) -> set[str]:
    """The modules a Python file imports (absolute names; relative imports resolved against ``package``), read from
    its syntax tree -- imports done by string at run time are not seen."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join([*parts, base] if base else parts)
            if base:
                names.add(base)
                names.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
    return names


def spec_modules(spec_dir: Path | str, modules: list[str]) -> dict[str, Path]:
    """``modules`` and every module of the spec's folder they import, their parent packages included, with their
    files: what a run freezes."""
    root = Path(spec_dir).resolve()
    found: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):  # a module's parent packages are imported before it
            name = ".".join(parts[:i])
            path = module_file(root, name)
            if path is None or name in found:
                continue
            found[name] = path
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            todo.extend(_imported_names(path, package))
    return found


def freeze_spec_code(rules: list[Any], tools: list[Any], spec_dir: Path | str) -> dict[str, str]:
    """Freeze the files of a spec's python rules (``rules``: ``reward.rules``) and function tools (``tools``:
    ``environment.tools``) for a run, with every module of the spec's folder they import (:func:`freeze_files`):
    ``{file relative to the spec: sha256}``. A file that cannot be read is left to its worker, which reports it
    when it loads."""
    root = Path(spec_dir).resolve()
    refs = [r.function for r in rules if getattr(r, "kind", None) == "python"]
    refs += [t.function for t in tools if getattr(t, "function", None)]
    found: dict[str, str] = {}
    for name, path in sorted(spec_modules(root, [split_ref(ref)[0] for ref in dict.fromkeys(refs)]).items()):
        try:
            sha = freeze_files([path])[str(path)]
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        found[path.resolve().relative_to(root).as_posix()] = sha
        with _FROZEN_LOCK:
            _FROZEN_MODULES.setdefault(str(root), {})[name] = str(path.resolve())
    return found


def file_version(path: Path | None, spec_dir: Path | str | None = None) -> tuple[Any, dict[str, list[Any]] | None]:
    """(what identifies the version of ``path`` workers run, the frozen modules of its spec folder or None): for a
    frozen file, its sha256 and every frozen module of ``spec_dir`` (name -> [path, text, is package]) -- with one
    warning on stderr the first time one of them differs on disk -- else the file's size and mtime."""
    try:
        st = path.stat() if path is not None else None
    except OSError:
        st = None
    frozen = _FROZEN.get(str(path.resolve())) if path is not None else None
    if frozen is None:
        return ((st.st_size, st.st_mtime_ns) if st else None), None
    root = str(Path(spec_dir).resolve()) if spec_dir is not None else str(path.resolve().parent)
    modules: dict[str, list[Any]] = {}
    for name, real in _FROZEN_MODULES.get(root, {}).items():
        sha, text, stamp = _FROZEN[real]
        _warn_if_changed(real, sha, stamp)
        modules[name] = [real, text, real.endswith("__init__.py")]
    if not modules:  # frozen by freeze_files alone: the file is its own module
        _warn_if_changed(str(path.resolve()), frozen[0], frozen[2])
        modules[path.stem] = [str(path.resolve()), frozen[1], path.name == "__init__.py"]
    return ("frozen", frozen[0]), modules


def _warn_if_changed(real: str, sha: str, stamp: tuple[int, int]) -> None:
    try:
        st = os.stat(real)
        now = (st.st_size, st.st_mtime_ns)
    except OSError:
        now = (-1, -1)
    if now != stamp and _SEEN_CHANGED.get(real) is None:
        _SEEN_CHANGED[real] = now
        print(f"warning: {real} changed on disk during the run; the run goes on with the version it started with "
              f"(sha256 {sha[:12]}), and the change takes effect in the next run", file=sys.stderr, flush=True)


#: Seconds a worker may take to check a function (the module is already imported).
_LOAD_TIMEOUT_S = 10.0


class PythonFunction:
    """A rule's ``function:`` next to ``spec_dir``, called in worker processes (one pool per file version).

    ``spec_dir`` None (a caller that does not know the spec's folder) makes every call fail with that reason.
    """

    def __init__(self, spec_dir: Path | str | None, ref: str, timeout_s: float,
                 memory_mb: float | None = DEFAULT_MEMORY_MB, env: list[str] | None = None) -> None:
        self.env = list(env or [])
        self.spec_dir = Path(spec_dir).resolve() if spec_dir is not None else None
        self.ref = ref
        self.module, self.function = split_ref(ref)
        self.timeout_s = float(timeout_s)
        self.memory_mb = None if memory_mb is None else float(memory_mb)
        self.label = describe(ref)

    def _pool(self) -> WorkerPool:
        assert self.spec_dir is not None
        path = module_file(self.spec_dir, self.module)
        version, frozen = file_version(path, self.spec_dir)
        key = (str(self.spec_dir), self.module, self.memory_mb, tuple(self.env), str(path), version)
        return _POOLS.get(key, key[:4], lambda: WorkerPool(
            {"kind": "python", "job": "sailrl.runtime.rewards.python_rules:PythonJob", "spec_dir": str(self.spec_dir), "module": self.module, "memory_mb": self.memory_mb,
             **({"frozen": frozen} if frozen is not None else {})},
            size=POOL_SIZE, start_timeout_s=IMPORT_TIMEOUT_S + 10, cwd=str(self.spec_dir), env_names=self.env))

    def load_problem(self) -> tuple[str, str] | None:
        """``(code, plain words)`` when the function cannot be loaded, else None (it is then loaded and ready).

        Codes: ``no_spec_dir``, ``missing_module``, ``import_error``, ``shadowed``, ``missing_function``,
        ``not_callable``, ``signature``, ``start_timeout``, ``died``, ``timeout``. Bounded by the import time
        limit.
        """
        if self.spec_dir is None:
            return "no_spec_dir", "the spec's folder is not known, so its python file cannot be found"
        if module_file(self.spec_dir, self.module) is None:
            want = self.module.replace(".", "/") + ".py"
            return "missing_module", f"there is no file {want} next to the spec (in {self.spec_dir})"
        try:
            reply = self._pool().call({"op": "load", "function": self.function}, _LOAD_TIMEOUT_S)
        except WorkerStartError as exc:
            return exc.reason, str(exc)
        except Exception as exc:  # noqa: BLE001 - e.g. the interpreter cannot be started
            return "died", f"the worker process could not start ({_exc_text(exc)})"
        result = reply.get("result")
        if result == "ok":
            return None
        if result == "unloadable":
            return str(reply.get("error", "error")), str(reply.get("message", ""))
        if result == "timeout":
            return "timeout", f"checking {self.label} took longer than {_LOAD_TIMEOUT_S:g} s"
        return str(result), str(reply.get("message", result))

    def call(self, completion: str, fields: dict[str, Any], timeout_s: float | None = None) -> PythonResult:
        """``fn(completion, fields)`` in a worker, within ``min(timeout_s, self.timeout_s)`` seconds. Never raises."""
        limit = self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s)
        if self.spec_dir is None:
            return PythonResult(None, problem=f"{self.label}: the spec's folder is not known, so the file cannot "
                                "be found (RewardFunction.from_spec(..., spec_dir=...))")
        try:
            reply = self._pool().call({"op": "call", "function": self.function, "completion": completion,
                                       "fields": fields}, limit)
        except WorkerStartError as exc:
            return PythonResult(None, problem=str(exc))
        except Exception as exc:  # noqa: BLE001 - e.g. fields that cannot be pickled
            return PythonResult(None, problem=f"{self.label} could not be called: {_exc_text(exc)}")
        out = {"output": str(reply.get("output") or ""), "output_bytes": int(reply.get("output_bytes") or 0),
               "output_lines": int(reply.get("output_lines") or 0)}
        result = reply.get("result")
        if result == "ok":
            return PythonResult(float(reply["value"]), reply.get("subscores"), **out)
        if result == "timeout":
            return PythonResult(None, problem=f"{self.label} timed out after {limit:g} s", timed_out=True, **out)
        if result == "memory":
            return PythonResult(None, problem=f"{self.label} ran out of memory{reply.get('message') or ''}: it may "
                                f"use {self.memory_mb:g} MiB beyond what loading its file took (the rule's "
                                f"memory_mb)", **out)
        if result == "error":
            return PythonResult(None, problem=f"{self.label} {reply.get('message', 'failed')}", **out)
        return PythonResult(None, problem=str(reply.get("message") or f"{self.label}: {result}"), **out)
