"""Scoring off the event loop, under a per-step time budget.

:class:`StepScorer` scores one training step's completions: ``await scorer.score(text, fields, truncated=...,
num_tokens=...)`` runs :meth:`sailrl.runtime.rewards.rules.RewardFunction.score` in a worker thread (one shared pool of
:data:`SCORING_THREADS` threads per process), so the event loop keeps polling the sampler while rules run. Work
a thread cannot interrupt goes to worker processes with hard time limits (``compare: math``, ``kind: python``;
see :mod:`sailrl.runtime.sandbox.workers`); regexes run with the ``regex`` module's timeout.

The step's budget (``reward.step_budget_s``) is wall time: the time during which at least one of the step's
completions is being scored (:class:`ScoringBudget`; time spent sampling, or waiting for a free thread, does not
count). Each rule's own time limit is cut to what the budget has left; once it is used up the remaining rules
fail at once, give the reason ``not scored: the step's scoring budget ... was used up`` and are counted in
``Score.budget_exceeded`` (the ``reward_budget_exceeded`` metric). So a step's scoring takes about the budget at
most, plus the grace period of a worker being stopped (:data:`sailrl.runtime.sandbox.workers.GRACE_S`).

One StepScorer per step: the budget starts afresh with each.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sailrl.runtime.rewards.judge import JudgeStats

__all__ = ["SCORING_THREADS", "ScoringBudget", "StepScorer"]

#: Lines of a python rule's printed output a step shows (each prefixed with the rule's name); the rest is counted.
SHOWN_LINES = 10
#: Characters of one such line shown.
SHOWN_LINE_CHARS = 300
#: Threads that score completions (shared by every StepScorer of the process).
SCORING_THREADS = 4

_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=SCORING_THREADS, thread_name_prefix="sailrl-scoring")
        return _EXECUTOR


class ScoringBudget:
    """``budget_s`` seconds of scoring wall time, shared by the threads scoring one step. Thread-safe.

    Time counts while at least one scoring call is between :meth:`begin` and :meth:`end` (so four threads
    scoring at once for 1 s use 1 s). :meth:`remaining` is ``budget_s`` minus :meth:`used_s` (<= 0: used up).
    """

    def __init__(self, budget_s: float) -> None:
        self.budget_s = float(budget_s)
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self._used = 0.0

    def begin(self) -> None:
        with self._lock:
            if self._active == 0:
                self._since = time.monotonic()
            self._active += 1

    def end(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._used += time.monotonic() - self._since

    def used_s(self) -> float:
        """Seconds of scoring so far (including calls still running)."""
        with self._lock:
            return self._used + (time.monotonic() - self._since if self._active else 0.0)

    def remaining(self) -> float:
        return self.budget_s - self.used_s()


class StepScorer:
    """Scores one step's completions in worker threads within one :class:`ScoringBudget`.

    reward_fn: a :class:`~sailrl.runtime.rewards.rules.RewardFunction`. budget_s: the step's budget in seconds
    (default ``reward_fn.step_budget_s``, i.e. ``reward.step_budget_s``). Counters for the step: ``scored``
    (completions), ``budget_exceeded`` (rules failed for want of budget); :meth:`metrics` returns them with the
    scoring time.
    """

    def __init__(self, reward_fn: Any, budget_s: float | None = None) -> None:
        self.reward_fn = reward_fn
        if budget_s is None:
            budget_s = getattr(reward_fn, "step_budget_s", 60.0)
        self.budget = ScoringBudget(budget_s)
        self.scored = 0
        self.budget_exceeded = 0
        self.judges: dict[str, Any] = dict(getattr(reward_fn, "judges", None) or {})
        self.judge_stats = JudgeStats()
        self._lock = threading.Lock()
        #: python rule name -> {"calls", "bytes", "lines", "shown"}: what its calls printed this step
        self.output: dict[str, dict[str, int]] = {}

    def score_sync(self, text: str, fields: dict[str, Any], *, truncated: bool = False,
                   num_tokens: int | None = None, judged: dict[str, Any] | None = None) -> Any:
        """Score in the calling thread, within the step's budget (what :meth:`score` runs in a worker thread).

        judged: as for ``RewardFunction.score`` (``{}`` leaves the judge rules pending); None judges them here.
        """
        self.budget.begin()
        try:
            result = self.reward_fn.score(text, fields, truncated=truncated, num_tokens=num_tokens,
                                          budget=self.budget, judged=judged, judge_stats=self.judge_stats) \
                if self.judges else self.reward_fn.score(text, fields, truncated=truncated, num_tokens=num_tokens,
                                                         budget=self.budget)
        finally:
            self.budget.end()
        with self._lock:
            self.scored += 1
            if judged is None:
                self.budget_exceeded += int(getattr(result, "budget_exceeded", 0))
        for rule, (text, printed, lines) in (getattr(result, "output", None) or {}).items():
            self._printed(rule, text, printed, lines)
        return result

    def _printed(self, rule: str, text: str, printed: int, printed_lines: int) -> None:
        """Show what one call of python rule ``rule`` printed: whole lines prefixed with the rule's name, at most
        :data:`SHOWN_LINES` a step (the rest is counted for :meth:`warnings`), in one write so lines of calls
        scored at the same time never mix."""
        lines = text.splitlines() or [""]
        with self._lock:
            seen = self.output.setdefault(rule, {"calls": 0, "bytes": 0, "lines": 0, "shown": 0})
            seen["calls"] += 1
            seen["bytes"] += printed
            seen["lines"] += printed_lines
            room = SHOWN_LINES - seen["shown"]
            shown = lines[:max(room, 0)]
            seen["shown"] += len(shown)
            if shown:
                out = "".join(f"  [{rule}] {line[:SHOWN_LINE_CHARS]}\n" for line in shown)
                try:
                    sys.stderr.write(out)
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass

    async def score(self, text: str, fields: dict[str, Any], *, truncated: bool = False,
                    num_tokens: int | None = None) -> Any:
        """The :class:`~sailrl.runtime.rewards.rules.Score` of one completion, computed in a worker thread.

        Judge rules (``kind: judge``) are judged on this event loop at the same time, each call bounded by its
        timeout and the step's budget, and merged in (``RewardFunction.with_verdicts``). Never raises for a
        rule's failure (``RewardFunction.score`` and ``Judge.judge`` do not). Cancelling the await leaves the
        thread to finish that completion (bounded by the rules' time limits and the budget).
        """
        loop = asyncio.get_running_loop()
        if not self.judges:
            return await loop.run_in_executor(
                _executor(), lambda: self.score_sync(text, fields, truncated=truncated, num_tokens=num_tokens))
        rules = loop.run_in_executor(
            _executor(), lambda: self.score_sync(text, fields, truncated=truncated, num_tokens=num_tokens,
                                                 judged={}))
        names = list(self.judges)
        results = await asyncio.gather(
            rules, *(self.judges[n].judge(text, fields, budget=self.budget, stats=self.judge_stats) for n in names))
        score = self.reward_fn.with_verdicts(results[0], dict(zip(names, results[1:], strict=True)))
        with self._lock:
            self.budget_exceeded += int(getattr(score, "budget_exceeded", 0))
        return score

    def metrics(self) -> dict[str, float]:
        """``{"reward_scoring_s": seconds of scoring wall time, "reward_budget_exceeded": rules failed for want of
        budget, "reward_scored": completions}`` for this step; with judge rules also ``judge/calls``,
        ``judge/cached``, ``judge/failed``, ``judge/unparsed``, ``tokens/judge_prompt``, ``tokens/judge_output``
        (:class:`sailrl.runtime.rewards.judge.JudgeStats`)."""
        with self._lock:
            out = {"reward_scoring_s": self.budget.used_s(), "reward_budget_exceeded": float(self.budget_exceeded),
                   "reward_scored": float(self.scored)}
        if self.judges:
            out.update(self.judge_stats.metrics())
        return out

    def warnings(self) -> list[str]:
        """One line per python rule that printed, e.g. "python rule 'style' printed 1,204 lines (52.1 kB) in 64 of
        128 calls (the first 10 lines are shown above)". (A judge rule that failed is reported by the run's line for
        rules that could not be scored.)"""
        out: list[str] = []
        with self._lock:
            for rule, seen in self.output.items():
                out.append(f"python rule '{rule}' printed {_lines(seen['lines'])} ({_size(seen['bytes'])}) in "
                           f"{seen['calls']:,} of {self.scored:,} calls (the first {_lines(seen['shown'])} "
                           f"{'is' if seen['shown'] == 1 else 'are'} shown above); print less, or return the "
                           f"details as named sub-scores")
        return out


def _lines(n: int) -> str:
    return f"{n:,} line{'' if n == 1 else 's'}"


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 10_000 else f"{n / 1e3:,.1f} kB" if n < 10_000_000 else f"{n / 1e6:,.1f} MB"
