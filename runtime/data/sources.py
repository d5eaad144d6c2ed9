"""Where a split's rows come from, read only as far as needed and never held whole in memory.

A :class:`RowSource` yields ``(index, key, raw row)`` for the rows ``[start, stop)`` of its split
(:meth:`RowSource.scan`, which stops reading at ``stop``) and reads one row again by its key
(:meth:`RowSource.read`). The run keeps only the keys of the rows it uses (:class:`RowList`: two 8-byte integers a
row), so memory stays flat in the file's size:

- ``.jsonl`` / ``.csv`` files are streamed line by line (:class:`JsonlSource`, :class:`CsvSource`; a key is the
  byte offset of the row's first line). Every line is at most :data:`MAX_LINE_BYTES` and the file at most
  :data:`MAX_STREAM_BYTES`; a line over the limit is refused with its number before more is read.
- ``.json`` files (one array or object, parsed whole) are at most :data:`~sailrl.runtime.data.readers.MAX_JSON_BYTES`
  (:class:`ListSource`).
- parquet, ``save_to_disk`` folders and hub ids stay in ``datasets``' Arrow tables (memory-mapped where
  ``datasets`` maps them) and are converted to Python a batch at a time (:class:`ArrowSource`).

Devices, named pipes and sockets are refused before anything opens them (``stat``).
"""

from __future__ import annotations

import contextlib
import csv
import os
import threading
from array import array
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import sailrl.runtime.data.readers as readers
from sailrl.runtime.data.base import DatasetError
from sailrl.runtime.data.readers import (
    LOCAL_SUFFIXES,
    MAX_CSV_CELL_CHARS,
    csv_header_problem,
    json_line,
    json_rows,
    read_text,
    size_text,
    unreadable,
)
from sailrl.spec.files import special_kind
from sailrl.spec.schema import Spec

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_STREAM_BYTES",
    "ArrowSource",
    "CsvSource",
    "JsonlSource",
    "ListSource",
    "RowList",
    "RowSource",
    "load_split",
    "regular_file",
]

MAX_LINE_BYTES = 16 * 2**20  # bytes of one line of a .jsonl / .csv file (a row of text is kilobytes)
MAX_STREAM_BYTES = 16 * 2**30  # bytes of a .jsonl / .csv file (streamed: the limit bounds time, not memory)
ARROW_BATCH = 1024  # rows converted from Arrow to Python at a time while scanning


def regular_file(path: Path) -> os.stat_result:
    """``os.stat(path)`` of a regular file; raises :class:`DatasetError` for a missing path, a device, a named
    pipe or a socket (checked before opening: a FIFO blocks ``open``, ``/dev/zero`` never ends)."""
    kind = special_kind(path)
    if kind is not None:
        raise DatasetError(f"dataset.source {path} is {kind}, not a data file; point it at a .jsonl, .json, .csv or "
                           f".parquet file", key="dataset.source", path=str(path))
    try:
        return os.stat(path)
    except OSError as exc:
        raise unreadable(path, exc) from None


