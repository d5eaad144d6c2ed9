"""Answer extraction and comparison for ``answer`` reward rules.

Extraction takes an answer string out of a text (a completion, or a dataset's reference field):

* ``boxed``: the last (or first) ``\\boxed{...}`` / ``\\fbox{...}``. Braces are balanced by counting, so
  ``\\boxed{\\frac{1}{2}}`` yields ``\\frac{1}{2}``; escaped braces ``\\{`` ``\\}`` do not count. ``\\boxed 7``
  (a space and one token) yields ``7``. The box that *starts* last is taken; if it is unclosed or empty there is
  no answer (an earlier box is not used: a model that corrects itself is graded on its final answer).
  This fixes the two pitfalls of the Sail guide's ``re.search(r"\\\\boxed\\s*\\{([^{}]+)\\}")``: nested braces
  and first-box-wins.
* ``regex``: a user pattern, with the ``regex`` module's ``timeout=`` (raises :class:`TimeoutError`).
* ``last_number``: the last number (``1,000``, ``-3.5``, ``2/3``).
* ``after_marker``: the rest of the line after the last marker (GSM8K: ``#### 72``); if that line is empty,
  the next non-empty line.
* ``whole``: the whole text, stripped.

``boxed`` with ``occurrence: all`` takes every box as one set (:func:`all_boxes`: ``\\boxed{1},\\boxed{2}`` ->
``\\{1, 2\\}``), for ``compare: math``.

Comparison (:class:`Comparator`): ``exact``, ``normalized`` (:func:`normalize`), ``numeric``
(:func:`parse_number`, exact :class:`fractions.Fraction` values) or ``math`` (math-verify, under a time limit, on
:func:`math_text`; an answer math-verify reads only in part -- :func:`is_partial_parse` -- is unreadable, so
the rule fails rather than pass on a prefix).

Bounds (so that no answer can stall scoring): :func:`normalize` and :func:`parse_number` run in time linear in
their input. ``numeric`` and ``math`` read answers of at most :data:`MAX_ANSWER_CHARS` characters; a number whose
written exponent is beyond +-:data:`MAX_EXPONENT` (``1e1001``) is rejected as out of range (within the range
values are exact, far beyond float's 1e308). ``math`` runs math-verify under ``math_timeout_s`` per step:
in the main thread with SIGALRM; in any other thread (the training loop scores in worker threads) in a
worker process (:mod:`sailrl.runtime.sandbox.workers`) that is killed when it overruns.

Percent policy (``numeric``): a trailing ``%`` / ``\\%`` is dropped, so ``50%`` equals ``50`` and never ``0.5``
(GSM8K-style references write the number of percent without the sign). Use ``compare: math`` if ``0.5`` must
equal ``50%``.

Only the standard library and ``regex`` are imported here; math-verify (sympy) is imported on first use.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import regex

from sailrl.runtime.sandbox.workers import WorkerError, WorkerPool, _Alarm, _short_exc, _TimeLimit
from sailrl.spec.errors import SailrlError
from sailrl.spec.rewards import Extractor

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_EXPONENT",
    "Comparator",
    "CompiledExtractor",
    "MathTimeout",
    "UnreadableAnswer",
    "after_marker",
    "all_boxes",
    "describe_extractor",
    "find_boxed",
    "find_number",
    "is_partial_parse",
    "math_text",
    "normalize",
    "number_problem",
    "numbers_close",
    "parse_number",
]

#: Longest answer (characters) that ``numeric`` and ``math`` comparisons read; a longer one is unusable.
MAX_ANSWER_CHARS = 1000
#: Largest written exponent (``1e1000``) a ``numeric`` answer may have; beyond it the number is out of range.
MAX_EXPONENT = 1000


# --------------------------------------------------------------------------------------------- extraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _box_span(text: str, i: int) -> tuple[str | None, int]:
    """(content, end) of the box whose command name ends at ``i``: content None when unclosed or empty; ``end``
    the index just past the box (``len(text)`` for an unclosed one)."""
    n = len(text)
    j = i
    while j < n and text[j] in " \t\n\r":
        j += 1
    if j >= n:
        return None, n
    if text[j] == "{":
        depth = 1
        k = j + 1
        while k < n:
            c = text[k]
            if c == "\\":
                k += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    content = text[j + 1 : k].strip()
                    return content or None, k + 1
            k += 1
        return None, n  # unclosed
    if j == i:  # "\boxed7" is not a box (LaTeX would need a space or braces)
        return None, i
    k = j
    while k < n and not text[k].isspace() and text[k] != "$":
        k += 1
    return text[j:k] or None, k


def _box_content(text: str, i: int) -> str | None:
    """Content of the box whose command name ends at ``i``; None when unclosed or empty."""
    return _box_span(text, i)[0]


def _first_or_last_box(text: str, last: bool) -> int:
    """End of the command name of the last (or first) box command, or -1."""
    best_start, best_end = -1, -1
    for cmd in _BOX_COMMANDS:
        i = text.rfind(cmd) if last else text.find(cmd)
        while i != -1:
            end = i + len(cmd)
            if end >= len(text) or not text[end].isalpha():
                break
            i = text.rfind(cmd, 0, i) if last else text.find(cmd, end)
        if i != -1 and (best_start == -1 or (i > best_start if last else i < best_start)):
            best_start, best_end = i, i + len(cmd)
    return best_end


def find_boxed(text: str, occurrence: str = "last") -> str | None:
    """The content of the last (or first) ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` in ``text``.

    Returns None when there is no box or when the chosen box is unclosed or empty. ``occurrence="all"``: every
    box, read as one set (:func:`all_boxes`).
    """
    if "\\boxed" not in text and "\\fbox" not in text:
        return None
    if occurrence == "all":
        return all_boxes(text)
    end = _first_or_last_box(text, occurrence == "last")
    return None if end == -1 else _box_content(text, end)


_BOX_START = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")


def all_boxes(text: str) -> str | None:
    """Every ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` as one answer: a single box's content as it is;
    several joined as the set ``\\{a, b\\}`` (repeats kept once, in order: ``\\boxed{1},\\boxed{2}`` -> ``\\{1,
    2\\}``, which ``compare: math`` reads as the set {1, 2}). A box inside another belongs to the outer one's
    content; unclosed and empty boxes are skipped; None when no box has content. Time: linear in ``len(text)``.
    """
    contents: dict[str, None] = {}
    pos = 0
    while True:
        m = _BOX_START.search(text, pos)
        if m is None:
            break
        content, pos = _box_span(text, m.end())
        pos = max(pos, m.end())
        if content is not None:
            contents[content] = None
    if not contents:
        return None
    found = list(contents)
    return found[0] if len(found) == 1 else "\\{" + ", ".join(found) + "\\}"


_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_NUMBER_IN_TEXT = re.compile(
    rf"(?:(?<![\w)\]}}])[-\u2212])?(?<![\d.,])(?:{_NUMBER})(?:\s*/\s*(?:{_NUMBER}))?(?![\d])"
)


def find_number(text: str, occurrence: str = "last") -> str | None:
    """The last (or first) number in ``text`` as written (``-1,000.5``, ``2/3``), or None.

    A ``-`` counts as a sign only when it does not follow a word character or a closing bracket
    (``5-3`` has the numbers ``5`` and ``3``).
    """
    if occurrence == "first":
        m = _NUMBER_IN_TEXT.search(text)
        return m.group(0).replace("\u2212", "-") if m else None
    last = None
    for last in _NUMBER_IN_TEXT.finditer(text):  # noqa: B007 - keep the final match
        pass
    return last.group(0).replace("\u2212", "-") if last else None


def after_marker(text: str, marker: str, occurrence: str = "last") -> str | None:
    """The rest of the line after the last (or first) ``marker``, stripped; if empty, the next non-empty line."""
    i = text.rfind(marker) if occurrence == "last" else text.find(marker)
    if i == -1:
        return None
    for line in text[i + len(marker) :].split("\n"):
        line = line.strip()
        if line:
            return line
    return None


def describe_extractor(ex: Extractor, *, subject: str = "completion", located: bool = False) -> str:
    """Plain words for what an extractor takes, e.g. ``the last \\boxed{...} answer``; with ``located``, where
    from too (``the last \\boxed{...} answer in the completion``; ``the whole completion`` says it once)."""
    which = ex.occurrence
    if ex.from_ == "boxed":
        s = ("every \\boxed{...} answer, read as one set" if which == "all"
             else f"the {which} \\boxed{{...}} answer")
    elif ex.from_ == "regex":
        flags = f" (flags {', '.join(ex.flags)})" if ex.flags else ""
        s = f"the capture group of the {which} match of '{ex.pattern}'{flags}"
    elif ex.from_ == "last_number":
        s = f"the {which} number"
    elif ex.from_ == "after_marker":
        s = f"the text after the {which} '{ex.marker}'"
    else:
        return f"the whole {subject}"
    if located:
        s += f" in the {subject}"
    if ex.fallback == "whole":
        s += f" (or the whole {subject} if there is none)"
    return s


class CompiledExtractor:
    """An :class:`~sailrl.spec.rewards.Extractor` ready to run.

    ``extractor(text) -> str | None`` (None: nothing found). A ``regex`` extractor raises
    :class:`TimeoutError` when the pattern runs longer than ``timeout_s`` seconds on ``text``.
    """

    def __init__(self, ex: Extractor, timeout_s: float) -> None:
        self.spec = ex
        self.timeout_s = timeout_s
        #: Extractors with equal keys give equal answers on the same text (lets a scorer reuse a result).
        self.key = (ex.from_, ex.pattern, tuple(ex.flags), ex.occurrence, ex.marker, ex.fallback)
        self.kind = ex.from_
        self._fn: Callable[[str], str | None]
        self._regex: Callable[[str, float], str | None] | None = None
        occ = ex.occurrence
        if ex.from_ == "boxed":
            self._fn = lambda t: find_boxed(t, occ)
        elif ex.from_ == "regex":
            self.pattern = regex.compile(ex.pattern or "", _flags(ex.flags))
            self._group: int | str = "answer" if "answer" in self.pattern.groupindex else 1
            self._fn = lambda t: None  # regexes run in __call__, with their time limit
            self._regex = self._regex_first if occ == "first" else self._regex_last
        elif ex.from_ == "last_number":
            self._fn = lambda t: find_number(t, occ)
        elif ex.from_ == "after_marker":
            marker = ex.marker or ""
            self._fn = lambda t: after_marker(t, marker, occ)
        else:
            self._fn = lambda t: t.strip() or None
        self._fallback = ex.fallback == "whole"

    def _regex_first(self, text: str, timeout_s: float) -> str | None:
        for m in self.pattern.finditer(text, timeout=timeout_s):
            value = m.group(self._group)
            if value is not None and value.strip():
                return value.strip()
        return None

    def _regex_last(self, text: str, timeout_s: float) -> str | None:
        found = None
        for m in self.pattern.finditer(text, timeout=timeout_s):
            value = m.group(self._group)
            if value is not None and value.strip():
                found = value
        return found.strip() if found is not None else None

    def __call__(self, text: str, timeout_s: float | None = None) -> str | None:
        """The answer in ``text`` or None. ``timeout_s``: the regex time limit for this call (default the
        extractor's ``timeout_s``)."""
        if self._regex is not None:
            regex_fn = self._regex
            value = cpu_time_limited(lambda t: regex_fn(text, t), self.timeout_s if timeout_s is None else timeout_s)
        else:
            value = self._fn(text)
        if value is None and self._fallback:
            value = text.strip() or None
        return value

    def describe(self, subject: str = "completion", *, located: bool = False) -> str:
        return describe_extractor(self.spec, subject=subject, located=located)


#: Tries a regex gets when its wall-clock time limit passed while its thread had used less CPU than the limit.
REGEX_TRIES = 4


def cpu_time_limited(run: Callable[[float], Any], limit_s: float) -> Any:
    """``run(timeout_s)`` -- a ``regex`` call with the module's wall-clock ``timeout=`` -- within ``limit_s``
    seconds of this thread's CPU time (``time.thread_time``).

    A wall-clock timeout that came while the thread had used less CPU than the limit means it was waiting for a
    core or the interpreter lock (other threads, a busy machine), not that the pattern was slow; it is retried
    with the CPU time left, at most :data:`REGEX_TRIES` times, so a trivial pattern never fails because the
    machine was busy (and a seeded run repeats). Raises ``TimeoutError`` once the pattern has used the limit's
    CPU time, or after the last try; wall time is at most ``REGEX_TRIES * limit_s``.
    """
    used = 0.0
    for _ in range(REGEX_TRIES):
        started = time.thread_time()
        try:
            return run(max(limit_s - used, 1e-3))
        except TimeoutError:
            used += time.thread_time() - started
            if used >= 0.9 * limit_s:
                raise
    raise TimeoutError(f"the pattern did not finish within {limit_s:g} s in {REGEX_TRIES} tries")


def _flags(names: list[str] | tuple[str, ...]) -> int:
    value = 0
    for name in names:
        value |= getattr(regex, name)
    return value


# --------------------------------------------------------------------------------------------- normalizing

_WRAPPER_TOKENS = re.compile(
    r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{|[{}]"
)
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_LATEX_SPACE = re.compile(r"\\[,!;: ]|~")
_DFRAC = re.compile(r"\\[dt]frac(?![a-zA-Z])")
_WHITESPACE = re.compile(r"\s+")
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")


def _unwrap_text(s: str, sep: str = "") -> str:
    """Replace each ``\\text{X}`` (``\\textbf``, ``\\mathrm``, ``\\mbox``, ...) by ``sep + X``, innermost first.

    A wrapper is unwrapped when its content has no other braces once the wrappers inside it are unwrapped
    (``\\text{\\text{a}}`` -> ``a``; ``\\text{a{b}}`` stays). One pass with a stack: time linear in ``len(s)``
    however deep the nesting (repeating a regex substitution until nothing changes is quadratic).
    """
    if "\\" not in s:
        return s
    out: list[str] = []
    # Open groups: [index of the opening piece in out, is a wrapper, holds a plain group (so stays)].
    stack: list[list[Any]] = []
    pos = 0
    for m in _WRAPPER_TOKENS.finditer(s):
        out.append(s[pos:m.start()])
        pos = m.end()
        tok = m.group(0)
        if tok == "}":
            if not stack:
                out.append(tok)
                continue
            start, wrapper, blocked = stack.pop()
            if wrapper and not blocked:
                out[start] = sep
            else:
                out.append(tok)
                if stack:
                    stack[-1][2] = True
            continue
        stack.append([len(out), tok != "{", False])
        out.append(tok)
    out.append(s[pos:])
    return "".join(out)


def _ungroup_thousands(s: str) -> str:
    if "," not in s:
        return s
    return _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), s)


