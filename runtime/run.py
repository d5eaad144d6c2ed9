"""One run's services and records, for the loop a generated script carries.

A generated script's ``main(run)`` holds the algorithm (snapshot, policy, rollouts, degenerate split, advantages,
datum assembly, forward_backward + optim_step). :class:`Run` gives it what a script should not repeat: the
backend's clients, the data order, prompts and reward rules, the sampler (Sail, Tinker or local), the run
directory (config, metrics, rollouts, checkpoints, resume), progress, token and cost accounting, and the
on-policy check. :func:`open_run` builds it.

Steps are numbered from 1 everywhere (console, ``metrics.jsonl``, ``rollouts.jsonl``, the plot, resume
messages): step ``s`` is the run's ``s``-th optimizer update. ``checkpoints.jsonl``'s ``batch`` is the number of
completed steps, so a resumed run continues at ``batch + 1``.

Safety: nothing is written to the run directory before the backend, the model, the data and the training
client have opened (so a refused run leaves nothing behind); an update once submitted lands and its step is
logged before state is saved on Ctrl-C (:meth:`Run.apply_update`); each step's metrics and rollouts are written
whole at its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import uuid
import warnings
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tinker
from tinker_cookbook import checkpoint_utils
from tinker_cookbook.rl.types import TrajectoryGroup

from sailrl import __version__
from sailrl.runtime import report
from sailrl.runtime.backends import Backend, check_keys, open_backend
from sailrl.runtime.console import make_console
from sailrl.runtime.rollout import RolloutBatch, RuleGroupBuilder, SamplingPolicy, rollout_groups
from sailrl.runtime.rundir import RunDirectory
from sailrl.spec.errors import ConfigError, SailrlError, ServiceError, UserError
from sailrl.spec.schema import Spec

__all__ = [
    "AllDegenerateError",
    "BudgetReached",
    "OnPolicyMismatch",
    "Policy",
    "Run",
    "RunDirectoryError",
    "RunError",
    "RunOptions",
    "open_run",
    "run_dir_path",
]


class RunError(ServiceError):
    """A service or backend fault, with the step and phase it happened in."""


class AllDegenerateError(RunError):
    """Every group of a step scored the same and the spec says ``on_all_degenerate: stop``."""


class OnPolicyMismatch(ServiceError):
    """The sampler's logprobs disagree with the learner's (``sampling.on_policy_mismatch: stop``)."""


class RunDirectoryError(UserError, FileExistsError):
    """The run directory holds a run that this command would overwrite, or that is already complete."""


class BudgetReached(SailrlError):
    """The next step would take the run's estimated cost above ``training.max_cost_usd``. Not a failure: state is
    saved and the run can be resumed with a larger budget."""


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
class Policy:
    """A rollout policy: a tinker_cookbook ``TokenCompleter`` over one sampler checkpoint.

    ``sampler_step``: the step whose snapshot it samples (the weights after ``sampler_step - 1`` updates).
    """

    completer: Any
    sampler_path: str
    sampler_step: int


@dataclass
class _StepRecord:
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    rollouts: list[tuple[str, RolloutBatch, list[Any] | None, list[bool] | None]] = field(default_factory=list)
    rule_errors: dict[str, tuple[int, str]] = field(default_factory=dict)  # rule -> (completions, first why)


def run_dir_path(spec: Spec, spec_dir: Path | str) -> Path:
    """``output.run_dir`` with ``{name}`` filled in; a relative path is relative to the spec's folder, like every
    other path in a spec (``dataset.source``, a local ``model.name``)."""
    p = Path(spec.output.run_dir.replace("{name}", spec.name)).expanduser()
    return p if p.is_absolute() else Path(spec_dir) / p


def _default_resume_command() -> str:
    import shlex
    import sys

    args = [a for a in sys.argv[1:] if a not in ("--resume", "--overwrite")]
    return shlex.join(["python", sys.argv[0], *args, "--resume"])


@contextlib.contextmanager
def _phase(step: int, name: str, timings: dict[str, float]) -> Iterator[None]:
    """Time a phase into ``timings['time/<name>']`` (seconds); re-raise a fault naming the step and phase."""
    t0 = time.perf_counter()
    try:
        yield
    except (KeyboardInterrupt, asyncio.CancelledError, SailrlError):
        raise
    except Exception as exc:  # a Tinker / Sail / backend fault: say where it happened
        raise RunError(f"step {step}, phase '{name}': {type(exc).__name__}: {exc}") from exc
    finally:
        timings[f"time/{name}"] = round(timings.get(f"time/{name}", 0.0) + time.perf_counter() - t0, 4)


class Run:
    """The services and records of one run. Build it with :func:`open_run`.

    Attributes the loop uses: ``spec``, ``training_client``, ``service_client``, ``tokenizer``, ``renderer``,
    ``prompts`` (``PromptBuilder``), ``reward_fn``, ``train_rows`` / ``eval_rows``, ``start_step`` (the first step
    still to run), ``console`` (rich).
    """

    def __init__(self, *, spec: Spec, options: RunOptions, run_dir: RunDirectory, backend: Backend,
                 training_client: Any, tokenizer: Any, renderer: Any, reward_fn: Any, prompts: Any,
                 train_rows: list[dict[str, Any]], eval_rows: list[dict[str, Any]], completed: int,
                 warmup_completed: int, run_id: str, lora_rank: int, console: Any, finished: bool = False) -> None:
        self.spec = spec
        self.options = options
        self.run_dir = run_dir
        self.backend = backend
        self.service_client = backend.service_client
        self.training_client = training_client
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.reward_fn = reward_fn
        self.prompts = prompts
        self.train_rows = train_rows
        self.eval_rows = eval_rows
        self.completed = completed
        self.start_step = completed + 1
        self.warmup_completed = warmup_completed
        self.run_id = run_id
        self.lora_rank = lora_rank
        self.console = console
        self.finished = finished
        self.history: list[dict[str, Any]] = run_dir.read_metrics()
        self.cost = _cost_model(spec, prompts, train_rows, eval_rows)
        self.rollout_log = _rollout_log(run_dir, spec.output.log_rollouts, spec.prompt.reference_field)
        self.wandb_run: Any = None
        self._records: dict[int, _StepRecord] = {}
        self._pending_update: tuple[int, list[tinker.Datum], asyncio.Future, bool] | None = None
        self._reference: Any = None
        self._model_inputs: dict[int, tuple[Any, list]] = {}
        self._step_started: dict[int, float] = {}
        self._mismatch_warned = False

    # ------------------------------------------------------------------ steps and data
    def _record(self, step: int) -> _StepRecord:
        return self._records.setdefault(step, _StepRecord())

    def steps(self) -> Iterator[int]:
        """The steps still to run (1-based), with a progress bar.

        With ``training.max_cost_usd``, raises :class:`BudgetReached` before a step whose estimated cost would take
        the run above the budget.
        """
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        total = self.spec.training.steps
        columns = (TextColumn("[bold]RL[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            task = progress.add_task("", total=total, completed=self.completed)
            for step in range(self.start_step, total + 1):
                self._check_budget(step)
                self._step_started[step] = time.perf_counter()
                yield step
                last = self.history[-1].get("reward/total") if self.history else None
                progress.update(task, completed=self.completed,
                                description=f"reward {last:+.3f}" if isinstance(last, float) else "")

    def steps_to_sample(self, step: int, max_steps_off_policy: int, started: Any) -> list[int]:
        """Steps ``step .. step + max_steps_off_policy`` (within the run) whose rollouts have not started."""
        last = min(step + max_steps_off_policy, self.spec.training.steps)
        return [s for s in range(step, last + 1) if s not in started]

    def rows(self, step: int) -> list[dict[str, Any]]:
        """The dataset rows of ``step``: a deterministic function of (seed, step), the same after a resume."""
        from sailrl.runtime.data import rows_for_step, shuffle_seed

        return rows_for_step(self.train_rows, step - 1, self.spec.training.groups_per_step, shuffle_seed(self.spec),
                             reshuffle=self.spec.dataset.shuffle)

    def due(self, every: int, step: int) -> bool:
        """True every ``every`` steps (``every`` 0: never)."""
        return every > 0 and step % every == 0

    # ------------------------------------------------------------------ 1. snapshot, 2. resolve
    async def save_sampler_checkpoint(self, step: int) -> str:
        """Save the current LoRA weights as a sampler checkpoint (``save_weights_for_sampler``) that expires after
        ``training.checkpoint_ttl_s``, and wait for it; its path (:meth:`submit_sampler_checkpoint`, awaited)."""
        return await (await self.submit_sampler_checkpoint(step))

    async def submit_sampler_checkpoint(self, step: int) -> Awaitable[str]:
        """Submit the sampler-checkpoint save of ``step`` without waiting for it: once this returns, the save is
        queued before any update submitted later, so it holds the weights ``step`` starts from. Returns an
        awaitable of its path (timed as ``time/snapshot`` while awaited) for :meth:`policy_for`."""
        timings = self._record(step).timings
        with _phase(step, "snapshot", timings):
            fut = await self.training_client.save_weights_for_sampler_async(
                f"{self.spec.name}-step-{step:06d}", ttl_seconds=self.spec.training.checkpoint_ttl_s)

        async def path() -> str:
            with _phase(step, "snapshot", timings):
                return (await fut.result_async()).path

        return path()

    async def policy_for(self, sampler_path: str | Awaitable[str], step: int) -> Policy:
        """The policy that samples ``sampler_path`` (a path, or an awaitable of one from
        :meth:`submit_sampler_checkpoint`): on Sail, a signed checkpoint URL wrapped in sailrl's adaptive
        Sail completer; on Tinker or the local backend, a sampling client for that checkpoint.

        A Tinker that refuses to sign the checkpoint URL stops the run here (a ``ServiceError`` naming the options).
        """
        if not isinstance(sampler_path, str):
            sampler_path = await sampler_path
        s = self.spec.sampling
        with _phase(step, "resolve", self._record(step).timings):
            if self.backend.sampler == "sail":
                from sailrl.runtime.sail import adapter_config_for, make_sail_policy, signed_checkpoint_url

                url = await signed_checkpoint_url(self.service_client, sampler_path,
                                                  ttl_seconds=self.spec.training.checkpoint_ttl_s)
                m = self.spec.model
                completer = make_sail_policy(
                    model=m.name, signed_url=url,
                    adapter_config=adapter_config_for(m.name, self.lora_rank, train_attn=m.train_attn,
                                                      train_mlp=m.train_mlp, train_unembed=m.train_unembed),
                    lora_name=f"{self.spec.name}-{self.run_id}-step-{step:06d}", max_tokens=s.max_tokens,
                    temperature=s.temperature, top_p=s.top_p, completion_window=s.completion_window,
                    vocab_size=len(self.tokenizer), poll_deadline_s=s.poll_deadline_s)
            else:
                client = await self.service_client.create_sampling_client_async(model_path=sampler_path)
                # Seeded per step (model.seed) on the local backend: a run repeats exactly.
                seed = (self.spec.model.seed * 1_000_003 + (step - 1) * 100_003) % (2**31) if self.backend.is_local \
                    else None
                completer = SamplingPolicy(client, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                                           seed=seed)
        return Policy(completer, sampler_path, step)

    async def reference_client(self) -> Any:
        """A sampling client of the base model (no adapter), for the KL penalty's reference logprobs."""
        if self._reference is None:
            self._reference = await self.service_client.create_sampling_client_async(base_model=self.spec.model.name)
        return self._reference

    # ------------------------------------------------------------------ 3. roll out
    def _builder(self, row: dict[str, Any], group_size: int, scorer: Any) -> RuleGroupBuilder:
        key = int(row.get("_index", id(row)))
        if key not in self._model_inputs:
            stop = self.spec.sampling.stop or self.prompts.stop_sequences()
            self._model_inputs[key] = (self.prompts.model_input(row), stop)
        model_input, stop = self._model_inputs[key]
        return RuleGroupBuilder(row=row, model_input=model_input, stop=stop, renderer=self.renderer,
                                reward_fn=self.reward_fn, group_size=group_size, scorer=scorer)

    async def rollout(self, policy: Policy | Awaitable[Policy], step: int, *,
                      rows: list[dict[str, Any]] | None = None, group_size: int | None = None,
                      phase: str = "rollout") -> RolloutBatch:
        """Every rollout of every group of ``step``'s rows, concurrently, scored by the reward rules. ``policy``: a
        :class:`Policy`, or an awaitable of one (a task resolving it, shared by the steps that sample from it).

        Scoring runs off the event loop, within one budget for the step (``reward.step_budget_s``; rules past it
        fail and are counted). A group whose rollouts fail is dropped and counted; every group records the sampler
        checkpoint and step that produced it. Raises :class:`RunError` when every group failed (a service fault,
        not a degenerate batch), quoting the first failures.
        """
        from sailrl.runtime.scoring import StepScorer

        if not isinstance(policy, Policy):
            policy = await policy
        rows = self.rows(step) if rows is None else rows
        gs = group_size or self.spec.training.group_size
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        scorer = StepScorer(self.reward_fn)
        with _phase(step, phase, timings):
            batch = await rollout_groups(policy.completer, [self._builder(r, gs, scorer) for r in rows])
        batch.seconds = time.perf_counter() - t0
        batch.sampler_paths = [policy.sampler_path] * len(batch.groups)
        batch.sampler_steps = [policy.sampler_step] * len(batch.groups)
        stats = getattr(policy.completer, "stats", None)  # the Sail completer counts polls, retries and failures
        batch.extra_metrics = {**(stats.as_metrics() if stats is not None else {}), **scorer.metrics()}
        for line in scorer.warnings():  # python rules that printed this step: one line each
            self.console.print(f"[yellow]step {step}: {line}[/yellow]")
        if batch.failed:
            first = batch.failed[0]
            self.console.print(f"[yellow]step {step}: {len(batch.failed)} group(s) failed and were dropped "
                               f"(row {first[0]}: {first[1]})[/yellow]")
        if not batch.groups and batch.failed:
            reasons = "; ".join(f"row {i}: {why}" for i, why in batch.failed[:3])
            raise RunError(f"step {step}, phase '{phase}': every group failed ({len(batch.failed)}): {reasons}")
        return batch

    async def wait_for(self, step: int, rollouts: Awaitable[RolloutBatch]) -> RolloutBatch:
        """Await rollouts started earlier (bounded off-policy); the wait is timed as ``time/rollout_wait``."""
        with _phase(step, "rollout_wait", self._record(step).timings):
            return await rollouts

    def record_rollouts(self, step: int, batch: RolloutBatch, groups: Sequence[TrajectoryGroup],
                        advantages: Sequence[Any], *, stale: int = 0) -> None:
        """Log ``step``'s rollouts: per-rule means over every group (degenerate ones included), the degenerate
        fraction, tokens, staleness, and the rollout log lines (written with the step's metrics at its end).

        ``groups`` / ``advantages``: the groups that train and their advantages (one tensor per group).
        """
        rec = self._record(step)
        kept = {id(g): a for g, a in zip(groups, advantages, strict=True)}
        rec.metrics.update(report.rollout_metrics(batch.groups, len(batch.failed), self.reward_fn.rule_names))
        rec.metrics.update({k: v for k, v in batch.extra_metrics.items() if k not in report.JUDGE_TOKEN_KEYS})
        report.add_judge_tokens(rec.metrics, batch.extra_metrics)  # eval's judge tokens may be there already
        n = len(batch.groups)
        rec.metrics["degenerate_frac"] = (n - len(groups) - stale) / n if n else float("nan")
        prompt, sampled = report.sampled_tokens(batch.groups)
        rec.metrics["tokens/prompt"] = float(prompt)
        rec.metrics["tokens/sampled"] = float(sampled)
        rec.timings.setdefault("time/rollout", round(getattr(batch, "seconds", 0.0), 4))
        staleness = [step - s for s in batch.sampler_steps]
        rec.metrics["off_policy_k"] = float(self.spec.training.max_steps_off_policy)  # 0: synchronous
        if self.spec.training.max_steps_off_policy > 0:
            rec.metrics["groups_stale_dropped"] = float(stale)
            if staleness:
                rec.metrics["staleness/mean"] = sum(staleness) / len(staleness)
                rec.metrics["staleness/max"] = float(max(staleness))
        rec.metrics["sampler_step"] = float(min(batch.sampler_steps)) if batch.sampler_steps else float("nan")
        for g in batch.groups:  # rules that could not be evaluated: counted per rule, the first reason kept
            for traj in g.trajectories_G:
                for tr in traj.transitions:
                    for key, why in tr.logs.items():
                        if key.startswith("error/"):
                            count, first = rec.rule_errors.get(key[6:], (0, str(why)))
                            rec.rule_errors[key[6:]] = (count + 1, first)
        per_group = [kept.get(id(g)) for g in batch.groups]  # None: the group did not train
        rec.rollouts.append(("train", batch, per_group, None))  # None: degenerate = every total equal

    async def evaluate(self, policy: Policy | Awaitable[Policy], step: int) -> None:
        """Sample every held-out row once from ``policy``; metrics under ``eval/``, rollouts logged as ``eval``."""
        if not self.eval_rows:
            return
        rec = self._record(step)
        batch = await self.rollout(policy, step, rows=self.eval_rows, group_size=1, phase="eval")
        rec.timings["time/eval"] = round(batch.seconds, 4)
        rec.metrics.update(report.rollout_metrics(batch.groups, len(batch.failed), self.reward_fn.rule_names,
                                                  prefix="eval/"))
        prompt, sampled = report.sampled_tokens(batch.groups)
        rec.metrics["tokens/eval_prompt"] = float(prompt)
        rec.metrics["tokens/eval_sampled"] = float(sampled)
        report.add_judge_tokens(rec.metrics, batch.extra_metrics)  # judge rules judged the eval rollouts too
        for key in ("judge/failed", "judge/unparsed"):
            if key in batch.extra_metrics:
                rec.metrics[f"eval/{key}"] = batch.extra_metrics[key]
        rec.rollouts.append(("eval", batch, None, None))

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Add ``metrics`` to ``step``'s metrics line."""
        self._record(step).metrics.update(metrics)

    def record_kl_penalty(self, step: int, data: Sequence[tinker.Datum], metrics: dict[str, float]) -> None:
        """Log the KL penalty's metrics (``kl_policy_base``) and ``tokens/reference``: every token of each datum's
        full sequence, which the base model scored (``compute_logprobs``; billed as prefill on Tinker)."""
        rec = self._record(step)
        rec.metrics.update(metrics)
        rec.metrics["tokens/reference"] = float(report.token_counts(data) + len(data))

    # ------------------------------------------------------------------ 5. train
    async def apply_update(self, step: int, data: list[tinker.Datum], update: Awaitable[Any], *,
                           warmup: bool = False) -> Any:
        """Await ``update`` (forward_backward + optim_step calls) as the ``train`` phase and return its result.

        Once submitted, an update lands on the backend even if the run is interrupted: the await is shielded, and
        the Ctrl-C handler waits for it and logs the step (``warmup``: warm-up step ``step``) before saving state,
        so a resumed run never applies it twice.
        """
        task = asyncio.ensure_future(update)
        self._pending_update = (step, data, task, warmup)
        if warmup:
            result = await asyncio.shield(task)
        else:
            with _phase(step, "train", self._record(step).timings):
                result = await asyncio.shield(task)
        self._pending_update = None
        return result

    def record_update(self, step: int, data: list[tinker.Datum], results: Sequence[tuple[Any, Any]],
                      learning_rate: float) -> None:
        """Log an update: loss, datums, optimizer metrics, tokens trained, the learning rate, and the
        sampler-vs-learner KL (checked against ``sampling.on_policy_kl_threshold`` at the step's end)."""
        from sailrl.runtime.rl import update_metrics

        rec = self._record(step)
        rec.metrics.update(update_metrics(data, results))
        rec.metrics["tokens/trained"] = float(report.token_counts(data))
        rec.metrics["learning_rate"] = learning_rate

    def skip_degenerate_step(self, step: int) -> None:
        """A step whose groups were all degenerate: no update. Raises :class:`AllDegenerateError` when the spec
        says ``training.on_all_degenerate: stop``."""
        rec = self._record(step)
        rec.metrics["skipped"] = 1.0
        rec.metrics["datums"] = 0.0
        if self.spec.training.on_all_degenerate == "stop":
            self.end_step(step)
            raise AllDegenerateError(
                f"step {step}: every group scored the same reward ({rec.metrics.get('reward/total')}); nothing to "
                "learn from. training.on_all_degenerate is 'stop'. Raise group_size or temperature, or check the "
                "reward rules with `sailrl preflight --sample`.")
        self.console.print(f"[yellow]step {step}: every group was degenerate (same reward within each group): no "
                           "gradient, step skipped[/yellow]")

    # ------------------------------------------------------------------ end of a step
    def end_step(self, step: int) -> None:
        """Write ``step``'s metrics line and rollouts, print its line, and check it was sampled on policy."""
        rec = self._records.pop(step, _StepRecord())
        m = rec.metrics
        if not self.history:  # the first step's line also carries the supervised warm-up's tokens
            m["tokens/warmup_trained"] = float(sum(r.get("tokens", 0) for r in self.run_dir.read_warmup()))
        for kind in report.TOKEN_KINDS:  # the kinds this run has used so far
            prev = (self.history[-1].get(f"tokens_cum/{kind}") if self.history else None) or 0.0
            if prev or m.get(f"tokens/{kind}"):
                m.setdefault(f"tokens/{kind}", 0.0)
                m[f"tokens_cum/{kind}"] = float(prev + m[f"tokens/{kind}"])
        if self.cost is not None:
            m.update(self.cost.step_cost(m))
        m.setdefault("learning_rate", self.spec.training.learning_rate)
        if step in self._step_started:
            rec.timings["time/step"] = round(time.perf_counter() - self._step_started.pop(step), 4)
        line = {"step": step, **m, **rec.timings}
        line = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in line.items()}
        for kind, batch, advantages, degenerate in rec.rollouts:
            if self.rollout_log is not None:
                self.rollout_log.write_step(
                    step, kind, batch.groups, batch.rows, advantages, sampler_paths=batch.sampler_paths,
                    sampler_steps=batch.sampler_steps, tokenizer=self.tokenizer, degenerate=degenerate)
        self.run_dir.append_metrics(line)
        self.history.append(line)
        self.completed = step
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in line.items() if v is not None}, step=step)
        seconds = rec.timings.get("time/step") or sum(v for k, v in rec.timings.items() if k != "time/step")
        self.console.print(report.step_line(step, self.spec.training.steps, m, self.reward_fn.rule_names, seconds,
                                            show_cost=not self.backend.is_local))
        rollouts = sum(len(g.trajectories_G) for kind, batch, _, _ in rec.rollouts if kind == "train"
                       for g in batch.groups)
        for rule, (count, why) in rec.rule_errors.items():
            self.console.print(
                f"[yellow]warning: step {step}: rule '{rule}' could not be scored on {count} of {rollouts} "
                f"completions (it counts as failed): {why}; `sailrl show {self.run_dir.path} --rule {rule}` shows "
                "them[/yellow]")
        if m.get("regex_timeouts"):
            self.console.print(
                f"[yellow]warning: step {step}: {int(m['regex_timeouts'])} regex time-outs (reward.regex_timeout_s "
                f"{self.spec.reward.regex_timeout_s:g} s): the pattern fails on those completions[/yellow]")
        if (m.get("frac_truncated") or 0) > 0.5:
            self.console.print(
                f"[yellow]warning: step {step}: {100 * m['frac_truncated']:.0f}% of completions were cut at "
                f"max_tokens={self.spec.sampling.max_tokens}; raise sampling.max_tokens or ask for shorter answers "
                "in the prompt[/yellow]")
        self._check_on_policy(step, m)

    def _check_on_policy(self, step: int, m: dict[str, Any]) -> None:
        s = self.spec.sampling
        kl = m.get("optim/kl_sample_train_v2")
        if kl is None or not isinstance(kl, float) or (m.get("staleness/max") or 0) > 0 or s.temperature != 1.0:
            return
        if kl <= s.on_policy_kl_threshold:
            return
        message = (f"step {step}: the sampler's logprobs disagree with the learner's (KL estimate {kl:.4f} > "
                   f"sampling.on_policy_kl_threshold {s.on_policy_kl_threshold}): the rollouts probably did not come "
                   "from the checkpoint just trained. Likely causes: Sail served the base model (the adapter was not "
                   "loaded) or a stale checkpoint, or the renderer / tokenizer differs from the model's.")
        if s.on_policy_mismatch == "stop":
            raise OnPolicyMismatch(message + " sampling.on_policy_mismatch is 'stop'.")
        self.console.print(f"[yellow]warning: {message}[/yellow]")

    def _check_budget(self, step: int) -> None:
        budget = self.spec.training.max_cost_usd
        if budget is None:
            return
        if self.history:
            spent = self.history[-1].get("cost/total")
        else:  # before the first RL step: what the supervised warm-up has cost
            spent = self.cost.cost_of("warmup_trained", sum(r.get("tokens", 0) for r in self.run_dir.read_warmup()))
        nxt = self.cost.next_step_estimate(self.history, step=step - 1)  # it counts steps from 0
        if spent is None or nxt is None:
            missing = ", ".join(p.spec_key for p in self.cost.missing_prices()) or "pricing:"
            raise ConfigError(f"training.max_cost_usd is set but these prices are unknown: {missing}; add them "
                              "under pricing: (USD per million tokens) or remove the budget")
        if spent + nxt > budget:
            raise BudgetReached(
                f"budget reached before step {step}: spent ${spent:.4f} of training.max_cost_usd ${budget:.4f}, and "
                f"the next step is estimated at ${nxt:.4f}. Raise training.max_cost_usd to continue.")

    # ------------------------------------------------------------------ checkpoints
    async def save_state(self, step: int, *, name: str | None = None, extra: dict[str, Any] | None = None) -> str:
        """``save_state`` (weights + optimizer) after ``step`` steps, recorded in checkpoints.jsonl."""
        self.run_dir.ensure()
        paths = await checkpoint_utils.save_checkpoint_async(
            self.training_client, name or f"{self.spec.name}-state-{step:06d}", str(self.run_dir.path),
            loop_state={"batch": step, **(extra or {})}, kind="state")
        return paths["state_path"]

    async def save_final(self) -> str:
        """Save the final state and sampler weights (the adapter to use), then print the summary."""
        self.run_dir.ensure()
        paths = await checkpoint_utils.save_checkpoint_async(
            self.training_client, f"{self.spec.name}-final", str(self.run_dir.path),
            loop_state={"batch": self.completed, "final": True}, kind="both")
        self.console.print(self.summary(paths["state_path"]))
        return paths["state_path"]

    async def settle_pending_update(self) -> None:
        """After an interrupt: let a submitted update land and log its step (see :meth:`apply_update`)."""
        if self._pending_update is None:
            return
        step, data, task, warmup = self._pending_update
        self._pending_update = None
        try:
            results = await task
        except Exception as exc:  # the update failed: its step is simply not completed
            self.console.print(f"[yellow]the update of {'warm-up ' if warmup else ''}step {step} did not finish: "
                               f"{exc}[/yellow]")
            return
        if warmup:
            self.record_warmup(step, data, results)
            return
        from sailrl.runtime.rl import learning_rate

        t = self.spec.training
        lr = learning_rate(t.learning_rate, step, t.steps, t.lr_schedule, t.lr_warmup_steps)
        self.record_update(step, data, results, lr)
        self.end_step(step)

    async def save_after_stop(self, reason: str) -> str | None:
        """Save resumable state after Ctrl-C or the budget (``reason`` names the checkpoint); print how to resume."""
        await self.settle_pending_update()
        extra = {"warmup": self.warmup_completed} if self.completed == 0 and self.warmup_completed else {}
        path = await self.save_state(self.completed, name=f"{self.spec.name}-{reason}-{self.completed:06d}",
                                     extra=extra)
        what = f"{self.completed} steps" if self.completed or not self.warmup_completed else \
            f"{self.warmup_completed} warm-up steps"
        self.console.print(f"{reason} after {what}; state saved. Resume with:\n    {self.resume_command()}")
        return path

    async def save_after_failure(self, exc: BaseException) -> None:
        """Best effort after a fault: save what the completed steps trained, so ``--resume`` can continue."""
        if self.completed < self.start_step:
            return
        try:
            await self.save_state(self.completed, name=f"{self.spec.name}-failed-{self.completed:06d}")
            self.console.print(f"state after {self.completed} steps saved; fix the cause, then resume with:\n"
                               f"    {self.resume_command()}")
        except Exception as save_exc:  # the backend may be the thing that failed
            self.console.print(f"[yellow]could not save state after the failure: {save_exc}[/yellow]")

    def resume_command(self) -> str:
        return self.options.resume_command or _default_resume_command()

    # ------------------------------------------------------------------ supervised warm-up
    def warmup_steps(self) -> Iterator[int]:
        """The supervised warm-up steps still to run (1-based; none once RL has started)."""
        w = self.spec.training.warmup
        if w is None or self.completed > 0:
            return iter(())
        return iter(range(self.warmup_completed + 1, w.steps + 1))

    def supervised_batch(self, i: int) -> list[tinker.Datum]:
        """Warm-up step ``i``'s datums: ``cross_entropy`` on the rendered reference completions
        (``training.warmup.completion``), in their own seeded data order."""
        from sailrl.runtime.data import rows_for_step, shuffle_seed

        w = self.spec.training.warmup
        completion = w.completion or "{{ " + self.spec.prompt.reference_field + " }}"
        rows = rows_for_step(self.train_rows, i - 1, w.batch_size, shuffle_seed(self.spec) + 7919,
                             reshuffle=self.spec.dataset.shuffle)
        return [self.prompts.supervised_datum(row, completion) for row in rows]

    def record_warmup(self, i: int, data: list[tinker.Datum], fb_output: Any) -> None:
        """Log warm-up step ``i`` (``warmup.jsonl``: step, cross-entropy per target token)."""
        n_tok = sum(float(sum(d.loss_fn_inputs["weights"].tolist())) for d in data)
        loss = float((fb_output.metrics or {}).get("loss:sum", 0.0)) / max(n_tok, 1.0)
        self.run_dir.append_jsonl("warmup.jsonl", {"step": i, "loss_per_token": loss,
                                                   "tokens": report.token_counts(data)})
        self.warmup_completed = i
        w = self.spec.training.warmup
        if i == 1 or i % 10 == 0 or i == w.steps:
            self.console.print(f"warm-up {i:4d}/{w.steps} | cross_entropy/token {loss:.3f}")

    # ------------------------------------------------------------------ summary
    def summary(self, final_state: str | None) -> str:
        """First-vs-last reward and ``correct``, tokens and cost, the run directory and the final adapter."""
        lines = report.summary_lines(self.history, show_cost=not self.backend.is_local)
        lines.append(f"run directory: {self.run_dir.path}")
        if final_state:
            lines.append(f"final state: {final_state}")
        sampler = self.run_dir.last_sampler_path()
        if sampler:
            lines.append(f"final adapter: {sampler}")
            if self.backend.is_local:
                from sailrl.runtime.backends import local_checkpoint_dir
                from sailrl.runtime.local.checkpoints import LocalPath

                p = LocalPath.parse(sampler)
                lines.append(f"  (a PEFT adapter directory: {local_checkpoint_dir() / p.run_id / p.kind / p.name})")
        if self.wandb_run is not None:
            self.wandb_run.finish()
        return "\n".join(lines)

    async def close(self) -> None:
        """Release the local backend: its worker threads finish the work already queued and stop, so none is
        inside torch when the interpreter exits (a thread killed there aborts the process)."""
        if self.backend.is_local:
            await asyncio.to_thread(self.service_client.close, "done")


