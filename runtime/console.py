"""Rich consoles for sailrl's output: laid out to the terminal on a terminal, never wrapped anywhere else.

Without a terminal rich lays everything out at 80 columns, so ``sailrl preflight | tee log`` and CI logs broke
lines mid-phrase. :func:`make_console` gives a console that, when its output is not a terminal (and ``COLUMNS``
does not set a width), does not wrap text (``soft_wrap``) and lays tables and panels out in
:data:`PIPE_WIDTH` columns, so each line is as long as what it holds. On a terminal nothing changes.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

__all__ = ["PIPE_WIDTH", "make_console", "panel_expand"]

#: Columns a console writing to a pipe or a file lays out tables in: wide enough that no line is wrapped.
PIPE_WIDTH = 4096


def make_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """A ``rich.console.Console`` (``kwargs`` as rich takes them) that wraps only on a terminal."""
    console = Console(stderr=stderr, **kwargs)
    if not console.is_terminal and "width" not in kwargs and not os.environ.get("COLUMNS"):
        console.soft_wrap = True
        console.width = PIPE_WIDTH
    return console


def panel_expand(console: Console) -> bool:
    """Whether a panel should fill the console's width: on a terminal yes, else it fits its content (a
    :data:`PIPE_WIDTH`-wide border helps no one)."""
    return console.width < PIPE_WIDTH
