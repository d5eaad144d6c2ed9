"""Dataset rows for a spec: load, map fields, select, check, shuffle and split.

Order of operations (each step that leaves no rows stops with a :class:`DatasetError` naming that step):

1. **load** the split: a local ``.jsonl`` / ``.json`` file (parsed here, line by line, so a malformed line is
   reported with its file and line number and values keep their JSON types), a local ``.csv`` / ``.parquet`` file
   (``datasets``' csv / parquet builders; csv cells are kept as text), a directory written by
   ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``datasets.load_from_disk``), or a Hugging Face
   dataset id (``datasets.load_dataset(id, config, split=split)``). Relative paths are relative to the spec file.
2. **range** ``[start, end)`` of the split, then **limit** (at most N rows).
3. **map** dataset columns to the names the templates and reward rules use (``dataset.fields``); a missing
   column is an error naming the columns the dataset has (did-you-mean by ``difflib``).
4. **check** every row: each field a template uses and each reference field must be present and not null; the
   templates must render; the reward function must accept the reference (``reward_fn.reference_problem``);
   an optional ``renderer_check``. Failing rows are skipped and reported (:class:`SkippedRow`), never rendered
   with empty strings.
5. **shuffle** once with ``dataset.shuffle_seed`` (default ``model.seed``): ``random.Random(seed).shuffle``.
6. **eval split**: a named split of the same dataset (loaded and checked the same way), or the LAST ``count`` /
   ``fraction`` of the shuffled rows carved off (disjoint from training rows by source index ``_index``);
   then ``eval.limit``.

Per-step data order for training is :func:`rows_for_step`: epoch-wise, deterministic in (seed, step), so a
resumed run sees exactly the rows an uninterrupted run would.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import random
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LOCAL_SUFFIXES",
    "DatasetError",
    "DatasetRows",
    "SkippedRow",
    "batches",
    "field_mapping",
    "load_rows",
    "required_fields",
    "rows_for_step",
]

LOCAL_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


class DatasetError(Exception):
    """The dataset cannot be used as the spec says. ``str(exc)`` is plain words with what to do.

    ``key``: the spec key the problem belongs to (e.g. ``"dataset.fields"``, ``"dataset.range"``), for locating
    it in the spec file; ``None`` when it is about the data itself. ``path`` / ``line``: the data file and
    1-based line for a malformed file.
    """

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
    row: the mapped row as far as it could be built. kind: "missing_field", "null_field", "template",
    "reference" or "renderer". split: the split the row came from.
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
    split). skipped: rows left out, with reasons. columns: the source dataset's columns. source: a description
    of where the rows came from (resolved path, or hub id with config and split).
    """

    train: list[dict]
    eval: list[dict]
    skipped: list[SkippedRow]
    columns: list[str]
    source: str
    loaded: int = 0  # rows in the split before range/limit
    selected: int = 0  # rows after range/limit (train split)
    notes: list[str] = field(default_factory=list)  # non-blocking remarks (e.g. a range clipped to the data)


# --------------------------------------------------------------------------------------------- loading


def _is_local(source: str, spec_dir: Path) -> bool:
    s = source.strip()
    if s.lower().endswith(LOCAL_SUFFIXES) or s.startswith(("./", "../", "/", "~", ".\\", "..\\")):
        return True
    return (spec_dir / s).exists()


def _resolve(source: str, spec_dir: Path) -> Path:
    p = Path(source).expanduser()
    return p if p.is_absolute() else (spec_dir / p)


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"dataset file not found: {path}. Relative paths are relative to the spec file's "
                           f"folder.", key="dataset.source", path=str(path)) from None
    except OSError as exc:
        raise DatasetError(f"cannot read dataset file {path}: {exc.strerror or exc}", key="dataset.source",
                           path=str(path)) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetError(f"{path}:{line}: not UTF-8 text (byte {exc.start}); save the file as UTF-8",
                           path=str(path), line=line) from None


