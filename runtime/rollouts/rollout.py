"""Rollouts: one dataset row -> one group of ``group_size`` rollouts scored by the spec's reward rules.

The environment follows tinker_cookbook's ``Env`` / ``EnvGroupBuilder`` contract (``rl/types.py``) so that
``tinker_cookbook.rl.rollouts.do_group_rollout`` runs it unchanged, exactly as the Sail guide's ``MathEnv`` does;
the reward is computed by :class:`sailrl.runtime.rewards.rules.RewardFunction` instead of hand-written Python.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Any

import tinker
from tinker_cookbook import renderers
from tinker_cookbook.completers import TokenCompleter, TokensWithLogprobs
from tinker_cookbook.rl.rollouts import do_group_rollout
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, StepResult, TrajectoryGroup

from sailrl.runtime.backends.faults import is_bug
from sailrl.runtime.rewards.scoring import StepScorer

#: The group of the batch a rollout task samples for: set by :func:`rollout_groups` in each group's task, which
#: the group's episode tasks copy.
_GROUP: contextvars.ContextVar[int | None] = contextvars.ContextVar("sailrl_rollout_group", default=None)


@dataclass
class EpisodeSeat:
    """Which episode of a batch the current rollout task samples for (``ordinal``: its place in the batch, group
    by group) and how many replies it has sampled (``turn``): a seeded :class:`SamplingPolicy` derives the seed of
    each call from these, not from the order in which concurrent episodes happen to call it."""

    ordinal: int
    turn: int = 0
    lockstep: Lockstep | None = None


class Lockstep:
    """The turns of a batch of seeded episodes, sampled in lockstep: turn ``t``'s replies are sampled as one
    announced batch, in the episodes' order, once every episode of the batch has asked for its turn-``t`` reply or
    ended. A sampler that batches concurrent calls computes a reply's logprobs over the whole batch (its shapes, its
    padding), so a batch formed by arrival times would make them differ from run to run in their last bits.

    ``size``: the episodes of the batch; ``announce``: the sampling client's ``expect_requests`` (turn 0 is
    announced by the caller, with the batch).
    """

    def __init__(self, size: int, announce: Any) -> None:
        self.size = size
        self.announce = announce
        self.ended: set[int] = set()
        self.waiting: dict[int, list[tuple[int, asyncio.Future]]] = {}

    async def turn(self, seat: EpisodeSeat) -> None:
        """Wait until ``seat``'s episode may ask for its reply of ``seat.turn`` (then ask at once)."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(seat.turn, []).append((seat.ordinal, future))
        self._release()
        await future

    def end(self, ordinals: Any) -> None:
        """Episodes that will ask for no more replies (their rollout ended, or their group failed before it)."""
        self.ended.update(ordinals)
        self._release()

    def _release(self) -> None:
        for turn in sorted(self.waiting):
            waiters = self.waiting[turn]
            if len(waiters) + len(self.ended - {o for o, _ in waiters}) < self.size:
                return
            del self.waiting[turn]
            if turn > 0 and self.announce is not None:
                self.announce(len(waiters))
            for _, future in sorted(waiters, key=lambda w: w[0]):
                if not future.done():
                    future.set_result(None)


_SEAT: contextvars.ContextVar[EpisodeSeat | None] = contextvars.ContextVar("sailrl_episode_seat", default=None)
_LOCKSTEP: contextvars.ContextVar[Lockstep | None] = contextvars.ContextVar("sailrl_lockstep", default=None)


def enter_episode(index: int, group_size: int) -> None:
    """Called by an episode env as its rollout starts (in the rollout's own task): the task's later sampling calls
    are seeded as episode ``index`` of its group (see :class:`EpisodeSeat`), in lockstep with the batch's other
    episodes when the policy keeps one (:class:`Lockstep`; the episode ends with its task). Outside
    :func:`rollout_groups`: no-op."""
    group = _GROUP.get()
    if group is None:
        return
    seat = EpisodeSeat(group * group_size + index, lockstep=_LOCKSTEP.get())
    _SEAT.set(seat)
    task = asyncio.current_task()
    if seat.lockstep is not None and task is not None:
        task.add_done_callback(lambda _: seat.lockstep.end([seat.ordinal]))


