"""A conversation -> a ``cross_entropy`` datum, and the NLL of datums.

The renderer builds the tokens and the weights (``renderer.build_supervised_example`` with
``TrainOnWhat.ALL_ASSISTANT_MESSAGES``: 1 on every assistant turn's tokens, the end-of-turn that closes it
included, 0 on system and user turns), then ``tinker_cookbook.supervised.data.conversation_to_datum`` shifts them
into the datum (inputs without the last token, targets and weights without the first). ``reduction="mean"``
(tinker_cookbook's default for SFT) scales each conversation's weights to sum to 1, so every conversation counts
the same in the loss however long its reply.

The NLL of a batch is tinker_cookbook's ``compute_mean_nll``: ``-sum(logprob * weight) / sum(weight)``, the mean
per-token NLL of the assistant tokens, each conversation weighted equally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tinker
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.supervised.common import compute_mean_nll
from tinker_cookbook.supervised.data import conversation_to_datum

__all__ = ["REDUCTION", "TRAIN_ON", "ContextBound", "conversation_datum", "mean_nll", "train_on", "trained_tokens"]

TRAIN_ON = TrainOnWhat.ALL_ASSISTANT_MESSAGES
REDUCTION = "mean"


def conversation_datum(messages: list[dict[str, str]], renderer: Any, max_length: int | None = None) -> tinker.Datum:
    """The datum of ``messages`` (weights on the assistant turns only, summing to 1); ``max_length``: tokens kept
    from the start (the model's context window). Every message renders to at least one token (its role's header),
    so of a conversation of more than ``max_length`` messages only the first ``max_length + 1`` can reach the
    kept tokens: the rest is not rendered, which bounds the time a huge conversation takes by the context."""
    if max_length is not None and len(messages) > max_length + 1:
        messages = messages[:max_length + 1]
    return conversation_to_datum(messages, renderer, max_length, train_on(messages), reduction=REDUCTION)


def train_on(messages: Sequence[dict[str, str]]) -> TrainOnWhat:
    """What of ``messages`` trains: :data:`TRAIN_ON`, every assistant message; for a conversation whose one
    assistant message is its last (every prompt + completion row), ``LAST_ASSISTANT_MESSAGE``, the same tokens and
    weights, and what every renderer builds (the ``chat_template`` renderer builds only that)."""
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return TrainOnWhat.LAST_ASSISTANT_MESSAGE if assistant == [len(messages) - 1] else TRAIN_ON


def mean_nll(logprobs: Sequence[Any], data: Sequence[tinker.Datum]) -> float:
    """``-sum(logprob * weight) / sum(weight)`` over ``data`` (``logprobs``: each datum's per-target-token
    logprobs, a forward pass's ``loss_fn_outputs[i]["logprobs"]``)."""
    return compute_mean_nll(list(logprobs), [d.loss_fn_inputs["weights"] for d in data])


def trained_tokens(data: Sequence[tinker.Datum]) -> int:
    """The target tokens with a weight above 0 (the assistant tokens the loss reads)."""
    return sum(sum(1 for w in d.loss_fn_inputs["weights"].data if w > 0) for d in data)


class ContextBound:
    """Whether a conversation surely fits ``limit`` tokens, by a bound that renders no text (as the RL prompt
    limit's, :class:`~sailrl.runtime.data.rows.PromptLimit`): a token stands for at least one byte of text or a word
    boundary, so a message of ``b`` UTF-8 bytes is at most ``2 b`` tokens, plus the renderer's own tokens for the
    same roles, measured once on empty messages. A row check that rendered every row whole would cost each row's
    tokenisation when the run opens; one that asks this first renders only a row that might not fit."""

    MEASURED_ROLES = 64  # a longer conversation is not bounded (it is rendered, within the context)
    SLACK = 16

    def __init__(self, renderer: Any, limit: int) -> None:
        self.renderer = renderer
        self.limit = limit
        self._overhead: dict[tuple[str, ...], int] = {}

    def surely_fits(self, messages: Sequence[dict[str, str]]) -> bool:
        roles = tuple(m["role"] for m in messages)
        if len(roles) > self.MEASURED_ROLES:
            return False
        if roles not in self._overhead:
            empty = [{"role": role, "content": ""} for role in roles]
            model_input, _ = self.renderer.build_supervised_example(empty, train_on_what=train_on(empty))
            self._overhead[roles] = model_input.length + self.SLACK
        return self._overhead[roles] + 2 * sum(len(m["content"].encode("utf-8")) for m in messages) <= self.limit
