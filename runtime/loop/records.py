"""A run's records: each step's metrics line, its rollout log lines, the console, tokens and cost, wandb.

:class:`Records` is ``run.records`` in a generated script. A step's metrics and timings collect in a
:class:`StepRecord` while the step runs (``rollouts``, ``kl_penalty``, ``update``, ``skipped_step``, ``add``, and
the phase timings of :mod:`sailrl.runtime.loop.sampler`); :meth:`Records.end_step` writes them whole (``metrics.jsonl``,
``rollouts.jsonl``), prints the step's line and warnings, and checks the step was sampled on policy
(:func:`check_on_policy`). ``history`` holds every metrics line so far (a resumed run's too).

Seam for new metrics: a feature adds its keys to the step's record (``add``) before ``end_step``; the metrics
line, wandb and ``sailrl show`` / ``sailrl plot`` pick them up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import tinker
import torch
from rich.console import Console
from rich.markup import escape
from tinker_cookbook.rl.metrics import compute_kl_sample_train
from tinker_cookbook.rl.types import TrajectoryGroup

from sailrl.runtime.backends.backend import local_checkpoint_dir
from sailrl.runtime.loop import report
from sailrl.runtime.loop.collapse import collapse_warning
from sailrl.runtime.loop.console import RunConsole
from sailrl.runtime.loop.errors import AllDegenerateError, OnPolicyMismatch
from sailrl.runtime.loop.gaming import GamingWatch
from sailrl.runtime.planning.cost import CostModel
from sailrl.runtime.rollouts.rollout import RolloutBatch
from sailrl.runtime.rundir.directory import RunDirectory
from sailrl.runtime.rundir.rollout_log import RolloutLog
from sailrl.spec.schema import SamplingSpec, Spec

__all__ = ["Records", "StepRecord", "Streaks", "check_on_policy"]


class Streaks:
    """Conditions that hold over consecutive steps (most completions cut at max_tokens, steps skipped for want of
    a gradient): each is said when its streak starts and summed up once, with its length, when it ends or the run
    does, so a condition that lasts 66 steps takes two lines, not 66. A streak of one step has nothing to add at
    its end."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self._open: dict[str, list[Any]] = {}  # key -> [first step, last step, what the closing line says held]

    def step(self, step: int, found: dict[str, tuple[str, str]]) -> None:
        """The conditions that hold at ``step``: key -> (the warning that starts a streak, what held, for the
        line that ends it). A streak whose key is missing ends here (at the step before)."""
        for key in [k for k in self._open if k not in found]:
            self._close(key, at_end=False)
        for key, (start, held) in found.items():
            if key in self._open:
                self._open[key][1] = step
            else:
                self._open[key] = [step, step, held]
                self.console.print(f"[yellow]{escape(start)}[/yellow]")

    def end(self) -> None:
        """The run's end: sum up the streaks still open (once; a second call finds none)."""
        for key in list(self._open):
            self._close(key, at_end=True)

    def _close(self, key: str, *, at_end: bool) -> None:
        first, last, held = self._open.pop(key)
        if last > first:
            until = ", until the run's end" if at_end else ""
            self.console.print(f"[yellow]steps {first}-{last}: {escape(held)} ({last - first + 1} steps{until})"
                               "[/yellow]")


@dataclass
class StepRecord:
    """What one step has logged so far (written whole by :meth:`Records.end_step`)."""

    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    rollouts: list[tuple[str, RolloutBatch, list[Any] | None, list[bool] | None]] = field(default_factory=list)
    rule_errors: dict[str, tuple[int, str]] = field(default_factory=dict)  # rule -> (completions, first why)