def completion_text(renderer: Any, action: list[int], stop: list, *, mode: str = "visible") -> tuple[str, bool]:
    """(text the reward rules read, whether the completion ended cleanly) for sampled tokens ``action``.

    ``visible``: ``renderers.get_text_content`` of the parsed reply (thinking removed), as the Sail guide scores.
    A reply cut off at max_tokens is not parsed into parts by the renderers, so its raw text would still hold
    the thinking; the text after the last ``</think>`` is kept and an unfinished ``<think>`` block is dropped,
    so a box written while thinking never counts as the answer. ``full``: the decoded completion, special
    tokens and thinking included, with a trailing stop sequence removed.
    """
    message, termination = renderer.parse_response(action)
    clean = termination.is_clean
    if mode == "full":
        text = renderer.tokenizer.decode(action)
        for s in stop or []:
            s_text = renderer.tokenizer.decode([s]) if isinstance(s, int) else s
            if s_text and text.endswith(s_text):
                text = text[: -len(s_text)]
                break
        return text, clean
    text = renderers.get_text_content(message)
    if not clean:
        if "</think>" in text:
            text = text.rsplit("</think>", 1)[1]
        if "<think>" in text:
            text = text.split("<think>", 1)[0]
    return text, clean


def score_record(score: Any, text: str, *, length_stopped: bool) -> tuple[dict[str, float], dict[str, Any]]:
    """(metrics, logs) of one scored completion, as :class:`RuleEnv` documents them (``text``: what the rules
    read; ``length_stopped``: sampling stopped at max_tokens)."""
    metrics: dict[str, float] = {f"reward/{name}": float(v) for name, v in score.contributions.items()}
    for rule, subs in score.subscores.items():
        for name, v in subs.items():
            metrics[f"reward/{rule}/{name}"] = float(v)
    metrics["truncated"] = float(length_stopped)
    metrics["regex_timeouts"] = float(score.timeouts)
    metrics["rule_errors"] = float(len(score.errors))
    metrics["python_rule_failures"] = float(score.python_failures)
    metrics["reward_budget_exceeded"] = float(score.budget_exceeded)
    if score.correct is not None:
        metrics["correct"] = float(score.correct)
    logs: dict[str, str | int | float] = {"completion": text[:2000]}
    for name, value in score.contributions.items():
        logs[f"why/{name}"] = score.reasons.get(name, "")
        logs[f"passed/{name}"] = int(score.passed[name])
        logs[f"score/{name}"] = float(value)
    for name, why in score.errors.items():  # the rule could not be evaluated (raised, timed out, ...)
        logs[f"error/{name}"] = why[:200]
    for name, verdict in score.judge.items():  # judge rules: the judge's answer and the score read from it
        logs[f"judge/{name}"] = verdict.answer[:2000]
        logs[f"judge_score/{name}"] = verdict.label
    return metrics, logs


class RuleEnv(Env):
    """A single-turn environment: the prompt of one row; the completion is scored by the reward rules.

    Scoring runs off the event loop through ``scorer`` (a :class:`sailrl.runtime.rewards.scoring.StepScorer`, which holds
    the step's scoring budget; default: a scorer of this env's own). ``StepResult.metrics``: ``reward/<rule>``
    (the rule's contribution), ``reward/<rule>/<name>`` (sub-scores a python rule returned), ``correct`` (0/1)
    when the spec has an answer rule, ``truncated`` (0/1, cut at max_tokens: stop_reason ``length``),
    ``regex_timeouts`` (user regexes and math-verify steps that hit their time limit), ``rule_errors`` (rules that
    could not be evaluated), ``python_rule_failures`` (python calls that raised, timed out or returned something
    else) and ``reward_budget_exceeded`` (rules failed because the step's budget was used up).
    ``StepResult.logs``: ``completion`` (the text the rules read, at most 2,000 characters), and per rule
    ``why/<rule>`` (the reason, at most 200 characters), ``passed/<rule>`` (0 or 1), ``score/<rule>`` (its
    contribution), and ``error/<rule>`` for a rule that could not be evaluated (why, at most 200 characters);
    for a judge rule ``judge/<rule>`` (the judge's answer, at most 2,000 characters) and ``judge_score/<rule>``
    (the text of the ``<score>`` tag the score was taken from; empty when none was read).
    """

    def __init__(self, row: dict[str, Any], model_input: tinker.ModelInput, stop: list, renderer: Any,
                 reward_fn: Any, scorer: Any = None) -> None:
        self.row = row
        self.model_input = model_input
        self.stop = stop
        self.renderer = renderer
        self.reward_fn = reward_fn
        self.scorer = scorer

    async def initial_observation(self):
        return self.model_input, self.stop

    async def step(self, action, *, extra=None) -> StepResult:
        stop_reason = (extra or {}).get("stop_reason", "stop")
        text, clean = completion_text(self.renderer, action, self.stop, mode=self.reward_fn.text_mode)
        truncated = stop_reason == "length" or not clean
        if self.scorer is None:
            self.scorer = StepScorer(self.reward_fn)
        score = await self.scorer.score(text, self.row, truncated=truncated, num_tokens=len(action))
        metrics, logs = score_record(score, text, length_stopped=stop_reason == "length")
        return StepResult(
            reward=float(score.total),
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=[],
            metrics=metrics,
            logs=logs,
        )