class _FirstArchiveNotice(logging.Filter):
    """Let tinker's deprecation notice of the archive-URL call through once per run, not on every Sail step."""

    seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "get_checkpoint_archive_url" not in record.getMessage():
            return True
        first, _FirstArchiveNotice.seen = not _FirstArchiveNotice.seen, True
        return first


def _quiet_archive_deprecation() -> None:
    """tinker 0.35 logs (at ERROR) and warns that the archive-URL call sail needs is deprecated, at every call:
    keep the first of each (README, "Why tinker < 0.36"); a refusal still stops the run in one line."""
    logger = logging.getLogger("tinker.lib.public_interfaces.rest_client")
    if not any(isinstance(f, _FirstArchiveNotice) for f in logger.filters):
        logger.addFilter(_FirstArchiveNotice())
    warnings.filterwarnings("once", message=".*get_checkpoint_archive_url.*", category=FutureWarning)


def _cost_model(spec: Spec, prompts: Any, train_rows: list[dict[str, Any]], eval_rows: list[dict[str, Any]]) -> Any:
    """The run's prices; with a budget, the prompt lengths too (the first step's estimate counts them)."""
    from sailrl.runtime.cost import CostModel

    if spec.training.max_cost_usd is None:
        return CostModel.from_spec(spec)
    return CostModel.from_spec(spec, prompt_token_lengths=[prompts.model_input(r).length for r in train_rows],
                               eval_prompt_token_lengths=[prompts.model_input(r).length for r in eval_rows])


