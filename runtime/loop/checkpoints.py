"""Checkpoints and resume: updates that land whole, saved state, the final adapter, and saving after a stop.

:class:`Checkpoints` is ``run.checkpoints`` in a generated script: ``apply_update`` (an update, once submitted,
lands and its step is logged before a Ctrl-C saves state, so a resumed run never applies it twice),
``save_state`` (weights + optimizer, recorded in ``checkpoints.jsonl`` with ``batch`` = completed steps),
``save_final`` (state + the sampler weights to use, then the summary). ``sailrl.launch`` calls
``save_after_stop`` (Ctrl-C, the budget) and ``save_after_failure`` (a fault), each printing how to resume.

A saved state is always a step boundary: the weights and optimizer after exactly ``batch`` updates, whose records
(``metrics.jsonl``, ``rollouts.jsonl``, ``warmup.jsonl``) are all written. When an update has landed on the
backend but its step's record could not be written (a full disk), or an update failed part-way, the weights are
past the last recorded step and no state is saved: ``--resume`` continues from the last state saved before it,
and drops the records after it.

Seam for resume fixes: what a resumed run continues from is read in :mod:`sailrl.runtime.loop.opening`
(``resume_state``); what it needs written is here.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import tinker
from tinker_cookbook import checkpoint_utils

from sailrl.runtime.loop.errors import phase
from sailrl.runtime.loop.records import Records
from sailrl.runtime.loop.schedule import learning_rate
from sailrl.runtime.loop.warmup import Warmup
from sailrl.runtime.rundir.directory import CHECKPOINTS_FILE, RunDirectory, append_whole, stamped
from sailrl.runtime.rundir.writes import RunWriteError, write_error
from sailrl.spec.schema import Spec

__all__ = ["CheckpointIndex", "Checkpoints", "default_resume_command"]


def default_resume_command() -> str:
    """This script's command line with ``--resume`` (and without ``--resume`` / ``--overwrite``)."""
    args = [a for a in sys.argv[1:] if a not in ("--resume", "--overwrite")]
    return shlex.join(["python", sys.argv[0], *args, "--resume"])


