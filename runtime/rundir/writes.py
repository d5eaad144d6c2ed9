"""Writing a run directory: a disk failure as one located line (:class:`RunWriteError`), and a run directory that
a command would overwrite (:class:`RunDirectoryError`)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator

from sailrl.spec.errors import StorageError, UserError

__all__ = ["RunDirectoryError", "RunWriteError", "write_error", "writing"]


class RunDirectoryError(UserError, FileExistsError):
    """The run directory holds a run that this command would overwrite, or that is already complete."""

    code = "E103"


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
