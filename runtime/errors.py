"""The errors a run raises, and :func:`phase`, which times a step's phase and names the step and phase of a fault.

Every class derives from :class:`~sailrl.spec.errors.SailrlError` through its category (``ServiceError``: a
service or backend fault; ``UserError``: something the user fixes; :class:`RunStopped`: a stop the spec asked for).
``sailrl.launch`` turns them into exit statuses: :class:`BudgetReached` 3, :class:`RunStopped` 4, the others 1.

:func:`service_fault` tells a fault of a service, of its HTTP transport or of the embedded backend (the Tinker and
Sail SDKs' errors, httpx / aiohttp / requests errors, a refused or dropped connection, a time-out, an out-of-memory
error) from everything else, which is a bug in sailrl: :func:`phase` wraps only the former, so the latter keeps its
own type and traceback and the command line exits 70 with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import time
from collections.abc import Iterator

from sailrl.spec.errors import SailrlError, ServiceError, StorageError, UserError

__all__ = ["AllDegenerateError", "BudgetReached", "OnPolicyMismatch", "RunDirectoryError", "RunError", "RunStopped",
           "RunWriteError", "is_bug", "phase", "service_fault", "write_error", "writing"]


class RunError(ServiceError):
    """A service or backend fault, with the step and phase it happened in."""

    code = "E100"


class RunStopped(SailrlError):
    """The run stopped where its spec says to stop on what a step found (``training.on_all_degenerate: stop``,
    ``sampling.on_policy_mismatch: stop``): neither a service fault nor a bug. State is saved; exit status 4."""

    code = "E107"


class AllDegenerateError(RunStopped):
    """Every group of a step scored the same and the spec says ``on_all_degenerate: stop``."""

    code = "E101"


class OnPolicyMismatch(RunStopped):
    """The sampler's logprobs disagree with the learner's (``sampling.on_policy_mismatch: stop``)."""

    code = "E102"


class RunDirectoryError(UserError, FileExistsError):
    """The run directory holds a run that this command would overwrite, or that is already complete."""

    code = "E103"


class BudgetReached(SailrlError):
    """The next step would take the run's estimated cost above ``training.max_cost_usd``. Not a failure: state is
    saved and the run can be resumed with a larger budget."""

    code = "E104"


class RunWriteError(StorageError):
    """A write of the run failed for want of space or a working disk (``ENOSPC``, ``EDQUOT``, ``EROFS``, ``EIO``,
    ``EFBIG``): the disk, the path and what to do, in one line. The run stops at a step boundary, so ``--resume``
    continues it once the disk is fixed."""

    code = "E105"

    def __init__(self, message: str, *, errno_: int = 0, path: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno_
        self.path = path


#: What each write failure means, and what to do about it ({path}: the file or folder being written).
_DISK_ERRORS = {
    errno.ENOSPC: "the disk is full at {path}: free space and run again with --resume",
    errno.EDQUOT: "the disk quota is used up at {path}: free space and run again with --resume",
    errno.EFBIG: "a file grew past the file system's size limit at {path}: free space or move output.run_dir, "
                 "then run again with --resume",
    errno.EROFS: "the file system at {path} is read-only: make it writable and run again with --resume",
    errno.EIO: "the disk failed (I/O error) writing {path}: check it, then run again with --resume",
}
#: How libraries that write with their own I/O (safetensors) name the errno in their messages.
_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)")


def write_error(exc: BaseException, path: str | os.PathLike | None = None) -> RunWriteError | None:
    """``exc`` (or an error it was raised from) as a :class:`RunWriteError` when it is a disk failure, else None.
    ``path``: what was being written, when ``exc`` does not name it."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, RunWriteError):
            return exc
        code = exc.errno if isinstance(exc, OSError) else None
        if code is None and (m := _OS_ERROR_IN_TEXT.search(str(exc))):
            code = int(m[1])
        if code in _DISK_ERRORS:
            where = getattr(exc, "filename", None) or path
            where = os.fspath(where) if where is not None else "the run's output"
            return RunWriteError(_DISK_ERRORS[code].format(path=where), errno_=code,
                                 path=None if where == "the run's output" else where)
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn a disk failure while writing ``path`` into a :class:`RunWriteError` naming it; other errors pass."""
    try:
        yield
    except Exception as exc:
        err = write_error(exc, path)
        if err is None or err is exc:
            raise
        raise err from exc


#: The exception classes of a service's, its transport's or the embedded backend's faults, as (module, name): an
#: exception is one when a class of its hierarchy is listed. By name, so that this module imports none of those
#: libraries (a run on the embedded backend never loads the Sail SDK).
_FAULT_CLASSES = frozenset({
    ("tinker", "TinkerError"),  # the Tinker SDK: API status, connection, time-out, a request that failed
    ("tinker._exceptions", "TinkerError"),
    ("sail.errors", "SailError"),  # the Sail SDK
    ("httpx", "HTTPError"), ("httpx", "StreamError"),  # HTTP, as the SDKs and sailrl's Sail client speak it
    ("aiohttp.client_exceptions", "ClientError"),
    ("requests.exceptions", "RequestException"),
    ("builtins", "ConnectionError"), ("builtins", "TimeoutError"),  # refused, reset, timed out
    ("socket", "gaierror"), ("ssl", "SSLError"),  # a host name that does not resolve, a TLS failure
    ("torch", "OutOfMemoryError"), ("builtins", "MemoryError"),  # the embedded backend out of memory
})


def service_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault of a service, its HTTP transport or the embedded backend (a sailrl
    ``ServiceError`` included) rather than a bug in sailrl."""
    if isinstance(exc, ServiceError):
        return True
    return any((cls.__module__, cls.__qualname__) in _FAULT_CLASSES for cls in type(exc).__mro__)


def is_bug(exc: BaseException) -> bool:
    """Whether ``exc`` is a bug in sailrl: neither an error sailrl raises on purpose nor a service fault."""
    return not isinstance(exc, SailrlError) and not service_fault(exc)


@contextlib.contextmanager
def phase(step: int, name: str, timings: dict[str, float]) -> Iterator[None]:
    """Time a phase into ``timings['time/<name>']`` (seconds). A service fault (:func:`service_fault`) is
    re-raised as a :class:`RunError` naming the step and phase, a disk failure as a :class:`RunWriteError`;
    anything else (sailrl's own errors, a bug) passes unchanged."""
    t0 = time.perf_counter()
    try:
        yield
    except (KeyboardInterrupt, asyncio.CancelledError, SailrlError):
        raise
    except Exception as exc:
        if (disk := write_error(exc)) is not None:  # a backend's checkpoint write: the disk, not the service
            raise disk from exc
        if not service_fault(exc):
            raise  # a bug in sailrl: its own type and traceback (exit 70), never dressed as a service fault
        raise RunError(f"step {step}, phase '{name}': {type(exc).__name__}: {exc}") from exc
    finally:
        timings[f"time/{name}"] = round(timings.get(f"time/{name}", 0.0) + time.perf_counter() - t0, 4)
