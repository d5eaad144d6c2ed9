"""run.rewards (sailrl.runtime.loop.rewarder): sampling hands completions over, the score step scores them."""

from __future__ import annotations

import asyncio
import time

import pytest

from sailrl.runtime.loop.errors import RunError
from sailrl.runtime.loop.rewarder import Completions, Rewards, ScoreRequests
from sailrl.runtime.rollouts.rollout import RolloutBatch


class _Rules:
    """A RewardFunction stand-in: the score of a text is its length; records the order it scored in."""

    step_budget_s = 60.0

    def __init__(self) -> None:
        self.seen: list[str] = []

    def score(self, text, fields, *, truncated=False, num_tokens=None, budget=None):
        self.seen.append(text)
        return len(text)


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, line: str) -> None:
        self.lines.append(line)


class _Records:
    def __init__(self) -> None:
        self.console = _Console()


def _completions(requests: ScoreRequests, texts: list[str], failed=()) -> tuple[Completions, list]:
    scores: list = []

    async def sampling() -> RolloutBatch:
        for text in texts:  # each rollout waits for its completion's score, as RuleEnv.step does
            scores.append(await requests.score(text, {}))
        return RolloutBatch(groups=[object()] * (len(texts) - len(failed)), rows=[], failed=list(failed))

    task = asyncio.ensure_future(sampling())
    return Completions(step=3, task=task, requests=requests, sampler_path="local://s/3", sampler_step=2,
                       stats=None, started=time.perf_counter()), scores


def test_completions_wait_for_the_score_step_then_are_scored_in_their_order():
    async def go():
        rules, requests = _Rules(), ScoreRequests()
        rollouts, scores = _completions(requests, ["a", "bbb", "cc"])
        for _ in range(5):
            await asyncio.sleep(0)
        assert rules.seen == [] and scores == [] and not rollouts.task.done()  # sampled, not scored yet
        batch = await Rewards(rules, _Records()).score(3, rollouts)
        return rules.seen, scores, batch

    seen, scores, batch = asyncio.run(go())
    assert seen == ["a", "bbb", "cc"] and scores == [1, 3, 2]
    assert batch.sampler_paths == ["local://s/3"] * 3 and batch.sampler_steps == [2, 2, 2]
    assert batch.extra_metrics["reward_scored"] == 3.0 and batch.extra_metrics["reward_budget_exceeded"] == 0.0


def test_the_score_step_takes_an_awaitable_of_the_rollouts():
    async def go():
        rules, requests = _Rules(), ScoreRequests()

        async def later() -> Completions:
            return _completions(requests, ["xy"])[0]

        return await Rewards(rules, _Records()).score(3, later())

    assert asyncio.run(go()).extra_metrics["reward_scored"] == 1.0


def test_every_group_failed_is_one_run_error_naming_step_and_phase():
    async def go():
        records = _Records()
        rollouts, _ = _completions(ScoreRequests(), [], failed=[(7, "SamplerError: gone")])
        with pytest.raises(RunError) as info:
            await Rewards(_Rules(), records).score(3, rollouts)
        return str(info.value), records.console.lines

    message, lines = asyncio.run(go())
    assert message == "step 3, phase 'rollout': every group failed (1): row 7: SamplerError: gone"
    assert lines == ["[yellow]step 3: 1 group(s) failed and were dropped (row 7: SamplerError: gone)[/yellow]"]
