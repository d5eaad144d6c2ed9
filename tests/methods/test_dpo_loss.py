"""The DPO loss, its gradient and its metrics against a hand computation, the loss function of a batch of pairs on
the datums forward_backward_custom hands it (the reply's tokens summed by the datum's weights), and the reference's
logprobs read once per pair."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from tinker import types

from sailrl.runtime.preference.loss import dpo_loss, pair_loss_fn, sequence_logprob
from sailrl.runtime.preference.pairs import Reference

BETA = 0.5
# Two pairs: sequence logprobs under the policy and the reference.
CHOSEN, REJECTED = [-1.0, -2.0], [-3.0, -1.0]
CHOSEN_REF, REJECTED_REF = [-1.5, -2.0], [-2.0, -2.0]
# By hand: rewards beta * (policy - reference): chosen 0.25 and 0.0, rejected -0.5 and 0.5; margins 0.75, -0.5.
MARGINS = [0.75, -0.5]


def _softplus(x: float) -> float:
    return math.log(1.0 + math.exp(x))


def test_the_loss_is_the_mean_of_minus_log_sigmoid_of_the_margins():
    chosen = torch.tensor(CHOSEN, dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor(REJECTED, dtype=torch.float64, requires_grad=True)
    loss, _ = dpo_loss(chosen, rejected, torch.tensor(CHOSEN_REF, dtype=torch.float64),
                       torch.tensor(REJECTED_REF, dtype=torch.float64), BETA)
    # -log sigmoid(m) = log(1 + exp(-m))
    assert float(loss.detach()) == pytest.approx((_softplus(-0.75) + _softplus(0.5)) / 2, abs=1e-15)
    assert float(loss.detach()) == pytest.approx(0.6804739951, abs=1e-9)
    loss.backward()
    # d loss / d chosen_i = -(beta / n) * sigmoid(-m_i); d loss / d rejected_i = +(beta / n) * sigmoid(-m_i)
    sig = [1.0 / (1.0 + math.exp(m)) for m in MARGINS]
    assert chosen.grad.tolist() == pytest.approx([-BETA / 2 * s for s in sig], abs=1e-15)
    assert rejected.grad.tolist() == pytest.approx([BETA / 2 * s for s in sig], abs=1e-15)
    assert chosen.grad.tolist() == pytest.approx([-0.0802053252, -0.1556148328], abs=1e-9)


def test_the_metrics_are_exact_on_a_constructed_batch():
    t = lambda xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    _, metrics = dpo_loss(t(CHOSEN), t(REJECTED), t(CHOSEN_REF), t(REJECTED_REF), BETA)
    assert metrics == {
        "dpo/loss": pytest.approx(0.6804739951, abs=1e-9),
        "dpo/accuracy": 0.5,  # the first pair is ranked right (margin 0.75), the second wrong (-0.5)
        "dpo/margin": 0.125,  # (0.75 - 0.5) / 2
        "dpo/chosen_reward": 0.125,  # (0.25 + 0.0) / 2
        "dpo/rejected_reward": 0.0,  # (-0.5 + 0.5) / 2
    }
    # a tie is not a pair ranked right
    _, tie = dpo_loss(t([-1.0]), t([-1.0]), t([-1.0]), t([-1.0]), BETA)
    assert tie["dpo/accuracy"] == 0.0 and tie["dpo/loss"] == pytest.approx(math.log(2), abs=1e-15)


def _datum(n_prompt: int, reply: list[int]) -> types.Datum:
    tokens = list(range(40, 40 + n_prompt)) + reply
    weights = [0.0] * (n_prompt - 1) + [1.0] * len(reply)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})


def test_the_batch_loss_function_sums_each_reply_by_its_weights_and_pairs_neighbours():
    data = [_datum(3, [7, 8]), _datum(3, [9]), _datum(2, [5, 6, 7]), _datum(2, [4])]
    # target-token logprobs: prompt positions carry values the weights must drop
    logprobs = [torch.tensor([-9.0, -8.0, -0.5, -0.75]), torch.tensor([-9.0, -8.0, -3.0]),
                torch.tensor([-9.0, -1.0, -0.5, -0.5]), torch.tensor([-9.0, -1.0])]
    logprobs = [lp.requires_grad_(True) for lp in logprobs]
    assert float(sequence_logprob(logprobs[0], data[0].loss_fn_inputs["weights"].to_torch()).detach()) == -1.25
    reference = [(-1.5, -2.0), (-2.0, -2.0)]  # (chosen, rejected) per pair
    loss, metrics = pair_loss_fn(reference, BETA)(data, logprobs)
    # sequences: chosen -1.25 and -2.0, rejected -3.0 and -1.0: margins 0.5 * (0.25 + 1.0) and 0.5 * (0 - 1.0)
    expected = (_softplus(-0.625) + _softplus(0.5)) / 2
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-12) and metrics["dpo/accuracy"] == 0.5
    loss.backward()
    g = 1.0 / (1.0 + math.exp(0.625)) * BETA / 2
    assert logprobs[0].grad.tolist() == pytest.approx([0.0, 0.0, -g, -g], abs=1e-7)  # prompt positions: none
    assert logprobs[1].grad.tolist() == pytest.approx([0.0, 0.0, g], abs=1e-7)
    with pytest.raises(ValueError, match="2 datums per pair: 4 datums for 1 pairs"):
        pair_loss_fn(reference[:1], BETA)(data, logprobs)


class _CountingReference:
    """A sampling client whose logprob of token t at position i is -(t % 7) / 10 - i / 100 (None first), and which
    counts the sequences it was asked for."""

    def __init__(self) -> None:
        self.asked: list[list[int]] = []

    async def compute_logprobs_async(self, sequence: types.ModelInput) -> list[float | None]:
        tokens = sequence.to_ints()
        self.asked.append(tokens)
        return [None] + [-(t % 7) / 10 - i / 100 for i, t in enumerate(tokens) if i > 0]


def test_the_reference_reads_each_pair_once_and_sums_the_reply_tokens():
    client = _CountingReference()
    reference = Reference(client)
    data = [_datum(3, [7, 8]), _datum(3, [9]), _datum(2, [5, 6, 7]), _datum(2, [4])]
    rows = [{"_index": 0}, {"_index": 1}]

    def by_hand(n_prompt: int, reply: list[int]) -> float:
        tokens = list(range(40, 40 + n_prompt)) + reply
        return sum(-(t % 7) / 10 - i / 100 for i, t in enumerate(tokens) if i >= n_prompt)

    values, read = asyncio.run(reference.logprobs(rows, data))
    assert values == [pytest.approx((by_hand(3, [7, 8]), by_hand(3, [9])), abs=1e-12),
                      pytest.approx((by_hand(2, [5, 6, 7]), by_hand(2, [4])), abs=1e-12)]
    assert read == 5 + 4 + 5 + 3 and len(client.asked) == 4  # every token of the 4 sequences, once
    again, read = asyncio.run(reference.logprobs(rows[::-1], data[2:] + data[:2]))
    assert again == values[::-1] and read == 0 and len(client.asked) == 4  # kept: asked for nothing more
    # a row of another split with the same _index but other replies is another pair
    _, read = asyncio.run(reference.logprobs([{"_index": 0}], [_datum(3, [1]), _datum(3, [2])]))
    assert read == 8 and len(client.asked) == 6