def _json_rows(text: str, path: Path, *, lines: bool) -> list[dict]:
    """Rows of a JSON Lines file (``lines``) or of a .json file (an array of objects, or JSON Lines)."""
    if not lines:
        stripped = text.lstrip()
        if stripped.startswith("["):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}",
                                   path=str(path), line=exc.lineno) from None
            for i, item in enumerate(data):
                if not isinstance(item, dict):
                    raise DatasetError(f"{path}: item {i} of the array is a {type(item).__name__}, not an object "
                                       f"with named fields", path=str(path))
            return data
        if stripped.startswith("{"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                obj = None  # several objects: JSON Lines in a .json file, parsed line by line below
            if isinstance(obj, dict):
                keys = [k for k, v in obj.items() if isinstance(v, list) and v and isinstance(v[0], dict)]
                if keys:
                    raise DatasetError(f"{path}: the file is one JSON object whose rows are under {keys[0]!r}; "
                                       f"write the rows as a JSON array or as JSON Lines (one object per line)",
                                       path=str(path))
                return [obj]
    rows: list[dict] = []
    for lineno, line in enumerate(io.StringIO(text), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{lineno}:{exc.colno}: malformed JSON line: {exc.msg}. Each line must be "
                               f"one JSON object, e.g. {{\"question\": \"3+4\", \"answer\": \"7\"}}",
                               path=str(path), line=lineno) from None
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}:{lineno}: the line is a JSON {type(obj).__name__}, not an object with "
                               f"named fields", path=str(path), line=lineno)
        rows.append(obj)
    return rows


def _columns_of(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    return list(seen)


class _Quiet:
    """Silence datasets' progress bars while loading, restoring the user's setting."""

    def __enter__(self) -> None:
        import datasets

        self._was = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()

    def __exit__(self, *exc: object) -> None:
        import datasets

        if self._was:
            datasets.enable_progress_bars()


def _builder_rows(kind: str, path: Path) -> list[dict]:
    """Rows of a local csv / parquet file through ``datasets``' builder (cached in a temp dir, kept in memory)."""
    import datasets

    if not path.is_file():
        _read_text(path)  # raises the plain "not found" / "cannot read" error
    kwargs: dict[str, Any] = {}
    if kind == "csv":
        header = next(csv.reader(io.StringIO(_read_text(path))), None)
        if not header:
            raise DatasetError(f"{path}: the CSV file is empty (no header line)", path=str(path), line=1)
        if len(set(header)) != len(header):
            dup = next(h for h in header if header.count(h) > 1)
            raise DatasetError(f"{path}:1: column {dup!r} appears twice in the header", path=str(path), line=1)
        # Keep every cell as the text typed ("007", "3.10" stay as written); empty cells become None.
        kwargs["features"] = datasets.Features({name: datasets.Value("string") for name in header})
    with tempfile.TemporaryDirectory(prefix="sailrl-datasets-") as cache, _Quiet():
        try:
            ds = datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=cache,
                                       keep_in_memory=True, **kwargs)
        except Exception as exc:  # noqa: BLE001 -- pyarrow / pandas parse errors, reworded for the user
            raise DatasetError(f"cannot read {path} as {kind}: {_first_line(exc)}", path=str(path)) from None
        return ds.to_list()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _split_of(obj: Any, split: str, where: str, key: str) -> Any:
    """Pick ``split`` from a DatasetDict (did-you-mean on a wrong name); a plain Dataset only has 'train'."""
    if isinstance(obj, dict):  # DatasetDict is a dict of split name -> Dataset
        names = list(obj.keys())
        if split not in names:
            raise DatasetError(f"{where} has no split {split!r}{_dym(split, names)}; its splits are: "
                               f"{', '.join(names)}", key=key)
        return obj[split]
    if split != "train":
        raise DatasetError(f"{where} holds a single split of rows, so split {split!r} does not exist; use the "
                           f"default split (train), or carve evaluation rows with eval.count / eval.fraction",
                           key=key)
    return obj


