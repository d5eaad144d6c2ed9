"""Rich consoles for sailrl's output: laid out to the terminal on a terminal, never wrapped anywhere else.

Without a terminal rich lays everything out at 80 columns, so ``sailrl preflight | tee log`` and CI logs broke
lines mid-phrase. :func:`make_console` gives a console that, when its output is not a terminal (and ``COLUMNS``
does not set a width), does not wrap text (``soft_wrap``) and lays tables and panels out in
:data:`PIPE_WIDTH` columns, so each line is as long as what it holds. On a terminal nothing changes.

A run prints to two streams, as ``sailrl show`` / ``explain`` / ``export`` do: what it produced (each step's line,
the summary) to stdout, and what it says along the way (progress, notes, warnings, how to resume) to stderr, so
``sailrl run spec.yaml > run.log`` keeps the steps and the summary. :class:`RunConsole` is that pair: ``print``
writes to stderr, :meth:`RunConsole.result` to stdout.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

from sailrl.runtime.sandbox.redact import redact

__all__ = ["PIPE_WIDTH", "RedactingConsole", "RunConsole", "make_console", "panel_expand"]

#: Columns a console writing to a pipe or a file lays out tables in: wide enough that no line is wrapped.
PIPE_WIDTH = 4096


class RedactingConsole(Console):
    """A rich console whose output never holds a secret of this process's environment
    (:func:`sailrl.runtime.sandbox.redact.redact` on the rendered text, whatever printed it)."""

    def _render_buffer(self, buffer: Any) -> str:
        return redact(super()._render_buffer(buffer))


def make_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """A ``rich.console.Console`` (``kwargs`` as rich takes them) that wraps only on a terminal and never prints a
    secret (:class:`RedactingConsole`)."""
    return _unwrapped(RedactingConsole(stderr=stderr, **kwargs), kwargs)


def _unwrapped(console: Console, kwargs: dict[str, Any]) -> Console:
    """``console`` set not to wrap when it writes to no terminal (see the module docstring)."""
    if not console.is_terminal and "width" not in kwargs and not os.environ.get("COLUMNS"):
        console.soft_wrap = True
        console.width = PIPE_WIDTH
    return console


class RunConsole(RedactingConsole):
    """A run's console: :meth:`print` (progress, notes, warnings) writes to stderr, :meth:`result` (step lines,
    the summary) to stdout. ``file`` / ``out_file`` (tests) replace stderr / stdout; other ``kwargs`` as rich
    takes them, for both streams. Neither wraps without a terminal (:func:`make_console`).
    """

    def __init__(self, *, out_file: Any = None, **kwargs: Any) -> None:
        super().__init__(stderr=True, **kwargs)
        _unwrapped(self, kwargs)
        out_kwargs = {k: v for k, v in kwargs.items() if k != "file"}
        self.out = make_console(file=out_file, **out_kwargs)

    def result(self, text: str) -> None:
        """Print ``text``, a line the run produced (plain text, never markup), to stdout. When stdout and stderr
        are both terminals (the same screen), it is printed through this console, above the progress bar, which
        a write beside the bar would garble."""
        if self.out.is_terminal and self.is_terminal:
            self.print(text, markup=False)
        else:
            self.out.print(text, markup=False)


def panel_expand(console: Console) -> bool:
    """Whether a panel should fill the console's width: on a terminal yes, else it fits its content (a
    :data:`PIPE_WIDTH`-wide border helps no one)."""
    return console.width < PIPE_WIDTH
