"""The local sampler: logprobs, stops, limits, seeds, truncation, prompt logprobs, coalescing."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tinker import types

from sailrl.runtime.local import LocalServiceClient

PROMPT = "User: 2+3=?\n\nAssistant:"


@pytest.fixture(scope="module")
def sampler(tmp_path_factory):
    svc = LocalServiceClient(base_dir=tmp_path_factory.mktemp("ckpt"), seed=0)
    return svc.create_sampling_client(base_model="sailrl/tiny").result()


@pytest.fixture(scope="module")
def prompt(sampler):
    return sampler.get_tokenizer().encode(PROMPT, add_special_tokens=False)


def _model(sampler):
    return sampler._batcher._model


def _reference_logprobs(model, prompt, tokens, temperature=1.0):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0]
    lp = torch.log_softmax(logits / temperature, -1)
    return lp[len(prompt) - 1 : -1].gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_are_temperature_scaled_model_logprobs(sampler, prompt, temperature):
    params = types.SamplingParams(max_tokens=16, temperature=temperature, stop=[])
    response = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result()
    assert len(response.sequences) == 3
    for seq in response.sequences:
        assert len(seq.tokens) == 16 and seq.stop_reason == "length"
        ref = _reference_logprobs(_model(sampler), prompt, seq.tokens, temperature)
        assert torch.allclose(torch.tensor(seq.logprobs), ref, atol=1e-5)


def test_stop_string_ends_with_the_stop_sequence(sampler, prompt):
    tok = sampler.get_tokenizer()
    # a one-character stop string that a random byte model hits quickly
    params = types.SamplingParams(max_tokens=200, stop=["e"], seed=1)
    response = sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result()
    stopped = [s for s in response.sequences if s.stop_reason == "stop"]
    assert stopped
    for seq in stopped:
        text = tok.decode(seq.tokens)
        assert text.endswith("e") or seq.tokens[-1] == tok.eos_token_id
        assert "e" not in tok.decode(seq.tokens[:-1])


def test_stop_token_ids_and_max_tokens(sampler, prompt):
    first = sampler.sample(
        types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=5, temperature=0.0, stop=[])
    ).result()
    greedy = first.sequences[0].tokens
    assert len(greedy) == 5 and first.sequences[0].stop_reason == "length"
    # stopping on the third greedy token's id ends the sequence there, keeping that token
    target = greedy[2]
    cut = greedy.index(target) + 1
    response = sampler.sample(
        types.ModelInput.from_ints(prompt),
        1,
        types.SamplingParams(max_tokens=5, temperature=0.0, stop=[target]),
    ).result()
    assert response.sequences[0].tokens == greedy[:cut]
    assert response.sequences[0].stop_reason == "stop"


def test_seed_reproduces_and_top_k_one_is_greedy(sampler, prompt):
    mi = types.ModelInput.from_ints(prompt)
    a = sampler.sample(mi, 2, types.SamplingParams(max_tokens=12, seed=42, stop=[])).result()
    b = sampler.sample(mi, 2, types.SamplingParams(max_tokens=12, seed=42, stop=[])).result()
    c = sampler.sample(mi, 2, types.SamplingParams(max_tokens=12, seed=43, stop=[])).result()
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    assert [s.tokens for s in a.sequences] != [s.tokens for s in c.sequences]
    assert a.sequences[0].tokens != a.sequences[1].tokens
    greedy = sampler.sample(mi, 1, types.SamplingParams(max_tokens=8, temperature=0.0, stop=[])).result()
    top1 = sampler.sample(mi, 2, types.SamplingParams(max_tokens=8, top_k=1, stop=[])).result()
    nucleus = sampler.sample(mi, 2, types.SamplingParams(max_tokens=8, top_p=1e-6, stop=[])).result()
    for seq in top1.sequences + nucleus.sequences:
        assert seq.tokens == greedy.sequences[0].tokens


def test_top_k_restricts_to_the_k_most_likely(sampler, prompt):
    response = sampler.sample(
        types.ModelInput.from_ints(prompt), 16, types.SamplingParams(max_tokens=1, top_k=3, seed=5, stop=[])
    ).result()
    with torch.no_grad():
        logits = _model(sampler)(input_ids=torch.tensor([prompt])).logits[0, -1]
    allowed = set(logits.topk(3).indices.tolist())
    assert {s.tokens[0] for s in response.sequences} <= allowed


def test_prompt_logprobs_and_compute_logprobs(sampler, prompt):
    mi = types.ModelInput.from_ints(prompt)
    response = sampler.sample(
        mi, 1, types.SamplingParams(max_tokens=1), include_prompt_logprobs=True, topk_prompt_logprobs=2
    ).result()
    with torch.no_grad():
        lp = torch.log_softmax(_model(sampler)(input_ids=torch.tensor([prompt])).logits[0], -1)
    ref = lp[:-1].gather(-1, torch.tensor(prompt[1:])[:, None]).squeeze(-1)
    assert response.prompt_logprobs[0] is None
    assert torch.allclose(torch.tensor(response.prompt_logprobs[1:]), ref, atol=1e-5)
    top = response.topk_prompt_logprobs
    assert top[0] is None and len(top[1]) == 2
    assert top[1][0][0] == int(lp[0].argmax()) and top[1][0][1] == pytest.approx(float(lp[0].max()), abs=1e-5)
    computed = sampler.compute_logprobs(mi).result()
    assert computed[0] is None
    assert torch.allclose(torch.tensor(computed[1:]), ref, atol=1e-5)
    last = sampler.compute_logprobs(mi, prompt_logprobs_last_n=3).result()
    assert last[:-3] == [None] * (len(prompt) - 3)
    assert torch.allclose(torch.tensor(last[-3:]), ref[-3:], atol=1e-5)


def test_concurrent_calls_are_one_batch_with_one_prefill_per_prompt(sampler, prompt):
    model = _model(sampler)
    prefills: list[tuple[int, int]] = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            prefills.append(tuple(ids.shape))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    other = prompt[:-3]

    async def run():
        params = types.SamplingParams(max_tokens=6, stop=[])
        calls = [sampler.sample_async(types.ModelInput.from_ints(prompt), 1, params) for _ in range(6)]
        calls += [sampler.sample_async(types.ModelInput.from_ints(other), 2, params) for _ in range(2)]
        return await asyncio.gather(*calls)

    before = len(sampler._batcher.batch_sizes)
    try:
        results = asyncio.run(run())
    finally:
        handle.remove()
    assert sampler._batcher.batch_sizes[before:] == [10]
    assert prefills == [(2, len(prompt))]  # two distinct prompts, left-padded, prefilled once
    assert [len(r.sequences) for r in results] == [1] * 6 + [2] * 2
    for r, p in zip(results, [prompt] * 6 + [other] * 2, strict=True):
        for seq in r.sequences:
            ref = _reference_logprobs(model, p, seq.tokens)
            assert torch.allclose(torch.tensor(seq.logprobs), ref, atol=1e-5)


def test_sampling_errors_are_plain(sampler):
    with pytest.raises(ValueError, match="num_samples must be at least 1"):
        sampler.sample(types.ModelInput.from_ints([5]), 0, types.SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="empty prompt"):
        sampler.sample(types.ModelInput.from_ints([]), 1, types.SamplingParams(max_tokens=1)).result()
    with pytest.raises(ValueError, match="does not support topk_sample_logprobs"):
        sampler.sample(
            types.ModelInput.from_ints([5]), 1, types.SamplingParams(max_tokens=1), topk_sample_logprobs=2
        )