class _Lines:
    """The lines of a text file opened in binary mode, each ``(line number, byte offset, text)``, bounded by
    :data:`MAX_LINE_BYTES` a line and :data:`MAX_STREAM_BYTES` in all (each refused with the line number)."""

    def __init__(self, f: BinaryIO, path: Path, *, offset: int = 0, lineno: int = 0) -> None:
        self.f, self.path, self.offset, self.lineno = f, path, offset, lineno

    def __iter__(self) -> Iterator[tuple[int, int, str]]:
        while True:
            start = self.offset
            raw = self.f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            self.lineno += 1
            self.offset += len(raw)
            if len(raw) > MAX_LINE_BYTES and not (len(raw) == MAX_LINE_BYTES + 1 and raw.endswith(b"\n")):
                raise DatasetError(
                    f"{self.path}:{self.lineno}: line {self.lineno} is longer than {size_text(MAX_LINE_BYTES)}, "
                    f"the most sailrl reads in one line; a .jsonl or .csv file has one row per line "
                    f"(is this a data file?)",
                    path=str(self.path), line=self.lineno)
            if self.offset > MAX_STREAM_BYTES:
                raise DatasetError(
                    f"{self.path}:{self.lineno}: the file is larger than {size_text(MAX_STREAM_BYTES)}, the most "
                    f"sailrl reads from one data file; select rows with dataset.range / dataset.limit or split the "
                    f"file",
                    path=str(self.path), line=self.lineno)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{self.path}:{self.lineno}: not UTF-8 text (byte {start + exc.start}); save the "
                                   f"file as UTF-8", path=str(self.path), line=self.lineno) from None
            if start == 0:
                text = text.removeprefix("\ufeff")
            yield self.lineno, start, text


def _changed(path: Path) -> DatasetError:
    return DatasetError(f"{path} changed while the run reads it (a row is gone); restart the run", path=str(path))


class RowSource:
    """One split's rows. ``columns``: known before scanning (Arrow) or learned while scanning (files, in the
    order first seen). ``total``: rows in the split once a scan reached its end, else None."""

    where: str = ""

    def __init__(self) -> None:
        self.columns: list[str] = []
        self.total: int | None = None
        self._seen: dict[str, None] = {}
        self.path: Path | None = None
        self._file: BinaryIO | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def _saw(self, row: Mapping[str, Any]) -> None:
        if len(row) != len(self._seen) or any(k not in self._seen for k in row):
            for k in row:
                if k not in self._seen:
                    self._seen[k] = None
                    self.columns.append(k)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[BinaryIO]:
        """The file (``self.path``) open for reading rows again, kept open between reads, one reader at a time
        (reopened in a forked child)."""
        with self._lock:
            if self._file is None or self._pid != os.getpid():
                self._file, self._pid = open(self.path, "rb"), os.getpid()  # noqa: SIM115 -- kept open for reads
            yield self._file

    def __del__(self) -> None:
        f = getattr(self, "_file", None)
        if f is not None:
            f.close()

    def scan(self, start: int, stop: int | None) -> Iterator[tuple[int, int, dict]]:
        """``(index, key, raw row)`` of rows ``start <= index < stop`` (``stop`` None: to the end); reading stops
        at ``stop``. Sets :attr:`total` when the end of the split was reached."""
        raise NotImplementedError

    def read(self, key: int) -> dict:
        """The raw row a scan yielded with ``key``."""
        raise NotImplementedError


