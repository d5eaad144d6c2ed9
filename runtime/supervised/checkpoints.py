"""Updates, saved state and resume of a run that trains on fixed data (``run.checkpoints``; SFT, and DPO on it).

As the RL loop's (:mod:`sailrl.runtime.loop.checkpoints`): an update once submitted lands and its step is recorded
before a Ctrl-C saves state (the await is shielded), so a resumed run never applies it twice; a state is saved only
at a step boundary (every update that landed has its line written); ``checkpoints.jsonl`` records each save through
the same :class:`~sailrl.runtime.loop.checkpoints.CheckpointIndex` (``batch``: completed steps; the final save has
sampler weights too), so ``sailrl export`` / ``sample``, ``--resume`` and a later stage's ``training.init_from``
read it as they read an RL run's. ``sailrl.launch`` calls :meth:`save_after_stop` and :meth:`save_after_failure`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from tinker_cookbook import checkpoint_utils

from sailrl.runtime.loop.checkpoints import CheckpointIndex, default_resume_command
from sailrl.runtime.rundir.directory import RunDirectory
from sailrl.runtime.rundir.writes import RunWriteError, write_error
from sailrl.runtime.supervised.records import StepRecords
from sailrl.spec.schema import Spec

__all__ = ["SupervisedCheckpoints"]


class SupervisedCheckpoints:
    """``run.checkpoints``: :meth:`apply_update`, :meth:`save_state`, :meth:`save_final` and the saves after a stop.
    ``records``: an object with ``completed``, ``train(step, data, output, lr)``, ``end_step(step)``, ``console``
    and ``summary(state_path)`` (:class:`~sailrl.runtime.supervised.records.StepRecords`)."""

    def __init__(self, *, spec: Spec, training_client: Any, run_dir: RunDirectory, records: StepRecords,
                 start_step: int, resume_command: str | None) -> None:
        self.spec = spec
        self.training_client = training_client
        self.run_dir = run_dir
        self.records = records
        self.start_step = start_step
        self._resume_command = resume_command
        self._pending: tuple[int, list[Any], float, asyncio.Future] | None = None
        self._landed = start_step - 1  # the last step whose update landed on the backend
        self._broken: int | None = None  # a step whose update failed: the backend's weights are unknown

    async def apply_update(self, step: int, data: list[Any], lr: float, update: Awaitable[Any]) -> Any:
        """Await ``update`` (forward_backward + optim_step of step ``step`` on ``data`` at ``lr``) and return its
        forward_backward output. Shielded: after a Ctrl-C it still lands, and :meth:`save_after_stop` records its
        step (``records.train``) before saving."""
        task = asyncio.ensure_future(update)
        self._pending = (step, data, lr, task)
        try:
            output = await asyncio.shield(task)
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise
        except BaseException:
            self._pending, self._broken = None, step
            raise
        self._pending, self._landed = None, step
        return output

    def at_step_boundary(self) -> bool:
        """Whether the backend holds the weights after exactly the recorded steps (only then is a state saved)."""
        return self._broken is None and self._landed <= self.records.completed

    async def settle_pending_update(self) -> None:
        """After an interrupt: let a submitted update land and record its step."""
        if self._pending is None:
            return
        step, data, lr, task = self._pending
        self._pending = None
        try:
            output = await task
        except Exception as exc:
            self._broken = step
            self.records.console.print(f"[yellow]the update of step {step} did not finish: {exc}[/yellow]")
            return
        self._landed = step
        self.records.train(step, data, output, lr)
        self.records.end_step(step)

    async def save_state(self, step: int, *, name: str | None = None) -> str:
        """``save_state`` (weights + optimizer) after ``step`` steps, recorded in ``checkpoints.jsonl``."""
        self.run_dir.ensure()
        paths = await checkpoint_utils.save_checkpoint_async(
            self.training_client, name or f"{self.spec.name}-state-{step:06d}", str(self.run_dir.path),
            loop_state={"batch": step}, kind="state", store=CheckpointIndex(self.run_dir))
        return paths["state_path"]

    async def save_final(self) -> str:
        """The final state and sampler weights (the adapter ``sailrl export`` / ``sample`` use), then the summary."""
        self.run_dir.ensure()
        paths = await checkpoint_utils.save_checkpoint_async(
            self.training_client, f"{self.spec.name}-final", str(self.run_dir.path),
            loop_state={"batch": self.records.completed, "final": True}, kind="both",
            store=CheckpointIndex(self.run_dir))
        self.records.console.result(self.records.summary(paths["state_path"]))
        return paths["state_path"]

    def _last_saved(self) -> str:
        state = self.run_dir.last_state()
        if state is None:
            return "--resume starts again from step 1 (no state was saved before)"
        return f"--resume continues from the state saved after {int(state.get('batch', 0))} steps"

    async def save_after_stop(self, reason: str) -> str | None:
        """Save resumable state after Ctrl-C or a stop (``reason`` names the checkpoint); print how to resume."""
        try:
            await self.settle_pending_update()
            if not self.at_step_boundary():
                self.records.console.print(f"[yellow]{reason}: state not saved: the weights are past step "
                                           f"{self.records.completed}; {self._last_saved()}:\n"
                                           f"    {self.resume_command()}[/yellow]")
                return None
            done = self.records.completed
            path = await self.save_state(done, name=f"{self.spec.name}-{reason}-{done:06d}")
            self.records.console.print(f"{reason} after {done} steps; state saved. Resume with:\n"
                                       f"    {self.resume_command()}")
            return path
        except Exception as exc:
            disk = write_error(exc)
            if disk is None:
                raise
            self.records.console.print(f"error: {disk}; state not saved: {self._last_saved()}")
            return None

    async def save_after_failure(self, exc: BaseException) -> None:
        """Best effort after a fault: save what the completed steps trained, so ``--resume`` can continue."""
        done = self.records.completed
        if done < self.start_step or not self.at_step_boundary():
            return
        try:
            await self.save_state(done, name=f"{self.spec.name}-failed-{done:06d}")
            self.records.console.print(f"state after {done} steps saved; fix the cause, then resume with:\n"
                                       f"    {self.resume_command()}")
        except Exception as save_exc:  # the backend may be the thing that failed
            self.records.console.print(f"[yellow]could not save state after the failure: {save_exc}[/yellow]")

    def resume_command(self) -> str:
        return self._resume_command or default_resume_command()

    def after_write_failure(self, exc: RunWriteError) -> str:
        return f"{exc} ({self._last_saved()})"
