"""Spec errors: one located, plain-words problem (:class:`SpecError`) and the collection (:class:`SpecErrors`).

A formatted error reads like a compiler's (dbt, rustc)::

    spec.yaml:12:3: training.learnig_rate: unknown key 'learnig_rate' -- did you mean 'learning_rate'?
       |
    12 |   learnig_rate: 1e-5
       |   ^^^^^^^^^^^^
       = hint: ...

Lines and columns are 1-based; a column of 0 means "the whole line / unknown column".

Every error sailrl raises on purpose derives from :class:`SailrlError` (the pattern of tinker-cookbook's
``exceptions.py``): a category class below it, plus the stdlib exception it replaces, so existing ``except``
clauses keep working. :class:`UserError` marks problems the user can fix (a bad spec value, unusable data, a
missing key, a model that cannot load): the command line prints their message as one line and exits 1, never
a traceback.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

_RED = "\033[31;1m"
_BOLD = "\033[1m"
_BLUE = "\033[34;1m"
_CYAN = "\033[36m"
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
    related: other lines worth showing.
    """

    file: str
    line: int
    column: int
    key_path: str
    message: str
    hint: str | None = None
    end_column: int | None = None
    related: list[Related] = field(default_factory=list)

    @property
    def expected(self) -> str | None:
        """Alias of ``hint`` (what the field expects / what to do)."""
        return self.hint

    def headline(self) -> str:
        """``file:line:col: key.path: message``."""
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        key = f" {self.key_path}:" if self.key_path else ""
        return f"{where}:{key} {self.message}"


def _excerpt(lines: list[str], line: int, column: int, end_column: int | None, note: str | None,
             width: int, color: bool) -> list[str]:
    """Source line ``line`` with a gutter and a caret line under [column, end_column)."""
    if not 1 <= line <= len(lines):
        return []
    blue = _BLUE if color else ""
    red = _RED if color else ""
    reset = _RESET if color else ""
    text = lines[line - 1].rstrip("\r\n").replace("\t", "→")  # make tabs visible; width 1 keeps carets aligned
    out = [f"{blue}{str(line).rjust(width)} |{reset} {text}"]
    if column >= 1:
        start = min(column - 1, len(text))
        stop = end_column - 1 if end_column and end_column > column else start + 1
        stop = max(start + 1, min(stop, max(len(text), start + 1)))
        carets = "^" * (stop - start)
        suffix = f" {note}" if note else ""
        out.append(f"{blue}{' ' * width} |{reset} {' ' * start}{red}{carets}{suffix}{reset}")
    return out


class SailrlError(Exception):
    """Base of every error sailrl raises on purpose (catch it to handle any of them)."""


class UserError(SailrlError):
    """A problem the user can fix; ``str(exc)`` is one plain line saying what and what to do."""


class ConfigError(UserError, ValueError):
    """A setting (spec value, override, environment variable) cannot be used."""


class DataError(UserError, ValueError):
    """The dataset cannot be read or has no usable rows."""


class ModelError(UserError, ValueError):
    """A model, tokenizer or checkpoint cannot be loaded."""


class ServiceError(SailrlError, RuntimeError):
    """A remote service (Tinker, Sail) or a backend failed while the run was going."""


class SpecErrors(UserError):
    """Every problem found in one spec file (YAML syntax, schema and semantic checks), sorted by line.

    ``errors``: the :class:`SpecError` list. ``text``: the file's source (for excerpts; may be empty).
    ``str(exc)`` is the uncoloured :meth:`format`.
    """

    def __init__(self, errors: list[SpecError], text: str = "") -> None:
        self.errors = sorted(errors, key=lambda e: (e.file, e.line or 10**9, e.column, e.key_path))
        self.text = text
        super().__init__(self.format())

    def __len__(self) -> int:
        return len(self.errors)

    def format(self, color: bool = False) -> str:
        """All errors, each as a headline, the source lines with carets, related lines and the hint."""
        lines = self.text.splitlines()
        blocks = []
        for err in self.errors:
            blocks.append(_format_one(err, lines, color))
        n = len(self.errors)
        if n > 1:
            files = {e.file for e in self.errors}
            where = f" in {next(iter(files))}" if len(files) == 1 else ""
            blocks.append(f"{n} problems{where}.")
        return "\n\n".join(blocks)


def _format_one(err: SpecError, lines: list[str], color: bool) -> str:
    bold = _BOLD if color else ""
    red = _RED if color else ""
    cyan = _CYAN if color else ""
    reset = _RESET if color else ""
    where = f"{err.file}:{err.line}:{err.column}" if err.line else err.file
    key = f" {err.key_path}:" if err.key_path else ""
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
    return "\n".join(out)