class JsonlSource(RowSource):
    """A JSON Lines file, one object a line (blank lines are not rows); checked as
    :func:`~sailrl.runtime.data.readers.json_line` says."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        regular_file(path)

    def scan(self, start: int, stop: int | None) -> Iterator[tuple[int, int, dict]]:
        index = 0
        with open(self.path, "rb") as f:
            for lineno, offset, text in _Lines(f, self.path):
                if stop is not None and index >= stop:
                    return
                if not text.strip():
                    continue
                if index >= start:
                    row = json_line(text, self.path, lineno)
                    self._saw(row)
                    yield index, offset, row
                index += 1
        self.total = index

    def read(self, key: int) -> dict:
        with self._reading() as f:
            f.seek(key)
            for lineno, _, text in _Lines(f, self.path, offset=key):
                return json_line(text, self.path, lineno)
        raise _changed(self.path)


class CsvSource(RowSource):
    """A CSV file read with Python's ``csv`` module (see :mod:`sailrl.runtime.data.readers`), record by record."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        regular_file(path)
        self.header: list[str] | None = None
        self.header_line = 1

    def _records(self, f: BinaryIO, offset: int = 0) -> Iterator[tuple[int, int, int, list[str]]]:
        """``(first line, last line, offset, cells)`` of each non-blank record from ``offset``."""
        lines = _Lines(f, self.path, offset=offset)
        reader = csv.reader(text for _, _, text in lines)
        old = csv.field_size_limit(MAX_CSV_CELL_CHARS)
        try:
            while True:
                start_offset, first = lines.offset, lines.lineno + 1
                try:
                    record = next(reader, None)
                except csv.Error as exc:
                    msg = str(exc)
                    if "field larger than field limit" in msg:
                        msg = (f"a cell is longer than {MAX_CSV_CELL_CHARS:,} characters, the most sailrl reads "
                               f"from one cell")
                    elif "NUL" in msg:
                        msg = "the line contains a NUL byte; is this a CSV text file?"
                    line = lines.lineno or first
                    raise DatasetError(f"{self.path}:{line}: cannot read the CSV record: {msg}", path=str(self.path),
                                       line=line) from None
                if record is None:
                    return
                if record:
                    yield first, lines.lineno, start_offset, record
        finally:
            csv.field_size_limit(old)

    def _row(self, first: int, last: int, record: list[str]) -> dict:
        header = self.header or []
        if len(record) != len(header):
            where = f"{first}" if last == first else f"{first}-{last}"
            raise DatasetError(
                f"{self.path}:{first}: the record on line{'s' if last != first else ''} {where} has {len(record)} "
                f"cell{'s' if len(record) != 1 else ''}, but the header (line {self.header_line}) has {len(header)} "
                f"columns ({', '.join(header)}); a cell that contains a comma must be in double quotes, e.g. "
                '"3,4"',
                path=str(self.path), line=first)
        return {name: (cell if cell != "" else None) for name, cell in zip(header, record, strict=True)}

    def scan(self, start: int, stop: int | None) -> Iterator[tuple[int, int, dict]]:
        index = 0
        with open(self.path, "rb") as f:
            for first, last, offset, record in self._records(f):
                if self.header is None:
                    problem = csv_header_problem(record)
                    if problem:
                        raise DatasetError(f"{self.path}:{first}: {problem}", path=str(self.path), line=first)
                    self.header, self.header_line = record, first
                    self.columns = list(record)
                    continue
                if stop is not None and index >= stop:
                    return
                if index >= start:
                    yield index, offset, self._row(first, last, record)
                index += 1
        if self.header is None:
            raise DatasetError(f"{self.path}: the CSV file is empty (no header line)", path=str(self.path), line=1)
        if index == 0:
            raise DatasetError(f"{self.path} has a header and no rows; add rows under the header line "
                               f"({', '.join(self.header)})", path=str(self.path), line=self.header_line)
        self.total = index

    def read(self, key: int) -> dict:
        with self._reading() as f:
            f.seek(key)
            for first, last, _, record in self._records(f, key):
                return self._row(first, last, record)
        raise _changed(self.path)


class ListSource(RowSource):
    """Rows already parsed (a ``.json`` file, bounded in size); the key is the row's index."""

    def __init__(self, rows: list[dict]) -> None:
        super().__init__()
        self.rows = rows
        for r in rows:
            self._saw(r)
        self.total = len(rows)

    def scan(self, start: int, stop: int | None) -> Iterator[tuple[int, int, dict]]:
        end = len(self.rows) if stop is None else min(stop, len(self.rows))
        for i in range(start, end):
            yield i, i, self.rows[i]

    def read(self, key: int) -> dict:
        return self.rows[key]


class ArrowSource(RowSource):
    """A ``datasets.Dataset``: rows converted from Arrow a batch at a time; the key is the row's index."""

    def __init__(self, dataset: Any) -> None:
        super().__init__()
        self.dataset = dataset
        self.columns = list(dataset.column_names)
        self.total = len(dataset)

    def scan(self, start: int, stop: int | None) -> Iterator[tuple[int, int, dict]]:
        end = self.total if stop is None else min(stop, self.total)
        for lo in range(start, end, ARROW_BATCH):
            hi = min(end, lo + ARROW_BATCH)
            for offset, row in enumerate(self.dataset.select(range(lo, hi)).to_list()):
                yield lo + offset, lo + offset, row

    def read(self, key: int) -> dict:
        return self.dataset[int(key)]