class Records:
    """Metrics, rollout log, console, tokens and cost of one run (``run.records``)."""

    def __init__(self, *, spec: Spec, run_dir: RunDirectory, rule_names: Sequence[str], tokenizer: Any,
                 console: RunConsole, is_local: bool, cost: CostModel, rollout_log: RolloutLog | None,
                 completed: int, wandb_run: Any = None, said_at_start: Sequence[str] = ()) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.rule_names = list(rule_names)
        self.tokenizer = tokenizer
        self.console = console
        self.is_local = is_local
        self.cost = cost
        self.rollout_log = rollout_log
        self.wandb_run = wandb_run
        self.completed = completed
        # rules whose failure the run's start already said in one line (a judge that could not be connected): their
        # failures are counted each step (judge/failed) but not said again
        self.said_at_start = set(said_at_start)
        self.history: list[dict[str, Any]] = run_dir.read_metrics()
        self._steps: dict[int, StepRecord] = {}
        self._started: dict[int, float] = {}
        self.streaks = Streaks(console)
        # reward gaming: a rule climbing while correctness does not, or passed by degenerate replies (gaming.jsonl)
        reward = spec.reward  # None: a distillation without reward rules, nothing to game
        self.gaming = GamingWatch(reward.rules if reward else [], reward.default_correct_rule() if reward else None,
                                  run_dir.path)

    def step(self, step: int) -> StepRecord:
        """``step``'s record (created on first use)."""
        return self._steps.setdefault(step, StepRecord())

    def timings(self, step: int) -> dict[str, float]:
        """``step``'s phase timings (``time/<phase>`` seconds)."""
        return self.step(step).timings

    def start(self, step: int) -> None:
        """Start ``step``'s clock (``time/step``)."""
        self._started[step] = time.perf_counter()

    def add(self, step: int, metrics: dict[str, float]) -> None:
        """Add ``metrics`` to ``step``'s metrics line."""
        self.step(step).metrics.update(metrics)

    # ------------------------------------------------------------------ what a step logs
    def rollouts(self, step: int, batch: RolloutBatch, groups: Sequence[TrajectoryGroup],
                 advantages: Sequence[Any], *, stale: int = 0) -> None:
        """Log ``step``'s rollouts: per-rule means over every group (degenerate ones included), the degenerate
        fraction, tokens, staleness, and the rollout log lines (written with the step's metrics at its end).

        ``groups`` / ``advantages``: the groups that train and their advantages (one tensor per group).
        """
        rec = self.step(step)
        kept = {id(g): a for g, a in zip(groups, advantages, strict=True)}
        rec.metrics.update(report.rollout_metrics(batch.groups, len(batch.failed), self.rule_names))
        rec.metrics.update({k: v for k, v in batch.extra_metrics.items() if k not in report.JUDGE_TOKEN_KEYS})
        report.add_judge_tokens(rec.metrics, batch.extra_metrics)  # eval's judge tokens may be there already
        n = len(batch.groups)
        rec.metrics["degenerate_frac"] = (n - len(groups) - stale) / n if n else float("nan")
        prompt, sampled = report.sampled_tokens(batch.groups)
        rec.metrics["tokens/prompt"] = float(prompt)
        rec.metrics["tokens/sampled"] = float(sampled)
        rec.timings.setdefault("time/rollout", round(getattr(batch, "seconds", 0.0), 4))
        staleness = [step - s for s in batch.sampler_steps]
        k = self.spec.training.max_steps_off_policy
        rec.metrics["off_policy_k"] = float(k)  # 0: synchronous
        if k > 0:
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

    def eval_rollouts(self, step: int, batch: RolloutBatch) -> None:
        """Log the held-out rows' rollouts: metrics under ``eval/``, rollouts logged as ``eval``."""
        rec = self.step(step)
        rec.timings["time/eval"] = round(batch.seconds, 4)
        rec.metrics.update(report.rollout_metrics(batch.groups, len(batch.failed), self.rule_names, prefix="eval/"))
        prompt, sampled = report.sampled_tokens(batch.groups)
        rec.metrics["tokens/eval_prompt"] = float(prompt)
        rec.metrics["tokens/eval_sampled"] = float(sampled)
        report.add_judge_tokens(rec.metrics, batch.extra_metrics)  # judge rules judged the eval rollouts too
        for key in ("judge/failed", "judge/unparsed"):
            if key in batch.extra_metrics:
                rec.metrics[f"eval/{key}"] = batch.extra_metrics[key]
        rec.rollouts.append(("eval", batch, None, None))

    def kl_penalty(self, step: int, data: Sequence[tinker.Datum], metrics: dict[str, float]) -> None:
        """Log the KL penalty's metrics (``kl_policy_base``) and ``tokens/reference``: every token of each datum's
        full sequence, which the base model scored (``compute_logprobs``; billed as prefill on Tinker)."""
        rec = self.step(step)
        rec.metrics.update(metrics)
        rec.metrics["tokens/reference"] = float(report.token_counts(data) + len(data))

    def update(self, step: int, data: list[tinker.Datum], results: Sequence[tuple[Any, Any]],
               learning_rate: float) -> None:
        """Log an update: loss, datums, optimizer metrics, tokens trained, the learning rate, and the
        sampler-vs-learner KL (checked against ``sampling.on_policy_kl_threshold`` at the step's end)."""
        rec = self.step(step)
        rec.metrics.update(update_metrics(data, results))
        rec.metrics["tokens/trained"] = float(report.token_counts(data))
        rec.metrics["learning_rate"] = learning_rate

    def skipped_step(self, step: int) -> None:
        """A step whose groups were all degenerate: no update (said when a streak of them starts and ends, by
        :meth:`end_step`). Raises :class:`AllDegenerateError` when the spec says ``training.on_all_degenerate:
        stop``."""
        rec = self.step(step)
        rec.metrics["skipped"] = 1.0
        rec.metrics["datums"] = 0.0
        if self.spec.training.on_all_degenerate == "stop":
            self.end_step(step)
            raise AllDegenerateError(
                f"step {step}: every group scored the same reward ({rec.metrics.get('reward/total')}); nothing to "
                "learn from. training.on_all_degenerate is 'stop'. Raise group_size or temperature, or check the "
                "reward rules with `sailrl preflight --sample`.")

    # ------------------------------------------------------------------ end of a step
    def end_step(self, step: int) -> None:
        """Write ``step``'s metrics line and rollouts, print its line, and check it was sampled on policy."""
        rec = self._steps.pop(step, StepRecord())
        m = rec.metrics
        if not self.history:  # the first step's line also carries the supervised warm-up's tokens
            m["tokens/warmup_trained"] = float(sum(r.get("tokens", 0) for r in self.run_dir.read_warmup()))
        for kind in report.TOKEN_KINDS:  # the kinds this run has used so far
            prev = (self.history[-1].get(f"tokens_cum/{kind}") if self.history else None) or 0.0
            if prev or m.get(f"tokens/{kind}"):
                m.setdefault(f"tokens/{kind}", 0.0)
                m[f"tokens_cum/{kind}"] = float(prev + m[f"tokens/{kind}"])
        m.update(self.cost.step_cost(m))
        m.setdefault("learning_rate", self.spec.training.learning_rate)
        if step in self._started:
            rec.timings["time/step"] = round(time.perf_counter() - self._started.pop(step), 4)
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
        self.console.result(report.step_line(step, self.spec.training.steps, m, self.rule_names, seconds,
                                             show_cost=not self.is_local))
        self._warn(step, m, rec)
        train_groups = [g for kind, batch, _, _ in rec.rollouts if kind == "train" for g in batch.groups]
        collapse = collapse_warning(step, self.history, train_groups, self.tokenizer, run_dir=str(self.run_dir.path))
        if collapse is not None:
            self.console.print(f"[yellow]warning: {escape(collapse)}[/yellow]")  # model text, not markup
        for gamed in self.gaming.observe(step, self.history, train_groups):
            self.console.print(f"[yellow]warning: {escape(gamed)}[/yellow]")
        check_on_policy(step, m, self.spec.sampling, self.console)

    def _warn(self, step: int, m: dict[str, Any], rec: StepRecord) -> None:
        rollouts = sum(len(g.trajectories_G) for kind, batch, _, _ in rec.rollouts if kind == "train"
                       for g in batch.groups)
        for rule, (count, why) in rec.rule_errors.items():
            if rule in self.said_at_start:
                continue
            self.console.print(
                f"[yellow]warning: step {step}: rule '{rule}' could not be scored on {count} of {rollouts} "
                f"completions (it counts as failed): {why}; `sailrl show {self.run_dir.path} --rule {rule}` shows "
                "them[/yellow]")
        if m.get("regex_timeouts"):
            self.console.print(
                f"[yellow]warning: step {step}: {int(m['regex_timeouts'])} regex time-outs (reward.regex_timeout_s "
                f"{self.spec.reward.regex_timeout_s:g} s): the pattern fails on those completions[/yellow]")
        streaks: dict[str, tuple[str, str]] = {}
        if m.get("skipped") and self.spec.training.on_all_degenerate == "skip":
            streaks["skipped"] = (f"step {step}: every group was degenerate (same reward within each group): no "
                                  "gradient, step skipped", "every group was degenerate, no gradient: steps skipped")
        if m.get("sampling/short"):  # dynamic sampling spent max_extra_groups without filling the step
            streaks["short"] = (
                f"step {step}: after {int(m.get('sampling/extra_groups') or 0)} extra groups "
                f"(training.dynamic_sampling.max_extra_groups) the step still lacked {int(m['sampling/short'])} of "
                "groups_per_step groups with signal; it trains on the ones it has. Raise max_extra_groups, or "
                "group_size or temperature for more varied groups",
                "dynamic sampling spent max_extra_groups before the step had groups_per_step groups with signal")
        if (m.get("frac_truncated") or 0) > 0.5:
            max_tokens = self.spec.sampling.max_tokens
            streaks["truncated"] = (
                f"warning: step {step}: {100 * m['frac_truncated']:.0f}% of completions were cut at "
                f"max_tokens={max_tokens}; raise sampling.max_tokens or ask for shorter answers in the prompt",
                f"over half the completions were cut at max_tokens={max_tokens}")
        self.streaks.step(step, streaks)

    # ------------------------------------------------------------------ the end of the run
    def summary(self, final_state: str | None) -> str:
        """First-vs-last reward and ``correct``, tokens and cost, the run directory and the final adapter; closes
        the wandb run. A warning whose streak lasts to the end is summed up first."""
        self.streaks.end()
        lines = report.summary_lines(self.history, show_cost=not self.is_local)
        lines.append(f"run directory: {self.run_dir.path}")
        if final_state:
            lines.append(f"final state: {final_state}")
        sampler = self.run_dir.last_sampler_path()
        if sampler:
            lines.append(f"final adapter: {sampler}")
            if self.is_local:
                # lazy: sailrl.runtime.backends.local loads torch; only a local run (which has loaded it) gets here
                from sailrl.runtime.backends.local.weights.checkpoints import LocalPath

                p = LocalPath.parse(sampler)
                lines.append(f"  (a PEFT adapter directory: {local_checkpoint_dir() / p.run_id / p.kind / p.name})")
        if self.wandb_run is not None:
            self.wandb_run.finish()
        return "\n".join(lines)