def _dym(name: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass
class _Source:
    """A loaded split before selection: ``rows`` (list of dicts) or ``dataset`` (a datasets.Dataset)."""

    columns: list[str]
    rows: list[dict] | None = None
    dataset: Any = None

    def __len__(self) -> int:
        return len(self.rows) if self.rows is not None else len(self.dataset)

    def select(self, start: int, stop: int) -> list[dict]:
        if self.rows is not None:
            return self.rows[start:stop]
        return self.dataset.select(range(start, stop)).to_list()


def _load_split(spec: Any, spec_dir: Path, split: str, key: str) -> tuple[_Source, str]:
    ds_spec = spec.dataset
    source = ds_spec.source
    if _is_local(source, spec_dir):
        path = _resolve(source, spec_dir)
        suffix = path.suffix.lower()
        if path.is_dir():
            return _load_disk_dir(path, split, key), f"{path} [{split}]"
        if suffix in (".jsonl", ".json"):
            if split != "train":
                _split_of([], split, f"the file {path}", key)  # raises: a file has one split
            rows = _json_rows(_read_text(path), path, lines=suffix == ".jsonl")
            return _Source(columns=_columns_of(rows), rows=rows), str(path)
        if suffix in (".csv", ".parquet"):
            if split != "train":
                _split_of([], split, f"the file {path}", key)
            rows = _builder_rows(suffix[1:], path)
            return _Source(columns=_columns_of(rows), rows=rows), str(path)
        if not path.exists():
            _read_text(path)
        raise DatasetError(f"dataset.source {source!r}: unsupported file type {suffix or '(none)'}; use a "
                           f".jsonl, .json, .csv or .parquet file", key="dataset.source")
    return _load_hub(source, ds_spec.config, split, key), f"{source}" + (
        f" ({ds_spec.config})" if ds_spec.config else "") + f" [{split}]"


def _load_disk_dir(path: Path, split: str, key: str) -> _Source:
    import datasets

    try:
        obj = datasets.load_from_disk(str(path), keep_in_memory=True)
    except FileNotFoundError:
        raise DatasetError(f"{path} is a folder but not one written by Dataset.save_to_disk; point "
                           f"dataset.source at a .jsonl, .json, .csv or .parquet file inside it",
                           key="dataset.source") from None
    ds = _split_of(obj, split, f"the dataset folder {path}", key)
    return _Source(columns=list(ds.column_names), dataset=ds)


def _load_hub(source: str, config: str | None, split: str, key: str) -> _Source:
    import datasets

    try:
        with _Quiet():
            ds = datasets.load_dataset(source, config, split=split)
    except ValueError as exc:
        msg = str(exc)
        if "split" in msg.lower():
            raise DatasetError(f"dataset {source!r} has no split {split!r}: {_first_line(exc)}", key=key) from None
        if "config" in msg.lower():
            raise DatasetError(f"dataset {source!r}: config {config!r} is not valid: {_first_line(exc)}",
                               key="dataset.config") from None
        raise DatasetError(f"cannot load dataset {source!r}: {_first_line(exc)}", key="dataset.source") from None
    except Exception as exc:  # noqa: BLE001 -- hub, network and builder errors, reworded for the user
        raise DatasetError(
            f"cannot load dataset {source!r} from the Hugging Face hub: {_first_line(exc)}. Check the id and your "
            f"network; for a local file give a path ending in .jsonl, .json, .csv or .parquet (relative to the "
            f"spec file)", key="dataset.source") from None
    if isinstance(ds, dict):  # a DatasetDict despite split=
        ds = _split_of(ds, split, f"dataset {source!r}", key)
    return _Source(columns=list(ds.column_names), dataset=ds)


# --------------------------------------------------------------------------------------------- mapping


def field_mapping(spec: Any, columns: Sequence[str]) -> dict[str, str]:
    """``{field name: dataset column}`` from ``dataset.fields`` (None: every column under its own name).

    Raises :class:`DatasetError` (key ``dataset.fields``) when a mapped column is not in ``columns``, naming
    the columns the dataset has and the closest one.
    """
    fields = spec.dataset.fields
    if fields is None:
        mapping = {c: c for c in columns}
    elif isinstance(fields, list):
        mapping = {f: f for f in fields}
    else:
        mapping = dict(fields)
    missing = [(i, name, col) for i, (name, col) in enumerate(mapping.items()) if col not in columns]
    if missing:
        i, name, col = missing[0]
        which = f"field {name!r} maps to column {col!r}" if name != col else f"column {col!r}"
        key = ("dataset.source" if fields is None else
               f"dataset.fields.{i}" if isinstance(fields, list) else f"dataset.fields.{name}")
        raise DatasetError(
            f"{which}, but the dataset has no such column{_dym(col, columns)}. The dataset's columns are: "
            f"{', '.join(columns) or '(none)'}",
            key=key,
        )
    return mapping


def required_fields(spec: Any) -> dict[str, str]:
    """``{field name: what needs it}``: template variables, reference fields of answer rules, warm-up template."""
    from sailrl.runtime.prompts import template_variables

    need: dict[str, str] = {}
    if spec.prompt.system:
        for v in sorted(template_variables(spec.prompt.system)):
            need.setdefault(v, "prompt.system")
    for v in sorted(template_variables(spec.prompt.user)):
        need.setdefault(v, "prompt.user")
    for i, rule in enumerate(spec.reward.rules):
        if getattr(rule, "kind", None) == "answer":
            ref = rule.reference.field or spec.prompt.reference_field
            need.setdefault(ref, f"reward.rules.{i} ({rule.name}) reference")
    warm = spec.training.warmup
    if warm is not None and warm.steps > 0:
        for v in sorted(template_variables(warm.completion)):
            need.setdefault(v, "training.warmup.completion")
    return need


def _check_required(need: Mapping[str, str], mapping: Mapping[str, str], columns: Sequence[str],
                    spec: Any) -> None:
    names = list(mapping)
    for name, user in need.items():
        if name in mapping:
            continue
        if spec.dataset.fields is None:
            raise DatasetError(
                f"{user} uses field {name!r}, but the dataset has no column {name!r}{_dym(name, columns)}. The "
                f"dataset's columns are: {', '.join(columns) or '(none)'}. Map it under dataset.fields "
                f"(e.g. {name}: <column>)", key="dataset.fields")
        raise DatasetError(
            f"{user} uses field {name!r}, but dataset.fields does not declare it{_dym(name, names)}. Declared "
            f"fields: {', '.join(names) or '(none)'}; the dataset's columns are: {', '.join(columns)}",
            key="dataset.fields")


# --------------------------------------------------------------------------------------------- checking


def _check_row(row: dict, need: Mapping[str, str], builder: Any, warm_template: str | None, reward_fn: Any,
               renderer_check: Callable[[dict], str | None] | None) -> tuple[str, str] | None:
    """``(kind, reason)`` when ``row`` cannot be used, else None."""
    from sailrl.runtime.prompts import PromptError

    for name, user in need.items():
        if name not in row:
            return "missing_field", f"field {name!r} is missing (used by {user})"
        if row[name] is None:
            return "null_field", f"field {name!r} is empty (null) (used by {user})"
    try:
        builder.messages(row)
        if warm_template is not None:
            builder.completion(row, warm_template)
    except PromptError as exc:
        text = str(exc)
        prefix = f"row {row.get('_index')}: "
        return "template", text.removeprefix(prefix)
    if reward_fn is not None:
        problem = reward_fn.reference_problem(row)
        if problem:
            return "reference", f"reference rejected by the reward rules: {problem}"
    if renderer_check is not None:
        problem = renderer_check(row)
        if problem:
            return "renderer", problem
    return None


def _select(src: _Source, split_label: str, *, rng: tuple[int, int] | None, limit: int | None,
            key_prefix: str, notes: list[str]) -> list[tuple[int, dict]]:
    """``(source index, raw row)`` pairs of ``range`` then ``limit``."""
    n = len(src)
    if n == 0:
        raise DatasetError(f"the {split_label} split is empty: it has no rows", key=f"{key_prefix}.split")
    start, stop = 0, n
    if rng is not None:
        start, stop = int(rng[0]), int(rng[1])
        if start < 0 or stop <= start:
            raise DatasetError(f"{key_prefix}.range [{start}, {stop}) is not a valid range: need 0 <= start < end",
                               key=f"{key_prefix}.range")
        if start >= n:
            raise DatasetError(f"{key_prefix}.range [{start}, {stop}) selects no rows: the {split_label} split has "
                               f"only {n} rows (indices 0..{n - 1})", key=f"{key_prefix}.range")
        if stop > n:
            notes.append(f"{key_prefix}.range ends at {stop} but the {split_label} split has {n} rows; "
                         f"using rows {start}..{n - 1}")
        stop = min(stop, n)
    if limit is not None:
        stop = min(stop, start + int(limit))
    return [(start + offset, r) for offset, r in enumerate(src.select(start, stop))]


def _map_and_check(raw_rows: list[tuple[int, dict]], mapping: Mapping[str, str], need: Mapping[str, str], builder: Any,
                   warm_template: str | None, reward_fn: Any, renderer_check: Any,
                   split: str) -> tuple[list[dict], list[SkippedRow]]:
    kept: list[dict] = []
    skipped: list[SkippedRow] = []
    for idx, raw in raw_rows:
        row = {name: raw[col] for name, col in mapping.items() if col in raw}
        row["_index"] = idx
        problem = _check_row(row, need, builder, warm_template, reward_fn, renderer_check)
        if problem is None:
            kept.append(row)
        else:
            kind, reason = problem
            skipped.append(SkippedRow(index=idx, reason=reason, row=row, kind=kind, split=split))
    return kept, skipped


def _skip_summary(skipped: Sequence[SkippedRow], limit: int = 3) -> str:
    counts: dict[str, int] = {}
    for s in skipped:
        counts[s.reason] = counts.get(s.reason, 0) + 1
    parts = [f"{n} x {reason}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])[:limit]]
    more = "" if len(counts) <= limit else f"; and {len(counts) - limit} more reasons"
    return "; ".join(parts) + more


def shuffle_seed(spec: Any) -> int:
    """The data seed: ``dataset.shuffle_seed``, else ``model.seed``."""
    s = spec.dataset.shuffle_seed
    return int(spec.model.seed if s is None else s)


def load_rows(spec: Any, spec_dir: Path | str, reward_fn: Any = None, *,
              renderer_check: Callable[[dict], str | None] | None = None) -> DatasetRows:
    """Load, map, check, shuffle and split the spec's dataset (see the module docstring for the order).

    spec: a :class:`~sailrl.spec.schema.Spec`. spec_dir: the folder of the spec file (relative paths start
    there). reward_fn: a ``RewardFunction`` whose ``reference_problem(row)`` rejects unusable references (rows
    skipped). renderer_check: ``row -> reason | None``, an extra per-row check (e.g. prompt too long).

    Returns :class:`DatasetRows`. Raises :class:`DatasetError` for a missing/unreadable/malformed file, an
    unknown split or column, or when a step leaves no rows (the message names the step).
    """
    from sailrl.runtime.prompts import PromptBuilder

    spec_dir = Path(spec_dir)
    ds = spec.dataset
    src, where = _load_split(spec, spec_dir, ds.split, "dataset.split")
    if len(src) == 0:
        raise DatasetError(f"the {ds.split} split is empty: {where} has no rows", key="dataset.source")
    columns = list(src.columns)
    mapping = field_mapping(spec, columns)
    need = required_fields(spec)
    _check_required(need, mapping, columns, spec)
    builder = PromptBuilder(spec.prompt, None, field_names=list(mapping))
    warm = spec.training.warmup
    warm_template = warm.completion if warm is not None and warm.steps > 0 else None

    notes: list[str] = []
    raw = _select(src, ds.split, rng=ds.range, limit=ds.limit, key_prefix="dataset", notes=notes)
    selected = len(raw)
    train, skipped = _map_and_check(raw, mapping, need, builder, warm_template, reward_fn, renderer_check,
                                    ds.split)
    if not train:
        raise DatasetError(f"every one of the {selected} selected rows was skipped ({_skip_summary(skipped)}); "
                           f"fix the data or the fields the prompt and reward rules use", key="dataset.fields")
    seed = shuffle_seed(spec)
    if ds.shuffle:
        random.Random(seed).shuffle(train)

    eval_rows: list[dict] = []
    ev = ds.eval
    if ev is not None:
        if ev.split is not None:
            if ev.split == ds.split:
                raise DatasetError(f"eval.split {ev.split!r} is the training split itself; name another split, or "
                                   f"carve rows with eval.count / eval.fraction", key="dataset.eval.split")
            esrc, _ = _load_split(spec, spec_dir, ev.split, "dataset.eval.split")
            emapping = field_mapping(spec, list(esrc.columns))
            eraw = _select(esrc, ev.split, rng=None, limit=None, key_prefix="dataset.eval", notes=notes)
            eval_rows, eskipped = _map_and_check(eraw, emapping, need, builder, None, reward_fn, renderer_check,
                                                 ev.split)
            skipped.extend(eskipped)
            if not eval_rows:
                raise DatasetError(f"every row of the eval split {ev.split!r} was skipped "
                                   f"({_skip_summary(eskipped)})", key="dataset.eval.split")
        elif ev.count is not None or ev.fraction is not None:
            n = len(train)
            k = int(ev.count) if ev.count is not None else max(1, round(float(ev.fraction) * n))
            what = f"eval.count {ev.count}" if ev.count is not None else f"eval.fraction {ev.fraction}"
            if k >= n:
                raise DatasetError(f"{what} would carve {k} evaluation rows off {n} usable training rows, leaving "
                                   f"none to train on; lower it", key="dataset.eval")
            eval_rows, train = train[n - k:], train[: n - k]
        if ev.limit is not None:
            eval_rows = eval_rows[: int(ev.limit)]
    return DatasetRows(train=train, eval=eval_rows, skipped=skipped, columns=columns, source=where,
                       loaded=len(src), selected=selected, notes=notes)


# --------------------------------------------------------------------------------------------- order


def _epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    if epoch > 0:  # epoch 0 keeps the load-time order (already shuffled with the seed, or the file order)
        random.Random(f"sailrl-epoch:{seed}:{epoch}").shuffle(order)
    return order


def rows_for_step(rows: Sequence[dict], step: int, groups_per_step: int, seed: int, *,
                  reshuffle: bool = True) -> list[dict]:
    """The ``groups_per_step`` rows (one per group) of RL step ``step`` (0-based).

    Positions ``step * groups_per_step ...`` run through the rows epoch after epoch; epoch ``e`` visits the
    rows in the load-time order when ``e == 0`` and in a permutation seeded by (``seed``, ``e``) afterwards
    (``reshuffle=False``: the load-time order every epoch). The result depends only on (rows, step,
    groups_per_step, seed), so a resumed run gets the same rows for step N as an uninterrupted one. A step
    that straddles an epoch boundary takes the end of one epoch and the start of the next.
    """
    n = len(rows)
    if n == 0:
        raise DatasetError("no training rows to draw a step from")
    if groups_per_step <= 0 or step < 0:
        raise ValueError("need groups_per_step > 0 and step >= 0")
    out: list[dict] = []
    orders: dict[int, list[int]] = {}
    for pos in range(step * groups_per_step, (step + 1) * groups_per_step):
        epoch, offset = divmod(pos, n)
        if epoch not in orders:
            orders[epoch] = _epoch_order(n, seed, epoch if reshuffle else 0)
        out.append(rows[orders[epoch][offset]])
    return out


def batches(rows: Sequence[dict], groups_per_step: int, seed: int, start_step: int = 0, *,
            reshuffle: bool = True) -> Iterator[tuple[int, list[dict]]]:
    """Endless ``(step, rows_for_step(rows, step, ...))`` from ``start_step`` on (a resumed run passes its step)."""
    step = start_step
    while True:
        yield step, rows_for_step(rows, step, groups_per_step, seed, reshuffle=reshuffle)
        step += 1
