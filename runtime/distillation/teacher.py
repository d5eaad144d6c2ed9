"""The teacher of on-policy distillation: a sampling client of ``distill.teacher`` opened next to the policy.

``distill.teacher.name`` is the teacher's base model (a Tinker model name, or a model the embedded backend runs);
``distill.teacher.checkpoint`` a sampler checkpoint of it (``tinker://...``, ``local://...``), or the folder of a
finished run (relative to the spec), whose final adapter is the teacher. The teacher only scores: its
``compute_logprobs_async`` reads the student's sequences (:mod:`sailrl.runtime.distillation.reverse_kl`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from sailrl.runtime.backends.backend import Backend
from sailrl.runtime.loop.opening import CREATE_TIMEOUT_S, call_with_deadline
from sailrl.runtime.rundir.directory import RunDirectory
from sailrl.spec.errors import ConfigError
from sailrl.spec.schema import Spec

__all__ = ["CHECKPOINT_SCHEMES", "open_teacher", "teacher_checkpoint"]

#: A checkpoint written with one of these is a service's path; anything else names a run directory.
CHECKPOINT_SCHEMES = ("tinker://", "local://")


def teacher_checkpoint(checkpoint: str | None, spec_dir: Path) -> str | None:
    """The sampler checkpoint ``distill.teacher.checkpoint`` names: a ``tinker://`` / ``local://`` path as written,
    or a run directory's last sampler checkpoint (its final adapter once the run finished). Raises
    :class:`ConfigError` for a run directory that holds none."""
    if checkpoint is None or checkpoint.startswith(CHECKPOINT_SCHEMES):
        return checkpoint
    folder = Path(checkpoint) if Path(checkpoint).is_absolute() else spec_dir / checkpoint
    if not folder.exists():
        raise ConfigError(f"distill.teacher.checkpoint: there is no folder {folder} (a path without :// names a "
                          "finished run's folder, relative to the spec's folder): run the teacher's spec first, or "
                          "name a tinker:// or local:// sampler checkpoint")
    path = RunDirectory(folder).last_sampler_path() if folder.is_dir() else None
    if path is None:
        raise ConfigError(f"distill.teacher.checkpoint: {folder} holds no run with a saved adapter: run the "
                          "teacher's spec there first, or name a tinker:// or local:// sampler checkpoint")
    return path


async def open_teacher(spec: Spec, backend: Backend, spec_dir: Path, student_tokenizer: Any,
                       console: Console) -> Any:
    """A sampling client of the teacher (its checkpoint, else its base model). On the embedded backend it checks
    that a checkpoint is one of ``distill.teacher.name`` and that the teacher's tokenizer is the student's (the
    validation stage checks the names it knows; this checks the tokenizers loaded). Raises :class:`ConfigError`."""
    assert spec.distill is not None
    t = spec.distill.teacher
    path = teacher_checkpoint(t.checkpoint, spec_dir)
    service = backend.service_client
    kwargs = {"model_path": path} if path else {"base_model": t.name}
    if backend.is_local:
        client = await service.create_sampling_client_async(**kwargs)
    else:
        client = await call_with_deadline(lambda: service.create_sampling_client(**kwargs), CREATE_TIMEOUT_S,
                                          f"open the teacher {path or t.name}")
    base = getattr(client, "get_base_model", None)
    if path and backend.is_local and base is not None and base() != t.name:
        raise ConfigError(f"distill.teacher.checkpoint {path} is an adapter of {base()}, not of "
                          f"distill.teacher.name {t.name}: set distill.teacher.name: {base()}")
    tokenizer = getattr(client, "get_tokenizer", None)
    if tokenizer is not None and not same_tokenizer(tokenizer(), student_tokenizer):
        raise ConfigError(f"distill.teacher.name: the teacher {t.name}'s tokenizer is not the student "
                          f"{spec.model.name}'s; the teacher scores the student's own tokens, so both need one "
                          "tokenizer: pick a teacher of the student's model family")
    console.print(f"teacher: {t.name}" + (f" ({path})" if path else " (its base weights)"))
    return client


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether two tokenizers map the same strings to the same ids (the same object, or equal vocabularies)."""
    if a is b:
        return True
    try:
        return bool(a.get_vocab() == b.get_vocab())
    except AttributeError:
        return len(a) == len(b)