def check_on_policy(step: int, m: dict[str, Any], s: SamplingSpec, console: Console) -> None:
    """Warn (or, with ``sampling.on_policy_mismatch: stop``, raise :class:`OnPolicyMismatch`) when an on-policy
    step's sampler-vs-learner KL estimate is above ``sampling.on_policy_kl_threshold``."""
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
    console.print(f"[yellow]warning: {message}[/yellow]")


def update_metrics(data: Sequence[tinker.Datum], results: Sequence[tuple[Any, Any]]) -> dict[str, float]:
    """Metrics of one update: ``loss:sum`` (summed over sub-batches), ``datums``, the last ``optim_step``'s metrics
    under ``optim/``, and tinker_cookbook's sampler-vs-learner KL (``optim/kl_sample_train_v1``, ``_v2``,
    ``optim/entropy``), computed from the learner's logprobs that ``forward_backward`` returned.

    ``data``: the datums as assembled (with ``mask``). ``results``: ``(ForwardBackwardOutput, OptimStepResponse)``
    per sub-batch, in order.
    """
    loss = 0.0
    train_logprobs: list[torch.Tensor] = []
    optim: dict[str, float] = {}
    for fb, opt in results:
        loss += float((fb.metrics or {}).get("loss:sum", 0.0))
        train_logprobs += [o["logprobs"].to_torch() for o in fb.loss_fn_outputs]
        optim = {f"optim/{k}": float(v) for k, v in (getattr(opt, "metrics", None) or {}).items()}
    out = {"loss:sum": loss, "datums": float(len(data)), **optim}
    if data and len(train_logprobs) == len(data) and all("mask" in d.loss_fn_inputs for d in data):
        kl = compute_kl_sample_train(list(data), train_logprobs)
        out.update({k: v for k, v in kl.items() if math.isfinite(v)})
    return out