def _rollout_log(run_dir: RunDirectory, limit: Any, reference_field: str) -> Any:
    from sailrl.runtime.rollout_log import RolloutLog

    return None if limit == 0 else RolloutLog(run_dir.path, limit, reference_field=reference_field)


def _open_wandb(spec: Spec, resolved: dict[str, Any], console: Any) -> Any:
    """A wandb run when ``output.wandb_project`` is set and wandb is installed; never required."""
    if not spec.output.wandb_project:
        return None
    try:
        import wandb
    except ImportError:
        console.print("[yellow]output.wandb_project is set but wandb is not installed (pip install wandb); "
                      "logging to metrics.jsonl only[/yellow]")
        return None
    return wandb.init(project=spec.output.wandb_project, name=spec.name, config=resolved)


#: Seconds Tinker gets to answer its first request (``SAILRL_CONNECT_TIMEOUT_S`` overrides) and to create a
#: training client (a large model can take minutes to place).
CONNECT_TIMEOUT_S = 30.0
CREATE_TIMEOUT_S = 900.0


def connect_timeout_s() -> float:
    try:
        return float(os.environ.get("SAILRL_CONNECT_TIMEOUT_S") or CONNECT_TIMEOUT_S)
    except ValueError:
        raise ConfigError(f"SAILRL_CONNECT_TIMEOUT_S must be a number of seconds, got "
                          f"{os.environ['SAILRL_CONNECT_TIMEOUT_S']!r}") from None


