"""The RL loop every generated script runs: the Sail guide's five moves per step, made robust.

Each step (``shared/seeds/000_ae89c72fb71d9d8c.txt``, "How one step fits together"):

1. **Snapshot** the current LoRA weights as a sampler checkpoint (``save_weights_for_sampler`` with a TTL).
2. **Resolve** it to a policy: on Sail a signed checkpoint URL wrapped in an adaptive-polling Sail completer;
   on Tinker or the local backend a sampling client for that checkpoint.
3. **Roll out** ``groups_per_step`` groups of ``group_size`` rollouts concurrently.
4. **Score** with the spec's reward rules; degenerate groups (every sample scored the same: zero advantage, no
   gradient) are dropped and counted; group-centred advantages; training data.
5. **Train**: ``forward_backward`` and ``optim_step`` submitted together so they share a clock cycle (as
   tinker_cookbook's ``rl.train.train_step`` does), with the spec's Adam parameters.

What this adds to the guide: a step where every group is degenerate is skipped with a warning (or stops the run,
``training.on_all_degenerate: stop``) instead of raising; failed groups are dropped and counted; metrics go to
``metrics.jsonl`` every step; resumable state is saved every ``save_every`` steps and on Ctrl-C; ``--resume``
continues at the next step with optimizer state and the same data order.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tinker
from tinker_cookbook import checkpoint_utils
from tinker_cookbook.rl.data_processing import assemble_training_data, compute_advantages
from tinker_cookbook.rl.types import TrajectoryGroup

from sailrl import __version__
from sailrl.runtime.backends import Backend, check_keys, open_backend
from sailrl.runtime.rollout import RolloutBatch, RuleGroupBuilder, SamplingPolicy, rollout_groups
from sailrl.runtime.rundir import RunDirectory
from sailrl.spec.schema import Spec

DEFAULT_LOSS_FN_CONFIG: dict[str, dict[str, float]] = {
    # Tinker loss doc: ppo / cispo clip the ratio to [1 - 0.2, 1 + 0.2]; dro's example uses beta 0.05.
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.05},
    "importance_sampling": {},
}


class RunError(RuntimeError):
    """A service or backend fault, with the step and phase it happened in."""


class AllDegenerateError(RunError):
    """Every group of a step scored the same and the spec says ``on_all_degenerate: stop``."""


@contextlib.contextmanager
def phase(step: int, name: str, timings: dict[str, float]):
    """Time a phase into ``timings['time/<name>']`` (seconds); re-raise faults naming step and phase."""
    t0 = time.perf_counter()
    try:
        yield
    except (KeyboardInterrupt, asyncio.CancelledError, RunError):
        raise
    except Exception as exc:  # a Tinker / Sail / backend fault: say where it happened
        raise RunError(f"step {step}, phase '{name}': {type(exc).__name__}: {exc}") from exc
    finally:
        timings[f"time/{name}"] = round(time.perf_counter() - t0, 4)


def split_degenerate(groups: list[TrajectoryGroup]) -> tuple[list[TrajectoryGroup], list[TrajectoryGroup]]:
    """(kept, degenerate): a group is degenerate when every rollout's total reward is the same.

    Its group-centred advantages are then all zero, so it carries no gradient.
    """
    kept, degenerate = [], []
    for g in groups:
        rewards = [float(r) for r in g.get_total_rewards()]
        (degenerate if rewards and len(set(rewards)) == 1 else kept).append(g)
    return kept, degenerate


def rollout_metrics(batch: RolloutBatch, rule_names: list[str], prefix: str = "") -> dict[str, float]:
    """Per-step means over every rollout of the step (degenerate groups included).

    Keys: ``reward/total``, ``reward/<rule>`` (mean contribution), ``correct`` (pass rate of the answer rule),
    ``frac_truncated``, ``tokens_sampled``, ``regex_timeouts``, ``groups``, ``groups_failed``.
    """
    totals: list[float] = []
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    tokens = 0
    for g in batch.groups:
        for traj, total in zip(g.trajectories_G, g.get_total_rewards(), strict=True):
            totals.append(float(total))
            for tr in traj.transitions:
                tokens += len(tr.ac.tokens)
                for k, v in tr.metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                    counts[k] = counts.get(k, 0) + 1
    n = len(totals)
    out: dict[str, float] = {
        "reward/total": sum(totals) / n if n else float("nan"),
        "groups": float(len(batch.groups)),
        "groups_failed": float(len(batch.failed)),
        "tokens_sampled": float(tokens),
    }
    for name in rule_names:
        key = f"reward/{name}"
        out[key] = sums[key] / counts[key] if counts.get(key) else float("nan")
    if counts.get("correct"):
        out["correct"] = sums["correct"] / counts["correct"]
    out["frac_truncated"] = sums.get("truncated", 0.0) / n if n else float("nan")
    out["regex_timeouts"] = sums.get("regex_timeouts", 0.0)
    return {f"{prefix}{k}": v for k, v in out.items()}


async def train_on(training_client: Any, data: list[tinker.Datum], *, adam: tinker.AdamParams, loss_fn: str,
                   loss_fn_config: dict[str, float] | None, num_substeps: int) -> dict[str, float]:
    """forward_backward + optim_step per sub-batch, each pair submitted before either result is awaited.

    Mirrors tinker_cookbook ``rl.train.train_step`` (same clock-cycle pipelining) but takes the spec's full
    ``AdamParams`` (that helper hard-codes beta/eps). Returns ``loss:sum``, ``datums``, the last optimizer
    step's metrics under ``optim/`` and tinker_cookbook's sampler-vs-learner KL (``optim/kl_sample_train_v1``,
    ``_v2``, ``optim/entropy``): near 0 when the sampler (Sail) serves the weights Tinker trains.
    """
    from tinker_cookbook.rl.metrics import compute_kl_sample_train
    from tinker_cookbook.utils.misc_utils import split_list

    sent = [tinker.Datum(model_input=d.model_input,
                         loss_fn_inputs={k: v for k, v in d.loss_fn_inputs.items() if k != "mask"}) for d in data]
    batches = split_list(sent, max(1, min(num_substeps, len(sent))))
    pending = []
    for b in batches:
        fb = await training_client.forward_backward_async(b, loss_fn=loss_fn, loss_fn_config=loss_fn_config)
        opt = await training_client.optim_step_async(adam)
        pending.append((fb, opt))
    loss = 0.0
    train_logprobs = []
    optim_metrics: dict[str, float] = {}
    for fb, opt in pending:
        out = await fb.result_async()
        result = await opt.result_async()
        loss += float((out.metrics or {}).get("loss:sum", 0.0))
        train_logprobs += [o["logprobs"].to_torch() for o in out.loss_fn_outputs]
        optim_metrics = {f"optim/{k}": float(v) for k, v in (getattr(result, "metrics", None) or {}).items()}
    metrics = {"loss:sum": loss, "datums": float(len(sent)), **optim_metrics}
    if all("mask" in d.loss_fn_inputs for d in data) and len(train_logprobs) == len(data):
        metrics.update(compute_kl_sample_train(data, train_logprobs))
    return metrics


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


@dataclass
class RLRun:
    """State shared by the steps of one run. Build it with :meth:`start`."""

    spec: Spec
    spec_path: str
    run_dir: RunDirectory
    backend: Backend
    training_client: Any
    tokenizer: Any
    renderer: Any
    reward_fn: Any
    prompts: Any
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]]
    start_step: int
    adam: tinker.AdamParams
    loss_fn_config: dict[str, float] | None
    console: Any
    history: list[dict[str, Any]] = field(default_factory=list)
    wandb_run: Any = None
    completed: int = 0
    run_id: str = ""
    lora_rank: int = 0
    _pending_train: Any = None
    _progress: Any = None
    _model_inputs: dict[int, tuple[Any, list]] = field(default_factory=dict)

    # ---------------------------------------------------------------- setup
    @classmethod
    async def start(cls, spec: Spec, *, spec_path: str, spec_dir: Path, spec_sha256: str, resume: bool = False,
                    overrides: list[str] | None = None, overwrite: bool = False) -> RLRun:
        """Open the run directory, the backend, the data and the training client.

        Raises ``FileExistsError`` when the run directory already has metrics and neither ``resume`` nor
        ``overwrite`` is set (``overwrite`` clears the old run's records first),
        :class:`~sailrl.runtime.backends.BackendError` on a missing API key, ``DatasetError`` on unusable data.
        """
        from rich.console import Console

        from sailrl.runtime.data import load_rows
        from sailrl.runtime.models import get_renderer, get_tokenizer
        from sailrl.runtime.prompts import PromptBuilder
        from sailrl.runtime.rewards import RewardFunction
        from sailrl.spec.renderers import default_renderer

        console = Console(stderr=True, soft_wrap=True)
        run_dir = RunDirectory(spec.output.run_dir.replace("{name}", spec.name))
        resolved = spec.resolved()
        if resume:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                changes = run_dir.check_resume_config(resolved, spec_sha256)
            if changes:
                console.print("[yellow]warning: resuming with a spec that differs from the one this run started "
                              "with:[/yellow]\n  " + "\n  ".join(changes))
            if not run_dir.has_metrics() and run_dir.last_state() is None:
                console.print(f"[yellow]nothing to resume in {run_dir.path}: starting a new run[/yellow]")
        elif run_dir.has_metrics() and overwrite:
            run_dir.clear_records()
        elif run_dir.has_metrics():
            raise FileExistsError(
                f"{run_dir.path} already holds a run ({len(run_dir.read_metrics())} steps logged). Continue it "
                "with --resume, start it over with --overwrite, or set output.run_dir to a new directory."
            )
        sampler = spec.sampling.sampler
        if sampler != "local":
            check_keys(sampler, spec_path)  # a missing key is one line, before anything else happens
            console.print(f"connecting to Tinker ({os.environ.get('TINKER_BASE_URL') or 'default endpoint'}) ...")
        backend = open_backend(spec, sampler=sampler, spec_path=spec_path)
        service = backend.service_client
        old_config = run_dir.read_config() if resume else None
        run_id = (old_config or {}).get("run_id") or uuid.uuid4().hex[:8]  # names this run's Sail adapters
        run_dir.write_config(resolved, spec_sha256, {"sailrl_version": __version__, "spec_path": spec_path,
                                                     "run_id": run_id,
                                                     "overrides": list(overrides or [])})

        # Training client: resume (state + optimizer) > spec resume_from > init_from (weights only) > fresh LoRA.
        start_step = 0
        state = run_dir.last_state() if resume else None
        resume_path = (state or {}).get("state_path") or spec.training.resume_from
        if resume and state is None and spec.training.resume_from is None and run_dir.has_metrics():
            console.print(f"[yellow]no saved state in {run_dir.path} yet; starting again from step 0[/yellow]")
        m = spec.model
        if resume_path:
            training_client = await service.create_training_client_from_state_with_optimizer_async(resume_path)
            start_step = int((state or {}).get("batch", 0))
            if start_step >= spec.training.steps:
                raise RunError(f"this run already completed {start_step} steps (training.steps is "
                               f"{spec.training.steps}); raise training.steps to train further")
            console.print(f"resuming from {resume_path} at step {start_step}")
        else:
            training_client = await service.create_lora_training_client_async(
                base_model=m.name, rank=m.lora_rank, seed=m.seed, train_mlp=m.train_mlp, train_attn=m.train_attn,
                train_unembed=m.train_unembed)
            if spec.training.init_from:
                await (await training_client.load_state_async(spec.training.init_from)).result_async()
        if resume:
            run_dir.truncate_metrics(start_step)
        lora_rank = m.lora_rank
        if resume_path:  # the checkpoint decides the adapter's shape, whatever the spec now says
            info = await training_client.get_info_async()
            if getattr(info, "lora_rank", None) and info.lora_rank != m.lora_rank:
                console.print(f"[yellow]the checkpoint's LoRA rank is {info.lora_rank}, the spec says "
                              f"{m.lora_rank}: training and sampling use {info.lora_rank}[/yellow]")
                lora_rank = int(info.lora_rank)

        tokenizer = get_tokenizer(m.name) if not backend.is_local else training_client.get_tokenizer()
        renderer = get_renderer(m.renderer or default_renderer(m.name), tokenizer)
        reward_fn = RewardFunction.from_spec(spec.reward, reference_field=spec.prompt.reference_field)
        rows = load_rows(spec, spec_dir, reward_fn=reward_fn)
        if rows.skipped:
            console.print(f"[yellow]skipped {len(rows.skipped)} dataset rows (first: row {rows.skipped[0].index}: "
                          f"{rows.skipped[0].reason}); see `sailrl preflight` for all[/yellow]")
        prompts = PromptBuilder(spec.prompt, renderer)
        t = spec.training
        adam = tinker.AdamParams(learning_rate=t.learning_rate, beta1=t.beta1, beta2=t.beta2, eps=t.eps)
        loss_cfg = {**DEFAULT_LOSS_FN_CONFIG[t.loss_fn], **(t.loss_fn_config or {})} or None
        run = cls(spec=spec, spec_path=spec_path, run_dir=run_dir, backend=backend, training_client=training_client,
                  tokenizer=tokenizer, renderer=renderer, reward_fn=reward_fn, prompts=prompts,
                  train_rows=rows.train, eval_rows=rows.eval, start_step=start_step, adam=adam,
                  loss_fn_config=loss_cfg, console=console)
        run.history = run_dir.read_metrics()
        run.completed = start_step
        run.run_id = run_id
        run.lora_rank = lora_rank
        if t.loss_fn == "dro":
            console.print("[yellow]note: loss_fn dro applies its quadratic penalty to every position the data "
                          "carries, prompt tokens included, and uses the group-centred advantages; the Tinker "
                          "loss doc asks for DRO's own soft advantage estimate, which sailrl does not compute "
                          "yet. importance_sampling, ppo and cispo have no such caveat.[/yellow]")
        run.wandb_run = _open_wandb(spec, resolved, console)
        if start_step == 0 and not resume_path and t.warmup and t.warmup.steps > 0:
            await run.warmup()
        return run

    # ---------------------------------------------------------------- supervised warm-up
    async def warmup(self) -> None:
        """Supervised warm-up: ``cross_entropy`` on the rendered reference completions (Tinker's SL path).

        Logs ``warmup.jsonl`` (step, loss per token). Uses the same data order function as RL.
        """
        from sailrl.runtime.data import rows_for_step, shuffle_seed

        w = self.spec.training.warmup
        completion = w.completion or "{{ " + self.spec.prompt.reference_field + " }}"
        adam = tinker.AdamParams(learning_rate=w.learning_rate, beta1=self.adam.beta1, beta2=self.adam.beta2,
                                 eps=self.adam.eps)
        seed = shuffle_seed(self.spec) + 7919  # its own order, independent of the RL steps'
        for i in range(w.steps):
            rows = rows_for_step(self.train_rows, i, w.batch_size, seed, reshuffle=self.spec.dataset.shuffle)
            data = []
            for row in rows:
                data.append(self.prompts.supervised_datum(row, completion))
            fb = await self.training_client.forward_backward_async(data, loss_fn="cross_entropy")
            opt = await self.training_client.optim_step_async(adam)
            out = await fb.result_async()
            await opt.result_async()
            n_tok = sum(float(sum(d.loss_fn_inputs["weights"].tolist())) for d in data)
            loss = float(out.metrics.get("loss:sum", 0.0)) / max(n_tok, 1.0)
            self.run_dir.append_jsonl("warmup.jsonl", {"step": i, "loss_per_token": loss})
            if i % 10 == 0 or i == w.steps - 1:
                self.console.print(f"warm-up {i + 1:4d}/{w.steps} | cross_entropy/token {loss:.3f}")

    # ---------------------------------------------------------------- the five moves
    def steps(self):
        """The steps still to run, with a rich progress bar (reward of the last step in its description)."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        total = self.spec.training.steps
        columns = (TextColumn("[bold]RL[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            task = progress.add_task("", total=total, completed=self.start_step)
            self._progress = (progress, task)
            try:
                for step in range(self.start_step, total):
                    yield step
                    last = self.history[-1].get("reward/total") if self.history else None
                    progress.update(task, advance=1, description=f"reward {last:+.3f}" if last is not None else "")
            finally:
                self._progress = None

    def batch(self, step: int) -> list[dict[str, Any]]:
        """The rows of ``step``: a deterministic function of (seed, step), the same after a resume."""
        from sailrl.runtime.data import rows_for_step, shuffle_seed

        return rows_for_step(self.train_rows, step, self.spec.training.groups_per_step, shuffle_seed(self.spec),
                             reshuffle=self.spec.dataset.shuffle)

    async def save_sampler_checkpoint(self, step: int, timings: dict[str, float]) -> str:
        """Move 1: snapshot the LoRA weights as a sampler checkpoint that expires after ``checkpoint_ttl_s``."""
        with phase(step, "snapshot", timings):
            fut = await self.training_client.save_weights_for_sampler_async(
                f"{self.spec.name}-step-{step:06d}", ttl_seconds=self.spec.training.checkpoint_ttl_s)
            return (await fut.result_async()).path

    async def policy_for(self, sampler_path: str, step: int, timings: dict[str, float]):
        """Move 2: resolve the checkpoint into a TokenCompleter."""
        s = self.spec.sampling
        with phase(step, "resolve", timings):
            if self.backend.sampler == "sail":
                from sailrl.runtime.sail_adapter import (
                    adapter_config_for,
                    make_sail_policy,
                    signed_checkpoint_url,
                )

                url = await signed_checkpoint_url(self.backend.service_client, sampler_path,
                                                  ttl_seconds=self.spec.training.checkpoint_ttl_s)
                m = self.spec.model
                return make_sail_policy(
                    model=m.name, signed_url=url,
                    adapter_config=adapter_config_for(m.name, self.lora_rank or m.lora_rank, train_attn=m.train_attn,
                                                      train_mlp=m.train_mlp, train_unembed=m.train_unembed),
                    lora_name=f"{self.spec.name}-{self.run_id}-step-{step:06d}", max_tokens=s.max_tokens,
                    temperature=s.temperature, top_p=s.top_p, completion_window=s.completion_window)
            client = await self.backend.service_client.create_sampling_client_async(model_path=sampler_path)
            # Seeded per step (model.seed): the local backend then samples the same rollouts on every run.
            seed = (self.spec.model.seed * 1_000_003 + step * 100_003) % (2**31) if self.backend.is_local else None
            return SamplingPolicy(client, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                                  seed=seed)

    def _builder(self, row: dict[str, Any], group_size: int) -> RuleGroupBuilder:
        key = int(row.get("_index", id(row)))
        if key not in self._model_inputs:
            stop = self.spec.sampling.stop or self.prompts.stop_sequences()
            self._model_inputs[key] = (self.prompts.model_input(row), stop)
        model_input, stop = self._model_inputs[key]
        return RuleGroupBuilder(row=row, model_input=model_input, stop=stop, renderer=self.renderer,
                                reward_fn=self.reward_fn, group_size=group_size)

    async def rollout(self, policy, rows: list[dict[str, Any]], step: int, timings: dict[str, float],
                      group_size: int | None = None) -> RolloutBatch:
        """Move 3: every rollout of every group, concurrently. Failed groups are dropped and counted."""
        gs = group_size or self.spec.training.group_size
        with phase(step, "rollout", timings):
            batch = await rollout_groups(policy, [self._builder(r, gs) for r in rows])
        stats = getattr(policy, "stats", None)  # the Sail completer counts polls, retries and failures
        batch.extra_metrics = stats.as_metrics() if stats is not None else {}
        return batch

    def assemble(self, batch: RolloutBatch, step: int) -> tuple[list[tinker.Datum], dict[str, float]]:
        """Move 4: score -> drop degenerate groups -> group-centred advantages -> training data.

        Raises :class:`RunError` when every group of the step failed (nothing was sampled: a service fault, not a
        degenerate batch), quoting the first failures.
        """
        if batch.failed:
            first = batch.failed[0]
            self.console.print(f"[yellow]step {step + 1}: {len(batch.failed)} group(s) failed and were dropped "
                               f"(row {first[0]}: {first[1]})[/yellow]")
        if not batch.groups and batch.failed:
            reasons = "; ".join(f"row {i}: {why}" for i, why in batch.failed[:3])
            raise RunError(f"step {step}, phase 'rollout': every group failed ({len(batch.failed)}): {reasons}")
        timings: dict[str, float] = {}
        with phase(step, "assemble", timings):
            return self._assemble(batch)

    def _assemble(self, batch: RolloutBatch) -> tuple[list[tinker.Datum], dict[str, float]]:
        metrics = {**rollout_metrics(batch, self.reward_fn.rule_names), **batch.extra_metrics}
        kept, degenerate = split_degenerate(batch.groups)
        metrics["degenerate_frac"] = len(degenerate) / len(batch.groups) if batch.groups else float("nan")
        metrics["datums"] = 0.0
        if not kept:
            return [], metrics
        advantages = compute_advantages(kept)
        data, _ = assemble_training_data(kept, advantages)
        return data, metrics

    async def train(self, data: list[tinker.Datum], step: int, timings: dict[str, float],
                    metrics: dict[str, float]) -> None:
        """Move 5: one optimizer update per sub-step on the backend; its metrics are added to ``metrics``.

        Once submitted, an update lands on the backend even if the run is interrupted; the await is shielded and
        :meth:`save_on_interrupt` waits for it and logs the step, so a resumed run never applies it twice.
        """
        t = self.spec.training
        task = asyncio.ensure_future(train_on(self.training_client, data, adam=self.adam, loss_fn=t.loss_fn,
                                              loss_fn_config=self.loss_fn_config, num_substeps=t.num_substeps))
        self._pending_train = (step, task, metrics, timings)
        with phase(step, "train", timings):
            metrics.update(await asyncio.shield(task))
        self._pending_train = None

    # ---------------------------------------------------------------- bookkeeping
    async def evaluate(self, policy, step: int, timings: dict[str, float]) -> dict[str, float]:
        """Sample the held-out rows once each from the current checkpoint; metrics under ``eval/``."""
        if not self.eval_rows:
            return {}
        eval_timings: dict[str, float] = {}
        batch = await self.rollout(policy, self.eval_rows, step, eval_timings, group_size=1)
        timings["time/eval"] = eval_timings.get("time/rollout", 0.0)
        return rollout_metrics(batch, self.reward_fn.rule_names, prefix="eval/")

    def due(self, every: int, step: int) -> bool:
        return every > 0 and (step + 1) % every == 0

    async def save_state(self, completed_steps: int, *, final: bool = False, name: str | None = None) -> str:
        """``save_state`` (weights + optimizer) recorded in checkpoints.jsonl; ``batch`` = completed steps."""
        paths = await checkpoint_utils.save_checkpoint_async(
            self.training_client, name or f"{self.spec.name}-state-{completed_steps:06d}", str(self.run_dir.path),
            loop_state={"batch": completed_steps, **({"final": True} if final else {})}, kind="state")
        return paths["state_path"]

    def log_step(self, step: int, metrics: dict[str, float], timings: dict[str, float]) -> None:
        line = {"step": step, "learning_rate": self.spec.training.learning_rate, **metrics, **timings}
        line = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in line.items()}
        self.run_dir.append_metrics(line)
        self.history.append(line)
        self.completed = step + 1
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in line.items() if v is not None}, step=step)
        rules = "  ".join(f"{n} {metrics.get(f'reward/{n}', float('nan')):+.3f}" for n in self.reward_fn.rule_names)
        self.console.print(
            f"step {step + 1:4d}/{self.spec.training.steps} | reward {metrics.get('reward/total', float('nan')):+.3f}"
            f" | {rules} | degenerate {100 * (metrics.get('degenerate_frac') or 0):3.0f}%"
            f" | truncated {100 * (metrics.get('frac_truncated') or 0):3.0f}%"
            f" | {sum(timings.values()):.1f}s")
        if (metrics.get("frac_truncated") or 0) > 0.5:
            self.console.print(
                f"[yellow]warning: step {step + 1}: {100 * metrics['frac_truncated']:.0f}% of completions were cut "
                f"at max_tokens={self.spec.sampling.max_tokens}; raise sampling.max_tokens or ask for shorter "
                "answers in the prompt[/yellow]")

    async def save_on_interrupt(self) -> str:
        """Ctrl-C: let a submitted update land and log its step, then ``save_state`` and print how to resume."""
        from sailrl.runtime.script import resume_command

        if self._pending_train is not None:
            step, task, metrics, timings = self._pending_train
            self._pending_train = None
            try:
                metrics.update(await task)
                self.log_step(step, metrics, timings)
            except Exception as exc:  # the update failed: its step is simply not completed
                self.console.print(f"[yellow]the update of step {step + 1} did not finish: {exc}[/yellow]")
        path = await self.save_state(self.completed, name=f"{self.spec.name}-interrupted-{self.completed:06d}")
        self.console.print(f"interrupted after {self.completed} steps; state saved. Resume with:\n"
                           f"    {resume_command()}")
        return path

    async def save_after_failure(self, exc: BaseException) -> None:
        """Best effort after a fault: save what the completed steps trained, so ``--resume`` can continue."""
        if self.completed <= self.start_step:
            return
        try:
            await self.save_state(self.completed, name=f"{self.spec.name}-failed-{self.completed:06d}")
            self.console.print(f"state after {self.completed} steps saved; fix the cause, then resume with --resume")
        except Exception as save_exc:  # the backend may be the thing that failed
            self.console.print(f"[yellow]could not save state after the failure: {save_exc}[/yellow]")

    def handle_all_degenerate(self, step: int, metrics: dict[str, float]) -> None:
        metrics["skipped"] = 1.0
        if self.spec.training.on_all_degenerate == "stop":
            raise AllDegenerateError(
                f"step {step}: every group scored the same reward ({metrics.get('reward/total')}); nothing to learn "
                "from. training.on_all_degenerate is 'stop'. Raise group_size or temperature, or check the reward "
                "rules with `sailrl preflight --sample`.")
        self.console.print(f"[yellow]step {step}: every group was degenerate (same reward within each group): "
                           "no gradient, step skipped[/yellow]")

    def summary(self, final_state: str | None) -> str:
        """Reward first -> last (means of the first and last five logged steps), run dir, final adapter."""
        rewards = [m["reward/total"] for m in self.history if m.get("reward/total") is not None]
        k = min(5, len(rewards))
        first = sum(rewards[:k]) / k if k else float("nan")
        last = sum(rewards[-k:]) / k if k else float("nan")
        sampler = self.run_dir.last_sampler_path()
        lines = [
            f"reward (mean of first {k} steps -> last {k}): {first:+.3f} -> {last:+.3f}",
            f"run directory: {self.run_dir.path}",
        ]
        if final_state:
            lines.append(f"final state: {final_state}")
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

    async def save_final_adapter(self) -> str:
        paths = await checkpoint_utils.save_checkpoint_async(
            self.training_client, f"{self.spec.name}-final", str(self.run_dir.path),
            loop_state={"batch": self.spec.training.steps, "final": True}, kind="both")
        return paths["state_path"]
