"""The run directory: ``config.json``, ``metrics.jsonl``, ``checkpoints.jsonl``, ``warmup.jsonl`` and ``train.py``.

Layout follows tinker-cookbook: ``metrics.jsonl`` has one JSON object per step with a ``step`` key (as
``tinker_cookbook.utils.ml_log`` writes it); ``checkpoints.jsonl`` is written by
``tinker_cookbook.checkpoint_utils.save_checkpoint_async`` (``name``, ``batch``, ``state_path``...).
Here ``batch`` is the number of completed RL steps; steps are numbered from 1, so a resumed run starts at step
``batch + 1``. A state saved during the supervised warm-up also records ``warmup`` (completed warm-up steps).

Crash safety: each metrics line is written whole and flushed with fsync (:func:`append_whole`: a write that fails,
a full disk, is taken back, so no half line stays). A run killed mid-step leaves at most a partial last line,
which is dropped on resume; lines for steps after the last saved state are dropped too (those
steps are re-run), so the metrics of a resumed run have every step exactly once.

Reading: every command that reads a run directory's files (export, sample, show, plot, the studio, ``--resume``,
``sailrl clean``) opens them with :func:`open_run_file`, which opens regular files only (a FIFO would block the
read, ``/dev/zero`` never ends: either is one located :class:`RunFileError`), and reads them within a size limit
per file (:func:`read_run_bytes`, :data:`FILE_LIMITS`) or, for the rollout log, a line at a time within
:data:`MAX_LINE_BYTES` (:func:`run_file_lines`), so memory stays bounded whatever the folder holds.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from sailrl.runtime.rundir.writes import writing
from sailrl.runtime.sandbox.redact import redact
from sailrl.spec.errors import UserError
from sailrl.spec.files import writable_folder
from sailrl.spec.schema import Spec

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_FILE = "checkpoints.jsonl"
WARMUP_FILE = "warmup.jsonl"
ROLLOUTS_FILE = "rollouts.jsonl"
GAMING_FILE = "gaming.jsonl"
PLOT_FILE = "reward.png"
SCRIPT_FILE = "train.py"
#: The files a run writes that a new run over the same directory (``--overwrite``) removes first.
RECORD_FILES = (CONFIG_FILE, METRICS_FILE, CHECKPOINTS_FILE, WARMUP_FILE, ROLLOUTS_FILE, PLOT_FILE, GAMING_FILE)
#: Each record file's schema version. Every record carries ``"schema": "<file's kind>/<version>"`` (e.g.
#: ``"metrics/2"``); readers accept this version and the one before it -- records written before versions were
#: recorded have none and are version 1 -- and refuse a newer one in one line.
SCHEMA_KEY = "schema"
SCHEMA_VERSIONS = {CONFIG_FILE: 2, METRICS_FILE: 2, CHECKPOINTS_FILE: 2, WARMUP_FILE: 2, ROLLOUTS_FILE: 2,
                   GAMING_FILE: 2}
#: Longest line the run's JSONL files are read with (a metrics line is a few KiB, a rollout record at most a few
#: MiB: its texts are capped by ``runtime.rollout_log``).
MAX_LINE_BYTES = 16 * 2**20
#: Largest size each run-directory file is read whole at (a quickstart step's metrics line is about 1.1 KiB, so
#: ``metrics.jsonl`` holds over 100,000 steps; ``rollouts.jsonl`` is read a line at a time instead, any size).
FILE_LIMITS = {
    CONFIG_FILE: 16 * 2**20,
    METRICS_FILE: 128 * 2**20,
    CHECKPOINTS_FILE: 64 * 2**20,
    WARMUP_FILE: 128 * 2**20,
}
DEFAULT_FILE_LIMIT = 64 * 2**20


class RunFileError(UserError):
    """A run-directory file that cannot be read as one: not a regular file (a FIFO, a device, a link to one), over
    its size limit, or refused by the file system. ``str(exc)`` names the file and what to do."""

    code = "E106"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n >= 2**20 else f"{n:,} bytes"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular_file(path: Path, mode: int) -> RunFileError:
    """The :class:`RunFileError` for ``path``, whose ``st_mode`` is ``mode`` and not a regular file's."""
    link = " (through a symbolic link)" if path.is_symlink() else ""
    return RunFileError(f"{path} is {_kind(mode)}{link}, not a regular file: a run directory holds only the regular "
                        "files a run wrote; remove it, or put back the file the run wrote")


