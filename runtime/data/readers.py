"""Parsing a dataset's files, with every problem located in the data file (the row sources that stream them
are :mod:`sailrl.runtime.data.sources`).

Sources (relative paths are relative to the spec file's folder):

- ``.jsonl``: parsed here line by line (:func:`json_line`); a ``.json`` file (read whole, at most
  :data:`MAX_JSON_BYTES`) holds a JSON array of objects, one object, or JSON
  Lines. Values keep their JSON types. Refused, each with ``file:line``: malformed JSON, a line that is not an
  object, an object with the same key twice (JSON would keep only the last value), an integer of more than
  :data:`MAX_NUMBER_DIGITS` digits, a value nested more than :data:`MAX_JSON_DEPTH` levels.
- ``.csv``: read with Python's ``csv`` module, record by record
  (:class:`~sailrl.runtime.data.sources.CsvSource`). The first record is the header; every cell stays the text typed
  (``"007"`` stays ``"007"``), an empty cell becomes ``None``, blank lines are ignored. Refused, each with its
  line: a record whose cell count differs from the header's, a duplicate or empty column name, a cell longer
  than :data:`MAX_CSV_CELL_CHARS` characters, a header with no rows under it.
- ``.parquet``: ``datasets``' parquet builder.
- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``: ``datasets.load_from_disk``.
- anything else is a Hugging Face dataset id: ``datasets.load_dataset(id, config, split=split)``, after a
  metadata request with a short timeout (:func:`hub_problem`), so an unreachable hub is one line in seconds.

Every failure is a :class:`~sailrl.runtime.data.base.DatasetError` in plain words.
"""

from __future__ import annotations

import io
import json
import json.decoder
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sailrl.runtime.data.base import DatasetError
from sailrl.spec.constants import LOCAL_DATA_SUFFIXES, MAX_INT_DIGITS
from sailrl.spec.errors import SailrlError
from sailrl.spec.messages import did_you_mean_text

__all__ = [
    "LOCAL_SUFFIXES",
    "MAX_CSV_CELL_CHARS",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_NUMBER_DIGITS",
    "csv_header_problem",
    "is_local",
    "json_line",
    "json_rows",
    "load_disk_dir",
    "load_hub",
    "parquet_dataset",
    "resolve",
    "split_of",
]

LOCAL_SUFFIXES = LOCAL_DATA_SUFFIXES  # the spec layer's table: a dataset.source ending in one is a local file
MAX_JSON_DEPTH = 100  # lists / objects inside each other, the row object itself counting as level 1
MAX_NUMBER_DIGITS = MAX_INT_DIGITS  # digits of a JSON integer: the spec's limit, Python's own (4,300)
MAX_CSV_CELL_CHARS = 1_000_000  # characters in one CSV cell
MAX_JSON_BYTES = 512 * 2**20  # bytes of a .json file, which is parsed whole (.jsonl and .csv files are streamed)


def size_text(n: int) -> str:
    """``"16 MiB"``, ``"16 GiB"``, ``"1,000 bytes"``."""
    if n >= 2**30:
        return f"{n / 2**30:g} GiB"
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"


# --------------------------------------------------------------------------------------------- files


def is_local(source: str, spec_dir: Path) -> bool:
    """True when ``source`` names a local file or folder (a data suffix, a path prefix, or an existing path)."""
    s = source.strip()
    if s.lower().endswith(LOCAL_SUFFIXES) or s.startswith(("./", "../", "/", "~", ".\\", "..\\")):
        return True
    return (spec_dir / s).exists()


def resolve(source: str, spec_dir: Path) -> Path:
    """``source`` as a path: ``~`` expanded, relative paths under ``spec_dir``."""
    p = Path(source).expanduser()
    return p if p.is_absolute() else (spec_dir / p)


def unreadable(path: Path, exc: OSError) -> DatasetError:
    """The :class:`DatasetError` for a dataset file that cannot be opened (missing, no permission, ...)."""
    if isinstance(exc, FileNotFoundError):
        return DatasetError(f"dataset file not found: {path}. Relative paths are relative to the spec file's "
                            f"folder.", key="dataset.source", path=str(path))
    return DatasetError(f"cannot read dataset file {path}: {exc.strerror or exc}", key="dataset.source",
                        path=str(path))


