"""What a run reports: per-step metrics from rollouts and training data, the console line, the summary.

Metric keys (one ``metrics.jsonl`` line per step; steps numbered from 1):

- ``reward/total``, ``reward/<rule>`` (mean contribution), ``correct`` (pass rate of the answer rule),
  ``frac_truncated``, ``regex_timeouts``, ``groups``, ``groups_failed``, ``degenerate_frac`` -- over every rollout
  of the step, degenerate groups included (:func:`rollout_metrics`).
- token accounting (:func:`token_counts`): ``tokens/prompt`` (prompt tokens sent for sampling, counted once per
  rollout request), ``tokens/sampled``, ``tokens/trained`` (tokens in the datums sent to forward_backward),
  ``tokens/eval_prompt``, ``tokens/eval_sampled``, ``tokens/reference`` (tokens scored by the KL reference model),
  ``tokens/warmup_trained`` (the supervised warm-up's, on the first step's line), ``tokens/judge_prompt`` /
  ``tokens/judge_output`` (what ``kind: judge`` rules' judge models read and wrote, train and eval) and
  ``tokens_cum/<kind>`` (the run so far). With prices: ``cost/<kind>``, ``cost/step``, ``cost/total`` (USD,
  ``sailrl.runtime.planning.cost``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import tinker

__all__ = ["JUDGE_TOKEN_KEYS", "TOKEN_KINDS", "add_judge_tokens", "rollout_metrics", "step_line", "summary_lines",
           "token_counts"]

TOKEN_KINDS = ("prompt", "sampled", "trained", "eval_prompt", "eval_sampled", "reference", "warmup_trained",
               "judge_prompt", "judge_output", "teacher")
#: Judge tokens of a step (train and eval rollouts together; ``kind: judge`` rules only).
JUDGE_TOKEN_KEYS = ("tokens/judge_prompt", "tokens/judge_output")


def add_judge_tokens(metrics: dict[str, Any], extra: dict[str, Any]) -> None:
    """Add the judge tokens in ``extra`` (a StepScorer's metrics) to ``metrics`` (a step's line)."""
    for key in JUDGE_TOKEN_KEYS:
        if key in extra:
            metrics[key] = float(metrics.get(key, 0.0)) + float(extra[key])


def rollout_metrics(groups: Sequence[Any], failed: int, rule_names: Sequence[str],
                    prefix: str = "") -> dict[str, float]:
    """Means over every rollout of ``groups`` (tinker_cookbook ``TrajectoryGroup``s) and the group counts.

    A mean over no rollouts is NaN (logged as null).
    """
    totals: list[float] = []
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for g in groups:
        for traj, total in zip(g.trajectories_G, g.get_total_rewards(), strict=True):
            totals.append(float(total))
            for tr in traj.transitions:
                for k, v in tr.metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                    counts[k] = counts.get(k, 0) + 1
    n = len(totals)
    out: dict[str, float] = {
        "reward/total": sum(totals) / n if n else float("nan"),
        "groups": float(len(groups)),
        "groups_failed": float(failed),
    }
    for name in rule_names:
        key = f"reward/{name}"
        out[key] = sums[key] / counts[key] if counts.get(key) else float("nan")
    for key in sums:  # sub-scores a python rule returned: reward/<rule>/<name>
        if key.startswith("reward/") and key not in out:
            out[key] = sums[key] / counts[key]
    if counts.get("correct"):
        out["correct"] = sums["correct"] / counts["correct"]
    out["frac_truncated"] = sums.get("truncated", 0.0) / n if n else float("nan")
    out["regex_timeouts"] = sums.get("regex_timeouts", 0.0)
    for key in sums:  # episodes: turns, tool calls and tool errors per episode, the fraction ended by each reason
        if key.startswith("episode/"):
            out[key] = sums[key] / n if n else float("nan")
    for key in sums:  # counters the reward rules add (e.g. failed python rules, scoring past its budget)
        if key.startswith("rule_") or key.endswith("_failures") or key.endswith("_exceeded"):
            out[key] = sums[key]
    return {f"{prefix}{k}": v for k, v in out.items()}


def sampled_tokens(groups: Iterable[Any]) -> tuple[int, int]:
    """``(prompt tokens, sampled tokens)`` over every rollout of ``groups``: each rollout is one sampling request,
    so its prompt is counted once per rollout."""
    prompt = sampled = 0
    for g in groups:
        for traj in g.trajectories_G:
            for tr in traj.transitions:
                prompt += tr.ob.length
                sampled += len(tr.ac.tokens)
    return prompt, sampled


def token_counts(data: Sequence[tinker.Datum]) -> int:
    """Tokens in training datums (``model_input.length`` summed): what forward_backward processes."""
    return sum(d.model_input.length for d in data)


def _fmt(x: Any, spec: str = "+.3f") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and not math.isnan(x) else "  n/a "


def _k(x: Any) -> str:
    x = float(x or 0)
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def _pct(x: Any) -> str:
    return f"{100 * x:.0f}%" if isinstance(x, (int, float)) and not math.isnan(x) else "n/a"


def step_line(step: int, total: int, metrics: dict[str, Any], rule_names: Sequence[str], seconds: float, *,
              show_cost: bool = True) -> str:
    """``step 3/40 | reward +0.512 = correct +0.40 + format +0.11 | correct 80% | degenerate 12% | truncated 0% |
    tokens 2.8k in, 1.5k out, 1.0k trained | $0.0123 (total $0.04) | 0.9s`` (cost only with ``show_cost`` and a
    known price). An episode run's line also says, per episode, the model's turns, its tool calls and how many
    of them failed, and feedback turns when there were any: ``episodes 2.10 turns, 1.05 tool calls (0.12
    failed)``."""
    reward = f"reward {_fmt(metrics.get('reward/total'))}"
    rules = " + ".join(f"{n} {_fmt(metrics.get(f'reward/{n}'))}" for n in rule_names)
    parts = [f"step {step:4d}/{total}", f"{reward} = {rules}" if rules else reward]
    if metrics.get("correct") is not None:
        parts.append(f"correct {_pct(metrics['correct'])}")
    if isinstance(metrics.get("distill/reverse_kl"), float):  # method distill
        parts.append(f"KL to teacher {metrics['distill/reverse_kl']:.3f}")
    parts.append(f"degenerate {100 * (metrics.get('degenerate_frac') or 0):3.0f}%")
    parts.append(f"truncated {100 * (metrics.get('frac_truncated') or 0):3.0f}%")
    episodes = _episodes(metrics)
    if episodes:
        parts.append(episodes)
    parts.append(f"tokens {_k(metrics.get('tokens/prompt'))} in, {_k(metrics.get('tokens/sampled'))} out, "
                 f"{_k(metrics.get('tokens/trained'))} trained")
    if metrics.get("cost/step") is not None and show_cost:
        parts.append(f"${metrics['cost/step']:.4f} (total ${metrics.get('cost/total') or 0:.2f})")
    if metrics.get("staleness/max"):
        parts.append(f"off-policy {metrics['staleness/max']:.0f}")
    if metrics.get("eval/reward/total") is not None:
        ev = f"eval reward {_fmt(metrics['eval/reward/total'])}"
        if metrics.get("eval/correct") is not None:
            ev += f" correct {_pct(metrics['eval/correct'])}"
        parts.append(ev)
    parts.append(f"{seconds:.1f}s")
    return " | ".join(parts)


def _episodes(metrics: dict[str, Any]) -> str | None:
    """The step line's episode part (means per episode, from :func:`rollout_metrics`); None for a single-turn
    run, whose metrics carry no ``episode/`` keys."""
    turns, calls = metrics.get("episode/turns"), metrics.get("episode/tool_calls")
    if not isinstance(turns, (int, float)) or not isinstance(calls, (int, float)) or math.isnan(turns):
        return None
    text = f"episodes {turns:.2f} turns, {calls:.2f} tool calls ({metrics.get('episode/tool_errors') or 0:.2f} failed)"
    feedback = metrics.get("episode/feedback_turns")
    if isinstance(feedback, (int, float)) and feedback > 0:
        text += f", {feedback:.2f} feedback turns"
    return text


def _window_mean(history: Sequence[dict[str, Any]], key: str, k: int) -> tuple[float, float, int]:
    """Means of the first and last ``n`` values, ``n = min(k, half of them)`` so the two never overlap."""
    values = [m[key] for m in history if isinstance(m.get(key), (int, float))]
    n = min(k, len(values) // 2) if len(values) > 1 else len(values)
    if not n:
        return float("nan"), float("nan"), 0
    return sum(values[:n]) / n, sum(values[-n:]) / n, n


def _steps(history: Sequence[dict[str, Any]], key: str) -> int:
    return sum(1 for m in history if isinstance(m.get(key), (int, float)))  # the values _window_mean reads


def _first_last(label: str, first: float, last: float, n: int, steps: int, fmt: str) -> str:
    """``reward (mean of first 5 steps -> last 5): a -> b``; ``(first step -> last step)`` for one step each;
    ``(the only step)`` for a run of one step."""
    if steps == 1:
        return f"{label} (the only step): {first:{fmt}}"
    if n == 1:
        return f"{label} (first step -> last step): {first:{fmt}} -> {last:{fmt}}"
    return f"{label} (mean of first {n} steps -> last {n}): {first:{fmt}} -> {last:{fmt}}"


def summary_lines(history: Sequence[dict[str, Any]], *, show_cost: bool = True) -> list[str]:
    """First-vs-last means (five steps each) of reward and ``correct``, tokens and (``show_cost``) cost of the run."""
    lines = []
    first, last, n = _window_mean(history, "reward/total", 5)
    lines.append(_first_last("reward", first, last, n, _steps(history, "reward/total"), "+.3f"))
    first, last, n = _window_mean(history, "correct", 5)
    if n:
        lines.append(_first_last("correct", first, last, n, _steps(history, "correct"), ".3f"))
    first, last, n = _window_mean(history, "distill/reverse_kl", 5)
    if n:  # method distill: the student's reverse KL to its teacher
        lines.append(_first_last("reverse KL to the teacher", first, last, n, _steps(history, "distill/reverse_kl"),
                                 ".3f"))
    if history:
        end = history[-1]
        tokens = {k: end.get(f"tokens_cum/{k}") for k in TOKEN_KINDS if end.get(f"tokens_cum/{k}")}
        if tokens:
            lines.append("tokens: " + ", ".join(f"{k} {int(v):,}" for k, v in tokens.items()))
        if end.get("cost/total") is not None and show_cost:
            lines.append(f"cost: ${end['cost/total']:.4f} (estimate from the prices in pricing:)")
    return lines
