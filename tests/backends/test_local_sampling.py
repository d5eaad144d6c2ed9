"""The local sampler: logprobs, stops, limits, seeds, truncation, prompt logprobs, coalescing, other architectures,
the preallocated KV cache, and the sampling worker (concurrent with training, own weights, thread budget)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tinker import types

from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.local.engine import generation

PROMPT = "User: 2+3=?\n\nAssistant:"


@pytest.fixture(scope="module")
def sampler(tmp_path_factory):
    svc = LocalServiceClient(base_dir=tmp_path_factory.mktemp("ckpt"), seed=0)
    return svc.create_sampling_client(base_model="sailrl/tiny")


@pytest.fixture(scope="module")
def prompt(sampler):
    return sampler.get_tokenizer().encode(PROMPT, add_special_tokens=False)


def _model(sampler):
    return sampler._batcher.engine.model


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


def test_concurrent_calls_are_one_batch_with_one_prefill_per_prompt(sampler, prompt, monkeypatch):
    model = _model(sampler)
    prefills: list[tuple[int, int]] = []
    forward_of = generation.decoder_of

    def recording(m):  # every forward the sampler runs (the model's own or decoder.FusedDecoder), its input shape
        forward = forward_of(m)

        def call(**kwargs):
            ids = kwargs.get("input_ids")
            if ids is not None and ids.shape[1] > 1:
                prefills.append(tuple(ids.shape))
            return forward(**kwargs)

        return call

    monkeypatch.setattr(generation, "decoder_of", recording)
    other = prompt[:-3]

    async def run():
        params = types.SamplingParams(max_tokens=6, stop=[])
        calls = [sampler.sample_async(types.ModelInput.from_ints(prompt), 1, params) for _ in range(6)]
        calls += [sampler.sample_async(types.ModelInput.from_ints(other), 2, params) for _ in range(2)]
        return await asyncio.gather(*calls)

    before = len(sampler._batcher.batch_sizes)
    results = asyncio.run(run())
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
    with pytest.raises(ValueError, match=r"token id 300, outside the model's vocabulary \(0\.\.258\)"):
        sampler.sample(types.ModelInput.from_ints([5, 300]), 1, types.SamplingParams(max_tokens=1)).result()
    empty = sampler.sample(types.ModelInput.from_ints([5, 6]), 2, types.SamplingParams(max_tokens=0)).result()
    assert [(s.tokens, s.stop_reason) for s in empty.sequences] == [([], "length")] * 2
    with pytest.raises(ValueError, match="does not support topk_sample_logprobs"):
        sampler.sample(
            types.ModelInput.from_ints([5]), 1, types.SamplingParams(max_tokens=1), topk_sample_logprobs=2
        )


# ---------------------------------------------------------------------------------------------------- sampler core
def test_inverse_cdf_picks_the_token_whose_interval_holds_u():
    from sailrl.runtime.backends.local.engine.generation import _RowParams, _sample

    # probabilities 0.2, 0, 0.5, 0.3: intervals [0, .2) [.2, .2) [.2, .7) [.7, 1)
    logits = torch.log(torch.tensor([[0.2, 0.0, 0.5, 0.3]] * 7, dtype=torch.float64))
    u = torch.tensor([0.0, 0.1999, 0.2001, 0.6999, 0.7001, 0.9999999, 0.2], dtype=torch.float64)
    rows = logits.shape[0]
    rp = _RowParams(torch.ones(rows, dtype=torch.float64), torch.zeros(rows, dtype=torch.bool),
                    torch.full((rows,), -1), torch.ones(rows, dtype=torch.float64),
                    any_greedy=False, all_greedy=False, any_filter=False)
    choice, lp = _sample(logits, rp, u)
    assert choice.tolist() == [0, 0, 2, 2, 3, 3, 2]  # the zero-probability token 1 is never drawn
    assert torch.allclose(lp, torch.log(torch.tensor([0.2, 0.2, 0.5, 0.5, 0.3, 0.3, 0.5], dtype=torch.float64)))
    # top_k=2 keeps tokens 2 and 3 (mass 0.8): u * 0.8 < 0.5 (u < 0.625) -> token 2, else 3
    rp_k = _RowParams(rp.temps, rp.greedy, torch.full((rows,), 2), rp.top_p,
                      any_greedy=False, all_greedy=False, any_filter=True)
    choice_k, lp_k = _sample(logits, rp_k, u)
    assert choice_k.tolist() == [2, 2, 2, 3, 3, 3, 2]
    assert torch.allclose(lp_k[4], torch.log(torch.tensor(0.3, dtype=torch.float64)))  # logprob before truncation


def test_sampled_tokens_follow_the_temperature_scaled_distribution(sampler, prompt):
    from sailrl.runtime.backends.local.engine.generation import _RowParams, _sample

    # the sampler alone: 20000 draws at temperature 2 from logits whose softmax(l / 2) is known
    target = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0], dtype=torch.float64)
    logits = (2.0 * torch.log(target)).expand(20_000, -1)
    n = logits.shape[0]
    rp = _RowParams(torch.full((n,), 2.0, dtype=torch.float64), torch.zeros(n, dtype=torch.bool),
                    torch.full((n,), -1), torch.ones(n, dtype=torch.float64),
                    any_greedy=False, all_greedy=False, any_filter=False)
    choice, _ = _sample(logits, rp, torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    freq = torch.bincount(choice, minlength=5) / n
    assert torch.allclose(freq.double(), target, atol=0.01), freq
    # end to end: 4000 first tokens at temperature 0.25 against the model's own next-token probabilities
    params = types.SamplingParams(max_tokens=1, temperature=0.25, seed=11, stop=[])
    response = sampler.sample(types.ModelInput.from_ints(prompt), 4000, params).result()
    with torch.no_grad():
        probs = torch.softmax(_model(sampler)(input_ids=torch.tensor([prompt])).logits[0, -1] / 0.25, -1)
    counts = torch.bincount(torch.tensor([s.tokens[0] for s in response.sequences]), minlength=probs.numel())
    tv = 0.5 * float((counts / counts.sum() - probs).abs().sum())
    assert tv < 0.11, tv  # sampling noise at n=4000 is ~0.09; one token off would be ~0.5


def test_top_p_restricts_to_the_nucleus(sampler, prompt):
    response = sampler.sample(
        types.ModelInput.from_ints(prompt), 64, types.SamplingParams(max_tokens=1, top_p=0.3, seed=9, stop=[])
    ).result()
    with torch.no_grad():
        probs = torch.softmax(_model(sampler)(input_ids=torch.tensor([prompt])).logits[0, -1], -1)
    sorted_p, order = probs.sort(descending=True)
    keep = int(((sorted_p.cumsum(0) - sorted_p) <= 0.3).sum())
    nucleus = set(order[:keep].tolist())
    drawn = {s.tokens[0] for s in response.sequences}
    assert drawn <= nucleus and len(drawn) > 1


def test_seeded_request_gives_the_same_tokens_alone_and_in_a_batch(sampler, prompt):
    """Coalescing, rows that finish early (compaction) and other prompts do not change a seeded request."""
    mi = types.ModelInput.from_ints(prompt)
    target = types.SamplingParams(max_tokens=30, seed=123, stop=[])
    alone = sampler.sample(mi, 3, target).result()

    async def crowd():
        others = [
            sampler.sample_async(types.ModelInput.from_ints(prompt[: 5 + k]), 2,
                                 types.SamplingParams(max_tokens=1 + 3 * k, seed=k, stop=[]))
            for k in range(8)
        ]
        greedy = sampler.sample_async(mi, 1, types.SamplingParams(max_tokens=20, temperature=0.0, stop=[]))
        mine = sampler.sample_async(mi, 3, target)
        return await asyncio.gather(mine, greedy, *others)

    before = len(sampler._batcher.batch_sizes)
    together, *_ = asyncio.run(crowd())
    assert sampler._batcher.batch_sizes[before:] == [3 + 1 + 16]
    assert [s.tokens for s in together.sequences] == [s.tokens for s in alone.sequences]
    for a, b in zip(together.sequences, alone.sequences, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_every_sequence_stops_at_the_first_stop_string(sampler, prompt):
    """Against the definition: a "stop" sequence's text contains a stop string that its text without the last
    token does not (or it ends with EOS); a "length" sequence has max_tokens tokens and no stop string."""
    tok = sampler.get_tokenizer()
    stops = ["e", "ab", "\u00e9", "q "]  # one byte, two bytes, a two-byte character, ends with a space
    response = sampler.sample(
        types.ModelInput.from_ints(prompt), 48, types.SamplingParams(max_tokens=100, seed=4, stop=stops)
    ).result()
    reasons = {"stop": 0, "length": 0}
    for seq in response.sequences:
        text = tok.decode(seq.tokens)
        reasons[seq.stop_reason] += 1
        if seq.stop_reason == "stop":
            ended_on_eos = seq.tokens[-1] == tok.eos_token_id
            assert ended_on_eos or any(s in text for s in stops), text
            assert not any(s in tok.decode(seq.tokens[:-1]) for s in stops), text
        else:
            assert len(seq.tokens) == 100 and not any(s in text for s in stops), text
    assert reasons["stop"] >= 12 and reasons["length"] >= 12, reasons


def test_stop_string_matcher_candidates():
    from sailrl.runtime.backends.local.engine.generation import StopStringMatcher
    from sailrl.runtime.backends.models import get_tokenizer

    tok = get_tokenizer("sailrl/tiny")  # byte tokenizer: id = byte + 3
    ids = torch.tensor([ord(":") + 3, ord("x") + 3, 0xC3 + 3, 0xA9 + 3, ord(" ") + 3])
    ascii_stop = StopStringMatcher(tok, ("\n\nUser:",))
    assert ascii_stop.candidates(ids).tolist() == [True, False, False, False, False]
    accent = StopStringMatcher(tok, ("caf\u00e9",))  # the last byte of U+00E9 decodes alone to nothing
    assert accent.candidates(ids).tolist() == [False, False, True, True, False]
    spaced = StopStringMatcher(tok, ("Answer: ",))  # a tokenizer may add a leading space in context
    assert spaced.candidates(ids).tolist() == [True] * 5
    word = list("caf\u00e9".encode())
    assert accent.matches([b + 3 for b in [ord("x")] + word]) and not accent.matches([b + 3 for b in word[:-1]])
    assert accent.window == 4 * 4 + 8


def test_half_precision_model_samples_with_float32_logprobs(tmp_path):
    from sailrl.runtime.backends.local.engine.generation import SampleRequest, generate
    from sailrl.runtime.backends.local.weights.tiny import build_tiny_model
    from sailrl.runtime.backends.models import get_tokenizer

    model = build_tiny_model(0, dtype=torch.bfloat16)
    prompt = get_tokenizer("sailrl/tiny").encode(PROMPT, add_special_tokens=False)
    req = SampleRequest(prompt, 2, types.SamplingParams(max_tokens=8, seed=3, stop=[]))
    (response,) = generate(model, [req], tokenizer=get_tokenizer("sailrl/tiny"), max_context=4096,
                           generator=torch.Generator().manual_seed(0))
    for seq in response.sequences:
        assert len(seq.tokens) == 8 and seq.logprobs_np.dtype.name == "float32"
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + seq.tokens])).logits[0].float()
        ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(-1, torch.tensor(seq.tokens)[:, None])
        assert torch.allclose(torch.tensor(seq.logprobs), ref.squeeze(-1), atol=0.05)


# ---------------------------------------------------------------------------------------------------- any architecture
def _arch_model(arch: str):
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
    )

    torch.manual_seed(0)
    if arch == "llama":  # grouped-query attention: 4 query heads over 2 key/value heads
        cfg = LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          tie_word_embeddings=False)
        return LlamaForCausalLM(cfg).eval()
    if arch == "gpt2":  # absolute position embeddings, multi-head attention
        return GPT2LMHeadModel(GPT2Config(vocab_size=259, n_embd=64, n_layer=2, n_head=4, n_positions=256)).eval()
    cfg = MistralConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=6, max_position_embeddings=256,
                        tie_word_embeddings=False)  # sliding-window cache layers
    return MistralForCausalLM(cfg).eval()


@pytest.mark.parametrize("arch", ["llama", "gpt2", "mistral-sliding"])
def test_other_architectures_decode_like_a_full_forward(arch):
    from sailrl.runtime.backends.local.engine.generation import SampleRequest, generate
    from sailrl.runtime.backends.models import get_tokenizer

    model = _arch_model(arch)
    tok = get_tokenizer("sailrl/tiny")
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("User: 1+2=", "User: seven plus one is", "Q:")]
    reqs = [
        SampleRequest(prompts[0], 2, types.SamplingParams(max_tokens=14, temperature=0.8, seed=1, stop=[])),
        SampleRequest(prompts[1], 1, types.SamplingParams(max_tokens=3, temperature=0.8, seed=2, stop=[])),
        SampleRequest(prompts[2], 1, types.SamplingParams(max_tokens=10, temperature=0.0, stop=[])),
    ]
    out = generate(model, reqs, tokenizer=tok, max_context=256, generator=torch.Generator().manual_seed(0))
    for req, response in zip(reqs, out, strict=True):
        for seq in response.sequences:
            assert len(seq.tokens) == req.params.max_tokens
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([req.prompt + seq.tokens])).logits[0]
            t = req.params.temperature or 1.0
            ref = torch.log_softmax(logits / t, -1)[len(req.prompt) - 1 : -1]
            got = ref.gather(-1, torch.tensor(seq.tokens)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(seq.logprobs), got, atol=1e-5), arch
    # greedy equals Hugging Face's greedy generate on the prompt alone
    with torch.no_grad():
        hf = model.generate(torch.tensor([prompts[2]]), do_sample=False, max_new_tokens=10, min_new_tokens=10,
                            pad_token_id=0)
    assert out[2].sequences[0].tokens == hf[0, len(prompts[2]) :].tolist()


def test_growing_cache_keeps_what_a_dynamic_cache_holds():
    from transformers.cache_utils import DynamicCache

    from sailrl.runtime.backends.local.engine.generation import _expand_cache, _GrowingLayer

    model = _arch_model("llama")
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
        assert isinstance(cache, DynamicCache)
        ref = [(layer.keys[[1, 1, 0]].clone(), layer.values[[1, 1, 0]].clone()) for layer in cache.layers]
        grown = _expand_cache(cache, torch.tensor([1, 1, 0]), reserve=2, limit=9)
        assert all(isinstance(layer, _GrowingLayer) for layer in grown.layers)
        for layer, (k, v) in zip(grown.layers, ref, strict=True):
            assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
        for step in range(5):  # past the reserve: the buffer grows
            new_k = torch.full((3, 2, 1, 16), float(step))
            keys, values = grown.layers[0].update(new_k, new_k + 1)
            assert keys.shape == (3, 2, 5 + step, 16) and torch.equal(keys[:, :, :4], ref[0][0])
            assert torch.equal(values[:, :, -1], new_k[:, :, 0] + 1)
        assert grown.get_seq_length() == 9
        grown.batch_select_indices(torch.tensor([2]))
        assert torch.equal(grown.layers[0].keys[:, :, :4], ref[0][0][[2]])
        assert grown.layers[0].keys.shape == (1, 2, 9, 16)


# ---------------------------------------------------------------------------------------------------- sampling worker
def _sft_datums(tok, n=8):
    text = tok.encode("User: 2+3=?\n\nAssistant: 5\n\nUser:", add_special_tokens=False)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(text[:-1]),
        loss_fn_inputs={"target_tokens": types.TensorData.from_torch(torch.tensor(text[1:]))},
    )
    return [datum] * n


def _train(tc, steps=3, lr=3e-2):
    for _ in range(steps):
        tc.forward_backward(_sft_datums(tc.get_tokenizer()), "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=lr))


@pytest.fixture
def trainer(tmp_path):
    svc = LocalServiceClient(base_dir=tmp_path / "ckpt", seed=0)
    tc = svc.create_lora_training_client("sailrl/tiny", rank=8, seed=2)
    _train(tc, steps=2)  # a non-trivial adapter
    yield svc, tc
    svc.close("success")


def test_checkpoint_sampler_runs_while_training_is_busy_and_gives_the_same_tokens(trainer, prompt):
    import threading

    svc, tc = trainer
    path = tc.save_weights_for_sampler("snap").result().path
    mi = types.ModelInput.from_ints(prompt)
    params = types.SamplingParams(max_tokens=16, seed=77, stop=[])
    quiet = svc.create_sampling_client(model_path=path).sample(mi, 4, params).result()

    # Block the training worker, queue training behind the block, then sample from the checkpoint: the sample
    # completes while training cannot have run, so it cannot be waiting for it.
    release, started = threading.Event(), threading.Event()
    blocker = svc._backend.worker.submit(lambda: (started.set(), release.wait(30)))
    assert started.wait(10)
    _train(tc, steps=3)
    fresh = LocalServiceClient(base_dir=svc.base_dir, seed=0)  # a second process-like client, same store
    try:
        busy_sampler = svc.create_sampling_client(model_path=path)
        during = busy_sampler.sample(mi, 4, params).result(timeout=10)
        assert not blocker.future().done()  # training was still blocked when sampling finished
        other = fresh.create_sampling_client(model_path=path).sample(mi, 4, params).result()
    finally:
        release.set()
        fresh.close("success")
    blocker.result(timeout=30)
    after = svc.create_sampling_client(model_path=path).sample(mi, 4, params).result()
    for response in (during, other, after):
        assert [s.tokens for s in response.sequences] == [s.tokens for s in quiet.sequences]
        assert [s.logprobs for s in response.sequences] == [s.logprobs for s in quiet.sequences]


def test_sampling_concurrent_with_training_matches_sampling_alone(trainer, prompt):
    svc, tc = trainer
    path = tc.save_weights_for_sampler("concurrent").result().path
    sampler = svc.create_sampling_client(model_path=path)
    mi = types.ModelInput.from_ints(prompt)

    async def step(train: bool):
        calls = [sampler.sample_async(mi, 1, types.SamplingParams(max_tokens=12, seed=500 + k, stop=[]))
                 for k in range(16)]
        if train:
            for _ in range(3):
                fb = await tc.forward_backward_async(_sft_datums(tc.get_tokenizer(), 32), "cross_entropy")
                opt = await tc.optim_step_async(types.AdamParams(learning_rate=3e-2))
                await fb.result_async()
                await opt.result_async()
        return [r.sequences[0] for r in await asyncio.gather(*calls)]

    alone = asyncio.run(step(train=False))
    weights_before = {n: p.detach().clone() for n, p in tc.peft_model.named_parameters() if p.requires_grad}
    together = asyncio.run(step(train=True))
    assert [s.tokens for s in together] == [s.tokens for s in alone]
    assert [s.logprobs for s in together] == [s.logprobs for s in alone]
    changed = [n for n, p in tc.peft_model.named_parameters() if p.requires_grad and not torch.equal(p, weights_before[n])]
    assert changed  # training did run meanwhile


def test_signing_a_checkpoint_does_not_wait_for_training(trainer):
    """Sail's URL signing (the rest client's TTL + archive calls) runs while the training worker is busy."""
    import threading

    svc, tc = trainer
    path = tc.save_weights_for_sampler("signed").result().path
    release, started = threading.Event(), threading.Event()
    blocker = svc._backend.worker.submit(lambda: (started.set(), release.wait(30)))
    assert started.wait(10)
    try:
        rest = svc.create_rest_client()
        rest.set_checkpoint_ttl_from_tinker_path(path, 3600).result(timeout=10)
        url = rest.get_checkpoint_archive_url_from_tinker_path(path).result(timeout=10).url
        assert not blocker.future().done()
    finally:
        release.set()
    assert url.startswith("file://") and url.endswith(".tar")


def test_save_for_sampler_keeps_the_weights_of_its_call(trainer, prompt):
    svc, tc = trainer
    tokens = prompt + [70, 71, 72, 73]
    mi = types.ModelInput.from_ints(tokens)
    before = svc.create_sampling_client(
        model_path=tc.save_weights_for_sampler("ref").result().path).compute_logprobs(mi).result()
    saved = tc.save_weights_for_sampler("then-train")  # not awaited: training is queued right behind it
    _train(tc, steps=3, lr=5e-2)
    path = saved.result().path
    from_path = svc.create_sampling_client(model_path=path).compute_logprobs(mi).result()
    trained = tc.save_weights_and_get_sampling_client().compute_logprobs(mi).result()
    assert from_path == before
    assert max(abs(a - b) for a, b in zip(trained[1:], before[1:], strict=True)) > 1e-3


def test_samplers_own_their_weights(trainer):
    svc, tc = trainer
    snap = tc.save_weights_and_get_sampling_client()
    from_path = svc.create_sampling_client(model_path=tc.save_weights_for_sampler("own").result().path)
    train_ptrs = {p.data_ptr() for p in tc.peft_model.parameters()}
    for sampler in (snap, from_path):
        params = list(sampler._batcher.engine.model.parameters())
        assert not any(p.requires_grad for p in params)
        assert not train_ptrs & {p.data_ptr() for p in params}
    assert snap._batcher._worker is svc._backend.sample_worker is not svc._backend.worker


def test_workers_share_the_service_thread_count(tmp_path):
    """A job alone gets all the service's torch threads; while the other worker runs a job, half each."""
    import threading

    main_threads = torch.get_num_threads()
    svc = LocalServiceClient(base_dir=tmp_path, seed=0, num_threads=2)
    train, sample = svc._backend.worker, svc._backend.sample_worker
    probe = lambda: (threading.current_thread().name, torch.get_num_threads())  # noqa: E731
    try:
        torch.set_num_threads(1)  # threads started from now on inherit 1; each job sets its own count
        alone = [train.submit(probe).result(), sample.submit(probe).result()]
        release, started = threading.Event(), threading.Event()
        busy = train.submit(lambda: (started.set(), release.wait(30), torch.get_num_threads())[2])
        assert started.wait(10)
        beside = sample.submit(probe).result(timeout=10)
        release.set()
        assert busy.result(timeout=10) == 2  # it started alone
        after = sample.submit(probe).result(timeout=10)
    finally:
        torch.set_num_threads(main_threads)
        svc.close("success")
    assert alone == [("sailrl-local-train", 2), ("sailrl-local-sample", 2)]
    assert beside == ("sailrl-local-sample", 1) and after == ("sailrl-local-sample", 2)


