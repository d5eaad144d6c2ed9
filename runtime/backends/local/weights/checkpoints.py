"""Checkpoint paths and files of the embedded backend.

Paths mirror Tinker's ``tinker://<run>/sampler_weights/<name>`` and ``tinker://<run>/weights/<name>``
as ``local://<run>/sampler_weights/<name>`` (sampling only, from ``save_weights_for_sampler``) and
``local://<run>/weights/<name>`` (``save_state``: adapter + optimizer state, for resuming). Each maps
to the directory ``<base_dir>/<run>/<kind>/<name>/`` holding:

- ``adapter_config.json`` + ``adapter_model.safetensors``: a PEFT LoRA adapter that
  ``peft.PeftModel.from_pretrained(base, dir)`` loads onto the base model;
- ``base_model.json``: the base model's name, seed and config (``sailrl/tiny`` is rebuilt from it);
- ``checkpoint.json``: kind, creation time, TTL / expiry, user metadata;
- ``optimizer.pt`` + ``training_state.json`` (``weights/`` only): AdamW state and step count.

Each training client is a training run: ``<base_dir>/<run>/training_run.json`` records its base model, LoRA rank,
user metadata and creation time (``write_run``), which the rest client's ``get_training_run`` and
``list_training_runs`` read. The two kinds are not interchangeable, as on Tinker: a sampler takes only
``sampler_weights/`` paths and ``load_state`` / ``create_training_client_from_state`` only ``weights/`` ones
(``require_kind``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import tarfile
from dataclasses import dataclass
from typing import Any, Literal

from tinker import types

from sailrl.spec.errors import ModelError

SCHEME = "local://"
Kind = Literal["sampler_weights", "weights"]
KINDS: tuple[str, ...] = ("sampler_weights", "weights")
META_FILE = "checkpoint.json"
RUN_FILE = "training_run.json"
OPTIMIZER_FILE = "optimizer.pt"
TRAINING_STATE_FILE = "training_state.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class CheckpointPathError(ModelError):
    """A checkpoint path that is not ``local://<run>/<kind>/<name>`` or names no saved checkpoint (a
    ``ValueError``)."""

    code = "E155"


@dataclass(frozen=True)
class LocalPath:
    """A parsed ``local://<run>/<kind>/<name>`` checkpoint path."""

    run_id: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.run_id}/{self.kind}/{self.name}"

    @classmethod
    def parse(cls, path: str) -> LocalPath:
        """Parse ``path``; raises ``CheckpointPathError`` with the expected shape."""
        if not path.startswith(SCHEME):
            hint = " (a tinker:// path belongs to the Tinker service, not the embedded backend)"
            raise CheckpointPathError(
                f"{path!r} is not an embedded-backend checkpoint path; expected "
                f"local://<run>/sampler_weights/<name> or local://<run>/weights/<name>"
                f"{hint if path.startswith('tinker://') else ''}."
            )
        parts = path[len(SCHEME) :].split("/")
        if len(parts) != 3 or parts[1] not in KINDS or not all(_NAME.match(p) for p in (parts[0], parts[2])):
            raise CheckpointPathError(
                f"{path!r} is not a valid checkpoint path; expected "
                "local://<run>/sampler_weights/<name> or local://<run>/weights/<name>."
            )
        return cls(parts[0], parts[1], parts[2])


_KIND_WORDS = {
    "weights": "a training-state checkpoint (weights/, written by save_state)",
    "sampler_weights": "a sampler checkpoint (sampler_weights/, written by save_weights_for_sampler)",
}


def require_kind(path: str, kind: str, what: str) -> None:
    """Raise ``CheckpointPathError`` unless ``path`` (a ``local://`` path; anything else is left to the caller) is
    of ``kind``: a sampler reads only ``sampler_weights/`` checkpoints and training starts only from ``weights/``
    ones. ``what`` names the call, for the message."""
    if not path.startswith(SCHEME):
        return
    lp = LocalPath.parse(path)
    if lp.kind != kind:
        raise CheckpointPathError(
            f"{what} needs {_KIND_WORDS[kind]}, but {path} is {_KIND_WORDS[lp.kind]}; pass "
            f"local://{lp.run_id}/{kind}/<name> instead.")


