"""Checkpoints and resume: updates that land whole, saved state, the final adapter, and saving after a stop.

:class:`Checkpoints` is ``run.checkpoints`` in a generated script: ``apply_update`` (an update, once submitted,
lands and its step is logged before a Ctrl-C saves state, so a resumed run never applies it twice),
``save_state`` (weights + optimizer, recorded in ``checkpoints.jsonl`` with ``batch`` = completed steps),
``save_final`` (state + the sampler weights to use, then the summary). ``sailrl.launch`` calls
``save_after_stop`` (Ctrl-C, the budget) and ``save_after_failure`` (a fault), each printing how to resume.

Seam for resume fixes: what a resumed run continues from is read in :mod:`sailrl.runtime.opening`
(``resume_state``); what it needs written is here.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import tinker
from tinker_cookbook import checkpoint_utils

from sailrl.runtime.errors import phase
from sailrl.runtime.records import Records
from sailrl.runtime.rl import learning_rate
from sailrl.runtime.rundir import RunDirectory
from sailrl.runtime.warmup import Warmup
from sailrl.spec.schema import Spec

__all__ = ["Checkpoints", "default_resume_command"]


def default_resume_command() -> str:
    """This script's command line with ``--resume`` (and without ``--resume`` / ``--overwrite``)."""
    args = [a for a in sys.argv[1:] if a not in ("--resume", "--overwrite")]
    return shlex.join(["python", sys.argv[0], *args, "--resume"])


class Checkpoints:
    """Updates, saved state and resume of one run (``run.checkpoints``)."""

    def __init__(self, *, spec: Spec, training_client: Any, run_dir: RunDirectory, records: Records,
                 warmup: Warmup, start_step: int, resume_command: str | None,
                 snapshots: Callable[[int], dict[str, Any] | None] | None = None) -> None:
        self.spec = spec
        self.training_client = training_client
        self.run_dir = run_dir
        self.records = records
        self.warmup = warmup
        self.start_step = start_step
        self._resume_command = resume_command
        self._pending: tuple[int, list[tinker.Datum], asyncio.Future, bool] | None = None
        self._snapshots = snapshots  # the sampler's recent snapshots, recorded with each state (off-policy resume)

    # ------------------------------------------------------------------ updates
    async def apply_update(self, step: int, data: list[tinker.Datum], update: Awaitable[Any], *,
                           warmup: bool = False) -> Any:
        """Await ``update`` (forward_backward + optim_step calls) as the ``train`` phase and return its result.

        Once submitted, an update lands on the backend even if the run is interrupted: the await is shielded, and
        the Ctrl-C handler waits for it and logs the step (``warmup``: warm-up step ``step``) before saving state,
        so a resumed run never applies it twice.
        """
        task = asyncio.ensure_future(update)
        self._pending = (step, data, task, warmup)
        if warmup:
            result = await asyncio.shield(task)
        else:
            with phase(step, "train", self.records.timings(step)):
                result = await asyncio.shield(task)
        self._pending = None
        return result

    async def settle_pending_update(self) -> None:
        """After an interrupt: let a submitted update land and log its step (see :meth:`apply_update`)."""
        if self._pending is None:
            return
        step, data, task, warmup = self._pending
        self._pending = None
        try:
            results = await task
        except Exception as exc:  # the update failed: its step is simply not completed
            self.records.console.print(f"[yellow]the update of {'warm-up ' if warmup else ''}step {step} did not "
                                       f"finish: {exc}[/yellow]")
            return
        if warmup:
            self.warmup.record(step, data, results)
            return
        t = self.spec.training
        lr = learning_rate(t.learning_rate, step, t.steps, t.lr_schedule, t.lr_warmup_steps)
        self.records.update(step, data, results, lr)
        self.records.end_step(step)

    # ------------------------------------------------------------------ saving
    async def save_state(self, step: int, *, name: str | None = None, extra: dict[str, Any] | None = None) -> str:
        """``save_state`` (weights + optimizer) after ``step`` steps, recorded in checkpoints.jsonl (with the
        sampler checkpoints of the last ``max_steps_off_policy`` snapshots, which a resume samples from)."""
        self.run_dir.ensure()
        snapshots = self._snapshots(step) if self._snapshots is not None else None
        loop_state = {"batch": step, **({"off_policy_snapshots": snapshots} if snapshots else {}), **(extra or {})}
        paths = await checkpoint_utils.save_checkpoint_async(
            self.training_client, name or f"{self.spec.name}-state-{step:06d}", str(self.run_dir.path),
            loop_state=loop_state, kind="state")
        return paths["state_path"]

    async def save_final(self) -> str:
        """Save the final state and sampler weights (the adapter to use), then print the summary."""
        self.run_dir.ensure()
        paths = await checkpoint_utils.save_checkpoint_async(
            self.training_client, f"{self.spec.name}-final", str(self.run_dir.path),
            loop_state={"batch": self.records.completed, "final": True}, kind="both")
        self.records.console.result(self.records.summary(paths["state_path"]))
        return paths["state_path"]

    async def save_after_stop(self, reason: str) -> str | None:
        """Save resumable state after Ctrl-C or the budget (``reason`` names the checkpoint); print how to resume."""
        await self.settle_pending_update()
        completed, warm = self.records.completed, self.warmup.completed
        extra = {"warmup": warm} if completed == 0 and warm else {}
        path = await self.save_state(completed, name=f"{self.spec.name}-{reason}-{completed:06d}", extra=extra)
        what = f"{completed} steps" if completed or not warm else f"{warm} warm-up steps"
        self.records.console.print(f"{reason} after {what}; state saved. Resume with:\n    {self.resume_command()}")
        return path

    async def save_after_failure(self, exc: BaseException) -> None:
        """Best effort after a fault: save what the completed steps trained, so ``--resume`` can continue."""
        completed = self.records.completed
        if completed < self.start_step:
            return
        try:
            await self.save_state(completed, name=f"{self.spec.name}-failed-{completed:06d}")
            self.records.console.print(f"state after {completed} steps saved; fix the cause, then resume with:\n"
                                       f"    {self.resume_command()}")
        except Exception as save_exc:  # the backend may be the thing that failed
            self.records.console.print(f"[yellow]could not save state after the failure: {save_exc}[/yellow]")

    def resume_command(self) -> str:
        """What to run to continue this run (``RunOptions.resume_command``, else this script's argv)."""
        return self._resume_command or default_resume_command()