def test_announced_requests_are_one_batch_however_slowly_they_arrive(sampler, prompt):
    # what a busy machine does to the event loop: calls 20 ms apart, far past the 3 ms coalescing window
    params = types.SamplingParams(max_tokens=4, stop=[], seed=3)

    async def trickle(n):
        calls = []
        for _ in range(n):
            calls.append(asyncio.ensure_future(sampler.sample_async(types.ModelInput.from_ints(prompt), 1, params)))
            await asyncio.sleep(0.02)
        return await asyncio.gather(*calls)

    before = len(sampler._batcher.batch_sizes)
    asyncio.run(trickle(5))
    assert len(sampler._batcher.batch_sizes) - before > 1  # unannounced: split by the window
    before = len(sampler._batcher.batch_sizes)
    sampler.expect_requests(5)
    sampler.expect_requests(2)
    asyncio.run(trickle(8))  # 5 + 2 announced, then one more that is not
    assert sampler._batcher.batch_sizes[before:] == [5, 2, 1]


def test_an_announced_batch_that_never_fills_is_served_after_the_timeout(tmp_path, prompt):
    svc = LocalServiceClient(base_dir=tmp_path, seed=0)
    client = svc.create_sampling_client(base_model="sailrl/tiny")
    client._batcher._expect_timeout = 0.2
    client.expect_requests(4)
    params = types.SamplingParams(max_tokens=2, stop=[], seed=1)
    response = client.sample(types.ModelInput.from_ints(prompt), 1, params).result(timeout=30)
    assert len(response.sequences[0].tokens) == 2
    assert client._batcher.batch_sizes == [1]