class Checkpoints:
    """Updates, saved state and resume of one run (``run.checkpoints``)."""

    def __init__(self, *, spec: Spec, training_client: Any, run_dir: RunDirectory, records: Records,
                 warmup: Warmup, start_step: int, resume_command: str | None,
                 snapshots: Callable[[int], dict[str, Any] | None] | None = None,
                 draws: Callable[[int], dict[str, Any]] | None = None) -> None:
        self.spec = spec
        self.training_client = training_client
        self.run_dir = run_dir
        self.records = records
        self.warmup = warmup
        self.start_step = start_step
        self._resume_command = resume_command
        self._pending: tuple[int, list[tinker.Datum], asyncio.Future, bool] | None = None
        self._snapshots = snapshots  # the sampler's recent snapshots, recorded with each state (off-policy resume)
        self._draws = draws  # the data order's cursor after a step (dynamic sampling, the difficulty filter)
        # the last RL / warm-up step whose update landed on the backend; above the recorded steps while a step's
        # record is not written yet
        self._landed = start_step - 1
        self._warmup_landed = warmup.completed
        self._broken: int | None = None  # a step whose update failed: the backend's weights are unknown

    def at_step_boundary(self) -> bool:
        """Whether the backend holds the weights after exactly the recorded steps (RL and warm-up): every update
        that landed has its step's record written, and no update failed part-way. Only then is a state saved."""
        return (self._broken is None and self._landed <= self.records.completed
                and self._warmup_landed <= self.warmup.completed)

    def _why_not_saved(self) -> str:
        if self._broken is not None:
            return f"the update of step {self._broken} failed, so the weights may be part-way through it"
        if self._landed > self.records.completed:
            return f"the update of step {self._landed} landed but its record could not be written"
        return f"the update of warm-up step {self._warmup_landed} landed but its record could not be written"

    def _last_saved(self) -> str:
        """Where ``--resume`` continues from: the last state in ``checkpoints.jsonl``."""
        state = self.run_dir.last_state()
        if state is None:
            return "--resume starts again from step 1 (no state was saved before)"
        done, warm = int(state.get("batch", 0)), int(state.get("warmup", 0))
        what = f"{done} steps" if done or not warm else f"{warm} warm-up steps"
        return f"--resume continues from the state saved after {what}"

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
        try:
            if warmup:
                result = await asyncio.shield(task)
            else:
                with phase(step, "train", self.records.timings(step)):
                    result = await asyncio.shield(task)
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise  # the update goes on: settle_pending_update sees it land
        except BaseException:
            self._pending, self._broken = None, step
            raise
        self._pending = None
        self._landed_at(step, warmup)
        return result

    def _landed_at(self, step: int, warmup: bool) -> None:
        if warmup:
            self._warmup_landed = step
        else:
            self._landed = step

    async def settle_pending_update(self) -> None:
        """After an interrupt: let a submitted update land and log its step (see :meth:`apply_update`)."""
        if self._pending is None:
            return
        step, data, task, warmup = self._pending
        self._pending = None
        try:
            results = await task
        except Exception as exc:  # the update failed: its step is not completed, and no state can be saved
            self._broken = step
            self.records.console.print(f"[yellow]the update of {'warm-up ' if warmup else ''}step {step} did not "
                                       f"finish: {exc}[/yellow]")
            return
        self._landed_at(step, warmup)
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
        sampler checkpoints of the last ``max_steps_off_policy`` snapshots, which a resume samples from, and the
        data order's cursor of dynamic sampling / the difficulty filter, which a resume draws from)."""
        self.run_dir.ensure()
        snapshots = self._snapshots(step) if self._snapshots is not None else None
        loop_state = {"batch": step, **({"off_policy_snapshots": snapshots} if snapshots else {}),
                      **self._draws_state(step), **(extra or {})}
        paths = await checkpoint_utils.save_checkpoint_async(
            self.training_client, name or f"{self.spec.name}-state-{step:06d}", str(self.run_dir.path),
            loop_state=loop_state, kind="state", store=CheckpointIndex(self.run_dir))
        return paths["state_path"]

    def _draws_state(self, completed: int) -> dict[str, Any]:
        """``{"row_draws": ...}``: the data order's cursor after ``completed`` steps, for a run with dynamic sampling
        or the difficulty filter (a run that goes on past its final state draws from it too); else nothing."""
        return {} if self._draws is None else {"row_draws": self._draws(completed)}

    async def save_final(self) -> str:
        """Save the final state and sampler weights (the adapter to use), then print the summary."""
        self.run_dir.ensure()
        paths = await checkpoint_utils.save_checkpoint_async(
            self.training_client, f"{self.spec.name}-final", str(self.run_dir.path),
            loop_state={"batch": self.records.completed, "final": True,
                        **self._draws_state(self.records.completed)}, kind="both",
            store=CheckpointIndex(self.run_dir))
        self.records.console.result(self.records.summary(paths["state_path"]))
        return paths["state_path"]

    async def save_after_stop(self, reason: str) -> str | None:
        """Save resumable state after Ctrl-C or the budget (``reason`` names the checkpoint); print how to resume.
        When the backend is not at a step boundary (:meth:`at_step_boundary`), or the disk is full, nothing is
        saved and it says where ``--resume`` continues from."""
        try:
            await self.settle_pending_update()
            if not self.at_step_boundary():
                self.records.console.print(f"[yellow]{reason}: state not saved: {self._why_not_saved()}; "
                                           f"{self._last_saved()}:\n    {self.resume_command()}[/yellow]")
                return None
            return await self._save_after_stop(reason)
        except Exception as exc:
            disk = write_error(exc)
            if disk is None:
                raise
            self.records.console.print(f"error: {disk}; state not saved: {self._last_saved()}")
            return None

    async def _save_after_stop(self, reason: str) -> str | None:
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
        if not self.at_step_boundary():
            self.records.console.print(f"state not saved: {self._why_not_saved()}; {self._last_saved()}")
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

    def after_write_failure(self, exc: RunWriteError) -> str:
        """The line for a run stopped by a disk failure: the error, and where ``--resume`` continues from (the
        last state saved: nothing is saved on a disk that just failed a write)."""
        return f"{exc} ({self._last_saved()})"


class CheckpointIndex:
    """``checkpoints.jsonl`` for tinker_cookbook's ``save_checkpoint_async`` (its ``store``): each record appended
    whole or not at all (:func:`~sailrl.runtime.rundir.directory.append_whole`), so a full disk leaves no torn record for
    the next one to join."""

    def __init__(self, run_dir: RunDirectory) -> None:
        self.run_dir = run_dir

    def write_checkpoint(self, record: dict[str, Any]) -> None:
        line = json.dumps(stamped(CHECKPOINTS_FILE, record)) + "\n"
        append_whole(self.run_dir.path / CHECKPOINTS_FILE, line.encode("utf-8"))