def read_text(path: Path) -> str:
    """The file's text (UTF-8, an optional BOM dropped). Raises :class:`DatasetError` naming the path (and the
    line of the first byte that is not UTF-8)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise unreadable(path, exc) from None
    if len(data) > MAX_JSON_BYTES:
        line = data.count(b"\n") + 1
        raise DatasetError(f"{path}:{line}: the file is larger than {size_text(MAX_JSON_BYTES)}, the most sailrl "
                           f"reads from a .json file (read whole); write the rows as JSON Lines (.jsonl), which is "
                           f"streamed", path=str(path), line=line)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetError(f"{path}:{line}: not UTF-8 text (byte {exc.start}); save the file as UTF-8",
                           path=str(path), line=line) from None


# --------------------------------------------------------------------------------------------- JSON


class _Refused(SailrlError):
    """A JSON value sailrl will not read; ``str(exc)`` says why (no location: the caller adds it)."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for dup, _ in pairs:
            if dup in seen:
                break
            seen.add(dup)
        raise _Refused(f"key {dup!r} appears twice in one object; JSON keeps only the last value, so remove "
                       f"or rename one of them")
    return obj


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_NUMBER_DIGITS:
        raise _Refused(f"a number has {digits:,} digits, more than the {MAX_NUMBER_DIGITS:,} sailrl reads; "
                       f"write it as a string (in double quotes) if it is meant as text")
    return int(text)


_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_int=_integer)
_WS = json.decoder.WHITESPACE


def _too_deep() -> _Refused:
    return _Refused(f"a value is nested more than {MAX_JSON_DEPTH} levels deep (lists or objects inside each "
                    f"other), more than sailrl reads; flatten it")


def _depth_ok(value: Any, text: str) -> None:
    """Raise :class:`_Refused` when ``value`` nests deeper than :data:`MAX_JSON_DEPTH` (``text``: its source,
    used to skip the walk when it has too few brackets to be that deep)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def _decode_at(text: str, start: int) -> tuple[Any, int]:
    """``(value, end)`` of the JSON value at ``text[start:]``; raises ``JSONDecodeError`` or :class:`_Refused`."""
    try:
        value, end = _DECODER.raw_decode(text, start)
    except RecursionError:
        raise _too_deep() from None
    _depth_ok(value, text[start:end])
    return value, end


def json_line(line: str, path: Path, lineno: int) -> dict:
    """The object on one non-blank line of a JSON Lines file; raises :class:`DatasetError` at ``path:lineno``."""
    start = _WS.match(line, 0).end()
    try:
        obj, end = _decode_at(line, start)
        if _WS.match(line, end).end() != len(line):
            raise json.JSONDecodeError("Extra data", line, _WS.match(line, end).end())
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}:{lineno}:{exc.colno}: malformed JSON line: {exc.msg}. Each line must be "
                           f"one JSON object, e.g. {{\"question\": \"3+4\", \"answer\": \"7\"}}",
                           path=str(path), line=lineno) from None
    except _Refused as exc:
        raise DatasetError(f"{path}:{lineno}: {exc}", path=str(path), line=lineno) from None
    if not isinstance(obj, dict):
        raise DatasetError(f"{path}:{lineno}: the line is a JSON {_json_type(obj)}, not an object with "
                           f"named fields", path=str(path), line=lineno)
    return obj


def _line_rows(text: str, path: Path) -> list[dict]:
    return [json_line(line, path, lineno) for lineno, line in enumerate(io.StringIO(text), start=1)
            if _WS.match(line, 0).end() != len(line)]


def _json_type(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _array_rows(text: str, path: Path, start: int) -> list[dict]:
    """The objects of the JSON array starting at ``text[start] == "["``, item by item, so each problem is
    located at its item's line."""
    rows: list[dict] = []
    line, counted = 1, 0  # the line number of offset ``counted``

    def line_of(offset: int) -> int:
        nonlocal line, counted
        line += text.count("\n", counted, offset)
        counted = offset
        return line

    def unclosed() -> DatasetError:
        return DatasetError(f"{path}: malformed JSON: the array is not closed with ']'", path=str(path))

    i = _WS.match(text, start + 1).end()
    if text.startswith("]", i):
        i += 1
    else:
        while True:
            if i >= len(text):
                raise unclosed()
            item_line = line_of(i)
            try:
                obj, i = _decode_at(text, i)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}", path=str(path),
                                   line=exc.lineno) from None
            except _Refused as exc:
                raise DatasetError(f"{path}:{item_line}: item {len(rows)} of the array: {exc}", path=str(path),
                                   line=item_line) from None
            if not isinstance(obj, dict):
                raise DatasetError(f"{path}:{item_line}: item {len(rows)} of the array is a JSON "
                                   f"{_json_type(obj)}, not an object with named fields", path=str(path),
                                   line=item_line)
            rows.append(obj)
            i = _WS.match(text, i).end()
            if text.startswith(",", i):
                i = _WS.match(text, i + 1).end()
                if text.startswith("]", i):
                    bad = line_of(i)
                    raise DatasetError(f"{path}:{bad}: malformed JSON: a ',' after the last item of the array; "
                                       f"remove it", path=str(path), line=bad)
                continue
            if text.startswith("]", i):
                i += 1
                break
            if i >= len(text):
                raise unclosed()
            bad = line_of(i)
            raise DatasetError(f"{path}:{bad}: malformed JSON: expected ',' or ']' after item {len(rows) - 1} "
                               f"of the array", path=str(path), line=bad)
    rest = _WS.match(text, i).end()
    if rest != len(text):
        bad = line_of(rest)
        raise DatasetError(f"{path}:{bad}: malformed JSON: extra text after the array", path=str(path), line=bad)
    return rows


