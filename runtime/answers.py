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

Comparison (:class:`Comparator`): ``exact``, ``normalized`` (:func:`normalize`), ``numeric``
(:func:`parse_number`, exact :class:`fractions.Fraction` values) or ``math`` (math-verify, under a time limit).

Percent policy (``numeric``): a trailing ``%`` / ``\\%`` is dropped, so ``50%`` equals ``50`` and never ``0.5``
(GSM8K-style references write the number of percent without the sign). Use ``compare: math`` if ``0.5`` must
equal ``50%``.

Only the standard library and ``regex`` are imported here; math-verify (sympy) is imported on first use.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager
from fractions import Fraction
from typing import Any

import regex

from sailrl.spec.rewards import Extractor

__all__ = [
    "Comparator",
    "CompiledExtractor",
    "MathTimeout",
    "after_marker",
    "describe_extractor",
    "find_boxed",
    "find_number",
    "normalize",
    "numbers_close",
    "parse_number",
]


# --------------------------------------------------------------------------------------------- extraction

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _box_content(text: str, i: int) -> str | None:
    """Content of the box whose command name ends at ``i``; None when unclosed or empty."""
    n = len(text)
    j = i
    while j < n and text[j] in " \t\n\r":
        j += 1
    if j >= n:
        return None
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
                    return content or None
            k += 1
        return None  # unclosed
    if j == i:  # "\boxed7" is not a box (LaTeX would need a space or braces)
        return None
    k = j
    while k < n and not text[k].isspace() and text[k] != "$":
        k += 1
    return text[j:k] or None


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

    Returns None when there is no box or when the chosen box is unclosed or empty.
    """
    if "\\boxed" not in text and "\\fbox" not in text:
        return None
    end = _first_or_last_box(text, occurrence == "last")
    return None if end == -1 else _box_content(text, end)


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


def describe_extractor(ex: Extractor, *, subject: str = "completion") -> str:
    """Plain words for what an extractor takes, e.g. ``the last \\boxed{...} answer``."""
    which = ex.occurrence
    if ex.from_ == "boxed":
        s = f"the {which} \\boxed{{...}} answer"
    elif ex.from_ == "regex":
        flags = f" (flags {', '.join(ex.flags)})" if ex.flags else ""
        s = f"the capture group of the {which} match of '{ex.pattern}'{flags}"
    elif ex.from_ == "last_number":
        s = f"the {which} number"
    elif ex.from_ == "after_marker":
        s = f"the text after the {which} '{ex.marker}'"
    else:
        return f"the whole {subject}"
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
        occ = ex.occurrence
        if ex.from_ == "boxed":
            self._fn = lambda t: find_boxed(t, occ)
        elif ex.from_ == "regex":
            self.pattern = regex.compile(ex.pattern or "", _flags(ex.flags))
            self._group: int | str = "answer" if "answer" in self.pattern.groupindex else 1
            self._fn = self._regex_first if occ == "first" else self._regex_last
        elif ex.from_ == "last_number":
            self._fn = lambda t: find_number(t, occ)
        elif ex.from_ == "after_marker":
            marker = ex.marker or ""
            self._fn = lambda t: after_marker(t, marker, occ)
        else:
            self._fn = lambda t: t.strip() or None
        self._fallback = ex.fallback == "whole"

    def _regex_first(self, text: str) -> str | None:
        for m in self.pattern.finditer(text, timeout=self.timeout_s):
            value = m.group(self._group)
            if value is not None and value.strip():
                return value.strip()
        return None

    def _regex_last(self, text: str) -> str | None:
        found = None
        for m in self.pattern.finditer(text, timeout=self.timeout_s):
            value = m.group(self._group)
            if value is not None and value.strip():
                found = value
        return found.strip() if found is not None else None

    def __call__(self, text: str) -> str | None:
        value = self._fn(text)
        if value is None and self._fallback:
            value = text.strip() or None
        return value

    def describe(self, subject: str = "completion") -> str:
        return describe_extractor(self.spec, subject=subject)


def _flags(names: list[str] | tuple[str, ...]) -> int:
    value = 0
    for name in names:
        value |= getattr(regex, name)
    return value


# --------------------------------------------------------------------------------------------- normalizing

_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_LATEX_SPACE = re.compile(r"\\[,!;: ]|~")
_DFRAC = re.compile(r"\\[dt]frac(?![a-zA-Z])")
_WHITESPACE = re.compile(r"\s+")
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")


def _unwrap_text(s: str, sep: str = "") -> str:
    if "\\" not in s:
        return s
    prev = None
    while prev != s:
        prev, s = s, _TEXT_WRAPPER.sub(sep + r"\1", s)
    return s


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

_PLAIN_NUMBER = re.compile(rf"[-+]?(?:{_NUMBER})(?:[eE][-+]?\d+)?")
_LATEX_FRAC = re.compile(r"([-+]?)\\frac\s*(?:\{([^{}]+)\}|(\d))\s*(?:\{([^{}]+)\}|(\d))")
_SLASH_FRAC = re.compile(r"([-+]?)\s*\(?([^/()]+?)\)?\s*/\s*\(?([^/()]+?)\)?")
_UNIT_SUFFIX = re.compile(r"(?<=[\d}.])\s+[a-zA-Z][a-zA-Z ]*\.?$")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|\u00b0")


def _number_text(s: str) -> str:
    """Strip what decorates a number: $, \\$, %, \\%, \\text{} units, spacing, degrees, a trailing period."""
    s = _unwrap_text(s.strip(), " ")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = s.replace("\u2212", "-").replace("{,}", ",")
    if "\\" in s or "~" in s:
        s = _LATEX_SPACE.sub("", s)
        s = _LEFT_RIGHT.sub("", s)
        s = _DFRAC.sub(r"\\frac", s)
    if "^" in s or "\u00b0" in s:
        s = _DEGREES.sub("", s)
    s = s.strip().rstrip(".").strip()
    if s and s[-1].isalpha():
        s = _UNIT_SUFFIX.sub("", s).strip()
    while len(s) >= 2 and s[0] == "{" and s[-1] == "}" and "}" not in s[1:-1]:
        s = s[1:-1].strip()
    return s


def _plain_number(s: str) -> Fraction | None:
    s = s.strip()
    if not _PLAIN_NUMBER.fullmatch(s):
        return None
    s = s.replace(",", "")
    if s.isdigit() or (s[0] in "+-" and s[1:].isdigit()):
        return Fraction(int(s))
    return Fraction(s)


def parse_number(s: str) -> Fraction | None:
    """The exact value of a numeric answer, or None when ``s`` is not a number.

    Accepts integers and decimals with an optional sign and thousands separators grouped by three
    (``-1,000.50``), scientific notation (``1e-3``), ``\\frac{a}{b}`` / ``\\dfrac`` / ``\\frac12``, ``a/b``,
    surrounding ``$`` / ``\\$``, a trailing ``%`` (dropped: ``50%`` is 50), degrees, a trailing unit word
    (``18 dollars``, ``\\text{ cm}``) and a trailing period. Values are :class:`fractions.Fraction`, so
    ``0.5 == \\frac{1}{2}`` and ``2/3 == \\frac{2}{3}`` exactly.
    """
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

    A BaseException so that math-verify's own ``except Exception`` cannot swallow it.
    """


