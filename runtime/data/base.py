"""The data package's shared types: the error it raises and the rows it returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sailrl.spec.errors import DataError

__all__ = ["DatasetError", "DatasetRows", "SkippedRow"]


class DatasetError(DataError):
    """The dataset cannot be used as the spec says. ``str(exc)`` is plain words with what to do.

    ``key``: the spec key the problem belongs to (e.g. ``"dataset.fields"``, ``"dataset.range"``), for locating
    it in the spec file; ``None`` when it is about the data itself. ``path`` / ``line``: the data file and
    1-based line for a malformed file. A :class:`~sailrl.spec.errors.DataError` (so a ``UserError`` and a
    ``ValueError``).
    """

    code = "E120"

    def __init__(self, message: str, *, key: str | None = None, path: str | None = None,
                 line: int | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.path = path
        self.line = line


@dataclass
class SkippedRow:
    """A source row left out of training or evaluation.

    index: the row's index in its split. reason: plain words (e.g. "field 'answer' is empty (null)").
    row: the mapped row as far as it could be built. kind: one of :data:`sailrl.runtime.data.rows.SKIP_KINDS`
    ("missing_field", "null_field", "template", "reference", "too_long", "renderer"). split: the split the row
    came from.
    """

    index: int
    reason: str
    row: dict
    kind: str = ""
    split: str = "train"


@dataclass
class DatasetRows:
    """The rows a run trains and evaluates on.

    train / eval: mapped rows: keys are the spec's field names plus ``_index`` (the row's index in its source
    split); a :class:`~sailrl.runtime.data.sources.RowList` (rows read from their source when asked for) or a
    list. skipped: rows left out, with reasons. columns: the source dataset's columns (those of the rows read).
    source: a description of where the rows came from (resolved path, or hub id with config and split).
    loaded: rows in the split before range/limit, or None when reading stopped at the end of the range/limit
    (the rest of the file is never read); selected: rows after range/limit (train split). notes: non-blocking
    remarks (e.g. a range clipped to the data).
    """

    train: Sequence[dict]
    eval: Sequence[dict]
    skipped: list[SkippedRow]
    columns: list[str]
    source: str
    loaded: int | None = 0
    selected: int = 0
    notes: list[str] = field(default_factory=list)
