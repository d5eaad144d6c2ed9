"""Take a trained model away: ``sailrl export`` and ``sailrl sample`` share this (the top layer: it may use the
runtime, the spec and the installed libraries).

- :mod:`sailrl.export.runinfo`: a run directory's spec, checkpoints and metrics; the checkpoint ``final`` or a step.
- :mod:`sailrl.export.build`: a checkpoint as a PEFT adapter or a merged Hugging Face model (tinker_cookbook's
  ``weights`` for a Tinker run, peft for an embedded-backend run), written to a temporary folder and renamed.
- :mod:`sailrl.export.card`: the model card (``README.md``) and the spec and ``metrics.jsonl`` beside it.
- :mod:`sailrl.export.publish`: the folder pushed to the Hugging Face Hub (tinker_cookbook's ``publish_to_hf_hub``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sailrl.export.build import FORMATS, Built, build_local, build_tinker, write_atomically, write_marker
from sailrl.export.card import write_card
from sailrl.export.runinfo import Checkpoint, ExportError, RunInfo

__all__ = ["FORMATS", "Checkpoint", "ExportError", "Exported", "RunInfo", "default_output", "export_run"]


@dataclass
class Exported:
    """The result: the folder written, the checkpoint it holds, what the build made."""

    folder: Path
    checkpoint: Checkpoint
    built: Built


def default_output(run: RunInfo, ckpt: Checkpoint, fmt: str) -> Path:
    """``RUN_DIR/export/<format>-<final|step-N>``."""
    return run.path / "export" / f"{fmt}-{ckpt.label}"


def export_run(run_dir: str | Path, checkpoint: str | int = "final", fmt: str = "peft",
               output: str | Path | None = None, overwrite: bool = False) -> Exported:
    """Export one checkpoint of the run in ``run_dir`` as ``fmt`` (``peft`` | ``merged``) with its model card.

    Raises :class:`ExportError` (one line) for a folder that is not a run directory, a checkpoint the run does not
    have or that is gone (cleaned, or expired on Tinker), a base model that cannot be loaded, an existing output
    folder without ``overwrite``, or with it one that no earlier export wrote. Nothing is left half-written.
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format takes {' or '.join(FORMATS)}, not {fmt!r}")
    run = RunInfo.read(run_dir)
    ckpt = run.checkpoint(checkpoint)
    target = Path(output) if output is not None else default_output(run, ckpt, fmt)
    target = Path(os.path.abspath(target))  # '..' and '.' folded: the folder is renamed into place by its name
    _refuse_a_folder_that_holds_work(target, run)
    spec = run.spec()
    have = run._have()
    result: dict[str, Built] = {}

    def fill(out: Path) -> None:
        if ckpt.is_local:
            built = build_local(ckpt, fmt, out, target, have)
        else:
            built = build_tinker(ckpt, fmt, out, spec.model.name, have)
        write_card(out, run, ckpt, fmt, built, target.name)
        write_marker(out, ckpt, fmt)
        result["built"] = built

    write_atomically(target, overwrite, fill)
    return Exported(target, ckpt, result["built"])


def _refuse_a_folder_that_holds_work(target: Path, run: RunInfo) -> None:
    """:class:`ExportError` when ``target`` is the run directory, a folder above it, or the current folder or one
    above it: ``--overwrite`` would move that folder aside and delete it with the run (or the user's files)."""
    try:
        str(target).encode("utf-8")
    except UnicodeEncodeError:  # the model card names the folder
        raise ExportError(f"-o {target!r}: the folder's name is not UTF-8 text; give another name") from None
    real = target.resolve()
    if run.path.resolve().is_relative_to(real):
        raise ExportError(f"-o {target} holds the run directory {run.path}: nothing was written; give a new folder "
                          f"(the default is {run.path / 'export'}/...)")
    if Path.cwd().resolve().is_relative_to(real):
        raise ExportError(f"-o {target} is the current folder or holds it: nothing was written; give a new folder")