def normalize(s: str) -> str:
    """The ``normalized`` comparison form of an answer.

    Unwraps ``\\text{...}`` (and ``\\textbf``, ``\\mathrm``, ``\\mbox``, ...), drops ``$`` and ``\\$``,
    ``\\left`` / ``\\right`` and LaTeX spacing (``\\,`` ``\\!`` ``~``), reads ``{,}`` as ``,``, treats ``\\dfrac`` /
    ``\\tfrac`` as ``\\frac``, removes all whitespace, lower-cases, strips trailing periods and removes thousands
    separators only where digits are grouped by three (``1,000,000`` -> ``1000000``; ``1,2`` and ``(1,23)`` stay).
    """
    s = _unwrap_text(s)
    s = s.replace("\\$", "").replace("$", "")
    if "\\" in s:
        s = _LEFT_RIGHT.sub("", s)
        s = _LATEX_SPACE.sub("", s)
        s = _DFRAC.sub(r"\\frac", s)
    elif "~" in s:
        s = s.replace("~", "")
    s = s.replace("{,}", ",")
    s = _WHITESPACE.sub("", s).lower().rstrip(".")
    return _ungroup_thousands(s)


# --------------------------------------------------------------------------------------------- numbers

_PLAIN_NUMBER = re.compile(rf"([-+]?)((?:{_NUMBER}))(?:[eE]([-+]?\d+))?")
_LATEX_FRAC = re.compile(r"([-+]?)\\frac\s*(?:\{([^{}]+)\}|(\d))\s*(?:\{([^{}]+)\}|(\d))")
_SLASH_FRAC = re.compile(r"([-+]?)\s*\(?([^/()]+?)\)?\s*/\s*\(?([^/()]+?)\)?")
_UNIT_SUFFIX = re.compile(r"(?<=[\d}.])\s+[a-zA-Z][a-zA-Z ]*\.?$")
#: ``,\\!`` between digit groups (MATH-style thousands: ``32,\\! 349``), spaces after it allowed.
_LATEX_THOUSANDS = re.compile(r"(?<=\d),\\!\s*(?=\d{3}(?!\d))")
#: A leading ``x =`` (one letter, an optional subscript): ``x = 11`` is the number 11.
_NAME_EQUALS = re.compile(r"^[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=(?!=)\s*(?=[^=]*$)")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|\u00b0")


