"""The DPO loss (Rafailov et al., 2023) over sequence logprobs, and the ``forward_backward_custom`` loss function of
one batch of pairs.

For a pair (prompt ``x``, chosen ``y_c``, rejected ``y_r``) with sequence logprobs ``log pi(y|x)`` (the sum of the
completion tokens' logprobs: the datum's weights select them) under the policy ``pi`` and the frozen reference
``ref``::

    chosen_reward   = beta * (log pi(y_c|x) - log ref(y_c|x))
    rejected_reward = beta * (log pi(y_r|x) - log ref(y_r|x))
    loss            = mean over pairs of -log sigmoid(chosen_reward - rejected_reward)

Metrics per batch: ``dpo/loss`` (the loss), ``dpo/accuracy`` (the fraction of pairs whose chosen reward is above
the rejected one: the implicit reward model ranks the pair right), ``dpo/margin`` (mean of chosen_reward -
rejected_reward), ``dpo/chosen_reward`` and ``dpo/rejected_reward`` (their means).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["DPO_METRICS", "dpo_loss", "pair_loss_fn", "sequence_logprob"]

#: The metric keys :func:`dpo_loss` returns, in the order a step's line shows them.
DPO_METRICS = ("dpo/loss", "dpo/accuracy", "dpo/margin", "dpo/chosen_reward", "dpo/rejected_reward")


def sequence_logprob(token_logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum(token_logprobs * weights)``: a completion's logprob given its prompt (the weights are 1 on the
    completion's target tokens, 0 on the prompt's), in float64 so a long completion's sum loses nothing."""
    return (token_logprobs.double() * weights.double()).sum()


def dpo_loss(chosen: torch.Tensor, rejected: torch.Tensor, chosen_ref: torch.Tensor, rejected_ref: torch.Tensor,
             beta: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The DPO loss of a batch of pairs and its metrics (module docstring). Each argument is a 1-D tensor of
    sequence logprobs, one entry per pair; ``chosen`` and ``rejected`` carry the policy's gradient, the reference
    ones are constants."""
    chosen_reward = beta * (chosen - chosen_ref)
    rejected_reward = beta * (rejected - rejected_ref)
    margins = chosen_reward - rejected_reward
    loss = -F.logsigmoid(margins).mean()
    metrics = {
        "dpo/loss": float(loss.detach()),
        "dpo/accuracy": float((margins.detach() > 0).double().mean()),
        "dpo/margin": float(margins.detach().mean()),
        "dpo/chosen_reward": float(chosen_reward.detach().mean()),
        "dpo/rejected_reward": float(rejected_reward.detach().mean()),
    }
    return loss, metrics


def pair_loss_fn(reference: Sequence[tuple[float, float]], beta: float
                 ) -> Callable[[list[Any], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]:
    """The loss function ``forward_backward_custom`` calls for a batch laid out as pairs,
    ``[chosen_1, rejected_1, chosen_2, rejected_2, ...]``: each datum's target-token logprobs (policy, with grad)
    summed by its weights (:func:`sequence_logprob`), then :func:`dpo_loss` against ``reference[i]`` = (the
    reference model's chosen, rejected sequence logprobs) of pair ``i``."""

    def loss_fn(data: list[Any], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        if len(data) != 2 * len(reference):
            raise ValueError(f"a DPO batch holds 2 datums per pair: {len(data)} datums for {len(reference)} pairs")
        seq = [sequence_logprob(lp, d.loss_fn_inputs["weights"].to_torch()) for d, lp in
               zip(data, logprobs, strict=True)]
        ref = torch.tensor(reference, dtype=torch.float64).reshape(-1, 2)
        return dpo_loss(torch.stack(seq[0::2]), torch.stack(seq[1::2]), ref[:, 0], ref[:, 1], beta)

    return loss_fn