def open_run_file(path: str | Path) -> IO[bytes] | None:
    """``path`` opened for reading in binary when it is a regular file (a symbolic link to one counts), None when
    it does not exist; :class:`RunFileError` when it is anything else or cannot be opened.

    The type is checked before opening (opening some devices does something) and again on the open descriptor
    (the file may have been swapped in between); the open itself does not wait (``O_NONBLOCK``), so a FIFO swapped
    in cannot block it."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:  # also a link to nothing
        return None
    except OSError as exc:  # a link loop, a name too long, a folder that cannot be searched
        raise RunFileError(f"{path} cannot be read ({exc.strerror or exc}): check the run directory") from None
    if not stat.S_ISREG(st.st_mode):
        raise not_regular_file(path, st.st_mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunFileError(f"{path} cannot be read ({exc.strerror or exc}): check the run directory") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular_file(path, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_limit(path: str | Path) -> int:
    """The size limit :func:`read_run_bytes` reads ``path`` within, by its name (:data:`FILE_LIMITS`)."""
    return FILE_LIMITS.get(Path(path).name, DEFAULT_FILE_LIMIT)


def too_large(path: Path, size: int, limit: int) -> RunFileError:
    """The :class:`RunFileError` for ``path``, ``size`` bytes where ``limit`` is the most sailrl reads."""
    return RunFileError(f"{path} is {_mib(size)}, more than the {_mib(limit)} sailrl reads of a {path.name}: it was "
                        "not written by a run; remove it, or put back the file the run wrote")


def read_run_bytes(path: str | Path, limit: int | None = None) -> bytes | None:
    """The bytes of the regular file ``path`` (None when it does not exist), at most ``limit`` of them (default
    :func:`file_limit`); :class:`RunFileError` when it is not a regular file or is larger."""
    path = Path(path)
    limit = file_limit(path) if limit is None else limit
    f = open_run_file(path)
    if f is None:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise too_large(path, size, limit)
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew while it was read
        raise too_large(path, len(data), limit)
    return data


def run_file_lines(f: IO[bytes], max_line: int | None = None) -> Iterator[bytes | None]:
    """The lines of the open file ``f`` (each with its newline; the last may lack one), read a line at a time: a
    line longer than ``max_line`` (default :data:`MAX_LINE_BYTES`) is skipped to its end unread and yielded as
    None, so memory stays within ``max_line`` whatever the file holds."""
    max_line = MAX_LINE_BYTES if max_line is None else max_line
    while raw := f.readline(max_line):
        if len(raw) == max_line and not raw.endswith(b"\n"):  # too long: skip to its end, unread
            while (raw := f.readline(max_line)) and not raw.endswith(b"\n"):
                pass
            yield None
            continue
        yield raw


def _schema_kind(name: str) -> str:
    return name.split(".", 1)[0]


def stamped(name: str, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with the schema version of the file ``name`` it is written to (:data:`SCHEMA_VERSIONS`; a file
    without one gets none)."""
    version = SCHEMA_VERSIONS.get(name)
    return record if version is None else {**record, SCHEMA_KEY: f"{_schema_kind(name)}/{version}"}


