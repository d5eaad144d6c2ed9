"""Issue 14.2: scoring runs off the event loop within a per-step budget; RuleEnv logs each rule's verdict.

Before: ``RuleEnv.step`` scored on the event loop, so 128 completions x 3 timing-out regexes held one step for
38.8 s and, on the Sail path, other responses were not polled while a completion was scored.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest
import tinker
from tinker_cookbook.completers import TokenCompleter, TokensWithLogprobs
from tinker_cookbook.rl.rollouts import do_group_rollout

from sailrl.runtime.backends.models import get_renderer, get_tokenizer
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rewards.scoring import ScoringBudget, StepScorer
from sailrl.runtime.rollouts.rollout import RuleGroupBuilder, rollout_groups
from sailrl.spec.rewards import RewardSpec
from tests.fakes.sail_server import FakeSailServer

GUIDE = [
    {"name": "correct", "kind": "answer", "extract": {"from": "boxed"}, "compare": "numeric"},
    {"name": "format", "kind": "all_of", "pass_score": 0, "fail_score": -0.1,
     "checks": [{"kind": "has_answer", "extract": {"from": "boxed"}}, {"kind": "termination"}]},
]
EVIL = [{"name": f"evil{i}", "kind": "match", "pattern": "(a|aa)+$"} for i in range(3)]


def reward(rules: list[dict], spec_dir: Path | None = None, **kw: Any) -> RewardFunction:
    return RewardFunction.from_spec(RewardSpec.model_validate({"rules": rules, **kw}), "answer", spec_dir)


# ------------------------------------------------------------------------------------------- the budget


def test_the_budget_stops_a_step_of_timing_out_regexes_at_about_the_budget() -> None:
    # 128 completions x 3 regexes that each run into their 0.05 s limit: 19 s of scoring without a budget.
    fn = reward(EVIL, regex_timeout_s=0.05)
    scorer = StepScorer(fn, budget_s=1.0)

    async def step() -> list:
        return await asyncio.gather(*(scorer.score("a" * 30 + "b", {}) for _ in range(128)))

    t0 = time.perf_counter()
    scores = asyncio.run(step())
    seconds = time.perf_counter() - t0
    assert 0.9 < seconds < 3.5
    timed_out = sum(s.timeouts for s in scores)
    over = sum(s.budget_exceeded for s in scores)
    assert timed_out + over == 3 * 128  # every rule either ran into its own limit or was stopped by the budget
    assert 6 <= timed_out < 200 and over > 180
    assert scorer.metrics()["reward_budget_exceeded"] == over and scorer.metrics()["reward_scored"] == 128
    assert 0.95 < scorer.metrics()["reward_scoring_s"] < 2.0
    last = scores[-1]
    assert last.passed == {"evil0": False, "evil1": False, "evil2": False}
    assert set(last.reasons.values()) == {
        "not scored: the step's scoring budget (reward.step_budget_s = 1 s) was used up"}


def test_the_budget_cuts_a_slow_python_call_short(tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text("import time\n\ndef score(c, f):\n    time.sleep(0.8)\n    return 1\n",
                                      encoding="utf-8")
    fn = reward([{"name": "slow", "kind": "python", "function": "slow:score", "timeout_s": 2}], tmp_path)
    fn.score("warm", {})  # start the worker outside the measured step

    async def step() -> list:
        scorer = StepScorer(fn, budget_s=1.0)
        return await asyncio.gather(*(scorer.score(str(i), {}) for i in range(12)))

    t0 = time.perf_counter()
    scores = asyncio.run(step())
    seconds = time.perf_counter() - t0
    assert seconds < 3.0  # 12 x 0.8 s on at most 4 workers would be 2.4 s or more (4.8 s on 2)
    assert sum(s.passed["slow"] for s in scores) >= 1
    assert sum(s.budget_exceeded for s in scores) >= 1


def test_the_default_budget_is_the_specs_step_budget() -> None:
    assert StepScorer(reward(GUIDE, step_budget_s=12.5)).budget.budget_s == 12.5
    assert StepScorer(reward(GUIDE)).budget.budget_s == 60.0


def test_budget_counts_the_time_any_call_is_running_once() -> None:
    b = ScoringBudget(10)
    b.begin()
    b.begin()  # two calls at once
    time.sleep(0.2)
    b.end()
    time.sleep(0.1)
    b.end()
    time.sleep(0.2)  # idle: not counted
    assert 0.28 < b.used_s() < 0.5 and 9.5 < b.remaining() < 9.72


# ------------------------------------------------------------------------------------------- off the loop


def test_the_event_loop_runs_while_completions_are_scored() -> None:
    fn = reward(EVIL, regex_timeout_s=0.1)
    ticks = 0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    async def step() -> float:
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        scorer = StepScorer(fn, budget_s=60)
        t0 = time.perf_counter()
        await asyncio.gather(*(scorer.score("a" * 30 + "b", {}) for _ in range(16)))
        seconds = time.perf_counter() - t0
        stop.set()
        await tick
        return seconds

    seconds = asyncio.run(step())
    assert seconds > 0.3  # 16 x 3 regexes that each run 0.1 s, on 4 threads
    # The loop kept turning: tens of ticks (scored on the loop itself, the 16 tasks run back to back: 1 or 2).
    assert ticks >= 10, (ticks, seconds)


def test_math_off_the_main_thread_runs_in_the_worker_process() -> None:
    fn = reward([{"name": "m", "kind": "answer", "compare": "math"}])

    async def step() -> list:
        scorer = StepScorer(fn)
        cases = [("\\boxed{(x+1)^2}", "x^2+2x+1"), ("\\boxed{x+1}", "x^2+2x+1"), ("\\boxed{\\frac{1}{2}}", "0.5")]
        return await asyncio.gather(*(scorer.score(c, {"answer": r}) for c, r in cases))

    a, b, c = asyncio.run(step())
    assert (a.correct, b.correct, c.correct) == (True, False, True)
    assert b.reasons == {"m": "answer 'x+1' does not match reference 'x^2+2x+1'"}


def test_math_time_limit_holds_off_the_main_thread() -> None:
    fn = reward([{"name": "m", "kind": "answer", "compare": "math"}], math_timeout_s=0.001)

    async def one() -> Any:
        return await StepScorer(fn).score("\\boxed{(x+1)^{12} - (x-1)^{12}}", {"answer": "24x^{11}+440x^9"})

    s = asyncio.run(one())
    assert (s.passed, s.timeouts) == ({"m": False}, 1)
    assert s.reasons == {"m": "math-verify ran past the time limit"}


# ------------------------------------------------------------------------------------------- RuleEnv logs


class _Fixed(TokenCompleter):
    def __init__(self, tokenizer: Any, replies: list[str]) -> None:
        self.tokenizer = tokenizer
        self.replies = iter(replies)

    async def __call__(self, model_input: Any, stop: Any, *, max_tokens: int | None = None) -> TokensWithLogprobs:
        text = next(self.replies)
        return TokensWithLogprobs(tokens=self.tokenizer.encode(text, add_special_tokens=False), maybe_logprobs=None,
                                  stop_reason="length" if not text.endswith("User:") else "stop")


def test_rule_env_logs_each_rules_verdict_and_keeps_its_metrics() -> None:
    tok = get_tokenizer("sailrl/tiny")
    renderer = get_renderer("role_colon", tok)
    fn = reward(GUIDE)
    model_input = renderer.build_generation_prompt([{"role": "user", "content": "2+3?"}])
    builder = RuleGroupBuilder(row={"_index": 3, "answer": "5"}, model_input=model_input,
                               stop=renderer.get_stop_sequences(), renderer=renderer, reward_fn=fn, group_size=2,
                               scorer=StepScorer(fn))
    group = asyncio.run(do_group_rollout(builder, _Fixed(tok, [" so \\boxed{5}\n\nUser:", " I think 4 and"])))
    a, b = (t.transitions[0] for t in group.trajectories_G)
    assert a.logs == {"completion": "so \\boxed{5}",
                      "why/correct": "answer '5' matches reference '5'", "passed/correct": 1, "score/correct": 1.0,
                      "why/format": "answer '5'; ended cleanly", "passed/format": 1, "score/format": 0.0}
    assert b.logs == {"completion": "I think 4 and",
                      "why/correct": "no answer found", "passed/correct": 0, "score/correct": 0.0,
                      "why/format": "no answer found; cut off at max_tokens", "passed/format": 0,
                      "score/format": -0.1}
    assert a.metrics == {"reward/correct": 1.0, "reward/format": 0.0, "truncated": 0.0, "regex_timeouts": 0.0,
                         "rule_errors": 0.0, "python_rule_failures": 0.0, "reward_budget_exceeded": 0.0,
                         "correct": 1.0}
    assert b.metrics["truncated"] == 1.0 and b.metrics["reward/format"] == -0.1
    assert group.get_total_rewards() == [1.0, -0.1]


def test_builders_without_a_scorer_still_score() -> None:
    tok = get_tokenizer("sailrl/tiny")
    renderer = get_renderer("role_colon", tok)
    builder = RuleGroupBuilder(row={"answer": "5"}, model_input=tinker.ModelInput.from_ints([1, 2]),
                               stop=renderer.get_stop_sequences(), renderer=renderer, reward_fn=reward(GUIDE),
                               group_size=1)
    group = asyncio.run(do_group_rollout(builder, _Fixed(tok, [" \\boxed{5}\n\nUser:"])))
    assert group.get_total_rewards() == [1.0]


# ------------------------------------------------------------------------------------------- Sail


class _StaggeredSail(FakeSailServer):
    """A fake Sail whose k-th response is final after ``times[k]`` seconds."""

    times: list[float] = []

    def _create(self, body: Any, now: float) -> tuple[int, dict[str, Any]]:
        self.service_time_s = self.times.pop(0) if self.times else 0.0
        return super()._create(body, now)


def test_other_sail_responses_are_polled_while_completions_are_scored(tmp_path: Path, monkeypatch) -> None:
    import sail

    from sailrl.runtime.backends.sail import AdaptiveSailCompleter, PollPolicy, adapter_config_for
    from tests.fakes.sail_server import point_sail_sdk_at

    (tmp_path / "slow.py").write_text("import time\n\ndef score(c, f):\n    time.sleep(0.15)\n    return 1\n",
                                      encoding="utf-8")
    fn = reward([*GUIDE, {"name": "slow", "kind": "python", "function": "slow:score"}], tmp_path)
    fn.score("warm", {"answer": "1"})  # start the python worker before the step
    server = _StaggeredSail()
    server.times = [0.1 * (k + 1) for k in range(16)]
    server.start()
    try:
        point_sail_sdk_at(server.url, monkeypatch)
        poll = PollPolicy(min_interval_s=0.02, first_poll_s=0.03, max_interval_s=0.05, retry_base_s=0.01,
                          retry_max_s=0.02, response_deadline_s=30.0, request_timeout_s=10.0)
        completer = AdaptiveSailCompleter(
            model="moonshotai/Kimi-K2.6", max_tokens=8, temperature=1.0, top_p=1.0, completion_window="balanced",
            tinker_lora_signed_url="https://storage.example/x", tinker_lora_name="run-step-1", poll=poll,
            adapter_config=adapter_config_for("moonshotai/Kimi-K2.6", 8, train_attn=True, train_mlp=True,
                                              train_unembed=True), rng=random.Random(0))
        tok = get_tokenizer("sailrl/tiny")
        renderer = get_renderer("role_colon", tok)
        scorer = StepScorer(fn)
        spans: list[tuple[float, float]] = []
        inner = scorer.score_sync

        def recorded(*args: Any, **kw: Any) -> Any:
            t0 = time.monotonic()
            try:
                return inner(*args, **kw)
            finally:
                spans.append((t0, time.monotonic()))

        scorer.score_sync = recorded  # type: ignore[method-assign]
        builders = [RuleGroupBuilder(row={"_index": g, "answer": "1"},
                                     model_input=tinker.ModelInput.from_ints(list(range(10 + g, 20 + g))),
                                     stop=renderer.get_stop_sequences(), renderer=renderer, reward_fn=fn,
                                     group_size=4, scorer=scorer) for g in range(4)]
        batch = asyncio.run(rollout_groups(completer, builders))
    finally:
        server.close()
        sail.reset_transports()
    assert len(batch.groups) == 4 and not batch.failed
    assert len(spans) == 16
    gets = [r.at for r in server.requests if r.method == "GET"]
    during = [t for t in gets if any(a <= t <= b for a, b in spans)]
    # Scoring (16 x 0.15 s in the python rule) overlaps the staggered responses: they keep being polled.
    assert len(during) >= 20, (len(during), len(gets))  # scored on the event loop: 4 of 95
    assert all(t.transitions[0].metrics["reward/slow"] == 1.0 for g in batch.groups for t in g.trajectories_G)


@pytest.mark.parametrize("n", [1, 4])
def test_scores_through_the_scorer_equal_direct_scores(n: int) -> None:
    fn = reward(GUIDE)
    texts = [f"\\boxed{{{i}}}" for i in range(n)]

    async def step() -> list:
        scorer = StepScorer(fn)
        return await asyncio.gather(*(scorer.score(t, {"answer": "2"}) for t in texts))

    assert [s.total for s in asyncio.run(step())] == [fn.score(t, {"answer": "2"}).total for t in texts]
