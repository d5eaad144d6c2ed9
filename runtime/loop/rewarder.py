"""A step's rewards: the reward rules score the completions the sampler hands over (``run.rewards``).

A generated script's loop shows sampling and scoring as two steps::

    rollouts = await run.sampler.sample(policy, step)   # starts the step's rollouts; returns Completions
    batch = await run.rewards.score(step, rollouts)     # the rules score each completion as it arrives

:meth:`sailrl.runtime.loop.sampler.Sampler.sample` starts the rollouts and returns at once; each rollout hands its
completion to the step's :class:`ScoreRequests` and waits there for its score. :meth:`Rewards.score` opens the
step's :class:`~sailrl.runtime.rewards.scoring.StepScorer` (its scoring budget, its worker threads): the completions that
arrived before it are scored at once, the later ones as they land, so scoring still overlaps sampling. With
``environment:`` a rollout is an episode whose turns wait for their scores (feedback rules), so there sampling and
scoring interleave turn by turn.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sailrl.runtime.loop.errors import RunError, phase
from sailrl.runtime.rewards.scoring import StepScorer

if TYPE_CHECKING:
    from sailrl.runtime.loop.records import Records
    from sailrl.runtime.rollouts.rollout import RolloutBatch

__all__ = ["Completions", "Rewards", "ScoreRequests"]


class ScoreRequests:
    """What a step's rollouts score through (their ``scorer``): ``score()`` waits until the step's scoring has
    started (:meth:`start`), then scores with the step's :class:`StepScorer`. Completions that arrived before the
    start are released in their order of arrival."""

    def __init__(self) -> None:
        self.scorer: StepScorer | None = None
        self._waiting: list[asyncio.Future] = []

    def start(self, scorer: StepScorer) -> None:
        """Score from now on with ``scorer``; release the completions waiting for it."""
        self.scorer = scorer
        waiting, self._waiting = self._waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)

    async def score(self, text: str, fields: dict[str, Any], *, truncated: bool = False,
                    num_tokens: int | None = None) -> Any:
        """The :class:`~sailrl.runtime.rewards.rules.Score` of one completion (as ``StepScorer.score``), once the step's
        scoring has started."""
        if self.scorer is None:
            future = asyncio.get_running_loop().create_future()
            self._waiting.append(future)
            await future
        assert self.scorer is not None
        return await self.scorer.score(text, fields, truncated=truncated, num_tokens=num_tokens)


@dataclass
class Completions:
    """A step's rollouts, sampling (:meth:`sailrl.runtime.loop.sampler.Sampler.sample`): ``task`` gathers the groups,
    each completion waiting in ``requests`` for its score. Provenance: ``sampler_path`` / ``sampler_step`` (the
    snapshot sampled); ``stats``: the Sail completer's counters (None elsewhere); ``started``: when sampling
    started (``time.perf_counter``); ``phase_name``: ``rollout`` or ``eval``."""

    step: int
    task: asyncio.Future
    requests: ScoreRequests
    sampler_path: str
    sampler_step: int
    stats: Any
    started: float
    phase_name: str = "rollout"


class Rewards:
    """``run.rewards``: the reward rules (``reward_fn``, a :class:`~sailrl.runtime.rewards.rules.RewardFunction`) score a
    step's completions; warnings and dropped groups go to ``records``' console."""

    def __init__(self, reward_fn: Any, records: Records) -> None:
        self.reward_fn = reward_fn
        self.records = records

    async def score(self, step: int, rollouts: Completions | Any) -> RolloutBatch:
        """Score ``rollouts`` (:class:`Completions`, or an awaitable of them) with the reward rules and return the
        step's batch: every completion scored as it arrives, in worker threads, within one budget for the step
        (``reward.step_budget_s``; rules past it fail and are counted).

        A group whose rollouts failed is dropped and counted; every group records the sampler checkpoint and step
        that produced it. Raises :class:`RunError` when every group failed (a service fault, not a degenerate
        batch), quoting the first failures.
        """
        if not isinstance(rollouts, Completions):
            rollouts = await rollouts
        scorer = StepScorer(self.reward_fn)
        rollouts.requests.start(scorer)
        try:
            with phase(step, rollouts.phase_name, {}):
                batch = await rollouts.task
        finally:
            if not rollouts.task.done():  # cancelled (Ctrl-C, a stop): the rollouts go with it
                rollouts.task.cancel()
        batch.seconds = time.perf_counter() - rollouts.started
        batch.sampler_paths = [rollouts.sampler_path] * len(batch.groups)
        batch.sampler_steps = [rollouts.sampler_step] * len(batch.groups)
        stats = rollouts.stats  # the Sail completer counts polls, retries and failures
        batch.extra_metrics = {**(stats.as_metrics() if stats is not None else {}), **scorer.metrics()}
        for line in scorer.warnings():  # python rules that printed this step: one line each
            self.records.console.print(f"[yellow]step {step}: {line}[/yellow]")
        if batch.failed:
            first = batch.failed[0]
            self.records.console.print(f"[yellow]step {step}: {len(batch.failed)} group(s) failed and were dropped "
                                       f"(row {first[0]}: {first[1]})[/yellow]")
        if not batch.groups and batch.failed:
            reasons = "; ".join(f"row {i}: {why}" for i, why in batch.failed[:3])
            raise RunError(f"step {step}, phase '{rollouts.phase_name}': every group failed ({len(batch.failed)}): "
                           f"{reasons}")
        return batch