@dataclass(frozen=True)
class RuleGroupBuilder(EnvGroupBuilder):
    """Fans one row out into ``group_size`` environments that share one prompt.

    scorer: the step's :class:`sailrl.runtime.rewards.scoring.StepScorer` (one per step, shared by every group of the
    step, so that the step has one scoring budget). Without it, each group gets a scorer of its own, i.e. a
    budget of ``reward.step_budget_s`` per group.
    """

    row: dict[str, Any]
    model_input: tinker.ModelInput
    stop: list
    renderer: Any
    reward_fn: Any
    group_size: int
    tags: tuple[str, ...] = field(default=("sailrl",))
    scorer: Any = None

    async def make_envs(self):
        scorer = self.scorer if self.scorer is not None else StepScorer(self.reward_fn)
        return [RuleEnv(self.row, self.model_input, self.stop, self.renderer, self.reward_fn, scorer)
                for _ in range(self.group_size)]

    # compute_group_rewards and cleanup: EnvGroupBuilder's. The reward lives in RuleEnv.step; there is no
    # group-level bonus, and nothing to release.

    def logging_tags(self):
        return list(self.tags)


@dataclass
class SamplingPolicy(TokenCompleter):
    """A TokenCompleter over a Tinker-interface sampling client (remote Tinker or the local backend).

    Like tinker_cookbook's ``TinkerTokenCompleter`` but also passes ``top_p``. One call samples one completion;
    the local backend batches concurrent calls of a step into one generation.
    """

    sampling_client: Any
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    _calls: int = field(default=0, repr=False)
    _batch_base: int = field(default=0, repr=False)  # episode seeds: where this batch's seeds start
    _batch_size: int = field(default=1, repr=False)  # episode seeds: the stride between an episode's turns
    _announced: int = field(default=0, repr=False)
    _lockstep: Lockstep | None = field(default=None, repr=False)

    def expect(self, calls: int) -> None:
        """Tell a sampling client that batches concurrent calls (the embedded backend's ``expect_requests``) that
        the next ``calls`` calls belong together, so their batch does not depend on the machine's load; a no-op
        for clients without it (Tinker). ``calls``: one per rollout of the batch, which also places the batch's
        episode seeds."""
        self._batch_base, self._batch_size = self._announced, max(int(calls), 1)
        self._announced += self._batch_size
        announce = getattr(self.sampling_client, "expect_requests", None)
        if announce is not None:
            announce(calls)
        # seeded episodes take their turns in lockstep (a seat that never binds to it leaves it unused)
        self._lockstep = Lockstep(int(calls), announce) if self.seed is not None and announce is not None else None

    async def __call__(self, model_input: tinker.ModelInput, stop, *, max_tokens: int | None = None):
        # With a seed, a single-turn call k samples with seed + k: the event loop issues those calls in a fixed
        # order. An episode's calls wait on tool calls and scoring (threads, worker processes) between turns, so
        # their order varies from run to run: turn t of the episode at place p of the batch samples with
        # seed + base + p + t * batch size instead. Either way a run is reproducible however the sampler batches
        # concurrent calls.
        seat = _SEAT.get()
        if self.seed is None:
            seed = None
        elif seat is not None:
            seed = self.seed + self._batch_base + seat.ordinal + seat.turn * self._batch_size
            if seat.lockstep is not None:
                await seat.lockstep.turn(seat)
            seat.turn += 1
        else:
            seed = self.seed + self._calls
        self._calls += 1
        result = await self.sampling_client.sample_async(
            prompt=model_input,
            num_samples=1,
            sampling_params=tinker.SamplingParams(
                stop=stop,
                max_tokens=min(self.max_tokens, max_tokens or self.max_tokens),
                temperature=self.temperature,
                top_p=self.top_p,
                seed=seed,
            ),
        )
        seq = result.sequences[0]
        return TokensWithLogprobs(tokens=list(seq.tokens), maybe_logprobs=list(seq.logprobs or []),
                                  stop_reason=seq.stop_reason)


