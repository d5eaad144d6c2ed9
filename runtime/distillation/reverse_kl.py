"""The reverse-KL advantage of on-policy distillation.

The student samples; the teacher scores the student's tokens (its prompt logprobs of the whole sequence). For each
sampled token ``t`` the student's own logprob ``log p(t)`` (recorded when it sampled) and the teacher's ``log q(t)``
give the per-token reverse-KL estimate ``log p(t) - log q(t)``; the token's advantage gains
``kl_coef * (log q(t) - log p(t))``: tokens the teacher finds likelier than the student did are reinforced, the
others discouraged. Minimising that with ``importance_sampling`` minimises the reverse KL ``KL(student || teacher)``
on the student's own distribution, as tinker_cookbook's on-policy distillation does. Prompt and observation tokens
(mask 0) gain nothing.

Reward rules, when the spec has them, give each rollout their group-centred advantage first; the KL term is added
to it token by token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import tinker
import torch

__all__ = ["KL_METRIC", "add_reverse_kl", "sequence_inputs", "teacher_logprobs"]

#: The metric of the mean per-token reverse KL (student minus teacher logprob over sampled tokens), per step.
KL_METRIC = "distill/reverse_kl"


def sequence_inputs(data: Sequence[tinker.Datum]) -> list[tinker.ModelInput]:
    """Each datum's whole sequence: its model input (every token but the last) plus its last target token."""
    return [d.model_input.append_int(int(d.loss_fn_inputs["target_tokens"].data[-1])) for d in data]


async def teacher_logprobs(teacher: Any, data: Sequence[tinker.Datum]) -> list[list[float]]:
    """The teacher's logprob of every token of each datum's sequence given the tokens before it (a sampling
    client's ``compute_logprobs_async``; Tinker bills it as prefill), aligned with the datum's targets: entry
    ``i`` is the logprob of target token ``i``."""
    sequences = sequence_inputs(data)
    expect = getattr(teacher, "expect_requests", None)  # the embedded backend: one batch, whatever the load
    if expect is not None and sequences:
        expect(len(sequences))
    answers = await asyncio.gather(*(teacher.compute_logprobs_async(seq) for seq in sequences))
    out: list[list[float]] = []
    for seq, logprobs in zip(sequences, answers, strict=True):
        values = list(logprobs)
        if len(values) == seq.length:  # the first token has no logprob (None): drop it
            values = values[1:]
        if len(values) != seq.length - 1 or any(v is None for v in values):
            raise ValueError(f"the teacher returned {len(values)} logprobs for a sequence of {seq.length} tokens "
                             "(expected one per token, None only for the first)")
        out.append([float(v) for v in values])
    return out


def add_reverse_kl(data: Sequence[tinker.Datum], teacher: Sequence[Sequence[float]],
                   kl_coef: float) -> dict[str, float]:
    """Add ``kl_coef * (teacher logprob - student logprob)`` to each sampled token's advantage, in place, and
    return the step's metrics: :data:`KL_METRIC` (mean ``student - teacher`` logprob over sampled tokens) and
    ``tokens/teacher`` (the tokens the teacher read: each datum's whole sequence).

    ``data``: datums from ``assemble_training_data`` (``logprobs`` are the student's sampling logprobs, ``mask``
    1 on sampled tokens). ``teacher``: per datum, the teacher's logprob of each target token
    (:func:`teacher_logprobs`).
    """
    kl_sum, tokens = 0.0, 0.0
    for datum, q in zip(data, teacher, strict=True):
        inputs = datum.loss_fn_inputs
        student = inputs["logprobs"].to_torch().double()
        mask = inputs["mask"].to_torch().double()
        q_t = torch.tensor(list(q), dtype=torch.float64)
        if q_t.shape != student.shape:
            raise ValueError(f"{q_t.numel()} teacher logprobs for {student.numel()} target tokens")
        reverse_kl = (student - q_t) * mask
        advantages = inputs["advantages"].to_torch().double() - kl_coef * reverse_kl
        inputs["advantages"] = tinker.TensorData.from_torch(advantages.float())
        kl_sum += float(reverse_kl.sum())
        tokens += float(mask.sum())
    read = float(sum(d.model_input.length + 1 for d in data))
    return {KL_METRIC: kl_sum / tokens if tokens else float("nan"), "tokens/teacher": read}