class _OutOfRange(SailrlError):
    """A number's written exponent is beyond +-MAX_EXPONENT (internal: parse_number answers None)."""


def _number_text(s: str) -> str:
    """Strip what decorates a number: $, \\$, %, \\%, \\text{} units, spacing, degrees, a trailing period."""
    s = _unwrap_text(s.strip(), " ")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.replace("\u2212", "-").replace("{,}", ",")
    if "\\" in s or "~" in s:
        if ",\\!" in s:
            s = _LATEX_THOUSANDS.sub(",", s)  # MATH-style 32,\! 349
        s = _LATEX_SPACE.sub("", s)
        s = _LEFT_RIGHT.sub("", s)
        s = _DFRAC.sub(r"\\frac", s)
    if "^" in s or "\u00b0" in s:
        s = _DEGREES.sub("", s)
    s = s.strip().rstrip(".").strip()
    if "=" in s:
        s = _NAME_EQUALS.sub("", s, count=1)  # x = 11
    if s and s[-1].isalpha():
        s = _UNIT_SUFFIX.sub("", s).strip()
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}" and "}" not in s[1:-1]:
        s = s[1:-1].strip()
    return s


def _plain_number(s: str) -> Fraction | None:
    """The value of a plain number (sign, digits, thousands separators, decimals, exponent), else None.

    Raises _OutOfRange when the exponent is beyond +-MAX_EXPONENT (10**exponent is never built for it).
    """
    s = s.strip()
    if s.isdecimal():  # the common case: a bare integer (length is capped by the callers)
        return Fraction(int(s))
    m = _PLAIN_NUMBER.fullmatch(s)
    if not m:
        return None
    sign, mantissa, exponent = m.groups()
    mantissa = mantissa.replace(",", "")
    value = Fraction(int(mantissa)) if mantissa.isdecimal() else Fraction(mantissa)
    if exponent is not None:
        digits = exponent.lstrip("+-").lstrip("0")
        if len(digits) > len(str(MAX_EXPONENT)) or int(exponent) > MAX_EXPONENT or int(exponent) < -MAX_EXPONENT:
            raise _OutOfRange
        e = int(exponent)
        value = value * 10**e if e >= 0 else value / 10**-e
    return -value if sign == "-" else value