def json_rows(text: str, path: Path, *, lines: bool) -> list[dict]:
    """Rows of a JSON Lines file (``lines``) or of a .json file (an array of objects, one object, or JSON
    Lines). Raises :class:`DatasetError` with ``file:line`` (see the module docstring for what is refused)."""
    if not lines:
        start = _WS.match(text, 0).end()
        if text.startswith("[", start):
            return _array_rows(text, path, start)
        if text.startswith("{", start):
            try:
                obj, end = _decode_at(text, start)
            except (json.JSONDecodeError, _Refused):
                obj, end = None, 0  # not one object: read as JSON Lines below, which locates the problem
            if isinstance(obj, dict) and _WS.match(text, end).end() == len(text):
                keys = [k for k, v in obj.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
                if keys:
                    raise DatasetError(f"{path}: the file is one JSON object whose rows are under {keys[0]!r}; "
                                       f"write the rows as a JSON array or as JSON Lines (one object per line)",
                                       path=str(path))
                return [obj]
    return _line_rows(text, path)


# --------------------------------------------------------------------------------------------- CSV


def csv_header_problem(header: Sequence[str]) -> str | None:
    """What is wrong with a CSV header (a column without a name, a name twice), or None."""
    for col, name in enumerate(header, start=1):
        if not name.strip():
            return f"column {col} of the header has no name; name it, or remove the extra delimiter"
        if header.index(name) != col - 1:
            return f"column {name!r} appears twice in the header"
    return None


# --------------------------------------------------------------------------------------------- datasets


class _Quiet:
    """Silence datasets' progress bars while loading, restoring the user's setting."""

    def __enter__(self) -> None:
        import datasets  # lazy: datasets takes seconds; only a hub, parquet or save_to_disk dataset needs it

        self._was = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()

    def __exit__(self, *exc: object) -> None:
        import datasets  # lazy: see __enter__

        if self._was:
            datasets.enable_progress_bars()


def first_line(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` of an exception from a library."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def parquet_dataset(path: Path) -> Any:
    """A local parquet file as a ``datasets.Dataset`` (Arrow, through ``datasets``' parquet builder)."""
    import datasets  # lazy: pyarrow and datasets only for parquet sources

    with tempfile.TemporaryDirectory(prefix="sailrl-datasets-") as cache, _Quiet():
        try:
            ds = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=cache,
                                       keep_in_memory=True)
        except Exception as exc:  # noqa: BLE001 -- pyarrow parse errors, reworded for the user
            raise DatasetError(f"cannot read {path} as parquet: {first_line(exc)}", path=str(path)) from None
    if len(ds) == 0:
        raise DatasetError(f"{path} has columns and no rows", path=str(path))
    return ds


def split_of(obj: Any, split: str, where: str, key: str) -> Any:
    """Pick ``split`` from a DatasetDict (did-you-mean on a wrong name); a plain Dataset only has 'train'."""
    if isinstance(obj, Mapping):  # DatasetDict is a dict of split name -> Dataset
        names = list(obj.keys())
        if split not in names:
            raise DatasetError(f"{where} has no split {split!r}{did_you_mean_text(split, names) or '.'} Its splits "
                               f"are: {', '.join(names)}", key=key)
        return obj[split]
    if split != "train":
        raise DatasetError(f"{where} holds a single split of rows, so split {split!r} does not exist; use the "
                           f"default split (train), or carve evaluation rows with eval.count / eval.fraction",
                           key=key)
    return obj


def load_disk_dir(path: Path, split: str, key: str) -> Any:
    """Split ``split`` of a folder written by ``save_to_disk`` (memory-mapped Arrow files)."""
    import datasets  # lazy: datasets only for save_to_disk folders

    try:
        obj = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise DatasetError(f"{path} is a folder but not one written by Dataset.save_to_disk; point "
                           f"dataset.source at a .jsonl, .json, .csv or .parquet file inside it",
                           key="dataset.source") from None
    return split_of(obj, split, f"the dataset folder {path}", key)


HUB_TIMEOUT_S = 5.0  # seconds the hub's metadata request may take before the hub counts as unreachable
_LOCAL_HINT = "for a local file give a path ending in .jsonl, .json, .csv or .parquet (relative to the spec file)"


def hub_problem(source: str) -> str | None:
    """Why the Hugging Face hub cannot serve dataset ``source`` now, or None (load it).

    One metadata request with a :data:`HUB_TIMEOUT_S` timeout, so an unreachable hub is reported in seconds
    instead of after ``datasets``' download retries. With ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set:
    None (``datasets`` reads its cache).
    """
    from datasets import config  # lazy: datasets and huggingface_hub take seconds; only a hub dataset needs them
    from huggingface_hub import HfApi  # lazy: see above
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError  # lazy: see above

    if config.HF_HUB_OFFLINE:
        return None
    try:
        HfApi().dataset_info(source, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return "it is gated: accept its terms on the hub and set HF_TOKEN"
    except RepositoryNotFoundError:
        return "the hub has no dataset of that name you can read (check the id; a private one needs HF_TOKEN)"
    except HfHubHTTPError:
        return None  # the hub answered; let datasets say what it makes of it
    except Exception as exc:  # noqa: BLE001 -- DNS, refused, timeout: the hub is unreachable
        return (f"the Hugging Face hub is unreachable ({first_line(exc)}); connect to the network, or with a "
                f"cached copy set HF_HUB_OFFLINE=1")
    return None


def load_hub(source: str, config: str | None, split: str, key: str) -> Any:
    """Split ``split`` of hub dataset ``source`` as a ``datasets.Dataset`` (after :func:`hub_problem`)."""
    import datasets  # lazy: datasets only for hub sources

    problem = hub_problem(source)
    if problem is not None:
        raise DatasetError(f"cannot load dataset {source!r}: {problem}; {_LOCAL_HINT}", key="dataset.source")
    try:
        with _Quiet():
            ds = datasets.load_dataset(source, config, split=split)
    except ValueError as exc:
        msg = str(exc)
        if "split" in msg.lower():
            raise DatasetError(f"dataset {source!r} has no split {split!r}: {first_line(exc)}", key=key) from None
        if "config" in msg.lower():
            raise DatasetError(f"dataset {source!r}: config {config!r} is not valid: {first_line(exc)}",
                               key="dataset.config") from None
        raise DatasetError(f"cannot load dataset {source!r}: {first_line(exc)}", key="dataset.source") from None
    except Exception as exc:  # noqa: BLE001 -- hub, network and builder errors, reworded for the user
        from datasets import config  # lazy: datasets only for hub sources

        if config.HF_HUB_OFFLINE:
            raise DatasetError(
                f"cannot load dataset {source!r}: it is not in the datasets cache and HF_HUB_OFFLINE is set "
                f"(so the hub is not asked); load it once where the hub is reachable, or {_LOCAL_HINT}",
                key="dataset.source") from None
        raise DatasetError(
            f"cannot load dataset {source!r} from the Hugging Face hub: {first_line(exc)}. Check the id and your "
            f"network; {_LOCAL_HINT}", key="dataset.source") from None
    if isinstance(ds, Mapping):  # a DatasetDict despite split=
        ds = split_of(ds, split, f"dataset {source!r}", key)
    return ds
