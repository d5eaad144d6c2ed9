"""Scoring worker processes: run work a thread cannot interrupt (math-verify, a user's Python reward function)
under a hard time limit.

A :class:`WorkerPool` keeps up to ``size`` child processes (``python -P -m sailrl.runtime.sandbox.worker_child``). Each child
loads one job once (``math``: math-verify; ``python``: one function from a file next to the spec; ``tool``:
the tools of a file next to the spec, :mod:`sailrl.runtime.tools.functions`; ``python_tool``: the unisolated python tool's
snippets) and then
answers one request at a time over pipes: every message is a 4-byte big-endian length and a pickle
(:data:`MAX_FRAME_BYTES` at most). A request carries a time limit ``timeout_s``:

* the child stops its own work at the limit (``SIGALRM`` in its main thread, which interrupts Python code) and
  answers ``{"result": "timeout"}``, so it stays loaded for the next call;
* a child that has not answered ``GRACE_S`` seconds after the limit (stuck in C code, or user code that
  swallows the alarm) is killed with ``SIGKILL`` and replaced on the next call; that call answers
  ``{"result": "timeout"}`` too;
* a child that dies (a crash, ``os._exit``) answers ``{"result": "died", "message": ...}``.

So a call never takes longer than its limit plus ``GRACE_S``, plus the child's start (at most
``start_timeout_s``) when it is the first call of that child. The child reads requests on stdin and answers
on a private copy of its stdout; what user code prints (fd 1 and 2) is captured per call (:class:`_Capture`: the
first :data:`MAX_OUTPUT_BYTES` and a byte count, sent back with the answer as ``output`` / ``output_bytes`` /
``output_lines``), so it can neither corrupt the protocol nor flood the parent's terminal. An ``init`` with
``memory_mb`` caps the child's address space at its size after loading plus that much (:func:`limit_memory`); a
``MemoryError`` that escapes the job answers ``{"result": "memory"}``. The child ignores SIGINT (Ctrl-C stops the
parent, which then closes the pipes) and exits when its stdin closes, also when the parent was killed.

A child's environment is an allowlist (:func:`worker_environment`): keys and tokens of the run's environment
reach only a rule or tool that names them in its ``env:``. The code in a child is the user's own (trusted): the
model's code never runs in one unless the spec opts in to ``environment.sandbox: unisolated_worker``.

Uses ``select`` on pipes, so POSIX only (Linux, macOS).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from sailrl.runtime.sandbox.redact import SECRET_NAME
from sailrl.spec.errors import ServiceError

__all__ = ["GRACE_S", "MAX_FRAME_BYTES", "MAX_OUTPUT_BYTES", "SAFE_ENV", "PoolCache", "WorkerError",
           "WorkerPool", "WorkerStartError", "close_all", "limit_memory", "worker_environment"]

#: Seconds a child may overrun a request's time limit before it is killed.
GRACE_S = 0.5
#: Largest message either side accepts (a completion is capped far below this by the reward rules).
MAX_FRAME_BYTES = 16 * 1024 * 1024
#: Bytes of one call's printed output a child sends back (the rest is counted, not kept).
MAX_OUTPUT_BYTES = 4096
_HEADER = struct.Struct(">I")


class WorkerError(ServiceError):
    """A scoring worker process could not start, died, or answered outside the protocol."""

    code = "E130"


class WorkerStartError(WorkerError):
    """The child could not load its job. ``reason``: a short kind (e.g. ``missing_module``, ``import_error``,
    ``signature``, ``start_timeout``); ``str(exc)``: plain words."""

    code = "E131"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# ------------------------------------------------------------------------------------------------ framing


def _encode(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_FRAME_BYTES:
        raise WorkerError(f"a message of {len(data):,} bytes is over the {MAX_FRAME_BYTES:,}-byte limit")
    return _HEADER.pack(len(data)) + data


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """``n`` bytes from ``fd``; None at end of file; raises TimeoutError past ``deadline`` (time.monotonic)."""
    chunks: list[bytes] = []
    left = n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int, deadline: float | None = None) -> Any:
    """One message, or None at end of file. Raises TimeoutError past ``deadline``, WorkerError on a bad frame."""
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        return None
    (n,) = _HEADER.unpack(head)
    if n > MAX_FRAME_BYTES:
        raise WorkerError(f"a message of {n:,} bytes is over the {MAX_FRAME_BYTES:,}-byte limit")
    body = _read_exact(fd, n, deadline)
    if body is None:
        return None
    return pickle.loads(body)


# ------------------------------------------------------------------------------------------------ parent side


#: Variables of the run's environment every worker gets: where programs and libraries are, the locale, the
#: interpreter's and numeric libraries' settings, offline switches. Nothing that holds a credential.
SAFE_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "PYTHONPATH", "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONWARNINGS", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
    "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "SAILRL_HOME",
})


def worker_environment(names: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a worker process: :data:`SAFE_ENV` and ``LC_*`` from this process's (never a name that
    looks like a credential, :data:`SECRET_NAME`), plus the variables a rule or tool names in its ``env:``."""
    env = {k: v for k, v in os.environ.items()
           if (k in SAFE_ENV or k.startswith("LC_")) and not SECRET_NAME.search(k)}
    env.update({k: os.environ[k] for k in names if k in os.environ})
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    return env


