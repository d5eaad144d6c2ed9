"""The embedded backend's checkpoint store, run by run: what is in it, what run directories still need, removing.

The store is ``$SAILRL_HOME/checkpoints`` (:func:`sailrl.runtime.backends.backend.local_checkpoint_dir`): one folder per
training client (a *store run*, e.g. ``tiny-3f9a1c2e``) holding ``sampler_weights/<name>/`` and ``weights/<name>/``
checkpoints (``sailrl.runtime.backends.local.weights.checkpoints``) and their ``.tar`` archives. Every run of the embedded backend
adds one store run (~40 MB for the quickstart: a sampler checkpoint per step); nothing is removed automatically.

A checkpoint is **needed** when a run directory's ``--resume`` would load it: the last saved state in the run
directory's ``checkpoints.jsonl`` or, for a run directory with no saved state yet, the ``training.resume_from`` /
``training.init_from`` of its ``config.json``. Run directories are found in the registry
``$SAILRL_HOME/run_dirs.jsonl`` (:func:`note_run_directory`, called when a run opens), under ``./runs`` and
under any folder the caller names. Removing a store run that holds a needed checkpoint keeps that checkpoint
(every other checkpoint and archive of the store run goes), unless ``force``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sailrl.runtime.backends.backend import local_checkpoint_dir
from sailrl.runtime.rundir.directory import (
    CHECKPOINTS_FILE,
    CONFIG_FILE,
    RunDirectory,
    RunFileError,
    _read_jsonl_tolerant,
    read_run_bytes,
)

__all__ = [
    "REGISTRY_FILE",
    "Removal",
    "StoreRun",
    "find_run_directories",
    "list_store",
    "needed_checkpoints",
    "note_run_directory",
    "plan_removals",
    "remove",
    "store_dir",
]

REGISTRY_FILE = "run_dirs.jsonl"
CHECKPOINT_META_MAX_BYTES = 2**20
KINDS = ("sampler_weights", "weights")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def store_dir() -> Path:
    """``$SAILRL_HOME/checkpoints`` (default ``~/.cache/sailrl/checkpoints``)."""
    return local_checkpoint_dir()


def _registry(store: Path) -> Path:
    return store.parent / REGISTRY_FILE


def note_run_directory(run_dir: str | Path, store: Path | None = None) -> None:
    """Record ``run_dir`` (made absolute) in the registry next to the store, once, so cleaning the store can see
    what it needs wherever ``output.run_dir`` put it."""
    store = store or store_dir()
    path = str(Path(run_dir).absolute())
    registry = _registry(store)
    if path in _registered(store):
        return
    registry.parent.mkdir(parents=True, exist_ok=True)
    with open(registry, "a", encoding="utf-8") as f:
        f.write(json.dumps({"run_dir": path}) + "\n")


def _registered(store: Path) -> list[str]:
    out: list[str] = []
    for record in _read_jsonl_tolerant(_registry(store)):  # a torn line from a killed writer is skipped
        value = record.get("run_dir")
        if isinstance(value, str) and value not in out:
            out.append(value)
    return out


def _is_run_dir(path: Path) -> bool:
    return (path / CHECKPOINTS_FILE).is_file() or (path / CONFIG_FILE).is_file()


def find_run_directories(extra: Iterable[str | Path] = (), store: Path | None = None) -> list[Path]:
    """Run directories to respect: the registry's (those that still exist), ``./runs/*`` and each of ``extra``
    (a run directory, or a folder whose subfolders are run directories). Absolute, without duplicates."""
    store = store or store_dir()
    candidates: list[Path] = [Path(p) for p in _registered(store)]
    for root in [Path("runs"), *map(Path, extra)]:
        if _is_run_dir(root):
            candidates.append(root)
        elif root.is_dir():
            candidates.extend(sorted(p for p in root.iterdir() if p.is_dir()))
    out: list[Path] = []
    for c in candidates:
        c = c.absolute()
        if c not in out and _is_run_dir(c):
            out.append(c)
    return out


def needed_checkpoints(run_dirs: Sequence[Path]) -> dict[str, list[Path]]:
    """``{local:// checkpoint path: [run directories whose --resume loads it]}``.

    Per run directory: the ``state_path`` of the last record of ``checkpoints.jsonl`` that has one, and the last
    ``sampler_path`` of a final record (the adapter the run printed as its result); with no state,
    ``training.resume_from`` and ``training.init_from`` from ``config.json``. ``tinker://`` paths are ignored.
    """
    out: dict[str, list[Path]] = {}
    for path in run_dirs:
        rd = RunDirectory(path)
        state = rd.last_state()
        wanted: list[str] = []
        if state is not None:
            wanted.append(str(state.get("state_path")))
        final = [r for r in _jsonl(rd.checkpoints_path) if r.get("final") and r.get("sampler_path")]
        if final:
            wanted.append(str(final[-1]["sampler_path"]))
        else:
            try:
                training = ((rd.read_config() or {}).get("spec") or {}).get("training") or {}
            except (OSError, ValueError):
                training = {}
            wanted += [str(training[k]) for k in ("resume_from", "init_from") if training.get(k)]
        for p in wanted:
            if p.startswith("local://"):
                out.setdefault(p, []).append(path)
    return out


def _jsonl(path: Path) -> list[dict]:
    return _read_jsonl_tolerant(path)


@dataclass
class StoreRun:
    """One store run.

    run_id: its folder name. path: the folder. size_bytes: every file under it. checkpoints: ``local://`` paths
    of its checkpoints. newest: when its last checkpoint was written (``checkpoint.json`` ``time``, else the
    folder's modification time), timezone-aware UTC. needed: ``{checkpoint path: [run directories]}`` of its
    checkpoints that a run directory's ``--resume`` loads.
    """

    run_id: str
    path: Path
    size_bytes: int
    checkpoints: list[str]
    newest: _dt.datetime
    needed: dict[str, list[Path]] = field(default_factory=dict)

    def age_days(self, now: _dt.datetime | None = None) -> float:
        now = now or _dt.datetime.now(_dt.UTC)
        return (now - self.newest).total_seconds() / 86400.0


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _checkpoint_time(directory: Path) -> _dt.datetime:
    try:
        meta = json.loads(read_run_bytes(directory / "checkpoint.json", CHECKPOINT_META_MAX_BYTES) or b"")
        when = _dt.datetime.fromisoformat(meta["time"])
        return when if when.tzinfo else when.replace(tzinfo=_dt.UTC)
    except (OSError, ValueError, KeyError, TypeError, RecursionError, RunFileError):
        return _dt.datetime.fromtimestamp(directory.stat().st_mtime, _dt.UTC)


def list_store(store: Path | None = None, run_dirs: Sequence[Path] = ()) -> list[StoreRun]:
    """The store runs under ``store`` (default :func:`store_dir`), oldest first, with what ``run_dirs`` need.

    Only real folders named like a run id that hold ``sampler_weights/`` or ``weights/`` count; links and other
    files are never listed (so never removed).
    """
    store = store or store_dir()
    if not store.is_dir():
        return []
    needed = needed_checkpoints(run_dirs)
    runs: list[StoreRun] = []
    for entry in sorted(store.iterdir()):
        if entry.is_symlink() or not entry.is_dir() or not _RUN_ID.match(entry.name):
            continue
        kinds = [entry / k for k in KINDS if (entry / k).is_dir() and not (entry / k).is_symlink()]
        if not kinds:
            continue
        checkpoints: list[str] = []
        times: list[_dt.datetime] = []
        for kind_dir in kinds:
            for ckpt in sorted(kind_dir.iterdir()):
                if ckpt.is_dir() and not ckpt.is_symlink():
                    checkpoints.append(f"local://{entry.name}/{kind_dir.name}/{ckpt.name}")
                    times.append(_checkpoint_time(ckpt))
        newest = max(times) if times else _dt.datetime.fromtimestamp(entry.stat().st_mtime, _dt.UTC)
        mine = {p: dirs for p, dirs in needed.items() if p in checkpoints}
        runs.append(StoreRun(entry.name, entry, _size(entry), checkpoints, newest, mine))
    return sorted(runs, key=lambda r: r.newest)


@dataclass
class Removal:
    """What removing one store run does.

    whole: the folder goes entirely. Otherwise ``paths`` (checkpoint folders and archives) go and ``kept``
    (needed checkpoints) stay. freed_bytes: the size of what goes.
    """

    run: StoreRun
    whole: bool
    paths: list[Path]
    kept: list[str]
    freed_bytes: int


def plan_removals(runs: Sequence[StoreRun], *, force: bool = False) -> list[Removal]:
    """One :class:`Removal` per store run in ``runs``: the whole folder when nothing in it is needed (or
    ``force``), else everything but the needed checkpoints."""
    out: list[Removal] = []
    for run in runs:
        if force or not run.needed:
            out.append(Removal(run, True, [run.path], [], run.size_bytes))
            continue
        keep = {run.path.joinpath(*p.removeprefix("local://").split("/")[1:]) for p in run.needed}
        paths: list[Path] = []
        for kind in KINDS:
            kind_dir = run.path / kind
            if not kind_dir.is_dir():
                continue
            for item in sorted(kind_dir.iterdir()):
                if not item.is_symlink() and item not in keep:
                    paths.append(item)
        freed = sum(_size(p) if p.is_dir() else p.stat().st_size for p in paths)
        out.append(Removal(run, False, paths, sorted(run.needed), freed))
    return out


def remove(removal: Removal) -> int:
    """Carry out ``removal``; returns the bytes freed."""
    for p in removal.paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    return removal.freed_bytes
