"""Policy collapse: degenerate groups above a threshold for several steps in a row, and the completion behind it.

A policy that collapses to one answer (every rollout writes "0") makes every group degenerate -- the same reward
within each group, so no advantage and no gradient -- and the run trains on nothing, step after step, with no
error. :func:`collapse_warning` reads the run's metrics lines (``degenerate_frac`` per step, a resumed run's
earlier lines included) and, on the step where the streak reaches :data:`COLLAPSE_STEPS` steps at or above
:data:`COLLAPSE_FRACTION`, returns one warning naming the step's most common completion and its share. Once per
streak: the streak must fall below the threshold before it is said again. When the rollouts do not share one
answer (the most common completion is under :data:`ONE_ANSWER_SHARE` of them: each group agrees, the groups
differ, as when every sum is answered right) the warning says the task is solved or too hard instead.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = ["COLLAPSE_FRACTION", "COLLAPSE_STEPS", "ONE_ANSWER_SHARE", "collapse_warning", "degenerate_streak",
           "dominant_completion"]

#: Fraction of degenerate groups at or above which a step counts towards a collapse.
COLLAPSE_FRACTION = 0.9
#: Steps in a row at or above :data:`COLLAPSE_FRACTION` before the warning.
COLLAPSE_STEPS = 5
#: Share of a step's rollouts the most common completion must reach for the warning to say "collapsed to one
#: answer" (below it the groups are degenerate with different answers: a solved task, or one too hard).
ONE_ANSWER_SHARE = 0.5
#: Characters of the dominant completion quoted in the warning.
QUOTE_CHARS = 80


def degenerate_streak(history: Sequence[dict[str, Any]], threshold: float = COLLAPSE_FRACTION) -> int:
    """How many of the last metrics lines in a row have ``degenerate_frac`` at or above ``threshold`` (a line
    without a value -- e.g. a step with no groups -- ends the streak)."""
    n = 0
    for line in reversed(history):
        value = line.get("degenerate_frac")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                or value < threshold:
            break
        n += 1
    return n


def _text(transition: Any, tokenizer: Any) -> str | None:
    text = (getattr(transition, "logs", None) or {}).get("completion")
    if isinstance(text, str):
        return text
    try:
        return str(tokenizer.decode(list(transition.ac.tokens)))
    except Exception:  # noqa: BLE001 -- an undecodable completion is left out of the count, never fatal
        return None


def dominant_completion(groups: Sequence[Any], tokenizer: Any) -> tuple[str, int, int] | None:
    """``(text, count, rollouts)``: the most common final completion over ``groups`` (each trajectory's last
    transition, compared stripped), or None when there is none."""
    counts: Counter[str] = Counter()
    total = 0
    for group in groups:
        for traj in getattr(group, "trajectories_G", []):
            if not traj.transitions:
                continue
            total += 1
            text = _text(traj.transitions[-1], tokenizer)
            if text is not None:
                counts[text.strip()] += 1
    if not counts:
        return None
    text, count = counts.most_common(1)[0]
    return text, count, total


def _quote(text: str) -> str:
    shown = text.replace("\n", "⏎")
    return repr(shown if len(shown) <= QUOTE_CHARS else shown[:QUOTE_CHARS - 3] + "...")


def collapse_warning(step: int, history: Sequence[dict[str, Any]], groups: Sequence[Any], tokenizer: Any, *,
                     run_dir: str = "RUN_DIR") -> str | None:
    """The warning for ``step`` (whose metrics line is ``history[-1]``) when the degenerate streak reaches
    :data:`COLLAPSE_STEPS` with it, else None. ``groups``: the step's train groups."""
    if degenerate_streak(history) != COLLAPSE_STEPS:
        return None
    found = dominant_completion(groups, tokenizer)
    head = (f"step {step}: {COLLAPSE_STEPS} steps in a row with at least {COLLAPSE_FRACTION:.0%} of groups "
            "degenerate (the same reward within each group: no gradient)")
    show = f"`sailrl show {run_dir}` shows the completions."
    if found is None:
        return f"{head}. {show}"
    text, count, total = found
    said = f"; the most common completion this step is {_quote(text)} ({count} of {total} rollouts)"
    if count >= ONE_ANSWER_SHARE * total:
        return (f"{head}{said}. The policy may have collapsed to one answer: lower training.learning_rate, raise "
                f"sampling.temperature, or resume from an earlier checkpoint; {show}")
    reward = history[-1].get("reward/total") if history else None
    mean = (f" (mean reward {reward:+.3f} this step)" if isinstance(reward, (int, float))
            and not isinstance(reward, bool) and math.isfinite(reward) else "")
    return (f"{head}{said}, so the rollouts do not share one answer. Every rollout of a group scores alike{mean}: "
            "if that is the best score, the task is solved at this difficulty (stop, or train on harder rows); if "
            "it is the worst, the rows are too hard for now (raise sampling.temperature or training.group_size, or "
            f"give easier rows); {show}")
