"""Small pure pieces of the RL algorithm that a generated script calls between tinker_cookbook's functions.

The script itself shows the algorithm (snapshot, policy, rollouts, degenerate split, advantages, datum assembly,
forward_backward + optim_step); these helpers only keep it short:

- :func:`split_degenerate`: a group whose rollouts all scored the same has zero group-centred advantages and so no
  gradient (tinker_cookbook's ``remove_constant_reward_groups`` does the same filtering).
- :func:`scale_advantages`: ``training.advantage_scale`` (GRPO's division by the group's standard deviation, or
  by the step's; TRL's ``scale_rewards`` names ``group`` / ``batch``).
- :func:`drop_stale`: bounded off-policy sampling drops groups sampled more than K steps before the step that
  trains on them (tinker_cookbook ``AsyncConfig.max_steps_off_policy``).
- :func:`learning_rate`: ``training.lr_schedule`` with ``lr_warmup_steps`` (:mod:`sailrl.runtime.loop.schedule`,
  which the saved state also reads).
- :func:`loss_fn_config`, :func:`without_mask`.

Steps are numbered from 1: step ``s`` is the ``s``-th optimizer update of the run.
"""

from __future__ import annotations

from collections.abc import Sequence

import tinker
import torch
from tinker_cookbook.rl.types import TrajectoryGroup

from sailrl.runtime.loop.schedule import learning_rate

__all__ = [
    "ADVANTAGE_STD_EPS",
    "DEFAULT_LOSS_FN_CONFIG",
    "drop_stale",
    "learning_rate",
    "loss_fn_config",
    "scale_advantages",
    "split_degenerate",
    "without_mask",
]

#: Added to a standard deviation before dividing by it (TRL's GRPO uses 1e-4, tinker_cookbook has no scaling).
ADVANTAGE_STD_EPS = 1e-6

#: Loss parameters when the spec gives none (Tinker loss docs: ppo / cispo clip the probability ratio to
#: [0.8, 1.2]; the dro example uses beta 0.05).
DEFAULT_LOSS_FN_CONFIG: dict[str, dict[str, float]] = {
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.05},
    "importance_sampling": {},
}


def split_degenerate(groups: Sequence[TrajectoryGroup]) -> tuple[list[TrajectoryGroup], list[TrajectoryGroup]]:
    """``(kept, degenerate)``, in order. A group is degenerate when every rollout's total reward is the same."""
    kept: list[TrajectoryGroup] = []
    degenerate: list[TrajectoryGroup] = []
    for g in groups:
        rewards = [float(r) for r in g.get_total_rewards()]
        (degenerate if rewards and len(set(rewards)) == 1 else kept).append(g)
    return kept, degenerate


def scale_advantages(groups: Sequence[TrajectoryGroup], advantages: Sequence[torch.Tensor],
                     mode: str) -> list[torch.Tensor]:
    """Scale group-centred advantages (one tensor of shape ``(group_size,)`` per group) by a reward std.

    ``none``: unchanged. ``group_std``: each group's advantages / (that group's population std of total reward +
    :data:`ADVANTAGE_STD_EPS`) (GRPO). ``batch_std``: every advantage / (the population std of every total reward
    in ``groups`` + eps). Degenerate groups (std 0) must have been dropped first; one that was not keeps its zeros
    (0 / eps = 0), never a division by zero. Raises ``ValueError`` for another mode.
    """
    if mode == "none":
        return list(advantages)
    rewards = [torch.tensor([float(r) for r in g.get_total_rewards()], dtype=torch.float64) for g in groups]
    if mode == "group_std":
        return [(a / (r.std(unbiased=False).item() + ADVANTAGE_STD_EPS)).to(a.dtype)
                for a, r in zip(advantages, rewards, strict=True)]
    if mode == "batch_std":
        if not rewards:
            return []
        std = torch.cat(rewards).std(unbiased=False).item()
        return [(a / (std + ADVANTAGE_STD_EPS)).to(a.dtype) for a in advantages]
    raise ValueError(f"unknown advantage_scale {mode!r}: use none, group_std or batch_std")


def drop_stale(groups: Sequence[TrajectoryGroup], sampler_steps: Sequence[int], step: int,
               max_steps_off_policy: int) -> tuple[list[TrajectoryGroup], list[int], int]:
    """``(fresh groups, their sampler steps, number dropped)``.

    A group sampled from the checkpoint of step ``sampler_step`` is ``step - sampler_step`` steps off policy when
    step ``step`` trains on it; more than ``max_steps_off_policy`` and it is dropped.
    """
    fresh: list[TrajectoryGroup] = []
    steps: list[int] = []
    for g, s in zip(groups, sampler_steps, strict=True):
        if step - s <= max_steps_off_policy:
            fresh.append(g)
            steps.append(s)
    return fresh, steps, len(groups) - len(fresh)


def loss_fn_config(loss_fn: str, config: dict[str, float] | None) -> dict[str, float] | None:
    """The spec's ``training.loss_fn_config`` over :data:`DEFAULT_LOSS_FN_CONFIG`; ``None`` when empty."""
    return {**DEFAULT_LOSS_FN_CONFIG.get(loss_fn, {}), **(config or {})} or None


def without_mask(data: Sequence[tinker.Datum]) -> list[tinker.Datum]:
    """The datums without ``loss_fn_inputs["mask"]``, which ``assemble_training_data`` adds for metrics only and
    Tinker's RL losses do not take (tinker_cookbook's ``rl.train`` removes it the same way)."""
    return [tinker.Datum(model_input=d.model_input,
                         loss_fn_inputs={k: v for k, v in d.loss_fn_inputs.items() if k != "mask"}) for d in data]
