"""``forward_backward_custom`` (the cookbook's DPO and distillation losses) and cross_entropy over ``(N, K)`` target
tokens (top-K distillation) on the embedded backend: the gradients are those of the same loss computed with torch
on the same model."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tinker import types

from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.local.engine.losses import LossInputError

PROMPT = [72, 101, 108, 108, 111, 58]
CHOSEN = [52, 50, 59, 10]
REJECTED = [120, 121, 122, 10, 65]
BETA = 0.1


def _datum(completion: list[int]) -> types.Datum:
    tokens = PROMPT + completion
    weights = [0.0] * (len(PROMPT) - 1) + [1.0] * len(completion)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights})


PAIRS = [_datum(CHOSEN), _datum(REJECTED), _datum(REJECTED[:3]), _datum(CHOSEN[:2])]
REF = [-9.0, -11.5, -7.25, -5.0]  # reference log-likelihoods of each sequence, constants as in DPO


def dpo_loss(data: list[types.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """tinker_cookbook's DPO objective on (chosen, rejected) pairs: -log sigmoid(beta * margin)."""
    seq = [(lp * d.loss_fn_inputs["weights"].to_torch().to(lp.dtype)).sum() for d, lp in zip(data, logprobs,
                                                                                          strict=True)]
    losses = []
    for i in range(0, len(seq), 2):
        margin = (seq[i] - REF[i]) - (seq[i + 1] - REF[i + 1])
        losses.append(-torch.nn.functional.logsigmoid(BETA * margin))
    loss = torch.stack(losses).sum()
    return loss, {"dpo_loss": float(loss)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A float64 client one step away from its init (so every LoRA matrix has a gradient)."""
    svc = LocalServiceClient(base_dir=tmp_path_factory.mktemp("ckpt"), seed=0, dtype=torch.float64)
    tc = svc.create_lora_training_client("sailrl/tiny", rank=4, seed=1)
    tc.forward_backward(PAIRS, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
    yield tc
    svc.close("success")


def _grads(tc) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.detach().clone() for n, p in tc.peft_model.named_parameters() if p.grad is not None}
    for p in tc.peft_model.parameters():
        p.grad = None
    return grads


def _direct_logprobs(tc, data: list[types.Datum]) -> list[torch.Tensor]:
    """Each datum's target logprobs, (N,) or (N, K), straight from the peft model with autograd."""
    out = []
    for d in data:
        ids = torch.tensor([d.model_input.to_ints()])
        logprobs = torch.log_softmax(tc.peft_model(input_ids=ids).logits[0], dim=-1)
        targets = d.loss_fn_inputs["target_tokens"].to_torch().long()
        out.append(logprobs.gather(-1, targets.reshape(len(targets), -1)).reshape(targets.shape))
    return out


def test_custom_dpo_loss_gradients_equal_torchs_on_the_same_model(trained):
    out = trained.forward_backward_custom(PAIRS, dpo_loss).result()
    custom = _grads(trained)
    direct_loss, _ = dpo_loss(PAIRS, _direct_logprobs(trained, PAIRS))
    direct_loss.backward()
    direct = _grads(trained)
    assert set(custom) == set(direct) and len(direct) > 0
    worst = max(float((custom[n] - direct[n]).abs().max()) for n in direct)
    print(f"forward_backward_custom vs torch: max |grad difference| {worst:.3g}")
    assert worst < 1e-6, worst
    assert max(float(g.abs().max()) for g in direct.values()) > 1e-3  # the comparison is not of zeros
    assert out.metrics["loss:sum"] == pytest.approx(float(direct_loss), abs=1e-6)
    assert out.metrics["dpo_loss"] == pytest.approx(float(direct_loss), abs=1e-6)
    assert "surrogate_loss:sum" in out.metrics
    assert [o["logprobs"].shape for o in out.loss_fn_outputs] == [[d.model_input.length] for d in PAIRS]


def test_the_async_form_gives_the_same_gradients(trained):
    trained.forward_backward_custom(PAIRS, dpo_loss).result()
    sync = _grads(trained)

    async def run():
        return await (await trained.forward_backward_custom_async(PAIRS, dpo_loss)).result_async()

    out = asyncio.run(run())
    assert all(torch.equal(g, _grads(trained)[n]) for n, g in [next(iter(sync.items()))])
    assert out.metrics["dpo_loss"] > 0


def test_a_custom_loss_must_use_every_logprob_and_only_logprobs_input(trained):
    with pytest.raises(ValueError, match="No gradient computed for logprob tensor 1"):
        trained.forward_backward_custom(PAIRS[:2], lambda data, lps: (lps[0].sum(), {}))
    with pytest.raises(ValueError, match="Unsupported loss_type_input='probs'"):
        trained.forward_backward_custom(PAIRS, dpo_loss, loss_type_input="probs")
    _grads(trained)


def _topk_datum(k: int) -> types.Datum:
    tokens = PROMPT + CHOSEN
    n = len(tokens) - 1
    generator = torch.Generator().manual_seed(k)
    targets = torch.randint(0, 256, (n, k), generator=generator)
    weights = torch.rand((n, k), generator=generator, dtype=torch.float32)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": types.TensorData.from_torch(targets),
                                       "weights": types.TensorData.from_torch(weights)})


