"""Regular expressions a spec writes: flag values, size limits and compiling, in one place.

Patterns are compiled with the ``regex`` module (what scoring uses, with per-match timeouts). Before compiling,
:func:`pattern_limit_problem` refuses patterns whose compilation alone would be costly or crash: group nesting
deeper than :data:`~sailrl.spec.constants.MAX_REGEX_NESTING` (the ``regex`` parser recurses per group; ~500 levels
raise RecursionError) and nested repeat counts whose product exceeds
:data:`~sailrl.spec.constants.MAX_REGEX_REPEAT` (``regex`` expands a repeat at compile time; the figures:
``benchmarks/limits.md``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from sailrl.spec.constants import MAX_REGEX_NESTING, MAX_REGEX_REPEAT, REGEX_FLAGS
from sailrl.spec.errors import ConfigError

__all__ = ["PatternError", "compile_pattern", "pattern_limit_problem", "regex_flags"]

_QUANT = re.compile(r"\{(\d*)(?:,(\d*))?\}")
_BRACED_ESCAPES = "xNpPuU"


class PatternError(ConfigError):
    """A pattern cannot be used. ``message``: plain words; ``pos``: 0-based offset into the pattern, or None;
    ``limit``: True when the pattern is over a size limit (it may well be valid syntax)."""

    code = "E011"

    def __init__(self, message: str, pos: int | None = None, *, limit: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos
        self.limit = limit


def regex_flags(names: Iterable[str]) -> int:
    """The ``regex`` flag value of flag names from :data:`~sailrl.spec.constants.REGEX_FLAGS` (unknown ones ignored)."""
    import regex

    value = 0
    for name in names:
        if name in REGEX_FLAGS:
            value |= getattr(regex, name)
    return value


def pattern_limit_problem(pattern: str) -> tuple[str, int] | None:
    """(plain-words problem, offset) when ``pattern`` exceeds a compile-time limit, else None.

    Counts group nesting (``(``) outside character classes, and for every atom the product of the minimum
    repeat counts (``{m}``, ``{m,n}``) of it and of the groups around it.
    """
    stack: list[int] = []  # per open group: the largest repeat product inside it so far
    i, n = 0, len(pattern)
    last: int | None = None  # weight of the atom just read (None: nothing a quantifier could apply to)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            j = i + 2
            if i + 1 < n and pattern[i + 1] in _BRACED_ESCAPES and j < n and pattern[j] == "{":
                close = pattern.find("}", j)
                j = close + 1 if close >= 0 else n
            i, last = j, 1
            continue
        if ch == "[":
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i, last = j + 1, 1
            continue
        if ch == "(":
            if pattern.startswith("(?#", i):
                close = pattern.find(")", i)
                i = close + 1 if close >= 0 else n
                continue
            stack.append(1)
            if len(stack) > MAX_REGEX_NESTING:
                return (f"groups are nested more than {MAX_REGEX_NESTING} levels deep; simplify the pattern", i)
            i, last = i + 1, None
            continue
        if ch == ")":
            inner = stack.pop() if stack else 1
            i, last = i + 1, inner
            weight = inner
        elif ch == "{" and last is not None and (m := _QUANT.match(pattern, i)) and (m.group(1) or m.group(2)):
            low = int(m.group(1)) if m.group(1) else 0
            weight = last * max(low, 1)
            if weight > MAX_REGEX_REPEAT:
                return (f"repeats a part at least {weight:,} times (nested repeat counts multiply); the limit is "
                        f"{MAX_REGEX_REPEAT:,}", i)
            i, last = m.end(), weight
        else:
            i, last = i + 1, (None if ch in "|" else 1)
            weight = 1
        if stack:
            stack[-1] = max(stack[-1], weight)
    return None


def compile_pattern(pattern: str, flags: Iterable[str] = ()) -> Any:
    """``regex.compile(pattern, flags)`` within the limits of :func:`pattern_limit_problem`.

    Raises :class:`PatternError` (with the offset when known) for a pattern over a limit or one that does not
    compile; never RecursionError, OverflowError or MemoryError.
    """
    import regex

    limit = pattern_limit_problem(pattern)
    if limit is not None:
        raise PatternError(limit[0], limit[1], limit=True)
    try:
        return regex.compile(pattern, regex_flags(flags))
    except regex.error as exc:
        pos = exc.pos if isinstance(exc.pos, int) else None
        raise PatternError(str(exc.msg if hasattr(exc, "msg") else exc), pos) from None
    except (RecursionError, OverflowError, MemoryError, ValueError, TypeError) as exc:
        raise PatternError(f"the pattern cannot be compiled ({type(exc).__name__}: {exc})") from None