def _parse(s: str) -> Fraction | None:
    value = _plain_number(s)  # fast path: already a plain number
    if value is not None:
        return value
    t = _number_text(s)
    if not t:
        return None
    value = _plain_number(t)
    if value is not None:
        return value
    m = _LATEX_FRAC.fullmatch(t)
    if m:
        num = _plain_number(_number_text(m.group(2) or m.group(3)))
        den = _plain_number(_number_text(m.group(4) or m.group(5)))
        if num is None or den is None or den == 0:
            return None
        value = num / den
        return -value if m.group(1) == "-" else value
    if "/" in t:
        m = _SLASH_FRAC.fullmatch(t)
        if m:
            num = _plain_number(m.group(2))
            den = _plain_number(m.group(3))
            if num is None or den is None or den == 0:
                return None
            value = num / den
            return -value if m.group(1) == "-" else value
    return None


def parse_number(s: str) -> Fraction | None:
    """The exact value of a numeric answer, or None when ``s`` is not a number (:func:`number_problem` says why).

    Accepts integers and decimals with an optional sign and thousands separators grouped by three
    (``-1,000.50``; LaTeX's ``32,\\! 349`` and ``32{,}349`` too), scientific notation (``1e-3``), ``\\frac{a}{b}`` /
    ``\\dfrac`` / ``\\frac12``, ``a/b``, surrounding ``$`` / ``\\$``, a trailing ``%`` (dropped: ``50%`` is 50),
    degrees, a leading ``x =`` (one letter), trailing unit words (``18 dollars``, ``\\text{ cm}``,
    ``\\text{5 apples}``: one rule, inside a text wrapper or not) and a trailing period. Values are
    :class:`fractions.Fraction`, so ``0.5 == \\frac{1}{2}`` and ``2/3 == \\frac{2}{3}`` exactly. None as well for a
    text over :data:`MAX_ANSWER_CHARS` characters and for an exponent beyond +-:data:`MAX_EXPONENT` (``1e1001``).
    Time: linear in ``len(s)``.
    """
    if len(s) > MAX_ANSWER_CHARS:
        return None
    try:
        return _parse(s)
    except _OutOfRange:
        return None


