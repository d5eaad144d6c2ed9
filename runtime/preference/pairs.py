"""Preference pairs: a row's prompt (``prompt.system`` / ``prompt.user``) with its chosen and its rejected
completion (the fields ``dpo.chosen_field`` and ``dpo.rejected_field``), each rendered as the assistant's reply
and built into a datum whose weights select the reply's tokens (the end-of-turn that closes it included, the
prompt's weight 0), and the frozen reference model's logprob of each reply, computed once per pair.

A batch is laid out as pairs, ``[chosen_1, rejected_1, chosen_2, rejected_2, ...]``
(:func:`sailrl.runtime.preference.loss.pair_loss_fn` reads it so).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import tinker
import torch
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.supervised.common import datum_from_model_input_weights

from sailrl.runtime.preference.loss import sequence_logprob
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.prompts.pairs import reply_text
from sailrl.spec.schema import Spec

__all__ = ["Reference", "pair_datums"]


def _reply_datum(prompts: PromptBuilder, row: Mapping[str, Any], reply: str, max_length: int | None) -> tinker.Datum:
    conversation = [*prompts.conversation(row), {"role": "assistant", "content": reply}]
    model_input, weights = prompts.renderer.build_supervised_example(
        conversation, train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    return datum_from_model_input_weights(model_input, weights, max_length=max_length)


def pair_datums(spec: Spec, prompts: PromptBuilder, row: Mapping[str, Any],
                max_length: int | None = None) -> tuple[tinker.Datum, tinker.Datum]:
    """``(chosen, rejected)`` datums of ``row``: the prompt's messages plus the completion as the assistant's
    reply, weight 1 on the reply's tokens (``TrainOnWhat.LAST_ASSISTANT_MESSAGE``), inputs shifted right and
    targets left as ``cross_entropy`` (and ``forward_backward_custom``) read them."""
    d = spec.dpo
    return (_reply_datum(prompts, row, reply_text(row, d.chosen_field), max_length),
            _reply_datum(prompts, row, reply_text(row, d.rejected_field), max_length))


class Reference:
    """The frozen reference model (a sampling client over the starting weights) and the logprobs it gave each
    pair: ``await logprobs(rows, data)`` computes a pair's (chosen, rejected) sequence logprobs the first time the
    pair is seen and keeps them, and says how many tokens it read (the step's ``tokens/reference``)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._cache: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[float, float]] = {}

    async def _sequence_logprob(self, datum: tinker.Datum) -> float:
        targets = datum.loss_fn_inputs["target_tokens"].tolist()
        full = datum.model_input.append_int(int(targets[-1]))  # the whole sequence: inputs + the last target
        token_logprobs = await self.client.compute_logprobs_async(full)
        values = torch.tensor([0.0 if x is None else float(x) for x in token_logprobs[1:]], dtype=torch.float64)
        return float(sequence_logprob(values, datum.loss_fn_inputs["weights"].to_torch()))

    async def logprobs(self, rows: list[Mapping[str, Any]], data: list[tinker.Datum]) -> tuple[
            list[tuple[float, float]], int]:
        """For each row (its pair at ``data[2i]``, ``data[2i + 1]``) the reference's (chosen, rejected) sequence
        logprobs, and the tokens read for the pairs not seen before (each pair is read once per run process; a
        pair is known by its two sequences' tokens, so rows of another split with the same index never share)."""
        keys = [(_sequence(data[2 * i]), _sequence(data[2 * i + 1])) for i in range(len(rows))]
        todo = {key: i for i, key in enumerate(keys) if key not in self._cache}
        values = await asyncio.gather(*(self._sequence_logprob(data[2 * i + k]) for i in todo.values()
                                        for k in (0, 1)))
        for j, key in enumerate(todo):
            self._cache[key] = (values[2 * j], values[2 * j + 1])
        read = sum(len(key[0]) + len(key[1]) for key in todo)
        return [self._cache[key] for key in keys], read


def _sequence(datum: tinker.Datum) -> tuple[int, ...]:
    """The datum's whole sequence: its inputs and the last target token."""
    return (*datum.model_input.to_ints(), int(datum.loss_fn_inputs["target_tokens"].tolist()[-1]))