class _Child:
    """One child process, used by one thread at a time."""

    def __init__(self, init: dict[str, Any], start_timeout_s: float, cwd: str | None,
                 env_names: tuple[str, ...] = ()) -> None:
        env = worker_environment(env_names)
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "sailrl.runtime.sandbox.worker_child"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, cwd=cwd, env=env, close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in = self.proc.stdin
        self._out = self.proc.stdout.fileno()
        try:
            self._send(init)
            reply = _read_frame(self._out, time.monotonic() + start_timeout_s)
        except TimeoutError:
            self.kill()
            raise WorkerStartError(
                "start_timeout", f"loading took longer than {start_timeout_s:g} s (the import runs too long)"
            ) from None
        except (OSError, WorkerError) as exc:
            self.kill()
            raise WorkerStartError("died", f"the worker process failed to start ({exc})") from None
        if reply is None:
            code = self.kill()
            raise WorkerStartError("died", f"the worker process exited while loading (exit code {code})")
        if not reply.get("ok"):
            self.kill()
            raise WorkerStartError(str(reply.get("error", "error")), str(reply.get("message", "")))
        self.info: dict[str, Any] = reply

    def _send(self, obj: Any) -> None:
        self._in.write(_encode(obj))
        self._in.flush()

    def call(self, data: bytes, wait_s: float) -> dict[str, Any]:
        """The child's answer to one encoded request; ``{"result": "timeout"}`` after killing it at ``wait_s``;
        ``died`` if it died."""
        try:
            self._in.write(data)
            self._in.flush()
            reply = _read_frame(self._out, time.monotonic() + wait_s)
        except TimeoutError:
            self.kill()
            return {"result": "timeout", "killed": True}
        except (OSError, WorkerError, pickle.UnpicklingError, EOFError) as exc:
            code = self.kill()
            return {"result": "died", "message": f"the worker process stopped answering ({exc}; exit code {code})"}
        if reply is None:
            code = self.kill()
            return {"result": "died", "message": f"the worker process exited (exit code {code})"}
        return reply

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> int | None:
        """Kill the child (if running) and reap it; its exit code."""
        try:
            self._in.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            return None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def close(self) -> None:
        """Ask the child to exit (end of its stdin); kill it if it does not within a second."""
        try:
            self._in.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class WorkerPool:
    """Up to ``size`` children that each loaded ``init`` (``{"kind": "math"}`` or ``{"kind": "python", ...}``).

    :meth:`call` is thread-safe: a thread takes an idle child (or starts one, or waits for one), sends one
    request and gets its answer within ``timeout_s + GRACE_S``. A child that fails to load raises
    :class:`WorkerStartError` from :meth:`call` and :meth:`start`; the failure is remembered, so later calls
    fail at once instead of loading again. ``cwd``: the children's working directory; ``env_names``: variables
    of this process's environment they get beyond :data:`SAFE_ENV` (:func:`worker_environment`).
    """

    def __init__(self, init: dict[str, Any], size: int, *, start_timeout_s: float = 60.0,
                 cwd: str | None = None, env_names: list[str] | tuple[str, ...] = ()) -> None:
        self.init = dict(init)
        self.env_names = tuple(env_names)
        self.size = max(1, int(size))
        self.start_timeout_s = start_timeout_s
        self.cwd = cwd
        self._idle: list[_Child] = []
        self._live = 0
        self._cond = threading.Condition()
        self._start_error: WorkerStartError | None = None
        self._closed = False
        self.info: dict[str, Any] = {}
        _POOLS.add(self)

    def start(self) -> dict[str, Any]:
        """Start one child now (if none is idle) and return what it reported when loading (e.g. a signature)."""
        child = self._acquire()
        self._release(child)
        return self.info

    def _acquire(self) -> _Child:
        with self._cond:
            while True:
                if self._start_error is not None:
                    raise self._start_error
                if self._closed:
                    raise WorkerError("the worker pool is closed")
                while self._idle:
                    child = self._idle.pop()
                    if child.alive:
                        return child
                    child.kill()
                    self._live -= 1
                if self._live < self.size:
                    self._live += 1
                    break
                self._cond.wait()
        try:
            child = _Child(self.init, self.start_timeout_s, self.cwd, self.env_names)
        except WorkerStartError as exc:
            with self._cond:
                self._live -= 1
                self._start_error = exc
                self._cond.notify_all()
            raise
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify_all()
            raise
        self.info = child.info
        return child

    def _release(self, child: _Child | None) -> None:
        with self._cond:
            if child is not None and child.alive and not self._closed:
                self._idle.append(child)
            else:
                if child is not None:
                    child.kill()
                self._live -= 1
            self._cond.notify()

    def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``request`` (``timeout_s`` is added to it) to an idle child; its answer (a dict with ``result``).

        Never takes longer than ``timeout_s + GRACE_S`` once a child is loaded. Raises WorkerStartError when the
        child cannot load its job, and WorkerError (or pickle's error) for a request that cannot be sent (too
        large, not picklable) -- before any child is used.
        """
        data = _encode({**request, "timeout_s": float(timeout_s)})
        child = self._acquire()
        reply: dict[str, Any] | None = None
        try:
            reply = child.call(data, float(timeout_s) + GRACE_S)
            return reply
        finally:
            self._release(child if reply is not None and reply.get("result") not in ("timeout", "died") else None)

    def close(self) -> None:
        """Stop every idle child; children in use stop when their call returns."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._cond.notify_all()
        for child in idle:
            child.close()
        _POOLS.discard(self)


