"""``training.init_from`` as a run directory: the final saved state of an earlier run, of any method.

``init_from`` takes a checkpoint path (``tinker://.../weights/...`` or ``local://.../weights/...``, used as given)
or a run directory: a path without ``://``, relative to the spec's folder like every path in a spec
(``init_from: runs/sums-sft``). A run directory stands for that run's final saved state, the ``state_path`` of
its ``checkpoints.jsonl`` record marked ``final``, read through :mod:`sailrl.runtime.rundir.directory`'s bounded
reader. It must hold a finished run (its last saved state is the final one: a run stopped part-way, or resumed with
more steps and not yet done, is not finished; S261) of the same model and LoRA rank, on the same backend (the
embedded one's ``local://`` states load only there, Tinker's ``tinker://`` ones only on Tinker; S262).

``sailrl run`` checks this with the spec's other problems, at the key's line, before anything runs; a run
directory that an earlier stage of the same ``sailrl run`` writes is checked against that stage's spec instead.
:func:`sailrl.runtime.loop.opening.open_training_client` resolves it again when the run opens (a generated script
run on its own), before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sailrl.runtime.rundir.directory import RunDirectory, RunFileError, resolved
from sailrl.spec.errors import ConfigError

__all__ = ["InitFromError", "InitWeights", "finished_state", "init_run_dir", "is_run_directory", "mismatch",
           "resolve_init_from"]


class InitFromError(ConfigError):
    """``training.init_from`` names a run directory that cannot start this run. ``problem``: its spec problem
    code (S261 not a finished run, S262 another model, LoRA rank or backend); ``hint``: what to do."""

    code = "E108"

    def __init__(self, problem: str, message: str, hint: str) -> None:
        super().__init__(f"training.init_from: {message}; {hint[0].lower()}{hint[1:]} [{problem}]")
        self.problem, self.message, self.hint = problem, message, hint


@dataclass(frozen=True)
class InitWeights:
    """The weights a run starts from: ``state_path`` (what ``load_state`` is given) and, for a run directory,
    ``run_dir`` (resolved)."""

    state_path: str
    run_dir: Path | None = None

    def record(self) -> dict[str, Any]:
        """What ``config.json`` records of it (``init_from``)."""
        return {"state_path": self.state_path, "run_dir": str(self.run_dir) if self.run_dir else None}


def is_run_directory(value: str) -> bool:
    """Whether an ``init_from`` value names a run directory (no ``scheme://``), not a checkpoint path."""
    return "://" not in value


def init_run_dir(value: str, spec_dir: Path | str | None) -> Path:
    """The run directory an ``init_from`` value names, resolved (``~`` expanded; relative to the spec's folder)."""
    p = Path(value).expanduser()
    return resolved(p if p.is_absolute() else Path(spec_dir or ".") / p)


def _shown(path: Path, spec_dir: Path | str | None) -> str:
    """``path`` relative to the spec's folder when it lies below it (as the spec writes it), else in full."""
    try:
        return path.relative_to(Path(spec_dir or ".").resolve()).as_posix()
    except ValueError:
        return str(path)


def finished_state(run_dir: RunDirectory) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(config, final record)`` of ``run_dir``: its ``config.json`` (None when it has none) and its last saved
    state when that is the final one (None otherwise). Raises :class:`RunFileError` for a file that is not a run's
    (a FIFO, an oversized file) and ``ValueError`` for a ``config.json`` that is not JSON."""
    config = run_dir.read_config()
    if not isinstance(config, dict):
        return None, None
    last = run_dir.last_state()
    return config, (last if last is not None and last.get("final") else None)


def mismatch(where: str, *, model: Any, lora_rank: Any, source_local: bool | None, spec_model: str, spec_rank: int,
             spec_local: bool, state_path: str | None = None) -> InitFromError | None:
    """S262 when the weights of ``where`` (a run of ``model`` with LoRA ``lora_rank`` on the embedded backend
    (``source_local``) or Tinker; its state at ``state_path`` when saved) cannot load into this spec's model, LoRA
    rank or backend. None for a value not known."""
    if model is not None and model != spec_model:
        return InitFromError("S262", f"the weights of {where} are for model {model!r}, and this spec trains "
                             f"{spec_model!r}: a LoRA adapter loads only into the model it was trained on",
                             f"Set model.name: {model} here, or start from a run of {spec_model}.")
    if lora_rank is not None and lora_rank != spec_rank:
        return InitFromError("S262", f"the weights of {where} are a LoRA of rank {lora_rank}, and this spec's "
                             f"model.lora_rank is {spec_rank}: an adapter's shape is the rank it was trained with",
                             f"Set model.lora_rank: {lora_rank} here.")
    if source_local is not None and source_local != spec_local:
        there, here = ("the embedded backend", "Tinker") if not spec_local else ("Tinker", "the embedded backend")
        saved = f" ({state_path})" if state_path else ""
        return InitFromError("S262", f"the weights of {where} are saved on {there}{saved}, and this spec trains on "
                             f"{here}: a state loads only where it was saved",
                             "Train both stages on the same backend (sampling.sampler: local for the embedded one).")
    return None


def resolve_init_from(value: str, spec_dir: Path | str | None, *, model: str, lora_rank: int,
                      local: bool) -> InitWeights:
    """The weights ``init_from: value`` names, for a spec of ``model`` / ``lora_rank`` on the embedded backend
    (``local``) or not: a checkpoint path as given; a run directory's final saved state, checked. Raises
    :class:`InitFromError` (S261, S262)."""
    if not is_run_directory(value):
        return InitWeights(value)
    path = init_run_dir(value, spec_dir)
    where = _shown(path, spec_dir)
    use_a_path = ("or give a checkpoint path (tinker://.../weights/... or local://.../weights/...) instead")
    if path.is_symlink() and not path.exists():
        raise InitFromError("S261", f"{where} is a symbolic link that leads to no folder (a loop of links, or its "
                            "target is gone)", f"Point it at the folder an earlier run wrote, {use_a_path}.")
    if not path.exists():
        raise InitFromError("S261", f"there is no run directory {where} (a path without :// names an earlier run's "
                            "folder, relative to the spec's folder)",
                            "Run the spec that writes it first (`sailrl run first.yaml this.yaml` runs specs as "
                            f"stages, in order), {use_a_path}.")
    if not path.is_dir():
        raise InitFromError("S261", f"{where} is a file, not a run directory",
                            f"Name the folder an earlier run wrote (its output.run_dir), {use_a_path}.")
    try:
        config, final = finished_state(RunDirectory(path))
    except RunFileError as exc:
        raise InitFromError("S261", f"{where} cannot be read as a run directory ({exc})",
                            "Name the folder an earlier run wrote (its output.run_dir).") from None
    except ValueError as exc:
        raise InitFromError("S261", f"{where}/config.json is not a run's config ({exc})",
                            "Name the folder an earlier run wrote (its output.run_dir).") from None
    if config is None:
        raise InitFromError("S261", f"{where} holds no run (it has no config.json)",
                            f"Name the folder an earlier run wrote (its output.run_dir), {use_a_path}.")
    spec = config.get("spec") if isinstance(config.get("spec"), dict) else {}
    if final is None or not isinstance(final.get("state_path"), str):
        again = config.get("spec_path")
        finish = f"`sailrl run {again} --resume`" if isinstance(again, str) else "its run with --resume"
        raise InitFromError("S261", f"the run in {where} has not finished: it has saved no final state",
                            f"Finish it first ({finish}), or name a finished run.")
    m = spec.get("model") if isinstance(spec.get("model"), dict) else {}
    state = final["state_path"]
    problem = mismatch(f"the run in {where}", model=m.get("name"), lora_rank=m.get("lora_rank"),
                       source_local=state.startswith("local://"), state_path=state, spec_model=model,
                       spec_rank=lora_rank, spec_local=local)
    if problem is not None:
        raise problem
    return InitWeights(state, path)
