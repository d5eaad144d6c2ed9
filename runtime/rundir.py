"""The run directory: ``config.json``, ``metrics.jsonl``, ``checkpoints.jsonl``, ``warmup.jsonl`` and ``train.py``.

Layout follows tinker-cookbook: ``metrics.jsonl`` has one JSON object per step with a ``step`` key (as
``tinker_cookbook.utils.ml_log`` writes it); ``checkpoints.jsonl`` is written by
``tinker_cookbook.checkpoint_utils.save_checkpoint_async`` (``name``, ``batch``, ``state_path``...).
Here ``batch`` is the number of completed RL steps; steps are numbered from 1, so a resumed run starts at step
``batch + 1``. A state saved during the supervised warm-up also records ``warmup`` (completed warm-up steps).

Crash safety: each metrics line is written whole and flushed with fsync (:func:`append_whole`: a write that fails,
a full disk, is taken back, so no half line stays). A run killed mid-step leaves at most a partial last line, which is dropped on resume; lines for steps after the last saved state are dropped too (those
steps are re-run), so the metrics of a resumed run have every step exactly once.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from sailrl.runtime.errors import writing
from sailrl.spec.files import writable_folder
from sailrl.spec.schema import Spec

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_FILE = "checkpoints.jsonl"
WARMUP_FILE = "warmup.jsonl"
SCRIPT_FILE = "train.py"
#: Longest line the run's JSONL files are read with (a metrics line is a few KiB).
from sailrl.runtime.redact import redact
from sailrl.spec.errors import UserError
MAX_LINE_BYTES = 16 * 2**20


def _read_jsonl_tolerant(path: Path) -> list[dict[str, Any]]:
    """Parse a JSONL file line by line, skipping a truncated or corrupt line (a killed writer, bytes that are not
    UTF-8, JSON nested past the recursion limit, a line longer than :data:`MAX_LINE_BYTES`) instead of failing."""
    if not path.exists():
        return []
    out = []
    with open(path, "rb") as f:
        while raw := f.readline(MAX_LINE_BYTES):
            if len(raw) == MAX_LINE_BYTES and not raw.endswith(b"\n"):  # too long: skip to its end, unread
                while (raw := f.readline(MAX_LINE_BYTES)) and not raw.endswith(b"\n"):
                    pass
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` whole and fsync it, or not at all: a write that fails part-way (a full disk) is
    cut back to where it began before the error, a :class:`~sailrl.runtime.errors.RunWriteError` for a disk
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
    return (p if p.is_absolute() else Path(spec_dir) / p).resolve()


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
        """Remove a previous run's records (config, metrics, checkpoint index, warm-up log, plot)."""
        for name in (CONFIG_FILE, METRICS_FILE, CHECKPOINTS_FILE, WARMUP_FILE, "rollouts.jsonl", "reward.png"):
            (self.path / name).unlink(missing_ok=True)

    def write_config(self, resolved_spec: dict[str, Any], spec_sha256: str, extra: dict[str, Any]) -> None:
        self.ensure()
        config = {"spec_sha256": spec_sha256, "spec": resolved_spec, **extra}
        replace_whole(self.path / CONFIG_FILE, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode("utf-8"))

    def read_config(self) -> dict[str, Any] | None:
        p = self.path / CONFIG_FILE
        if not p.exists():
            return None
        return json.loads(p.read_text(encoding="utf-8"))

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
        if not path.exists():
            return
        kept = [m for m in _read_jsonl_tolerant(path)
                if isinstance(m.get("step"), int) and m["step"] < first_step_to_rerun]
        replace_whole(path, "".join(json.dumps(m, sort_keys=True) + "\n" for m in kept).encode("utf-8"))

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
        append_whole(self.path / name, redact(json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
