"""One run, for the loop a generated script carries: :func:`open_run` builds a :class:`Run` from its parts.

A generated script's ``main(run)`` holds the algorithm (snapshot, policy, rollouts, degenerate split, advantages,
datum assembly, forward_backward + optim_step). What a script should not repeat sits in :class:`Run`'s parts, one
job each:

- ``run.sampler`` (:mod:`sailrl.runtime.loop.sampler`): sampler checkpoints, the policy for one, a step's rows and its
  rollouts, the held-out evaluation, the KL reference client;
- ``run.rewards`` (:mod:`sailrl.runtime.loop.rewarder`): the reward rules scoring a step's rollouts;
- ``run.records`` (:mod:`sailrl.runtime.loop.records`): each step's metrics line, rollout log, console line, tokens and
  cost, the on-policy check, the summary;
- ``run.checkpoints`` (:mod:`sailrl.runtime.loop.checkpoints`): updates that land whole, saved state, the final
  adapter, saving after a stop;
- ``run.budget`` (:mod:`sailrl.runtime.loop.budget`): the ``training.max_cost_usd`` stop;
- ``run.warmup`` (:mod:`sailrl.runtime.loop.warmup`): the supervised warm-up's steps and log.

Steps are numbered from 1 everywhere (console, ``metrics.jsonl``, ``rollouts.jsonl``, the plot, resume
messages): step ``s`` is the run's ``s``-th optimizer update. ``checkpoints.jsonl``'s ``batch`` is the number of
completed steps, so a resumed run continues at ``batch + 1``.

Safety: nothing is written to the run directory before the backend, the model, the data and the training
client have opened (so a refused run leaves nothing behind, :mod:`sailrl.runtime.loop.opening`); an update once
submitted lands and its step is logged before state is saved on Ctrl-C (``run.checkpoints.apply_update``); each
step's metrics and rollouts are written whole at its end, and a state is saved only at a step boundary (a write
that fails leaves the weights past the last recorded step: nothing is saved, ``--resume`` continues from the last
state saved before, :mod:`sailrl.runtime.loop.checkpoints`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sailrl.runtime.backends.backend import Backend
from sailrl.runtime.distillation.teacher import open_teacher
from sailrl.runtime.loop import opening
from sailrl.runtime.loop.budget import Budget
from sailrl.runtime.loop.checkpoints import Checkpoints
from sailrl.runtime.loop.console import RunConsole
from sailrl.runtime.loop.records import Records
from sailrl.runtime.loop.rewarder import Rewards
from sailrl.runtime.loop.sampler import Sampler
from sailrl.runtime.loop.warmup import Warmup
from sailrl.runtime.rewards.python_rules import freeze_spec_code
from sailrl.runtime.rollouts.episode import build_tools, close_tools
from sailrl.runtime.rundir.directory import RunDirectory, run_dir_path
from sailrl.runtime.rundir.rollout_log import RolloutLog
from sailrl.runtime.rundir.writes import writing
from sailrl.spec.models import context_window
from sailrl.spec.schema import Spec, every_due

__all__ = ["Run", "RunOptions", "open_run"]


@dataclass
class RunOptions:
    """How a run was started. ``resume_command``: what to print for resuming (default: this script's argv)."""

    spec_path: str
    spec_dir: Path
    spec_sha256: str
    resume: bool = False
    overwrite: bool = False
    overrides: list[str] = field(default_factory=list)
    resume_command: str | None = None
    script_text: str | None = None


@dataclass
class Run:
    """One run: its clients and data, and the parts that do its jobs (module docstring). Build it with
    :func:`open_run`. ``start_step``: the first step still to run; ``finished``: every step was done before this
    start (only the final save is missing)."""

    spec: Spec
    backend: Backend
    training_client: Any
    inputs: opening.Inputs
    run_dir: RunDirectory
    sampler: Sampler
    records: Records
    checkpoints: Checkpoints
    budget: Budget
    warmup: Warmup
    console: Console
    start_step: int
    finished: bool = False
    #: method distill: a sampling client of the teacher (``distill.teacher``), which scores the student's tokens
    teacher: Any = None

    @property
    def completed(self) -> int:
        """RL steps completed so far."""
        return self.records.completed

    @property
    def rewards(self) -> Rewards:
        """``run.rewards``: the reward rules scoring what ``run.sampler.sample`` hands over."""
        return self.sampler.rewards

    @property
    def service_client(self) -> Any:
        return self.backend.service_client

    @property
    def prompts(self) -> Any:
        return self.inputs.prompts

    @property
    def train_rows(self) -> list[dict[str, Any]]:
        return self.inputs.rows.train

    def steps(self) -> Iterator[int]:
        """The steps still to run (1-based), with a progress bar; each step's clock starts as it is yielded."""
        total = self.spec.training.steps
        columns = (TextColumn("[bold]RL[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            task = progress.add_task("", total=total, completed=self.completed)
            for step in range(self.start_step, total + 1):
                self.records.start(step)
                yield step
                history = self.records.history
                last = history[-1].get("reward/total") if history else None
                progress.update(task, completed=self.completed,
                                description=f"reward {last:+.3f}" if isinstance(last, float) else "")

    def warmup_steps(self) -> Iterator[int]:
        """The supervised warm-up steps still to run (1-based; none once RL has started)."""
        return self.warmup.steps(self.completed)

    @staticmethod
    def due(every: int, step: int) -> bool:
        """True every ``every`` steps (``every`` 0: never): :func:`sailrl.spec.schema.every_due`."""
        return every_due(every, step)

    async def close(self) -> None:
        """Release the local backend: its worker threads finish the work already queued and stop, so none is
        inside torch when the interpreter exits (a thread killed there aborts the process)."""
        await close_tools(self.sampler.tools)  # the Sailbox of environment.sandbox: sail
        if self.backend.is_local:
            await asyncio.to_thread(self.backend.service_client.close, "done")


async def open_run(spec: Spec, options: RunOptions) -> Run:
    """Open the backend, model, data and training client, then the run directory (the steps are
    :mod:`sailrl.runtime.loop.opening`'s). Raises ``RunDirectoryError`` (a run is there and neither ``resume`` nor
    ``overwrite`` is set; or it is complete), ``BackendError`` / ``ModelError`` / ``DataError`` (user errors)."""
    console = RunConsole(soft_wrap=True)
    run_dir = RunDirectory(run_dir_path(spec, options.spec_dir))
    start = opening.resume_point(run_dir, spec, resume=options.resume, overwrite=options.overwrite,
                                 spec_sha256=options.spec_sha256, console=console)
    # The rules' and tools' files are read once, before any worker loads them: the reward cannot change mid-run.
    code_sha256 = freeze_spec_code(spec.reward.rules if spec.reward else [], spec.environment.tools if spec.environment else [],
                                   options.spec_dir)
    resume_path = start.state_path or spec.training.resume_from
    init = None if resume_path else opening.init_weights(spec, options.spec_dir)  # an earlier run's final state
    backend = await opening.connect(spec, spec_path=options.spec_path, spec_dir=options.spec_dir, console=console)
    training_client, lora_rank = await opening.open_training_client(backend, spec, resume_path, console, init=init)
    episode = _episode_parts(spec, options.spec_dir)  # tools first: their declaration is part of every prompt
    inputs = opening.load_inputs(spec, backend, training_client, options.spec_dir, console,
                                 tool_specs=[t.to_spec() for t in episode.get("tools", [])])
    await opening.probe_judges(inputs, spec.prompt.reference_field)  # a judge no step could reach stops the run
    teacher = await open_teacher(spec, backend, options.spec_dir, inputs.tokenizer, console) \
        if spec.method == "distill" else None
    # Everything opened: now the run directory is written.
    run_id, warmup_completed = opening.write_run_dir(
        run_dir, spec, start, resume=options.resume, overwrite=options.overwrite, spec_sha256=options.spec_sha256,
        spec_path=options.spec_path, overrides=options.overrides, script_text=options.script_text,
        is_local=backend.is_local, code_sha256=code_sha256, init=init)
    run = _assemble(spec, options, console, run_dir, backend, training_client, lora_rank, inputs, run_id,
                    start, warmup_completed, episode)
    run.teacher = teacher
    _announce(run, resume_path, warmup_completed)
    return run


def _assemble(spec: Spec, options: RunOptions, console: Console, run_dir: RunDirectory, backend: Backend,
              training_client: Any, lora_rank: int, inputs: opening.Inputs, run_id: str,
              start: opening.ResumePoint, warmup_completed: int, episode: dict[str, Any]) -> Run:
    """The run's parts over what :func:`open_run` opened."""
    cost = opening.cost_model(spec, inputs)
    limit = spec.output.log_rollouts
    rollout_log = None if limit == 0 else RolloutLog(run_dir.path, limit, reference_field=spec.prompt.reference_field)
    if rollout_log is not None:
        with writing(rollout_log.path):  # a full disk: one line, not a traceback
            rollout_log.truncate(start.completed + 1)
    records = Records(spec=spec, run_dir=run_dir, rule_names=inputs.reward_fn.rule_names, tokenizer=inputs.tokenizer,
                      console=console, is_local=backend.is_local, cost=cost, rollout_log=rollout_log,
                      completed=start.completed, wandb_run=opening.open_wandb(spec, console),
                      said_at_start=[n for n, j in inputs.reward_fn.judges.items() if not j.connected])
    warmup = Warmup(spec=spec, train_rows=inputs.rows.train, prompts=inputs.prompts, run_dir=run_dir,
                    console=console, completed=warmup_completed)
    sampler = Sampler(spec=spec, backend=backend, training_client=training_client, tokenizer=inputs.tokenizer,
                      renderer=inputs.renderer, reward_fn=inputs.reward_fn, prompts=inputs.prompts,
                      train_rows=inputs.rows.train, eval_rows=inputs.rows.eval, run_id=run_id, lora_rank=lora_rank,
                      records=records, **episode)
    if start.state is not None:
        sampler.resume_snapshots(start.completed + 1, start.state)
        if sampler.draws is not None:  # dynamic sampling, the difficulty filter: the data order's cursor
            sampler.draws.resume(start.completed, start.state)
    checkpoints = Checkpoints(spec=spec, training_client=training_client, run_dir=run_dir, records=records,
                              warmup=warmup, start_step=start.completed + 1, resume_command=options.resume_command,
                              snapshots=sampler.saved_snapshots,
                              draws=sampler.draws.saved if sampler.draws is not None else None)
    budget = Budget(spec.training.max_cost_usd, cost, records, run_dir)
    return Run(spec=spec, backend=backend, training_client=training_client, inputs=inputs, run_dir=run_dir,
               sampler=sampler, records=records, checkpoints=checkpoints, budget=budget, warmup=warmup,
               console=console, start_step=start.completed + 1, finished=start.finished)


def _episode_parts(spec: Spec, spec_dir: Any) -> dict[str, Any]:
    """``environment.tools`` loaded and the model's context window (an episode's default token budget); nothing
    for a single-turn spec."""
    if spec.environment is None:
        return {}
    return {"tools": build_tools(spec.environment, spec_dir),
            "context_window": context_window(spec.model.name, spec_dir)[0]}


def _announce(run: Run, resume_path: str | None, warmup_completed: int) -> None:
    """Say where the run starts, and what the spec asks for that deserves a note."""
    t, completed = run.spec.training, run.completed
    if resume_path:
        where = f"step {completed + 1}" if completed or not warmup_completed else \
            f"warm-up step {warmup_completed + 1}"
        run.console.print(f"resuming from {resume_path} at {where} ({completed} of {t.steps} steps done)")
    if run.finished:
        run.console.print(f"all {t.steps} steps were done; saving the final adapter")
    if t.loss_fn == "dro":
        run.console.print("[yellow]note: loss_fn dro applies its quadratic penalty to every position the data "
                          "carries, prompt tokens included, and uses the group-centred advantages; the Tinker loss "
                          "doc asks for DRO's own soft advantage estimate, which sailrl does not compute yet.[/yellow]")
