"""The learning rate of a step: ``training.lr_schedule`` with ``lr_warmup_steps``, through tinker_cookbook's
``utils.lr_scheduling.compute_schedule_lr_multiplier``. The script calls it as ``rl.learning_rate``; the saved state
records it."""

from __future__ import annotations

from tinker_cookbook.utils.lr_scheduling import compute_schedule_lr_multiplier

__all__ = ["learning_rate"]


def learning_rate(base: float, step: int, total_steps: int, schedule: str = "constant", warmup_steps: int = 0) -> float:
    """The learning rate of 1-based ``step`` of ``total_steps``.

    During the first ``warmup_steps`` steps it rises linearly: ``base * step / (warmup_steps + 1)``. After them it
    follows ``schedule`` over the remaining steps: ``base * compute_schedule_lr_multiplier(schedule, i, n)`` with
    ``i = step - warmup_steps - 1`` (0-based) and ``n = total_steps - warmup_steps`` (tinker_cookbook
    ``utils.lr_scheduling``: linear ``1 - i/n``, cosine ``(1 + cos(pi i/n)) / 2``, constant 1).
    """
    if step <= warmup_steps:
        return base * step / (warmup_steps + 1)
    remaining = max(1, total_steps - warmup_steps)
    return base * compute_schedule_lr_multiplier(schedule, step - warmup_steps - 1, remaining)