async def _remote(call: Any, timeout_s: float, what: str) -> Any:
    """``call()`` (a blocking Tinker SDK call) in a daemon thread, awaited for at most ``timeout_s`` seconds, so
    an unreachable service is one line within the deadline and Ctrl-C interrupts the wait. Raises
    ``BackendError`` (a user error: the URL, the key or the network) on a timeout or a connection fault."""
    import threading

    from sailrl.runtime.backends import BackendError

    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not done.done():
            done.set_result(value) if ok else done.set_exception(value)

    def target() -> None:
        try:
            value = call()
        except BaseException as exc:  # noqa: BLE001 -- delivered to the awaiting coroutine
            loop.call_soon_threadsafe(settle, False, exc)
        else:
            loop.call_soon_threadsafe(settle, True, value)

    threading.Thread(target=target, name="sailrl-tinker-call", daemon=True).start()
    where = os.environ.get("TINKER_BASE_URL") or "the default endpoint"
    try:
        return await asyncio.wait_for(done, timeout_s)
    except TimeoutError:
        raise BackendError(f"Tinker did not {what} within {timeout_s:g} s ({where}): check TINKER_BASE_URL and "
                           "your network (SAILRL_CONNECT_TIMEOUT_S sets the wait), or train here with --sampler "
                           "local") from None
    except Exception as exc:
        import tinker as _tinker

        if isinstance(exc, (_tinker.APIConnectionError, _tinker.APITimeoutError, ConnectionError)):
            raise BackendError(f"cannot reach Tinker ({where}): {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''} -- check TINKER_BASE_URL and "
                               "your network, or train here with --sampler local") from None
        if isinstance(exc, _tinker.APIStatusError) and exc.status_code in (401, 403):
            raise BackendError(f"Tinker refused the API key (HTTP {exc.status_code}): check TINKER_API_KEY") \
                from None
        raise