def _windowed_model(arch):
    """Models whose attention is not over every earlier position, or whose positions scale with the pass."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3ForCausalLM

    from sailrl.runtime.backends.local.weights.tiny import tiny_config

    torch.manual_seed(0)
    if arch == "qwen3-sliding":  # Qwen3 with its sliding window switched on
        return Qwen3ForCausalLM(tiny_config({"use_sliding_window": True, "sliding_window": 8,
                                             "max_window_layers": 0, "layer_types": None})).eval()
    if arch == "gpt-neo-local":  # GPT-Neo's local layers (TinyStories models): window_size, attention_layers
        return GPTNeoForCausalLM(GPTNeoConfig(vocab_size=259, hidden_size=64, num_layers=2, num_heads=4,
                                              attention_types=[[["global", "local"], 1]], window_size=8,
                                              max_position_embeddings=256)).eval()
    return LlamaForCausalLM(LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
                                        rope_scaling={"rope_type": "dynamic", "factor": 2.0},
                                        tie_word_embeddings=False)).eval()


SHARED_START_ARCHS = ["qwen3", "llama", "gpt2"]  # the rest prefill each prompt whole


@pytest.mark.parametrize("arch", [*SHARED_START_ARCHS, "mistral-sliding", "qwen3-sliding", "gpt-neo-local",
                                  "llama-dynamic-rope"])
def test_prompts_that_start_alike_sample_as_each_prompt_alone(arch):
    """Distinct prompts that share their first 40 tokens (a judge's instructions, a system prompt) have that start
    prefilled once: each request's seeded tokens and logprobs are what it gets alone in the sampler (no sharing
    there), with padding between the shared start and a shorter prompt's own tokens. A model with sliding or local
    attention windows (the padding would take window places) or dynamic RoPE prefills each prompt whole."""
    from sailrl.runtime.backends.local.engine import generation
    from sailrl.runtime.backends.local.weights.tiny import build_tiny_model
    from sailrl.runtime.backends.models import get_tokenizer

    if arch == "qwen3":
        model = build_tiny_model(0)
    elif arch in ("llama", "gpt2", "mistral-sliding"):
        model = _arch_model(arch)
    else:
        model = _windowed_model(arch)
    tok = get_tokenizer("sailrl/tiny")
    start = tok.encode("You judge replies. Answer yes or no after a reason. ", add_special_tokens=False)[:40]
    own = ["1+2=", "seven plus one is", "Q:", "x"]
    prompts = [start + tok.encode(t, add_special_tokens=False) for t in own]
    assert generation.shared_prompt_length(prompts) == 40

    def requests():
        return [generation.SampleRequest(p, 2, types.SamplingParams(max_tokens=6, temperature=1.0, seed=10 + i,
                                                                    stop=[]))
                for i, p in enumerate(prompts)] + [
            generation.SampleRequest(prompts[1], 1, types.SamplingParams(max_tokens=5, temperature=0.0, stop=[]))]

    calls = []
    real = generation._prefill_shared

    def counted(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    gen = torch.Generator().manual_seed(0)
    generation._prefill_shared = counted
    try:
        together = generation.generate(model, requests(), tokenizer=tok, max_context=256, generator=gen)
    finally:
        generation._prefill_shared = real
    assert calls == ([40] if arch in SHARED_START_ARCHS else [])
    for req, got in zip(requests(), together, strict=True):
        (alone,) = generation.generate(model, [req], tokenizer=tok, max_context=256, generator=gen)
        for a, b in zip(got.sequences, alone.sequences, strict=True):
            assert a.tokens == b.tokens, arch
            # dynamic RoPE scales with the pass's padded length, so a batch differs from alone by more than rounding
            # whether or not a start is shared (3e-4 here); that is why it is not shared
            atol = 1e-3 if arch == "llama-dynamic-rope" else 1e-4
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=atol), arch


def test_a_shared_start_is_used_only_when_long_enough_and_each_prompt_keeps_a_token():
    from sailrl.runtime.backends.local.engine.generation import MIN_SHARED_PROMPT, shared_prompt_length

    long = list(range(2, 2 + MIN_SHARED_PROMPT))
    assert shared_prompt_length([long + [1], long + [1, 5]]) == MIN_SHARED_PROMPT
    assert shared_prompt_length([long + [3], long + [3, 7]]) == MIN_SHARED_PROMPT  # the shorter keeps its last token
    assert shared_prompt_length([long[:-1] + [0], long + [1]]) == 0  # 31 tokens alike: not worth a pass
    assert shared_prompt_length([long + [1]]) == 0  # one prompt: nothing to share
    assert shared_prompt_length([long + [1], long + [2], [9] + long]) == 0
