"""What kind of file a path names, before anything opens it: a device, a named pipe or a socket is refused up
front (reading ``/dev/zero`` never ends, opening a FIFO blocks until a writer comes)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sailrl.spec.errors import StorageError

__all__ = ["special_kind", "writable_folder"]

_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(path: str | Path) -> str | None:
    """``"a named pipe (FIFO)"`` / ``"a character device"`` / ``"a block device"`` / ``"a socket"`` when
    ``path`` (symlinks followed) is one of those, else None (a regular file, a folder, or nothing there)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return None


def writable_folder(path: str | Path, what: str, fix: str) -> Path:
    """Create folder ``path`` (and its parents) when missing and check that files can be written in it.

    what: what the folder is, for the message ("the run directory"); fix: what to do ("set output.run_dir to
    a folder you can write"). Raises :class:`~sailrl.spec.errors.StorageError` in one line (a read-only file
    system, no permission, a file where a folder belongs), before anything is written there.
    """
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and os.fspath(exc.filename) != os.fspath(p) else ""
        raise StorageError(f"cannot create {what} {p}{where}: {exc.strerror or exc}; {fix}") from None
    if not os.access(p, os.W_OK | os.X_OK):
        reason = "read-only file system" if _read_only_fs(p) else "no permission to write there"
        raise StorageError(f"cannot write in {what} {p}: {reason}; {fix}")
    return p


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