@contextmanager
def _time_limit(seconds: float):
    """Raise :class:`MathTimeout` in the block after ``seconds`` (SIGALRM; main thread only, else no limit)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

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

        import math_verify

        class _DropTimeoutNotice(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                return "Timeout is disabled" not in record.getMessage()

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutNotice())
        _math_verify = math_verify
    return _math_verify


def math_parse(answer: str, timeout_s: float) -> list[Any]:
    """math-verify's parse of one answer (wrapped in ``$...$``); [] when nothing parses. Raises MathTimeout."""
    mv = _mv()
    with _time_limit(timeout_s):
        parsed = mv.parse(f"${answer}$", parsing_timeout=None)
        if not parsed:
            parsed = mv.parse(answer, parsing_timeout=None)
    return parsed


def math_equal(gold: list[Any], pred: list[Any], timeout_s: float) -> bool:
    """math-verify's ``verify(gold, pred)``. Raises MathTimeout."""
    mv = _mv()
    with _time_limit(timeout_s):
        return bool(mv.verify(gold, pred, timeout_seconds=None))


# --------------------------------------------------------------------------------------------- comparison


class Comparator:
    """One comparison kind.

    ``prepare(answer) -> prepared | None`` turns an extracted answer into its comparison form (None: not usable,
    e.g. not a number for ``numeric``); ``equal(prepared_ref, prepared_pred) -> bool``. ``math`` may raise
    :class:`MathTimeout` from both.
    """

    def __init__(self, kind: str, *, abs_tol: float = 0.0, rel_tol: float = 0.0, math_timeout_s: float = 2.0):
        self.kind = kind
        self.abs_tol = abs_tol
        self.rel_tol = rel_tol
        self.math_timeout_s = math_timeout_s

    def prepare(self, answer: str) -> Any:
        if self.kind == "exact":
            return answer.strip() or None
        if self.kind == "normalized":
            return normalize(answer) or None
        if self.kind == "numeric":
            return parse_number(answer)
        return math_parse(answer, self.math_timeout_s) or None

    def equal(self, ref: Any, pred: Any) -> bool:
        if self.kind == "numeric":
            return numbers_close(ref, pred, self.abs_tol, self.rel_tol)
        if self.kind == "math":
            return math_equal(ref, pred, self.math_timeout_s)
        return bool(ref == pred)

    def unusable(self) -> str:
        """Why a prepared value came out None, in plain words."""
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
            extra = f" ({' or '.join(tol)})" if tol else ""
            return f"{pred} equals {ref} as a number{extra}"
        return f"{pred} is mathematically equivalent to {ref} (math-verify)"
