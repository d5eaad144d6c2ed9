"""Tinker's built-in loss functions, token level, SUM reduction.

Source: the Tinker documentation, "Loss functions in Tinker" (losses.mdx), "Basic loss functions". For one datum
with ``N`` = ``model_input.length`` target positions, ``target_logprobs`` (shape ``(N,)``) are the
learner's log-probabilities of ``loss_fn_inputs["target_tokens"]``; ``logprobs`` are the sampler's
(``sampling_logprobs``) and ``advantages`` the per-token advantages, all shape ``(N,)``:

- ``cross_entropy``:       ``-(target_logprobs * weights).sum()``
- ``importance_sampling``: ``ratio = exp(target_logprobs - logprobs)``; ``-(ratio * advantages).sum()``
- ``ppo``:   ``-min(ratio * A, clamp(ratio, clip_low, clip_high) * A).sum()``
- ``cispo``: ``-(clamp(ratio, clip_low, clip_high).detach() * target_logprobs * A).sum()``
- ``dro``:   ``-(target_logprobs * A - 0.5 * beta * (target_logprobs - logprobs) ** 2).sum()``

``cross_entropy`` also takes ``target_tokens`` and ``weights`` of shape ``(N, K)`` (top-K distillation, as in
tinker_cookbook's ``distillation/sdft.py``): ``target_logprobs`` is then ``(N, K)``, the logprob of each of the K
tokens at each position, and the loss ``-(target_logprobs * weights).sum()`` over both axes -- the sum of K
single-target cross-entropies, each with its column of weights. The other losses take ``(N,)`` inputs only.

``loss_fn_config`` keys: ``clip_low_threshold`` / ``clip_high_threshold`` for ppo and cispo
(defaults 0.8 / 1.2, i.e. epsilon 0.2 as the doc says Tinker fixes), ``beta`` for dro (default
0.05, the doc's example value). The loss of a batch is the sum over its datums.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from sailrl.spec.errors import ConfigError

LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")
DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.2
DEFAULT_DRO_BETA = 0.05

_REQUIRED_INPUTS = {
    "cross_entropy": ("target_tokens",),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "dro": ("target_tokens", "logprobs", "advantages"),
}
_OPTIONAL_INPUTS = {"cross_entropy": ("weights",)}
_CONFIG_KEYS = {
    "cross_entropy": (),
    "importance_sampling": (),
    "ppo": ("clip_low_threshold", "clip_high_threshold"),
    "cispo": ("clip_low_threshold", "clip_high_threshold"),
    "dro": ("beta",),
}


class LossInputError(ConfigError):
    """A loss name, a loss_fn_inputs key or a loss_fn_config key the embedded backend rejects (a
    ``ValueError``)."""

    code = "E154"


def check_loss_request(
    loss_fn: str, input_keys: set[str], loss_fn_config: Mapping[str, float | str] | None, index: int
) -> None:
    """Raise ``LossInputError`` in plain words for an unknown loss, or missing / extra inputs."""
    if loss_fn not in _REQUIRED_INPUTS:
        raise LossInputError(
            f"The embedded backend has no loss function {loss_fn!r}; use one of {', '.join(LOSS_FNS)}."
        )
    required = set(_REQUIRED_INPUTS[loss_fn])
    allowed = required | set(_OPTIONAL_INPUTS.get(loss_fn, ()))
    missing = sorted(required - input_keys)
    extra = sorted(input_keys - allowed)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected {', '.join(extra)}")
        raise LossInputError(
            f"Datum {index}: loss_fn_inputs for {loss_fn!r} are wrong ({'; '.join(parts)}). "
            f"It takes {', '.join(sorted(allowed))}."
        )
    unknown = sorted(set(loss_fn_config or {}) - set(_CONFIG_KEYS[loss_fn]))
    if unknown:
        accepted = ", ".join(_CONFIG_KEYS[loss_fn]) or "none"
        raise LossInputError(
            f"loss_fn_config keys {', '.join(unknown)} are not used by {loss_fn!r} (accepted: {accepted})."
        )


def check_input_shapes(loss_fn: str, shapes: Mapping[str, tuple[int, ...]], index: int) -> None:
    """Raise ``LossInputError`` for a two-dimensional loss input where ``loss_fn`` takes none (only cross_entropy's
    ``target_tokens`` and ``weights`` may be ``(N, K)``), or ``weights`` not shaped as ``target_tokens``."""
    two_d = sorted(key for key, shape in shapes.items() if len(shape) == 2)
    if two_d and (loss_fn != "cross_entropy" or set(two_d) - {"target_tokens", "weights"}):
        raise LossInputError(
            f"Datum {index}: loss_fn_inputs {', '.join(two_d)} are two-dimensional; only cross_entropy's "
            f"target_tokens and weights may be (N, K), the others take one value per token.")
    if "weights" in shapes and shapes["weights"] != shapes["target_tokens"]:
        raise LossInputError(
            f"Datum {index}: weights have shape {shapes['weights']} and target_tokens {shapes['target_tokens']}; "
            "cross_entropy needs them alike ((N,) or (N, K)).")


def _config_float(config: Mapping[str, float | str] | None, key: str, default: float) -> float:
    if not config or key not in config:
        return default
    try:
        return float(config[key])
    except (TypeError, ValueError) as exc:
        raise LossInputError(f"loss_fn_config[{key!r}] must be a number, got {config[key]!r}.") from exc


def datum_loss(
    loss_fn: str,
    target_logprobs: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    loss_fn_config: Mapping[str, float | str] | None = None,
) -> torch.Tensor:
    """The scalar loss of one datum (sum over its ``N`` tokens); formulas in the module docstring. Every loss is a
    sum over tokens, so for several datums' tokens one after another it is the sum of their losses.

    ``target_logprobs``: float tensor ``(N,)`` (differentiable). ``inputs``: float tensors ``(N,)``
    for ``weights`` / ``logprobs`` / ``advantages``. ``cross_entropy`` without ``weights`` weighs
    every token 1.
    """
    if loss_fn == "cross_entropy":
        weights = inputs.get("weights")
        if weights is None:
            weights = torch.ones_like(target_logprobs)
        return -(target_logprobs * weights).sum()
    sampling_logprobs = inputs["logprobs"]
    advantages = inputs["advantages"]
    if loss_fn == "importance_sampling":
        prob_ratio = torch.exp(target_logprobs - sampling_logprobs)
        return -(prob_ratio * advantages).sum()
    if loss_fn in ("ppo", "cispo"):
        low = _config_float(loss_fn_config, "clip_low_threshold", DEFAULT_CLIP_LOW)
        high = _config_float(loss_fn_config, "clip_high_threshold", DEFAULT_CLIP_HIGH)
        prob_ratio = torch.exp(target_logprobs - sampling_logprobs)
        clipped_ratio = torch.clamp(prob_ratio, low, high)
        if loss_fn == "ppo":
            objective = torch.min(prob_ratio * advantages, clipped_ratio * advantages)
        else:
            objective = clipped_ratio.detach() * target_logprobs * advantages
        return -objective.sum()
    if loss_fn == "dro":
        beta = _config_float(loss_fn_config, "beta", DEFAULT_DRO_BETA)
        quadratic_term = (target_logprobs - sampling_logprobs) ** 2
        return -(target_logprobs * advantages - 0.5 * beta * quadratic_term).sum()
    raise LossInputError(f"The embedded backend has no loss function {loss_fn!r}.")