def test_cross_entropy_over_k_targets_is_the_weighted_sum_of_k_single_target_ones(trained):
    datum = _topk_datum(3)
    targets = datum.loss_fn_inputs["target_tokens"].to_torch()
    weights = datum.loss_fn_inputs["weights"].to_torch()
    out = trained.forward_backward([datum], "cross_entropy").result()
    topk = _grads(trained)
    assert out.loss_fn_outputs[0]["logprobs"].shape == list(targets.shape)
    columns = [types.Datum(model_input=datum.model_input,
                           loss_fn_inputs={"target_tokens": types.TensorData.from_torch(targets[:, j].contiguous()),
                                           "weights": types.TensorData.from_torch(weights[:, j].contiguous())})
               for j in range(targets.shape[1])]
    single = trained.forward_backward(columns, "cross_entropy").result()
    summed = _grads(trained)
    assert out.metrics["loss:sum"] == pytest.approx(single.metrics["loss:sum"], rel=1e-9)
    for j, column in enumerate(single.loss_fn_outputs):
        assert torch.allclose(out.loss_fn_outputs[0]["logprobs"].to_torch()[:, j], column["logprobs"].to_torch())
    # (the single-target datums share their prompt's forward pass, the K-target one does not: rounding differs)
    assert max(float((topk[n] - summed[n]).abs().max()) for n in summed) < 1e-6
    # with the logprobs torch computes directly: -(logprobs * weights).sum()
    direct = -(_direct_logprobs(trained, [datum])[0] * weights.double()).sum()
    assert out.metrics["loss:sum"] == pytest.approx(float(direct), rel=1e-9)
    _grads(trained)


def test_k_targets_mix_with_one_target_datums_and_feed_a_custom_loss(trained):
    datum = _topk_datum(2)
    out = trained.forward([datum, PAIRS[0]], "cross_entropy").result()
    assert [o["logprobs"].shape for o in out.loss_fn_outputs] == [[9, 2], [9]]
    seen = []

    def reverse_kl(data, logprobs):
        seen.extend(lp.shape for lp in logprobs)
        w = data[0].loss_fn_inputs["weights"].to_torch()
        return (w * logprobs[0]).sum() + logprobs[1].sum(), {}

    trained.forward_backward_custom([datum, PAIRS[0]], reverse_kl).result()
    assert seen == [torch.Size([9, 2]), torch.Size([9])]
    _grads(trained)


def test_two_dimensional_inputs_are_refused_where_the_loss_takes_none(trained):
    datum = _topk_datum(2)
    bad = types.Datum(model_input=datum.model_input, loss_fn_inputs={
        "target_tokens": datum.loss_fn_inputs["target_tokens"],
        "logprobs": types.TensorData.from_torch(torch.zeros(9)),
        "advantages": types.TensorData.from_torch(torch.zeros(9))})
    with pytest.raises(LossInputError, match="only cross_entropy's target_tokens and weights may be"):
        trained.forward_backward([bad], "importance_sampling").result()
    mismatched = types.Datum(model_input=datum.model_input, loss_fn_inputs={
        "target_tokens": datum.loss_fn_inputs["target_tokens"],
        "weights": types.TensorData.from_torch(torch.ones(9))})
    with pytest.raises(LossInputError, match=r"weights have shape \(9,\) and target_tokens \(9, 2\)"):
        trained.forward_backward([mismatched], "cross_entropy").result()
