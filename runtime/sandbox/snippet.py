"""Running one Python snippet the way the built-in ``python`` tool does: standard library only.

This module's source is also what runs a snippet in its sandbox (:mod:`sailrl.runtime.sandbox.bubblewrap`, or a Sailbox
with ``environment.sandbox: sail``), so it imports nothing but the standard library and defines nothing that needs
sailrl.

:func:`run_code` executes the snippet in a fresh namespace (``__name__ == "__main__"``). When its last statement
is an expression, that expression's value is printed as a Python shell would show it (``repr``, nothing for
``None``), so ``2 ** 10`` alone answers ``1024``. An exception becomes :func:`error_text`: its type and message
and the snippet's line it came from, e.g. ``ZeroDivisionError: division by zero (line 3)``.
"""

from __future__ import annotations

import ast
import os
import sys

#: The file name a snippet's code is compiled under (its frames are the ones named in an error).
SNIPPET_FILE = "<snippet>"
#: Longest error text given back.
MAX_ERROR_CHARS = 500


def compile_snippet(code: str) -> tuple[object, object | None]:
    """(the code object of every statement but a last expression, that expression's code object or None).
    Raises SyntaxError."""
    tree = ast.parse(code, SNIPPET_FILE, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, SNIPPET_FILE, "exec")
    return body, (compile(last, SNIPPET_FILE, "eval") if last is not None else None)


def run_code(code: str) -> None:
    """Run ``code``; print the value of a last expression that is not None. Exceptions propagate."""
    body, last = compile_snippet(code)
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(body, namespace)  # noqa: S102 - the python tool runs the model's code, bounded by its caller
    if last is not None:
        value = eval(last, namespace)  # noqa: S307 - the snippet's own last expression
        if value is not None:
            print(repr(value))


def error_text(exc: BaseException) -> str:
    """``Type: message (line N)``: the exception and the snippet's line it was raised from (the deepest frame of
    the snippet in its traceback; a SyntaxError's own line)."""
    line = None
    if isinstance(exc, SyntaxError) and exc.filename == SNIPPET_FILE:
        line = exc.lineno
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == SNIPPET_FILE:
            line = tb.tb_lineno
        tb = tb.tb_next
    try:
        message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    except BaseException:  # noqa: BLE001 - an exception whose own text raises
        message = "(its message could not be read)"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 3] + "..."
    return text + (f" (line {line})" if line is not None else "")


#: Prefix of the one stderr line a sandboxed run writes when the snippet raised (followed by error_text).
ERROR_MARK = "\x00sailrl-snippet-error:"


def main(code: str) -> int:
    """A sandbox's entry point (bubblewrap or a Sailbox): run ``code``; on an exception write :data:`ERROR_MARK` +
    its text on stderr and return 1."""
    try:
        run_code(code)
    except BaseException as exc:  # noqa: BLE001 - every failure of the snippet is reported, none escapes
        _flush()
        try:
            os.write(2, ("\n" + ERROR_MARK + error_text(exc) + "\n").encode("utf-8", "replace"))
        except OSError:  # the snippet closed its stderr: the exit status still says it failed
            pass
        return 1
    _flush()
    return 0


def _flush() -> None:
    """Flush what the snippet printed; a snippet may have closed or replaced its streams."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed or broken stream has nothing more to give
            pass