class RowList(Sequence):
    """The rows a run uses, as a sequence of mapped row dicts (field names plus ``_index``) read from their
    source when asked for: only two integers a row (the source key and the row's index) stay in memory.

    Slicing gives a ``RowList``; :meth:`shuffle` permutes it in place as ``random.Random(seed).shuffle`` permutes
    a list of the same length. Compares equal to a list of the same rows.
    """

    def __init__(self, source: RowSource, mapping: Mapping[str, str] | None, keys: array | None = None,
                 indices: array | None = None) -> None:
        self.source = source
        self.mapping = mapping
        self.keys = keys if keys is not None else array("q")
        self.indices = indices if indices is not None else array("q")

    def append(self, key: int, index: int) -> None:
        self.keys.append(key)
        self.indices.append(index)

    def map(self, raw: Mapping[str, Any], index: int) -> dict:
        """``raw`` under the spec's field names (``mapping`` None: every column under its own name), plus
        ``_index``."""
        if self.mapping is None:
            row = dict(raw)
        else:
            row = {name: raw[col] for name, col in self.mapping.items() if col in raw}
        row["_index"] = index
        return row

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return RowList(self.source, self.mapping, self.keys[i], self.indices[i])
        return self.map(self.source.read(self.keys[i]), self.indices[i])

    def __iter__(self) -> Iterator[dict]:
        for i in range(len(self.keys)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, RowList)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def shuffle(self, rng: Any) -> None:
        """Permute in place with ``rng.shuffle`` (the same permutation it gives a list of this length)."""
        order = list(range(len(self.keys)))
        rng.shuffle(order)
        self.keys = array("q", (self.keys[j] for j in order))
        self.indices = array("q", (self.indices[j] for j in order))

    def __repr__(self) -> str:
        return f"RowList({len(self)} rows of {self.source.where})"


def load_split(spec: Spec, spec_dir: Path, split: str, key: str) -> tuple[RowSource, str]:
    """``(source, description)`` of split ``split`` of the spec's ``dataset.source``.

    key: the spec key a wrong split name belongs to (``dataset.split`` / ``dataset.eval.split``). A local file
    has the single split ``train``. Raises :class:`DatasetError`.
    """
    ds_spec = spec.dataset
    source = ds_spec.source
    if readers.is_local(source, spec_dir):
        path = readers.resolve(source, spec_dir)
        suffix = path.suffix.lower()
        if special_kind(path) is None and path.is_dir():
            src: RowSource = ArrowSource(readers.load_disk_dir(path, split, key))
            src.where = f"{path} [{split}]"
            return src, src.where
        if suffix in LOCAL_SUFFIXES:
            if split != "train":
                readers.split_of([], split, f"the file {path}", key)  # raises: a file has one split
            if suffix == ".parquet":
                regular_file(path)
                src = ArrowSource(readers.parquet_dataset(path))
            elif suffix == ".csv":
                src = CsvSource(path)
            elif suffix == ".jsonl":
                src = JsonlSource(path)
            else:
                regular_file(path)
                src = ListSource(json_rows(read_text(path), path, lines=False))
            src.where = str(path)
            return src, src.where
        regular_file(path)
        raise DatasetError(f"dataset.source {source!r}: unsupported file type {suffix or '(none)'}; use a "
                           f".jsonl, .json, .csv or .parquet file", key="dataset.source")
    src = ArrowSource(readers.load_hub(source, ds_spec.config, split, key))
    src.where = f"{source}" + (f" ({ds_spec.config})" if ds_spec.config else "") + f" [{split}]"
    return src, src.where