_POOLS: set[WorkerPool] = set()


class PoolCache:
    """Worker pools by key (one per version of a user's file), at most ``max_pools`` open in this process.

    :meth:`get` returns the pool for ``key``, making it with ``make()`` when there is none. A pool of the same
    ``family`` (the same file, an older version) is closed when a new one is made, and past ``max_pools`` the
    least recently used pool is closed, so a long process that meets many spec folders (the studio, a test
    session) keeps a bounded number of child processes. Thread-safe.
    """

    def __init__(self, max_pools: int = 8) -> None:
        self.max_pools = max(1, int(max_pools))
        self._pools: OrderedDict[Hashable, tuple[Hashable, WorkerPool]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, family: Hashable, make: Callable[[], WorkerPool]) -> WorkerPool:
        with self._lock:
            found = self._pools.get(key)
            if found is not None:
                self._pools.move_to_end(key)
                return found[1]
            stale = [k for k, (fam, _) in self._pools.items() if fam == family]
            while len(self._pools) - len(stale) >= self.max_pools:
                oldest = next(k for k in self._pools if k not in stale)
                stale.append(oldest)
            closing = [self._pools.pop(k)[1] for k in stale]
            pool = make()
            self._pools[key] = (family, pool)
        for old in closing:
            old.close()
        return pool

    def __len__(self) -> int:
        return len(self._pools)


