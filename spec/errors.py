"""Spec errors: one located, plain-words problem (:class:`SpecError`) and the collection (:class:`SpecErrors`).

A formatted error reads like a compiler's (dbt, rustc)::

    spec.yaml:12:3: training.learnig_rate: unknown key 'learnig_rate' -- did you mean 'learning_rate'?
       |
    12 |   learnig_rate: 1e-5
       |   ^^^^^^^^^^^^
       = hint: ...

Lines and columns are 1-based; a column of 0 means "the whole line / unknown column". Every error carries a
stable code from :data:`sailrl.spec.codes.CODES` (``S101`` unknown-key), shown as the block's last line
(``   = code: S101 unknown-key``), and a severity: ``error`` (the spec cannot be used) or ``warning`` (it can, but
a value looks wrong; the headline then reads ``file:line:col: warning: key: message``).

Every error sailrl raises on purpose derives from :class:`SailrlError` (the pattern of tinker-cookbook's
``exceptions.py``): a category class below it, plus the stdlib exception it replaces, so existing ``except``
clauses keep working. :class:`UserError` marks problems the user can fix (a bad spec value, unusable data, a
missing key, a model that cannot load): the command line prints their message as one line and exits 1, never
a traceback.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

from sailrl.spec.codes import CODES
from sailrl.spec.constants import MAX_REPORTED

#: YAML's line breaks (what its marks count lines by).
LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")


def yaml_lines(text: str) -> list[str]:
    """``text`` split at YAML line breaks (``\\n``, ``\\r\\n``, ``\\r``, NEL, LS, PS), numbered as YAML marks are.

    Unlike ``str.splitlines`` a form feed or vertical tab does not end a line.
    """
    parts = LINE_BREAK.split(text)
    if parts and parts[-1] == "":
        parts.pop()
    return parts


_EXCERPT_WIDTH = 100  # longest source excerpt shown (characters)
_RED = "\033[31;1m"
_BOLD = "\033[1m"
_BLUE = "\033[34;1m"
_CYAN = "\033[36m"
_YELLOW = "\033[33;1m"
_RESET = "\033[0m"


@dataclass
class Related:
    """Another place in the file that explains an error (e.g. the first of two duplicated keys)."""

    line: int
    column: int
    note: str


@dataclass
class SpecError:
    """One problem in a spec file.

    file: the spec path as given. line, column: 1-based position (0 when unknown). key_path: dotted path of
    the offending key ("training.group_size", "reward.rules.0.pattern"; "" for the whole file).
    message: what is wrong, in plain words. hint: what to do about it (optional). end_column: 1-based
    column just past the offending text on ``line``, for the caret underline (optional).
    related: other lines worth showing. code: the problem's stable code (``S101``; see
    :mod:`sailrl.spec.codes`). severity: ``"error"`` or ``"warning"``.
    """

    file: str
    line: int
    column: int
    key_path: str
    message: str
    hint: str | None = None
    end_column: int | None = None
    related: list[Related] = field(default_factory=list)
    code: str = ""
    severity: str = "error"

    @property
    def is_warning(self) -> bool:
        """True for a warning (the spec stays usable)."""
        return self.severity == "warning"

    @property
    def expected(self) -> str | None:
        """Alias of ``hint`` (what the field expects / what to do)."""
        return self.hint

    def headline(self) -> str:
        """``file:line:col: key.path: message``."""
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        key = f" {self.key_path}:" if self.key_path else ""
        level = " warning:" if self.is_warning else ""
        return f"{where}:{level}{key} {self.message}"


def _excerpt(lines: list[str], line: int, column: int, end_column: int | None, note: str | None,
             width: int, color: bool) -> list[str]:
    """Source line ``line`` with a gutter and a caret line under [column, end_column)."""
    if not 1 <= line <= len(lines):
        return []
    blue = _BLUE if color else ""
    red = _RED if color else ""
    reset = _RESET if color else ""
    text = lines[line - 1].rstrip("\r\n").replace("\t", "→")  # make tabs visible; width 1 keeps carets aligned
    shift = 0
    if len(text) > _EXCERPT_WIDTH:  # show a window around the column, marked with ... at the cut ends
        begin = max(0, min(column - 1 - _EXCERPT_WIDTH // 3, len(text) - _EXCERPT_WIDTH))
        window = text[begin:begin + _EXCERPT_WIDTH]
        head = "..." if begin else ""
        tail = "..." if begin + _EXCERPT_WIDTH < len(text) else ""
        text, shift = head + window + tail, begin - len(head)
    out = [f"{blue}{str(line).rjust(width)} |{reset} {text}"]
    if column >= 1:
        start = min(max(column - 1 - shift, 0), len(text))
        stop = end_column - 1 - shift if end_column and end_column > column else start + 1
        stop = max(start + 1, min(stop, max(len(text), start + 1)))
        carets = "^" * (stop - start)
        suffix = f" {note}" if note else ""
        out.append(f"{blue}{' ' * width} |{reset} {' ' * start}{red}{carets}{suffix}{reset}")
    return out


class SailrlError(Exception):
    """Base of every error sailrl raises on purpose (catch it to handle any of them).

    ``code``: the class's stable code (``E...``; listed in ``docs/error-codes.md`` from
    :data:`sailrl.spec.codes.ERROR_CODES`, a test keeps the two in step). ``fatal``: whether a rollout failing with
    it stops the run instead of dropping one group (:mod:`sailrl.runtime.rollouts.rollout`).
    """

    fatal = False

    code = "E000"


class UserError(SailrlError):
    """A problem the user can fix; ``str(exc)`` is one plain line saying what and what to do."""

    code = "E001"


class ConfigError(UserError, ValueError):
    """A setting (spec value, override, environment variable) cannot be used."""

    code = "E002"


class DataError(UserError, ValueError):
    """The dataset cannot be read or has no usable rows."""

    code = "E003"


class ModelError(UserError, ValueError):
    """A model, tokenizer or checkpoint cannot be loaded."""

    code = "E004"


class StorageError(UserError):
    """A folder sailrl must write (the run directory, ``$SAILRL_HOME``) cannot be created or written."""

    code = "E005"


class ServiceError(SailrlError, RuntimeError):
    """A remote service (Tinker, Sail) or a backend failed while the run was going."""

    code = "E006"


class SpecValueError(SailrlError, ValueError):
    """A field validator's complaint with its problem code (pydantic keeps the exception in the error's ctx)."""

    code = "S109"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SpecErrors(UserError):
    """Every problem found in one spec file (YAML syntax, schema and semantic checks), sorted by line.

    ``errors``: the :class:`SpecError` list, errors and warnings, at most ``limit`` of them (default
    :data:`MAX_REPORTED`); ``omitted``: how many more were found and not kept. ``text``: the file's source (for
    excerpts; may be empty). ``str(exc)`` is the uncoloured :meth:`format`.
    """

    code = "E010"

    def __init__(self, errors: list[SpecError], text: str = "", *, limit: int | None = MAX_REPORTED,
                 omitted: int = 0) -> None:
        ordered = sorted(errors, key=_order)
        kept = ordered if limit is None else ordered[:limit]
        self.errors = kept
        self.omitted = omitted + len(ordered) - len(kept)
        self.error_count = sum(not e.is_warning for e in ordered) + omitted
        self.warning_count = len(ordered) - self.error_count + omitted
        self.text = text
        super().__init__(self.format())

    def __len__(self) -> int:
        return len(self.errors)

    @property
    def warnings(self) -> list[SpecError]:
        """The warnings among :attr:`errors`."""
        return [e for e in self.errors if e.is_warning]

    @property
    def has_errors(self) -> bool:
        """True when at least one problem is an error (not only warnings); ``omitted`` ones count as errors."""
        return self.error_count > 0

    def format(self, color: bool = False) -> str:
        """All problems, each as a headline, the source lines with carets, related lines, the hint and the code."""
        return format_problems(self.errors, self.text, color=color, omitted=self.omitted)


def _order(e: SpecError) -> tuple:
    return (e.file, e.line or 10**9, e.column, e.key_path)


def format_problems(problems: list[SpecError], text: str = "", *, color: bool = False, omitted: int = 0) -> str:
    """``problems`` formatted as a report (see the module docstring), with a closing count when there are several.

    ``omitted``: problems found beyond the reported ones, announced in the closing line.
    """
    lines = yaml_lines(text)
    blocks = [_format_one(err, lines, color) for err in problems]
    n = len(problems)
    if n > 1 or omitted:
        files = {e.file for e in problems}
        where = f" in {next(iter(files))}" if len(files) == 1 else ""
        warnings = sum(e.is_warning for e in problems)
        if warnings:
            errors = n - warnings
            counts = f"{errors} error{'s' if errors != 1 else ''} and {warnings} warning{'s' if warnings != 1 else ''}"
        else:
            counts = f"{n} problems"
        if omitted:
            blocks.append(f"{counts}{where} shown, and {omitted} more not shown (a report lists at most "
                          f"{MAX_REPORTED}; fix these and run again).")
        else:
            blocks.append(f"{counts}{where}.")
    return "\n\n".join(blocks)


def _format_one(err: SpecError, lines: list[str], color: bool) -> str:
    bold = _BOLD if color else ""
    red = _RED if color else ""
    cyan = _CYAN if color else ""
    reset = _RESET if color else ""
    yellow = _YELLOW if color else ""
    where = f"{err.file}:{err.line}:{err.column}" if err.line else err.file
    key = f" {err.key_path}:" if err.key_path else ""
    if err.is_warning:
        out = [f"{yellow}{bold}{where}: warning:{reset}{bold}{key}{reset} {err.message}"]
    else:
        out = [f"{red}{bold}{where}:{reset}{bold}{key}{reset} {err.message}"]
    shown = [(err.line, err.column, err.end_column, None)]
    shown += [(r.line, r.column, None, r.note) for r in err.related]
    width = max(len(str(s[0])) for s in shown)
    body: list[str] = []
    for i, (line, column, end, note) in enumerate(sorted(shown, key=lambda s: s[0])):
        excerpt = _excerpt(lines, line, column, end, note, width, color)
        if excerpt and i and body:
            body.append(f"{' ' * width} :")
        body += excerpt
    if body:
        out.append(f"{' ' * width} |")
        out += body
    if err.hint:
        pad = " " * width
        hint_lines = [w for h in err.hint.splitlines()
                      for w in (textwrap.wrap(h, 100, break_on_hyphens=False) if len(h) > 100 else [h])]
        out.append(f"{pad} = {cyan}hint:{reset} {hint_lines[0]}")
        out += [f"{pad}         {h}" for h in hint_lines[1:]]
    if err.code:
        known = CODES.get(err.code)
        out.append(f"{' ' * width} = code: {err.code}" + (f" {known.name}" if known else ""))
    return "\n".join(out)