def _final_saved(run_dir: RunDirectory, completed: int) -> bool:
    from sailrl.runtime.rundir import _read_jsonl_tolerant

    return any(r.get("final") and r.get("sampler_path") and r.get("batch", -1) >= completed
               for r in _read_jsonl_tolerant(run_dir.checkpoints_path))


async def open_run(spec: Spec, options: RunOptions) -> Run:
    """Open the backend, model, data and training client, then the run directory.

    Order: the run directory's policy is checked (nothing written), then keys, backend, tokenizer and renderer,
    reward rules and data, then the training client (``--resume`` state + optimizer > ``training.resume_from`` >
    ``training.init_from`` weights > a fresh LoRA); only then are ``config.json`` and ``train.py`` written and the
    logs of steps to re-run dropped. Raises :class:`RunDirectoryError` (a run is there and neither ``resume`` nor
    ``overwrite`` is set; or it is complete), ``BackendError`` / ``ModelError`` / ``DataError`` (user errors).
    """
    from sailrl.runtime.data import load_rows
    from sailrl.runtime.models import get_renderer, get_tokenizer
    from sailrl.runtime.prompts import PromptBuilder
    from sailrl.runtime.rewards import RewardFunction
    from sailrl.spec.renderers import default_renderer

    console = make_console(stderr=True, soft_wrap=True)
    run_dir = RunDirectory(run_dir_path(spec, options.spec_dir))
    resolved = spec.resolved()
    resume, t, m = options.resume, spec.training, spec.model
    if not resume and run_dir.has_metrics() and not options.overwrite:
        done = len(run_dir.read_metrics())
        if _final_saved(run_dir, done):
            raise RunDirectoryError(
                f"{run_dir.path} holds a finished run ({done} steps). Start it over with --overwrite, train it "
                "further by raising training.steps and adding --resume, or set output.run_dir to a new directory.")
        raise RunDirectoryError(
            f"{run_dir.path} already holds a run ({done} steps logged). Continue it with --resume, start it over "
            "with --overwrite, or set output.run_dir to a new directory.")
    state = run_dir.last_state() if resume else None
    if resume:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            changes = run_dir.check_resume_config(resolved, options.spec_sha256)
        if changes:
            console.print("[yellow]warning: resuming with a spec that differs from the one this run started "
                          "with:[/yellow]\n  " + "\n  ".join(changes))
        if state is None and (run_dir.has_metrics() or run_dir.read_warmup()):
            console.print(f"[yellow]no saved state in {run_dir.path} yet; starting again from step 1[/yellow]")
        elif state is None:
            console.print(f"[yellow]nothing to resume in {run_dir.path}: starting a new run[/yellow]")
    completed = int((state or {}).get("batch", 0))
    finished = False
    if state is not None and completed >= t.steps:
        if _final_saved(run_dir, completed):
            raise RunDirectoryError(f"this run already completed {completed} steps (training.steps is {t.steps}); "
                                    "raise training.steps to train further")
        finished = True  # killed between the last periodic save and the final one: finish what is missing

    sampler = spec.sampling.sampler
    if sampler == "sail":
        _quiet_archive_deprecation()
    if sampler != "local":
        check_keys(sampler, options.spec_path, m.name, options.spec_dir)  # a missing key: one line, before all
        console.print(f"connecting to Tinker ({os.environ.get('TINKER_BASE_URL') or 'default endpoint'}) ...")
    backend = open_backend(spec, sampler=sampler, spec_path=options.spec_path)
    service = backend.service_client

    resume_path = (state or {}).get("state_path") or t.resume_from
    if not backend.is_local:  # the SDK blocks (and retries for minutes) when Tinker is unreachable: bound it
        await _remote(service.get_server_capabilities, connect_timeout_s(), "answer")
    if resume_path:
        training_client = await _remote(
            lambda: service.create_training_client_from_state_with_optimizer(resume_path), CREATE_TIMEOUT_S,
            f"open the training state {resume_path}") if not backend.is_local else \
            await service.create_training_client_from_state_with_optimizer_async(resume_path)
    else:
        kwargs = dict(base_model=m.name, rank=m.lora_rank, seed=m.seed, train_mlp=m.train_mlp,
                      train_attn=m.train_attn, train_unembed=m.train_unembed)
        training_client = await _remote(lambda: service.create_lora_training_client(**kwargs), CREATE_TIMEOUT_S,
                                        f"create a LoRA training client for {m.name}") if not backend.is_local \
            else await service.create_lora_training_client_async(**kwargs)
        if t.init_from:
            await (await training_client.load_state_async(t.init_from)).result_async()
    lora_rank = m.lora_rank
    if resume_path:  # the checkpoint decides the adapter's shape, whatever the spec now says
        info = await training_client.get_info_async()
        if getattr(info, "lora_rank", None) and info.lora_rank != m.lora_rank:
            console.print(f"[yellow]the checkpoint's LoRA rank is {info.lora_rank}, the spec says {m.lora_rank}: "
                          f"training and sampling use {info.lora_rank}[/yellow]")
            lora_rank = int(info.lora_rank)
    tokenizer = training_client.get_tokenizer() if backend.is_local else get_tokenizer(m.name)
    renderer = get_renderer(m.renderer or default_renderer(m.name, options.spec_dir), tokenizer)
    reward_fn = RewardFunction.from_spec(spec.reward, reference_field=spec.prompt.reference_field,
                                         spec_dir=options.spec_dir)  # python rules load from the spec's folder
    if reward_fn.judges:  # kind: judge rules: their clients open on the first judgement
        from sailrl.runtime.judge_clients import connect_judges

        for name, why in connect_judges(reward_fn, service_client=None if backend.is_local else service,
                                        local_service=service if backend.is_local else None,
                                        spec_dir=options.spec_dir).items():
            console.print(f"[yellow]warning: judge rule '{name}': {why}; it fails every judgement (judge/failed)"
                          "[/yellow]")
    rows = load_rows(spec, options.spec_dir, reward_fn=reward_fn, renderer=renderer)  # over-long prompts skipped
    if rows.skipped:
        console.print(f"[yellow]skipped {len(rows.skipped)} dataset rows (first: row {rows.skipped[0].index}: "
                      f"{rows.skipped[0].reason}); see `sailrl preflight` for all[/yellow]")
    prompts = PromptBuilder(spec.prompt, renderer)

    # Everything opened: now the run directory is written.
    if not resume and options.overwrite:
        run_dir.clear_records()
    old_config = run_dir.read_config() if resume else None
    run_id = (old_config or {}).get("run_id") or uuid.uuid4().hex[:8]  # names this run's Sail adapters
    run_dir.write_config(resolved, options.spec_sha256, {"sailrl_version": __version__,
                                                         "spec_path": options.spec_path, "run_id": run_id,
                                                         "overrides": list(options.overrides)})
    if options.script_text is not None:
        run_dir.write_script(options.script_text)
    if backend.is_local:  # `sailrl clean` keeps the checkpoints this run directory's --resume needs
        from sailrl.runtime.checkpoint_store import note_run_directory

        note_run_directory(run_dir.path)
    warmup_total = t.warmup.steps if t.warmup else 0
    if completed > 0 or (state is None and t.resume_from):  # RL has started, or starts from a saved state
        warmup_completed = warmup_total
    else:
        warmup_completed = int((state or {}).get("warmup", 0))
    run_dir.truncate_metrics(completed + 1)
    run_dir.truncate_jsonl("warmup.jsonl", warmup_completed + 1)
    run = Run(spec=spec, options=options, run_dir=run_dir, backend=backend, training_client=training_client,
              tokenizer=tokenizer, renderer=renderer, reward_fn=reward_fn, prompts=prompts, train_rows=rows.train,
              eval_rows=rows.eval, completed=completed, warmup_completed=warmup_completed, run_id=run_id,
              lora_rank=lora_rank, console=console, finished=finished)
    if run.rollout_log is not None:
        run.rollout_log.truncate(completed + 1)
    if resume_path:
        where = f"step {completed + 1}" if completed or not warmup_completed else \
            f"warm-up step {warmup_completed + 1}"
        console.print(f"resuming from {resume_path} at {where} ({completed} of {t.steps} steps done)")
    if finished:
        console.print(f"all {t.steps} steps were done; saving the final adapter")
    if t.loss_fn == "dro":
        console.print("[yellow]note: loss_fn dro applies its quadratic penalty to every position the data carries, "
                      "prompt tokens included, and uses the group-centred advantages; the Tinker loss doc asks for "
                      "DRO's own soft advantage estimate, which sailrl does not compute yet.[/yellow]")
    run.wandb_run = _open_wandb(spec, resolved, console)
    return run