def number_problem(s: str) -> str | None:
    """Why :func:`parse_number` gives None for ``s`` (plain words, completing "the answer ..."), or None."""
    if len(s) > MAX_ANSWER_CHARS:
        return (f"is {len(s):,} characters long; compare: numeric reads answers of at most "
                f"{MAX_ANSWER_CHARS:,} characters")
    try:
        value = _parse(s)
    except _OutOfRange:
        return f"is out of range (compare: numeric reads exponents up to +-{MAX_EXPONENT})"
    if value is None:
        return "is not a number, but the rule compares numerically (compare: numeric)"
    return None


def numbers_close(a: Fraction, b: Fraction, abs_tol: float = 0.0, rel_tol: float = 0.0) -> bool:
    """``a == b`` exactly, or ``|a - b| <= max(abs_tol, rel_tol * max(|a|, |b|))`` (as in :func:`math.isclose`)."""
    if a == b:
        return True
    if not abs_tol and not rel_tol:
        return False
    tol = max(Fraction(repr(abs_tol)), Fraction(repr(rel_tol)) * max(abs(a), abs(b)))
    return abs(a - b) <= tol


# --------------------------------------------------------------------------------------------- math-verify


class MathTimeout(BaseException):
    """A math-verify parse or comparison ran past its time limit.

    A BaseException, not a :class:`~sailrl.spec.errors.SailrlError`: the SIGALRM handler raises it inside
    math-verify, whose own ``except Exception`` clauses would otherwise swallow it and let the slow
    computation go on. It is a control-flow signal (the rule then fails and the timeout is counted), never an
    error shown to the user.
    """