def unstamped(path: str | Path, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as read from ``path``, without its schema key; a :class:`RunFileError` when a newer sailrl (or
    something else) wrote it in a version this one does not read (this version or the one before)."""
    name = Path(path).name
    current = SCHEMA_VERSIONS.get(name)
    value = record.get(SCHEMA_KEY)
    if current is None or value is None:
        return record
    kind, _, version = str(value).partition("/")
    if kind != _schema_kind(name) or not version.isdigit() or not current - 1 <= int(version) <= current:
        raise RunFileError(f"{path} holds records of schema {value!r}, and this sailrl reads {_schema_kind(name)}/"
                           f"{current - 1} and {_schema_kind(name)}/{current}: read it with the sailrl that wrote "
                           f"it (pip install -U sailrl), or start a new run directory")
    return {k: v for k, v in record.items() if k != SCHEMA_KEY}


def _read_jsonl_tolerant(path: Path) -> list[dict[str, Any]]:
    """Parse a JSONL file line by line, skipping a truncated or corrupt line (a killed writer, bytes that are not
    UTF-8, JSON nested past the recursion limit, a line longer than :data:`MAX_LINE_BYTES`) instead of failing.
    A missing file is ``[]``; a file that is not a regular one or is over its :func:`file_limit` is a
    :class:`RunFileError`."""
    path = Path(path)
    f = open_run_file(path)
    if f is None:
        return []
    out = []
    with f:
        size, limit = os.fstat(f.fileno()).st_size, file_limit(path)
        if size > limit:
            raise too_large(path, size, limit)
        read = 0
        for raw in run_file_lines(f):
            if raw is None:
                read += MAX_LINE_BYTES
                continue
            read += len(raw)
            if read > limit:  # it grew while it was read
                raise too_large(path, read, limit)
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                continue
            if isinstance(obj, dict):
                out.append(unstamped(path, obj))
    return out


def append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` whole and fsync it, or not at all: a write that fails part-way (a full disk) is
    cut back to where it began before the error, a :class:`~sailrl.runtime.rundir.writes.RunWriteError` for a disk
    failure, is raised. A torn last line a killed writer left is closed with a newline first, so the new record
    never joins it."""
    with writing(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            if start and os.pread(fd, 1, start - 1) != b"\n":
                data = b"\n" + data
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except BaseException:
                os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)


def replace_whole(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` by atomic replace (a temporary file beside it, fsynced); on failure the
    temporary file is removed and ``path`` is left as it was."""
    tmp = path.with_name(path.name + ".tmp")
    with writing(path):
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay whole)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def spec_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Plain-words list of the dotted keys whose values differ between two resolved specs (``examples``, which
    only `sailrl validate` reads, left out)."""
    a, b = flatten(old), flatten(new)
    changes = []
    for key in sorted(set(a) | set(b)):
        if key == "examples" or key.startswith("examples."):
            continue
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            changes.append(f"{key}: {a.get(key, '<unset>')!r} -> {b.get(key, '<unset>')!r}")
    return changes


def run_dir_path(spec: Spec, spec_dir: Path | str) -> Path:
    """``output.run_dir`` with ``{name}`` filled in; a relative path is relative to the spec's folder, like every
    other path in a spec (``dataset.source``, a local ``model.name``). Resolved, so it prints as the folder it
    is (``.../spec/examples/runs/x``, not ``.../generated/../spec/examples/runs/x``)."""
    p = Path(spec.output.run_dir.replace("{name}", spec.name)).expanduser()
    return resolved(p if p.is_absolute() else Path(spec_dir) / p)


def resolved(path: Path) -> Path:
    """``path`` resolved; a path through a symbolic-link loop is made absolute only, so that reading or writing it
    is refused in one line where it is used (``Path.resolve`` raises ``RuntimeError`` on a loop)."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return Path(os.path.abspath(path))


class RunDirectory:
    """One run's directory. Reading never creates it; the first write does (``mkdir -p``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def ensure(self) -> None:
        """Create the directory (and parents) if missing; a :class:`~sailrl.spec.errors.StorageError` in one
        line when it cannot be created or written."""
        writable_folder(self.path, "the run directory", "set output.run_dir (or --set output.run_dir=...) to a "
                        "folder you can write")

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def checkpoints_path(self) -> Path:
        return self.path / CHECKPOINTS_FILE

    def has_metrics(self) -> bool:
        return bool(_read_jsonl_tolerant(self.metrics_path))

    def clear_records(self) -> None:
        """Remove a previous run's records (config, metrics, checkpoint index, warm-up log, plot, gaming warnings)."""
        for name in RECORD_FILES:
            (self.path / name).unlink(missing_ok=True)

    def write_config(self, resolved_spec: dict[str, Any], spec_sha256: str, extra: dict[str, Any]) -> None:
        self.ensure()
        config = stamped(CONFIG_FILE, {"spec_sha256": spec_sha256, "spec": resolved_spec, **extra})
        replace_whole(self.path / CONFIG_FILE, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8"))

    def read_config(self) -> dict[str, Any] | None:
        """``config.json`` parsed (None when missing); ``ValueError`` when it is not JSON, :class:`RunFileError`
        when it is not a regular file or is over its size limit."""
        raw = read_run_bytes(self.path / CONFIG_FILE)
        if raw is None:
            return None
        try:
            config = json.loads(raw.decode("utf-8"))
        except RecursionError:
            raise ValueError("its JSON is nested too deeply") from None
        return unstamped(self.path / CONFIG_FILE, config) if isinstance(config, dict) else config

    def check_resume_config(self, resolved_spec: dict[str, Any], spec_sha256: str) -> list[str]:
        """Compare with the saved config (values after overrides, and the spec file's hash).

        Warns (``UserWarning``) and returns the changed dotted keys when the resolved values differ; a spec file
        whose hash changed while every value stayed the same (comments, formatting) is not a change.
        """
        old = self.read_config()
        if old is None:
            return []
        changes = spec_changes(old.get("spec", {}), resolved_spec)
        if changes:
            warnings.warn(
                "resuming with a spec that differs from the one this run started with: " + "; ".join(changes),
                stacklevel=2,
            )
        return changes

    def last_state(self) -> dict[str, Any] | None:
        """The last checkpoint record with a ``state_path`` (resumable), or None."""
        records = [r for r in _read_jsonl_tolerant(self.checkpoints_path) if r.get("state_path")]
        return records[-1] if records else None

    def final_saved(self, completed: int) -> bool:
        """True when a final checkpoint (state and sampler weights) after ``completed`` steps is recorded."""
        return any(r.get("final") and r.get("sampler_path") and r.get("batch", -1) >= completed
                   for r in _read_jsonl_tolerant(self.checkpoints_path))

    def last_sampler_path(self) -> str | None:
        records = [r for r in _read_jsonl_tolerant(self.checkpoints_path) if r.get("sampler_path")]
        return records[-1]["sampler_path"] if records else None

    def truncate_metrics(self, first_step_to_rerun: int) -> None:
        """Keep only metrics of steps before ``first_step_to_rerun`` (atomic rewrite)."""
        self.truncate_jsonl(METRICS_FILE, first_step_to_rerun)

    def truncate_jsonl(self, name: str, first_step_to_rerun: int) -> None:
        """Keep only the lines of ``name`` whose integer ``step`` is below ``first_step_to_rerun`` (atomic)."""
        path = self.path / name
        if not path.exists() and not path.is_symlink():
            return
        kept = [m for m in _read_jsonl_tolerant(path)
                if isinstance(m.get("step"), int) and m["step"] < first_step_to_rerun]
        replace_whole(path, "".join(json.dumps(stamped(name, m), sort_keys=True) + "\n" for m in kept)
                      .encode("utf-8"))

    def append_metrics(self, metrics: dict[str, Any]) -> None:
        """Append one step's metrics as one line, flushed to disk."""
        self.append_jsonl(METRICS_FILE, metrics)

    def write_script(self, text: str) -> None:
        """Record the training script that runs as ``train.py`` (atomic)."""
        self.ensure()
        replace_whole(self.path / SCRIPT_FILE, text.encode("utf-8"))

    def read_warmup(self) -> list[dict[str, Any]]:
        return _read_jsonl_tolerant(self.path / WARMUP_FILE)

    def read_metrics(self) -> list[dict[str, Any]]:
        return _read_jsonl_tolerant(self.metrics_path)

    def append_jsonl(self, name: str, record: dict[str, Any]) -> None:
        """Append ``record`` as one line of ``name``, whole or not at all (:func:`append_whole`; a kill leaves at
        most a torn last line)."""
        self.ensure()
        append_whole(self.path / name, redact(json.dumps(stamped(name, record), sort_keys=True) + "\n")
                     .encode("utf-8"))
