"""The ``dataset:`` section: prompt.reference_field is a declared field (S219), no field listed twice (S220), a
non-empty range (S222), one way to carve the eval set (S223), and a local ``dataset.source`` the loader can read
(S224 missing, S228 a device or pipe, S229 a type it does not read)."""

from __future__ import annotations

from typing import Any

from sailrl.compiler.checks.reader import SpecReader
from sailrl.runtime.data.readers import is_local, resolve
from sailrl.spec.constants import LOCAL_DATA_SUFFIXES
from sailrl.spec.files import special_kind

_DATA_TYPES_HINT = ("Point dataset.source at a .jsonl, .json, .csv or .parquet file, or a folder written by "
                    "Dataset.save_to_disk (relative paths are relative to the spec file's folder).")


def check_dataset(spec: SpecReader) -> None:
    declared = spec.declared_fields()
    ref = spec.text(("prompt", "reference_field"))
    if declared is not None and ref is not None and ref not in declared:
        spec.unknown_field(("prompt", "reference_field"), ref, declared, reference=True)
    if declared is not None and len(set(declared)) != len(declared):
        dup = next(n for n in declared if declared.count(n) > 1)
        spec.add(("dataset", "fields"), "S220", f"field '{dup}' is listed twice")
    rng = spec.get(("dataset", "range"))
    if isinstance(rng, list) and len(rng) == 2 and all(_is_int(x) for x in rng) and (
        rng[0] < 0 or rng[0] >= rng[1]
    ):
        spec.add(("dataset", "range"), "S222", f"range [{rng[0]}, {rng[1]}) is empty or negative",
                 "range: [start, end] takes rows start .. end-1; start must be >= 0 and below end.")
    ev = spec.get(("dataset", "eval"))
    if isinstance(ev, dict) and spec.whole("dataset"):
        chosen = [k for k in ("split", "count", "fraction") if ev.get(k) is not None]
        if len(chosen) != 1:
            spec.add(("dataset", "eval"), "S223",
                     "dataset.eval needs exactly one of split, count or fraction"
                     + (f" (got {', '.join(chosen)})" if chosen else ""),
                     "split: a named split (e.g. test); count / fraction: rows carved from the training data.")
    source = spec.text(("dataset", "source"))
    if source and spec.path_ok(("dataset", "source")) and spec.loaded.path.is_file():
        try:
            local = is_local(source, spec.loaded.base_dir)
        except (OSError, ValueError):  # a name no file system takes (the path checks report it)
            local = False
        if local:
            _local_data(spec, source)


def _local_data(spec: SpecReader, source: str) -> None:
    """The local ``dataset.source`` as the loader (``runtime.data.sources``) takes it: a device, pipe or
    socket (S228), a missing file (S224), a file of a type it cannot read or a folder ``save_to_disk`` did not
    write (S229) is refused here, at the key, as the run and preflight would refuse it."""
    full = resolve(source, spec.loaded.base_dir)
    kind = special_kind(full)
    if kind is not None:
        spec.add(("dataset", "source"), "S228", f"{full} is {kind}, not a data file",
                 "Point dataset.source at a .jsonl, .json, .csv or .parquet file (a device or a pipe "
                 "never ends or blocks).")
        return
    try:
        exists, is_dir = full.exists(), full.is_dir()
    except OSError:
        exists = is_dir = False
    if not exists:
        spec.add(("dataset", "source"), "S224", f"data file not found: {full}",
                 "Relative paths are relative to the spec file's folder.")
    elif is_dir:
        if not ((full / "dataset_info.json").is_file() and (full / "state.json").is_file()) \
                and not (full / "dataset_dict.json").is_file():
            spec.add(("dataset", "source"), "S229", f"{full} is a folder but not one written by "
                     "Dataset.save_to_disk", _DATA_TYPES_HINT)
    elif full.suffix.lower() not in LOCAL_DATA_SUFFIXES:
        spec.add(("dataset", "source"), "S229", f"{full} is not a file type sailrl reads "
                 f"({full.suffix or 'no suffix'})", _DATA_TYPES_HINT)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