class UnreadableAnswer(SailrlError, ValueError):
    """math-verify cannot read an answer (``side``: ``"answer"`` or ``"reference"``); the rule fails."""

    code = "E132"

    def __init__(self, side: str) -> None:
        super().__init__(f"math-verify cannot read the {side}")
        self.side = side


@contextmanager
def _time_limit(seconds: float):
    """Raise :class:`MathTimeout` in the block after ``seconds`` (SIGALRM; call from the main thread only)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        raise RuntimeError("_time_limit needs the main thread; other threads use the math worker process")

    def _alarm(signum: int, frame: Any) -> None:
        raise MathTimeout(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_math_verify: Any = None


def _mv() -> Any:
    """math_verify, imported on first use, with its 'timeout disabled' warnings silenced (we time it ourselves)."""
    global _math_verify
    if _math_verify is None:
        import logging

        # lazy: math-verify and sympy take seconds to import; only a math comparison loads them, once
        import math_verify

        # lazy: sympy's simplify imports it on first use (0.6 s): load it here, not inside a time limit
        import sympy.physics.units  # noqa: F401

        class _DropTimeoutNotice(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                return "Timeout is disabled" not in record.getMessage()

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutNotice())
        _math_verify = math_verify
    return _math_verify


#: One letter in an upright/text wrapper (``\\mathrm{e}``, ``\\text{i}``, ``\\operatorname{d}``): math-verify would
#: drop it as a unit (``1 + \\mathrm{e}`` read as ``1 +``, i.e. 1), so it is read as the bare letter.
_WRAPPED_LETTER = re.compile(
    r"\\(?:mathrm|text|textrm|textit|textbf|mathit|mathbf|mathsf|operatorname|mbox|rm)\s*\{\s*([A-Za-z])\s*\}")
#: ``\\text{5 apples}``: a number and unit words inside one text wrapper, read as ``5\\text{ apples}`` (the number
#: and its unit, as ``compare: numeric`` reads it and as math-verify reads the bare ``5 apples``).
_WRAPPED_NUMBER_UNIT = re.compile(
    r"\\(?:text|textrm|textit|textbf|mathrm|mbox)\s*\{\s*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)"
    r"\s+([A-Za-z][A-Za-z ]*?)\.?\s*\}")
#: What a complete expression cannot end with: math-verify read only a prefix of the answer when the text it
#: reports parsing ends like this (``1 +``, ``x \\cdot``, ``y =``).
_DANGLING = re.compile(
    r"(?:[-+*/=^_<>,(\[{]|\\(?:cdot|times|div|pm|mp|leq?|geq?|neq?|lt|gt|approx|equiv|sim|to|frac|sqrt|\{|left)"
    r"(?![a-zA-Z]))$")
_TRAILING_SPACE = re.compile(r"(?:\s|\\[,;:! ]|~)+$")


def math_text(answer: str) -> str:
    """The text math-verify is given for an answer: one letter in a wrapper read bare (``\\mathrm{e}`` -> ``e``,
    Euler's number as math-verify reads a bare ``e``), and ``\\text{5 apples}`` read as ``5\\text{ apples}``. Time:
    linear in ``len(answer)``."""
    if "\\" not in answer:
        return answer
    answer = _WRAPPED_LETTER.sub(r"\1", answer)
    return _WRAPPED_NUMBER_UNIT.sub(r"\1\\text{ \2}", answer)


def is_partial_parse(parsed: list[Any]) -> bool:
    """True when math-verify read only a prefix of an answer: the text it reports parsing (the last string in its
    result) ends with an operator, a relation or an open bracket (``1 + \\mathrm{ex}`` -> ``1 +``, read as 1)."""
    texts = [p for p in parsed if isinstance(p, str)]
    return bool(texts) and _DANGLING.search(_TRAILING_SPACE.sub("", texts[-1])) is not None


def math_parse_unlimited(answer: str) -> list[Any]:
    """math-verify's parse of one answer (:func:`math_text`, wrapped in ``$...$``, else as written); [] when
    nothing parses or when only a prefix of it does (:func:`is_partial_parse`: a wrong answer must never pass
    because its tail was dropped, so such an answer is unreadable and the rule fails).

    No time limit of its own: callers bound it (:func:`math_parse`, or the math worker process).
    """
    mv = _mv()
    text = math_text(answer)
    parsed = mv.parse(f"${text}$", parsing_timeout=None)
    if not parsed:
        parsed = mv.parse(text, parsing_timeout=None)
    return [] if is_partial_parse(parsed) else parsed


def math_equal_unlimited(gold: list[Any], pred: list[Any]) -> bool:
    """math-verify's ``verify(gold, pred)`` with no time limit of its own (callers bound it)."""
    return bool(_mv().verify(gold, pred, timeout_seconds=None))


def math_parse(answer: str, timeout_s: float) -> list[Any]:
    """:func:`math_parse_unlimited` under ``timeout_s`` (main thread only). Raises MathTimeout. math-verify and
    sympy are imported first, outside the limit (the import takes seconds on a busy machine: a first answer must
    not fail because the import was slow; ``benchmarks/limits.md``)."""
    _mv()
    with _time_limit(timeout_s):
        return math_parse_unlimited(answer)


def math_equal(gold: list[Any], pred: list[Any], timeout_s: float) -> bool:
    """math-verify's ``verify(gold, pred)`` under ``timeout_s`` (main thread only). Raises MathTimeout."""
    _mv()
    with _time_limit(timeout_s):
        return math_equal_unlimited(gold, pred)


_MATH_POOL: Any = None
_MATH_POOL_LOCK = threading.Lock()


def _math_pool() -> Any:
    """The process's math worker pool (started on first use; up to 2 processes)."""
    global _MATH_POOL
    with _MATH_POOL_LOCK:
        if _MATH_POOL is None:
            import os


            _MATH_POOL = WorkerPool({"kind": "math", "job": "sailrl.runtime.rewards.answers:MathJob"}, size=min(2, os.cpu_count() or 1), start_timeout_s=120.0)
        return _MATH_POOL


_FORMS_CACHE_SIZE = 4096
_MISSING = object()


class _MathValue:
    """An answer for ``compare: math``: its text and, when read in the main thread, math-verify's parse."""

    __slots__ = ("parsed", "text")

    def __init__(self, text: str, parsed: list[Any] | None) -> None:
        self.text = text
        self.parsed = parsed


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")


# --------------------------------------------------------------------------------------------- comparison


class Comparator:
    """One comparison kind.

    ``prepare(answer) -> prepared | None`` turns an extracted answer into its comparison form (None: not usable,
    e.g. not a number for ``numeric``; :meth:`unusable` says why); ``equal(prepared_ref, prepared_pred) -> bool``.
    ``math`` may raise :class:`MathTimeout` (time limit), :class:`UnreadableAnswer` (an answer math-verify
    cannot read, found only off the main thread) and :class:`~sailrl.runtime.sandbox.workers.WorkerError` from both.
    In the main thread ``math`` runs in this process under SIGALRM; in other threads, in the math worker
    process, where each call takes at most 3 x ``math_timeout_s`` plus the worker's grace period.
    """

    def __init__(self, kind: str, *, abs_tol: float = 0.0, rel_tol: float = 0.0, math_timeout_s: float = 2.0):
        self.kind = kind
        self.abs_tol = abs_tol
        self.rel_tol = rel_tol
        self.math_timeout_s = math_timeout_s
        # numeric / normalized forms of recent answers (the rollouts of a group often give the same answer)
        self._forms: dict[str, Any] = {}

    def prepare(self, answer: str) -> Any:
        if self.kind == "exact":
            return answer.strip() or None
        if self.kind in ("numeric", "normalized"):
            forms = self._forms
            form = forms.get(answer, _MISSING)  # one lookup: another thread may clear the cache meanwhile
            if form is not _MISSING:
                return form
            form = parse_number(answer) if self.kind == "numeric" else (normalize(answer) or None)
            if len(answer) <= 256:
                if len(forms) >= _FORMS_CACHE_SIZE:
                    forms.clear()
                forms[answer] = form
            return form
        if len(answer) > MAX_ANSWER_CHARS or not answer.strip():
            return None
        if not _in_main_thread():
            return _MathValue(answer, None)  # read by the worker process when compared
        parsed = math_parse(answer, self.math_timeout_s)
        return _MathValue(answer, parsed) if parsed else None

    def equal(self, ref: Any, pred: Any, *, timeout_s: float | None = None) -> bool:
        """Whether the prepared values are equal. ``timeout_s``: a lower time limit for ``math`` (a budget)."""
        if self.kind == "numeric":
            return numbers_close(ref, pred, self.abs_tol, self.rel_tol)
        if self.kind == "math":
            limit = self.math_timeout_s if timeout_s is None else min(self.math_timeout_s, timeout_s)
            if ref.parsed is not None and pred.parsed is not None and _in_main_thread():
                return math_equal(ref.parsed, pred.parsed, limit)
            reply = _math_pool().call({"op": "equal", "ref": ref.text, "pred": pred.text}, 3 * limit)
            result = reply.get("result")
            if result in ("equal", "unequal"):
                return result == "equal"
            if result == "timeout":
                raise MathTimeout(f"took longer than {limit:g} s")
            if result == "pred_unreadable":
                raise UnreadableAnswer("answer")
            if result == "ref_unreadable":
                raise UnreadableAnswer("reference")

            raise WorkerError(f"math worker: {reply.get('message', result)}")
        return bool(ref == pred)

    def unusable(self, answer: str | None = None) -> str:
        """Why a prepared value came out None, in plain words (more precise when given the ``answer``)."""
        if answer is not None and self.kind == "numeric":
            return number_problem(answer) or "is not a number, but the rule compares numerically (compare: numeric)"
        if answer is not None and self.kind == "math" and len(answer) > MAX_ANSWER_CHARS:
            return (f"is {len(answer):,} characters long; compare: math reads answers of at most "
                    f"{MAX_ANSWER_CHARS:,} characters")
        return {
            "exact": "is empty",
            "normalized": "is empty once normalized",
            "numeric": "is not a number, but the rule compares numerically (compare: numeric)",
            "math": "is not a math expression math-verify can read (compare: math)",
        }[self.kind]

    def sentence(self, pred: str, ref: str) -> str:
        """``pred`` and ``ref`` (plain-word descriptions) joined by what this comparison checks."""
        if self.kind == "exact":
            return f"{pred} is exactly the same text as {ref}"
        if self.kind == "normalized":
            return f"{pred} equals {ref} (ignoring case, spaces, $ signs, \\text{{}} and thousands separators)"
        if self.kind == "numeric":
            tol = []
            if self.abs_tol:
                tol.append(f"within {self.abs_tol:g}")
            if self.rel_tol:
                tol.append(f"within {self.rel_tol:g} relative")
            tol.append("a unit word after the number is ignored: '7 apples' counts as 7")
            return f"{pred} equals {ref} as a number ({'; '.join(tol)})"
        return f"{pred} is mathematically equivalent to {ref} (math-verify)"


class MathJob:
    """The math pool's worker job (:mod:`sailrl.runtime.sandbox.worker_child` loads it): math-verify in the child,
    ``parse`` (is the text readable?) and ``equal`` (reference vs answer)."""

    def __init__(self, init: dict[str, Any]) -> None:
        _mv()  # import math-verify (sympy) now, not in the first request's time limit
        self.cache: dict[str, list[Any]] = {}
        self.info: dict[str, Any] = {}

    def _parse(self, text: str, timeout_s: float) -> list[Any]:
        hit = self.cache.get(text)
        if hit is not None:
            return hit
        with _TimeLimit(timeout_s):
            parsed = math_parse_unlimited(text)
        if len(self.cache) >= 4096:
            self.cache.clear()
        self.cache[text] = parsed
        return parsed

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        t = float(req["timeout_s"]) / 3  # up to three math-verify steps share the request's limit
        try:
            if req["op"] == "parse":
                return {"result": "ok" if self._parse(req["text"], t) else "unreadable"}
            ref = self._parse(req["ref"], t)
            if not ref:
                return {"result": "ref_unreadable"}
            pred = self._parse(req["pred"], t)
            if not pred:
                return {"result": "pred_unreadable"}
            with _TimeLimit(t):
                ok = math_equal_unlimited(ref, pred)
            return {"result": "equal" if ok else "unequal"}
        except _Alarm:
            return {"result": "timeout"}
        except Exception as exc:  # noqa: BLE001 - a math-verify bug fails this comparison only
            return {"result": "error", "message": _short_exc(exc)}
