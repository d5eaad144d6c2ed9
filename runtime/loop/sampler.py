"""The policy and its rollouts: sampler checkpoints, the policy for one, a step's rows and its scored rollouts.

:class:`Sampler` is ``run.sampler`` in a generated script: ``save_checkpoint`` / ``submit_checkpoint`` (the
snapshot), ``policy_for`` (Sail: a signed checkpoint URL in sailrl's adaptive Sail completer; Tinker or the local
backend: a sampling client), ``sample`` (every group of a step, started; ``run.rewards.score`` scores them, see
:mod:`sailrl.runtime.loop.rewarder`), ``rollout`` (both), ``wait_for``
(rollouts started earlier, off-policy), ``evaluate`` (the held-out rows) and ``reference_client`` (the base model,
for the KL penalty). Phase timings go to the step's record (:class:`sailrl.runtime.loop.records.Records`).

A step's rows: ``rows`` (``rows_for_step``: a function of the seed and the step), or with
``training.dynamic_sampling`` / ``training.difficulty_filter`` the next rows of the data order from a cursor
(:mod:`sailrl.runtime.loop.draws`): ``more_rows`` draws a step's shortfall of groups with signal, ``extend`` adds
the groups sampled for it to the step's batch, ``rest_rows`` rests the rows whose groups keep coming out
degenerate; their counts go to the step's metrics (``sampling/*``) and the cursor to each saved state.

:meth:`Sampler.group_builder` builds one group's tinker_cookbook ``EnvGroupBuilder``: single-turn rollouts, or with
``environment:`` episodes (``sailrl.runtime.rollouts.episode``; ``rollout_groups`` runs either).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from sailrl.runtime.backends.backend import Backend
from sailrl.runtime.data import rows_for_step, shuffle_seed
from sailrl.runtime.loop.draws import StepDraws, extend_batch
from sailrl.runtime.loop.errors import phase
from sailrl.runtime.loop.records import Records
from sailrl.runtime.loop.rewarder import Completions, Rewards, ScoreRequests
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rollouts.episode import episode_group_builder
from sailrl.runtime.rollouts.rollout import RolloutBatch, RuleGroupBuilder, SamplingPolicy, rollout_groups
from sailrl.spec.schema import Spec

__all__ = ["Policy", "Sampler"]


@dataclass
class Policy:
    """A rollout policy: a tinker_cookbook ``TokenCompleter`` over one sampler checkpoint.

    ``sampler_step``: the step whose snapshot it samples (the weights after ``sampler_step - 1`` updates).
    """

    completer: Any
    sampler_path: str
    sampler_step: int


class Sampler:
    """Sampler checkpoints, policies and rollouts of one run (``run.sampler``)."""

    def __init__(self, *, spec: Spec, backend: Backend, training_client: Any, tokenizer: Any, renderer: Any,
                 reward_fn: RewardFunction, prompts: PromptBuilder, train_rows: list[dict[str, Any]],
                 eval_rows: list[dict[str, Any]], run_id: str, lora_rank: int, records: Records,
                 tools: list[Any] | None = None, context_window: int | None = None) -> None:
        self.spec = spec
        self.backend = backend
        self.service_client = backend.service_client
        self.training_client = training_client
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.reward_fn = reward_fn
        self.prompts = prompts
        self.train_rows = train_rows
        self.eval_rows = eval_rows
        self.tools: list[Any] = list(tools or [])  # environment.tools, loaded (sailrl.runtime.rollouts.episode.build_tools)
        self.context_window = context_window  # an episode's token budget when environment.max_episode_tokens is unset
        self.run_id = run_id
        self.lora_rank = lora_rank
        self.records = records
        #: ``run.rewards``: the reward rules scoring what :meth:`sample` hands over
        self.rewards = Rewards(reward_fn, records)
        self._reference: Any = None
        self._model_inputs: dict[int, tuple[Any, list]] = {}
        #: step -> the sampler checkpoint path of its snapshot, for the last max_steps_off_policy steps (saved
        #: with the state, so a resumed off-policy run samples its first steps from them, as it would have)
        self.snapshots: dict[int, str] = {}
        self._resumed: dict[int, str] = {}
        self._resume_step = 0
        self._older: dict[int, Any] = {}
        #: a step's rows when they depend on the steps before it (dynamic sampling, the difficulty filter)
        self.draws = StepDraws.of(spec, train_rows, records)

    def resume_snapshots(self, start_step: int, state: dict[str, Any] | None) -> None:
        """After a resume at ``start_step``: the snapshots the saved state recorded (:meth:`saved_snapshots`),
        used when they were taken with this run's ``max_steps_off_policy``."""
        self._resume_step = start_step
        saved = (state or {}).get("off_policy_snapshots") or {}
        if not isinstance(saved, dict) or saved.get("k") != self.spec.training.max_steps_off_policy:
            return
        self._resumed = {int(k): str(v) for k, v in (saved.get("paths") or {}).items()}
        self.snapshots.update(self._resumed)

    def saved_snapshots(self, completed: int) -> dict[str, Any] | None:
        """What a state save after ``completed`` steps records for :meth:`resume_snapshots`: ``{"k": K, "paths":
        {step: path}}`` of the snapshots of the last K completed steps (None for a synchronous run)."""
        k = self.spec.training.max_steps_off_policy
        if k == 0:
            return None
        last = [step for step in sorted(self.snapshots) if step <= completed][-k:]
        return {"k": k, "paths": {str(step): self.snapshots[step] for step in last}}

    async def _as_it_would_have(self, policy: Policy, step: int) -> Policy:
        """The policy ``step`` samples from: ``policy``, except for the first steps after a resume of an
        off-policy run, which an uninterrupted run would have started ``max_steps_off_policy`` steps earlier, from
        the snapshot of step ``step - K``: that snapshot (recorded with the state) is used, so the resumed run
        repeats the uninterrupted one. A snapshot that cannot be opened again (expired) leaves ``policy``, said
        once."""
        k = self.spec.training.max_steps_off_policy
        source = max(1, step - k)
        if k == 0 or source >= self._resume_step or source not in self._resumed:
            return policy
        if source not in self._older:
            self._older[source] = asyncio.ensure_future(self.policy_for(self._resumed[source], source))
        try:
            return await self._older[source]
        except Exception as exc:  # noqa: BLE001 -- an expired or deleted checkpoint: sample from the newest
            self._resumed.pop(source, None)
            self.records.console.print(f"[yellow]step {step}: the snapshot of step {source} it would have sampled "
                                       f"from cannot be opened again ({type(exc).__name__}: {exc}); it samples "
                                       f"from the newest[/yellow]")
            return policy

    # ------------------------------------------------------------------ data
    def rows(self, step: int) -> list[dict[str, Any]]:
        """The dataset rows of ``step``: a deterministic function of (seed, step), the same after a resume. With
        dynamic sampling or the difficulty filter: the next ``groups_per_step`` rows of the data order that are not
        resting (:meth:`StepDraws.rows`: deterministic in the seed and the steps before; a saved state records
        the cursor)."""
        if self.draws is not None:
            return self.draws.rows(step)
        return rows_for_step(self.train_rows, step - 1, self.spec.training.groups_per_step, shuffle_seed(self.spec),
                             reshuffle=self.spec.dataset.shuffle)

    def more_rows(self, step: int, batch: RolloutBatch, max_extra_groups: int) -> list[dict[str, Any]]:
        """Dynamic sampling: the rows ``step`` draws next for the groups with signal it lacks
        (:meth:`StepDraws.more_rows`); ``[]`` when it has ``groups_per_step`` or ``max_extra_groups`` is spent."""
        assert self.draws is not None
        return self.draws.more_rows(step, batch, max_extra_groups)

    def rest_rows(self, step: int, batch: RolloutBatch, difficulty_filter: dict[str, Any]) -> list[int]:
        """The difficulty filter: rest the rows whose groups keep coming out degenerate
        (:meth:`StepDraws.rest_rows`)."""
        assert self.draws is not None
        return self.draws.rest_rows(step, batch, difficulty_filter)

    extend = staticmethod(extend_batch)

    def steps_to_sample(self, step: int, max_steps_off_policy: int, started: Any) -> list[int]:
        """Steps ``step .. step + max_steps_off_policy`` (within the run) whose rollouts have not started."""
        last = min(step + max_steps_off_policy, self.spec.training.steps)
        return [s for s in range(step, last + 1) if s not in started]

    # ------------------------------------------------------------------ 1. snapshot, 2. resolve
    async def save_checkpoint(self, step: int) -> str:
        """Save the current LoRA weights as a sampler checkpoint (``save_weights_for_sampler``) that expires after
        ``training.checkpoint_ttl_s``, and wait for it; its path (:meth:`submit_checkpoint`, awaited)."""
        return await (await self.submit_checkpoint(step))

    async def submit_checkpoint(self, step: int) -> Awaitable[str]:
        """Submit the sampler-checkpoint save of ``step`` without waiting for it: once this returns, the save is
        queued before any update submitted later, so it holds the weights ``step`` starts from. Returns an
        awaitable of its path (timed as ``time/snapshot`` while awaited) for :meth:`policy_for`."""
        timings = self.records.timings(step)
        with phase(step, "snapshot", timings):
            fut = await self.training_client.save_weights_for_sampler_async(
                f"{self.spec.name}-step-{step:06d}", ttl_seconds=self.spec.training.checkpoint_ttl_s)

        async def path() -> str:
            with phase(step, "snapshot", timings):
                return (await fut.result_async()).path

        return path()

    async def policy_for(self, sampler_path: str | Awaitable[str], step: int) -> Policy:
        """The policy that samples ``sampler_path`` (a path, or an awaitable of one from
        :meth:`submit_checkpoint`): on Sail, a signed checkpoint URL wrapped in sailrl's adaptive Sail completer;
        on Tinker or the local backend, a sampling client for that checkpoint.

        A Tinker that refuses to sign the checkpoint URL stops the run here (a ``ServiceError`` naming the options).
        """
        if not isinstance(sampler_path, str):
            sampler_path = await sampler_path
        self.snapshots[step] = sampler_path
        for old in [k for k in self.snapshots if k < step - 8]:
            del self.snapshots[old]
        s = self.spec.sampling
        with phase(step, "resolve", self.records.timings(step)):
            if self.backend.sampler == "sail":
                completer = await self._sail_completer(sampler_path, step)
            else:
                client = await self.service_client.create_sampling_client_async(model_path=sampler_path)
                # Seeded per step (model.seed) on the local backend: a run repeats exactly.
                seed = (self.spec.model.seed * 1_000_003 + (step - 1) * 100_003) % (2**31) if self.backend.is_local \
                    else None
                completer = SamplingPolicy(client, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                                           seed=seed)
        return Policy(completer, sampler_path, step)

    async def _sail_completer(self, sampler_path: str, step: int) -> Any:
        # lazy: the Sail SDK loads only on a run that samples on Sail
        from sailrl.runtime.backends.sail import adapter_config_for, make_sail_policy, signed_checkpoint_url

        s, m = self.spec.sampling, self.spec.model
        url = await signed_checkpoint_url(self.service_client, sampler_path,
                                          ttl_seconds=self.spec.training.checkpoint_ttl_s)
        return make_sail_policy(
            model=m.name, signed_url=url,
            adapter_config=adapter_config_for(m.name, self.lora_rank, train_attn=m.train_attn,
                                              train_mlp=m.train_mlp, train_unembed=m.train_unembed),
            lora_name=f"{self.spec.name}-{self.run_id}-step-{step:06d}", max_tokens=s.max_tokens,
            temperature=s.temperature, top_p=s.top_p, completion_window=s.completion_window,
            vocab_size=len(self.tokenizer), poll_deadline_s=s.poll_deadline_s)

    async def reference_client(self) -> Any:
        """A sampling client of the base model (no adapter), for the KL penalty's reference logprobs."""
        if self._reference is None:
            self._reference = await self.service_client.create_sampling_client_async(base_model=self.spec.model.name)
        return self._reference

    # ------------------------------------------------------------------ 3. roll out
    def group_builder(self, row: dict[str, Any], group_size: int, scorer: Any) -> Any:
        """One group's builder: ``row``'s prompt (rendered once per row), ``group_size`` rollouts, scored by the
        reward rules through ``scorer`` (a :class:`~sailrl.runtime.loop.rewarder.ScoreRequests` or a ``StepScorer``).
        With ``environment:`` each rollout is an episode (:func:`sailrl.runtime.rollouts.episode.episode_group_builder`)."""
        if self.spec.environment is not None:
            return episode_group_builder(self.spec, row, prompts=self.prompts, renderer=self.renderer,
                                         reward_fn=self.reward_fn, tools=self.tools, group_size=group_size,
                                         scorer=scorer, context_window=self.context_window)
        key = int(row.get("_index", id(row)))
        if key not in self._model_inputs:
            stop = self.spec.sampling.stop or self.prompts.stop_sequences()
            self._model_inputs[key] = (self.prompts.model_input(row), stop)
        model_input, stop = self._model_inputs[key]
        return RuleGroupBuilder(row=row, model_input=model_input, stop=stop, renderer=self.renderer,
                                reward_fn=self.reward_fn, group_size=group_size, scorer=scorer)

    async def sample(self, policy: Policy | Awaitable[Policy], step: int, *,
                     rows: list[dict[str, Any]] | None = None, group_size: int | None = None,
                     phase_name: str = "rollout") -> Completions:
        """Start every rollout of every group of ``step``'s rows, concurrently, and return them as they sample:
        each completion waits for its score (:meth:`sailrl.runtime.loop.rewarder.Rewards.score`). ``policy``: a
        :class:`Policy`, or an awaitable of one (a task resolving it, shared by the steps that sample from it)."""
        if not isinstance(policy, Policy):
            policy = await policy
        if phase_name == "rollout":
            policy = await self._as_it_would_have(policy, step)
        rows = self.rows(step) if rows is None else rows
        gs = group_size or self.spec.training.group_size
        started = time.perf_counter()
        requests = ScoreRequests()
        expect = getattr(policy.completer, "expect", None)  # the embedded backend: one batch, whatever the load
        if expect is not None:
            expect(len(rows) * gs)
        with phase(step, phase_name, {}):
            builders = [self.group_builder(r, gs, requests) for r in rows]
        task = asyncio.ensure_future(rollout_groups(policy.completer, builders))
        return Completions(step=step, task=task, requests=requests, sampler_path=policy.sampler_path,
                           sampler_step=policy.sampler_step, stats=getattr(policy.completer, "stats", None),
                           started=started, phase_name=phase_name)

    async def rollout(self, policy: Policy | Awaitable[Policy], step: int, *,
                      rows: list[dict[str, Any]] | None = None, group_size: int | None = None,
                      phase_name: str = "rollout") -> RolloutBatch:
        """:meth:`sample`, then the reward rules score it (``run.rewards.score``): the step's scored batch."""
        return await self.rewards.score(step, await self.sample(policy, step, rows=rows, group_size=group_size,
                                                                phase_name=phase_name))

    async def wait_for(self, step: int, rollouts: Awaitable[RolloutBatch]) -> RolloutBatch:
        """Await rollouts started earlier (bounded off-policy); the wait is timed as ``time/rollout_wait``."""
        with phase(step, "rollout_wait", self.records.timings(step)):
            return await rollouts

    async def evaluate(self, policy: Policy | Awaitable[Policy], step: int) -> None:
        """Sample every held-out row once from ``policy``; metrics under ``eval/``, rollouts logged as ``eval``."""
        if not self.eval_rows:
            return
        batch = await self.rollout(policy, step, rows=self.eval_rows, group_size=1, phase_name="eval")
        self.records.eval_rollouts(step, batch)
