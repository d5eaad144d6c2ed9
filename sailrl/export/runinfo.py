"""What a finished (or stopped) run directory says about itself: its spec, its checkpoints, its metrics.

A run directory holds ``config.json`` (the resolved spec, its sha256, the spec file's path, the sailrl version),
``checkpoints.jsonl`` (one record per saved checkpoint: ``name``, ``batch`` = completed steps, ``state_path``,
``sampler_path`` for the final one, ``final``) and ``metrics.jsonl`` (``sailrl.runtime.rundir.directory``). A checkpoint is
chosen by ``final`` (the last final record) or by step number (the record whose ``batch`` is that step); its
sampler weights are preferred over its training state (``weights/``), which holds the same adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sailrl.runtime.rundir.directory import CHECKPOINTS_FILE, CONFIG_FILE, RunDirectory, _read_jsonl_tolerant
from sailrl.spec.errors import UserError
from sailrl.spec.schema import Spec


class ExportError(UserError):
    """A run directory, checkpoint, base model or output folder that cannot be used (one line, exit 1)."""

    code = "E200"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a run: ``path`` (``local://`` or ``tinker://``), ``step`` (completed steps), ``final``."""

    path: str
    step: int
    final: bool
    name: str

    @property
    def label(self) -> str:
        """``final`` or ``step-N``: names the default output folder."""
        return "final" if self.final else f"step-{self.step}"

    @property
    def is_local(self) -> bool:
        return self.path.startswith("local://")


@dataclass
class RunInfo:
    """A run directory's records. ``config``: ``config.json``; ``records``: ``checkpoints.jsonl``; ``metrics``:
    ``metrics.jsonl`` (one dict per step)."""

    path: Path
    config: dict[str, Any]
    records: list[dict[str, Any]]
    metrics: list[dict[str, Any]]

    @classmethod
    def read(cls, path: str | Path) -> RunInfo:
        """Read ``path``; :class:`ExportError` when it is not a run directory (no ``config.json``), a
        ``RunFileError`` when one of its files is not a regular file or is over its size limit
        (:func:`sailrl.runtime.rundir.directory.open_run_file`)."""
        p = Path(path)
        if not p.is_dir():
            raise ExportError(f"{path} is not a run directory (no such folder): give the folder a run wrote, "
                              "e.g. runs/quickstart next to the spec (output.run_dir)")
        rd = RunDirectory(p)
        try:
            config = rd.read_config()  # a FIFO, a device or an oversized file: RunFileError, one line
        except (OSError, ValueError) as exc:
            raise ExportError(f"{p / CONFIG_FILE} cannot be read ({exc}): the run directory is damaged") from None
        if config is None:
            raise ExportError(f"{path} is not a run directory (it has no {CONFIG_FILE}): give the folder a run "
                              "wrote, e.g. runs/quickstart next to the spec (output.run_dir)")
        if not isinstance(config, dict) or not isinstance(config.get("spec"), dict):
            raise ExportError(f"{p / CONFIG_FILE} holds no resolved spec: the run directory is damaged")
        return cls(p, config, _read_jsonl_tolerant(p / CHECKPOINTS_FILE), rd.read_metrics())

    # ---------------------------------------------------------------- the spec
    def spec(self) -> Spec:
        """The spec the run trained with (its resolved values, overrides included); :class:`ExportError` when this
        sailrl cannot read it (``config.json`` edited, or written by another version)."""
        try:
            return Spec.model_validate(self.config["spec"])
        except ValidationError as exc:
            errors = exc.errors()
            first = errors[0] if errors else {"loc": (), "msg": str(exc)}
            where = ".".join(str(part) for part in first.get("loc", ())) or "spec"
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise ExportError(f"{self.path / CONFIG_FILE} holds a spec this sailrl cannot read ({where}: "
                              f"{first.get('msg')}{more}): it was edited, or written by another sailrl version; "
                              f"install that version, or put back the file the run wrote") from None

    @property
    def spec_sha256(self) -> str:
        return str(self.config.get("spec_sha256") or "")

    @property
    def spec_path(self) -> Path | None:
        """The spec file the run read, when it still exists."""
        raw = self.config.get("spec_path")
        if not raw:
            return None
        p = Path(raw)
        return p if p.is_file() else None

    @property
    def spec_dir(self) -> Path:
        """The folder relative spec paths (data, python rules, a local model) are read from."""
        raw = self.config.get("spec_path")
        return Path(raw).parent if raw else self.path

    # ---------------------------------------------------------------- checkpoints
    def checkpoints(self) -> list[Checkpoint]:
        """Every checkpoint recorded, in the order saved (the last record per step wins)."""
        out: dict[int, Checkpoint] = {}
        for r in self.records:
            path = r.get("sampler_path") or r.get("state_path")
            step = r.get("batch")
            if not isinstance(path, str) or not isinstance(step, int):
                continue
            out[step] = Checkpoint(path, step, bool(r.get("final")), str(r.get("name") or ""))
        return [out[k] for k in sorted(out)]

    def _have(self) -> str:
        found = self.checkpoints()
        if not found:
            return "it has no checkpoint yet (a run saves one every training.save_every steps and at the end)"
        shown = ", ".join(f"{c.step}{' (final)' if c.final else ''}" for c in found)
        return f"it has checkpoints at step {shown}: pass --checkpoint STEP"

    def checkpoint(self, which: str | int = "final") -> Checkpoint:
        """The checkpoint ``which`` (``"final"`` or a step number); :class:`ExportError` naming the ones it has."""
        found = self.checkpoints()
        if which == "final":
            finals = [c for c in found if c.final]
            if not finals:
                raise ExportError(f"the run in {self.path} has no final checkpoint (it did not finish); {self._have()}")
            return finals[-1]
        try:
            step = int(which)
        except (TypeError, ValueError):
            raise ExportError(f"--checkpoint takes 'final' or a step number, not {which!r}") from None
        for c in found:
            if c.step == step:
                return c
        raise ExportError(f"the run in {self.path} has no checkpoint at step {step}; {self._have()}")