@dataclass
class RolloutBatch:
    """The groups of one step. ``failed`` holds (row index, error text) for groups whose rollouts failed.

    Provenance, one entry per group: ``sampler_paths`` (the sampler checkpoint) and ``sampler_steps`` (the step
    whose snapshot it is). ``seconds``: wall time of the rollouts.
    """

    groups: list[TrajectoryGroup]
    rows: list[dict[str, Any]]
    failed: list[tuple[int, str]]
    extra_metrics: dict[str, float] = field(default_factory=dict)
    sampler_paths: list[str] = field(default_factory=list)
    sampler_steps: list[int] = field(default_factory=list)
    seconds: float = 0.0


def _is_fatal(exc: BaseException) -> bool:
    """A failure that stops the run rather than dropping one group: an error class with ``fatal = True`` (a
    request Sail refuses, a checkpoint URL it cannot sign, a local trainer or sampler process that stopped)."""
    return bool(getattr(exc, "fatal", False))


async def rollout_groups(policy: TokenCompleter, builders: list[RuleGroupBuilder]) -> RolloutBatch:
    """Run every group of a step concurrently with tinker_cookbook's ``do_group_rollout``.

    A group whose rollout raises (a Sail response that still failed after its retries, a sampler error) is
    dropped and recorded in ``failed``; the other groups go on. A request Sail refused outright (HTTP 4xx: a
    bad key, an unknown model) or a stopped sampling process of the embedded backend would fail every group of
    every step, so it is raised, not dropped; so is an error that is neither sailrl's own nor a service fault
    (:func:`~sailrl.runtime.backends.faults.is_bug`): a bug, which keeps its traceback.
    Every group's samples share one prompt (asserted): group-centred advantages are only meaningful within one prompt.
    """
    lockstep = getattr(policy, "_lockstep", None)

    async def group(index: int, builder: RuleGroupBuilder) -> TrajectoryGroup:
        _GROUP.set(index)  # this group's task only: its episodes' seeds (enter_episode)
        _LOCKSTEP.set(lockstep)
        try:
            return await do_group_rollout(builder, policy)
        finally:  # episodes that never started (the group failed first) take no turns
            if lockstep is not None:
                n = builder.group_size
                lockstep.end(range(index * n, (index + 1) * n))

    results = await asyncio.gather(*(group(i, b) for i, b in enumerate(builders)), return_exceptions=True)
    groups: list[TrajectoryGroup] = []
    rows: list[dict[str, Any]] = []
    failed: list[tuple[int, str]] = []
    for builder, result in zip(builders, results, strict=True):
        if isinstance(result, BaseException):
            if isinstance(result, (KeyboardInterrupt, asyncio.CancelledError)) or _is_fatal(result):
                raise result
            if is_bug(result):
                raise result  # a bug in sailrl, not a failed sample: its own traceback, not a dropped group
            failed.append((int(builder.row.get("_index", -1)), f"{type(result).__name__}: {result}"))
            continue
        prompts = {tuple(t.transitions[0].ob.to_ints()) for t in result.trajectories_G if t.transitions}
        assert len(prompts) <= 1, "all samples of a group must share one prompt"
        groups.append(result)
        rows.append(builder.row)
    return RolloutBatch(groups=groups, rows=rows, failed=failed)
