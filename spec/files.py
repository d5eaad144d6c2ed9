"""What kind of file a path names, before anything opens it: a device, a named pipe or a socket is refused up
front (reading ``/dev/zero`` never ends, opening a FIFO blocks until a writer comes)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["special_kind"]

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