def check_name(name: str) -> None:
    """Raise ``ValueError`` unless ``name`` is a plain checkpoint name (letters, digits, ``._-``)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"Checkpoint name {name!r} is not allowed: use letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (for example 'step-000010')."
        )


class CheckpointStore:
    """Maps ``local://`` paths to directories under ``base_dir`` and keeps their metadata."""

    def __init__(self, base_dir: str):
        self.base_dir = os.path.abspath(base_dir)

    def directory(self, path: LocalPath | str) -> str:
        lp = LocalPath.parse(path) if isinstance(path, str) else path
        return os.path.join(self.base_dir, lp.run_id, lp.kind, lp.name)

    def existing(self, path: str) -> str:
        """The directory of a saved checkpoint; raises ``CheckpointPathError`` if absent."""
        directory = self.directory(path)
        if not os.path.isfile(os.path.join(directory, "adapter_config.json")):
            raise CheckpointPathError(
                f"No checkpoint at {path} (looked in {directory}). Check the path, or that the "
                "run saved it under this base directory."
            )
        return directory

    def prepare(self, path: LocalPath, overwrite: bool) -> str:
        """Create an empty directory for ``path``; raises ``ValueError`` if it exists and not overwrite."""
        directory = self.directory(path)
        if os.path.exists(directory):
            if not overwrite:
                raise ValueError(
                    f"A checkpoint named {path.name!r} already exists at {path}; pick a new name."
                )
            shutil.rmtree(directory)
        os.makedirs(directory)
        return directory

    def write_meta(
        self,
        path: LocalPath,
        ttl_seconds: int | None,
        user_metadata: dict[str, str] | None,
    ) -> None:
        now = _dt.datetime.now(_dt.UTC)
        meta = {
            "tinker_path": str(path),
            "checkpoint_type": "training" if path.kind == "weights" else "sampler",
            "time": now.isoformat(),
            "ttl_seconds": ttl_seconds,
            "expires_at": None
            if ttl_seconds is None
            else (now + _dt.timedelta(seconds=ttl_seconds)).isoformat(),
            "user_metadata": user_metadata,
        }
        with open(os.path.join(self.directory(path), META_FILE), "w") as f:
            json.dump(meta, f, indent=2)

    def read_meta(self, path: str) -> dict[str, Any]:
        with open(os.path.join(self.existing(path), META_FILE)) as f:
            return json.load(f)

    def set_ttl(self, path: str, ttl_seconds: int | None) -> None:
        """Record a TTL (seconds from now) or clear it (``None``). Nothing is deleted automatically."""
        meta = self.read_meta(path)
        now = _dt.datetime.now(_dt.UTC)
        meta["ttl_seconds"] = ttl_seconds
        meta["expires_at"] = (
            None if ttl_seconds is None else (now + _dt.timedelta(seconds=ttl_seconds)).isoformat()
        )
        with open(os.path.join(self.existing(path), META_FILE), "w") as f:
            json.dump(meta, f, indent=2)

    def archive(self, path: str) -> str:
        """Write ``<dir>.tar`` holding the checkpoint's files (rewritten each call); return its path."""
        directory = self.existing(path)
        target = directory.rstrip(os.sep) + ".tar"
        with tarfile.open(target, "w") as tar:
            for name in sorted(os.listdir(directory)):
                tar.add(os.path.join(directory, name), arcname=name)
        return target

    def delete(self, path: str) -> None:
        directory = self.existing(path)
        shutil.rmtree(directory)
        if os.path.exists(directory + ".tar"):
            os.remove(directory + ".tar")

    def run_file(self, run_id: str) -> str:
        if not _NAME.match(run_id):
            raise CheckpointPathError(f"{run_id!r} is not a training run id of the embedded backend.")
        return os.path.join(self.base_dir, run_id, RUN_FILE)

    def write_run(self, run_id: str, record: dict[str, Any]) -> None:
        """Record a new training run (``record``: JSON-able fields of ``tinker.types.TrainingRun``)."""
        os.makedirs(os.path.join(self.base_dir, run_id), exist_ok=True)
        with open(self.run_file(run_id), "w") as f:
            json.dump(record, f, indent=2)

    def read_run(self, run_id: str) -> dict[str, Any] | None:
        """The run's record, or ``None`` when it has none (a run saved before runs were recorded)."""
        path = self.run_file(run_id)
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            return json.load(f)

    def run_ids(self) -> list[str]:
        """Every run under ``base_dir`` that has a record or a checkpoint."""
        if not os.path.isdir(self.base_dir):
            return []
        return sorted(
            name for name in os.listdir(self.base_dir)
            if _NAME.match(name) and (os.path.isfile(os.path.join(self.base_dir, name, RUN_FILE))
                                      or any(os.path.isdir(os.path.join(self.base_dir, name, k)) for k in KINDS)))

    def list_run(self, run_id: str) -> list[types.Checkpoint]:
        """The run's checkpoints, oldest first."""
        out: list[types.Checkpoint] = []
        for kind in KINDS:
            kind_dir = os.path.join(self.base_dir, run_id, kind)
            if not os.path.isdir(kind_dir):
                continue
            for name in os.listdir(kind_dir):
                path = str(LocalPath(run_id, kind, name))
                if not os.path.isdir(os.path.join(kind_dir, name)):
                    continue
                meta = self.read_meta(path)
                size = sum(
                    os.path.getsize(os.path.join(kind_dir, name, f))
                    for f in os.listdir(os.path.join(kind_dir, name))
                )
                out.append(
                    types.Checkpoint(
                        checkpoint_id=f"{kind}/{name}",
                        checkpoint_type=meta["checkpoint_type"],
                        time=_dt.datetime.fromisoformat(meta["time"]),
                        tinker_path=path,
                        size_bytes=size,
                        user_metadata=meta.get("user_metadata"),
                        expires_at=_dt.datetime.fromisoformat(meta["expires_at"])
                        if meta.get("expires_at")
                        else None,
                    )
                )
        return sorted(out, key=lambda c: c.time)