def close_all() -> None:
    """Close every pool of this process (runs at exit)."""
    for pool in list(_POOLS):
        pool.close()


atexit.register(close_all)


# ------------------------------------------------------------------------------------------------ child side


class _Alarm(BaseException):
    """Raised in the child when a request's time limit passes.

    A BaseException so that ``except Exception`` in math-verify or in user code does not swallow it.
    """


class _TimeLimit:
    """``with _TimeLimit(s):`` raises :class:`_Alarm` in the block after ``s`` seconds (SIGALRM)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False

    def _handler(self, signum: int, frame: Any) -> None:
        self.fired = True
        raise _Alarm

    def __enter__(self) -> _TimeLimit:
        signal.signal(signal.SIGALRM, self._handler)
        signal.setitimer(signal.ITIMER_REAL, max(self.seconds, 1e-3))
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _short_exc(exc: BaseException, where: str = "") -> str:
    text = f"{type(exc).__name__}: {exc}"
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{where}{text}"


class _Capture:
    """What the child's code prints (fd 1 and 2, Python's ``print`` and C code alike), call by call.

    Both descriptors point into a pipe that a thread drains, keeping the first :data:`MAX_OUTPUT_BYTES` of each
    call's output and counting the rest, so a rule that prints without end costs neither memory nor the parent's
    terminal. :meth:`take` ends a call's output (a marker written after Python's buffers are flushed, read back
    by the thread) and returns ``(text, bytes printed)``.
    """

    END = b"\x00sailrl-call-output-end\x00"

    def __init__(self) -> None:
        read, write = os.pipe()
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        self._read = read
        self._kept = bytearray()
        self._total = 0
        self._lines = 0
        self._last_newline = True
        self._lock = threading.Lock()
        self._ended = threading.Event()
        threading.Thread(target=self._drain, name="sailrl-output", daemon=True).start()

    def _add(self, data: bytes) -> None:
        with self._lock:
            self._total += len(data)
            self._lines += data.count(b"\n")
            if data:
                self._last_newline = data.endswith(b"\n")
            room = MAX_OUTPUT_BYTES - len(self._kept)
            if room > 0:
                self._kept += data[:room]

    def _drain(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._read, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            data = pending + chunk
            while True:
                i = data.find(self.END)
                if i < 0:
                    break
                self._add(data[:i])
                data = data[i + len(self.END):]
                self._ended.set()
            keep = len(self.END) - 1  # a marker may be split between two reads
            self._add(data[:-keep] if len(data) > keep else b"")
            pending = data[-keep:] if len(data) > keep else data

    def take(self, wait_s: float = 2.0) -> tuple[str, int, int]:
        """The output since the last call: ``(text of at most MAX_OUTPUT_BYTES, bytes printed, lines printed)``
        (a last line without a newline counts as a line)."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        self._ended.clear()
        try:
            os.write(1, self.END)
        except OSError:
            pass
        self._ended.wait(wait_s)
        with self._lock:
            text, total = bytes(self._kept).decode("utf-8", "replace"), self._total
            lines = self._lines + (1 if total and not self._last_newline else 0)
            self._kept.clear()
            self._total = self._lines = 0
        return text, total, lines


def limit_memory(extra_mb: float) -> int | None:
    """Cap this process's address space (``RLIMIT_AS``) at its current size plus ``extra_mb`` MiB, so an
    allocation past it raises ``MemoryError`` instead of growing until the machine swaps. The new limit in bytes,
    or None where the current size cannot be read (no ``/proc``: not Linux)."""
    import resource  # lazy: POSIX only, and only in a child that limits its memory

    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
    limit = size + int(extra_mb * 2**20)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit
