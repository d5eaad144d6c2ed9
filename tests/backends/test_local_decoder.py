"""The hand-written decoder forward (runtime/backends/local/engine/decoder.py) against transformers' own forward and peft's LoRA.

Every supported architecture (Qwen3 with its query / key norms, Llama with tied embeddings, Qwen2 with q / k / v
biases, Mistral without a window), in float64 so that differences are the formulas' and not float32 rounding:
logits and KV caches at every real position of a left-padded batch, a decode step on the cache, a continuation
after a cache (the learner's shared prompt), and the gradient of every LoRA weight (adapters with a non-zero B and a
scale that is not a power of two, on every projection and ``lm_head``).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from sailrl.runtime.backends.local.engine import decoder
from sailrl.runtime.backends.local.engine.decoder import FusedDecoder, decoder_of, supports
from sailrl.runtime.backends.local.engine.lora import attach_lora

SMALL = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
             vocab_size=97, max_position_embeddings=128)


def _models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    return {
        "qwen3": Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=8, tie_word_embeddings=False)),
        "llama": LlamaForCausalLM(LlamaConfig(**SMALL, tie_word_embeddings=True, rope_theta=500.0)),
        "qwen2": Qwen2ForCausalLM(Qwen2Config(**{**SMALL, "num_key_value_heads": 6})),  # q / k / v biases
        "mistral": MistralForCausalLM(MistralConfig(**SMALL, sliding_window=None)),
    }


ARCHS = list(_models())


def _pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two identical peft models (rank 3: scale 32/3) with random B, in float64: the reference and the fused one."""
    base = _models()[name].double().eval()
    ref = attach_lora(base, rank=3, seed=1, train_mlp=True, train_attn=True, train_unembed=True)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return ref, copy.deepcopy(ref)


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 97, (3, 9), generator=gen)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :4] = 0  # left padding, as the sampler's prefill
    mask[2, :1] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_caches_and_a_decode_step_equal_transformers(arch):
    ref, mine = _pair(arch)
    assert supports(mine)
    fused = FusedDecoder(mine)
    ids, mask, pos = _batch()
    real = mask.bool()
    with torch.no_grad():
        a = ref(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        b = fused(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        assert (a.logits - b.logits)[real].abs().max() < 1e-12
        assert a.logits[real].abs().max() > 1.0  # not trivially equal
        for la, lb in zip(a.past_key_values.layers, b.past_key_values.layers, strict=True):
            keep = real[:, None, :, None].expand_as(la.keys)
            assert (la.keys - lb.keys)[keep].abs().max() < 1e-12
            assert (la.values - lb.values)[keep].abs().max() < 1e-12
        step = torch.tensor([[5], [17], [60]])
        longer = torch.cat([mask, torch.ones(3, 1, dtype=torch.long)], dim=1)
        a2 = ref(input_ids=step, attention_mask=longer, position_ids=pos[:, -1:] + 1,
                 past_key_values=a.past_key_values, use_cache=True)
        b2 = fused(input_ids=step, attention_mask=longer, position_ids=pos[:, -1:] + 1,
                   past_key_values=b.past_key_values, use_cache=True)
        assert (a2.logits - b2.logits).abs().max() < 1e-12
        # several tokens after a cache (the learner's completions after their shared prompt), right-padded
        more = torch.tensor([[7, 8, 9], [10, 11, 0], [12, 13, 14]])
        more_mask = torch.cat([longer, torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])], dim=1)
        more_pos = pos[:, -1:] + 2 + torch.arange(3)
        a3 = ref(input_ids=more, attention_mask=more_mask, position_ids=more_pos,
                 past_key_values=a2.past_key_values, use_cache=True, logits_to_keep=0)
        b3 = fused(input_ids=more, attention_mask=more_mask, position_ids=more_pos,
                   past_key_values=b2.past_key_values, use_cache=True)
        keep = more_mask[:, -3:].bool()
        assert (a3.logits - b3.logits)[keep].abs().max() < 1e-12
        last = fused(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1)
        assert last.logits.shape == (3, 1, 97) and last.past_key_values is None
        assert (last.logits[:, 0] - a.logits[:, -1]).abs().max() < 1e-12


@pytest.mark.parametrize("arch", ARCHS)
def test_every_lora_gradient_equals_peft(arch):
    ref, mine = _pair(arch)
    fused = FusedDecoder(mine)
    ids, mask, pos = _batch()
    real = mask.bool()
    weights = torch.linspace(-1.0, 2.0, int(real.sum()), dtype=torch.float64)
    targets = ids.roll(-1, dims=1)  # each position's next token (the last one's wraps round: any token will do)
    for run in (ref, fused):
        logits = run(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        lp = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
        (lp[real] * weights).sum().backward()
    grads = 0
    for (name, p), (name2, q) in zip(ref.named_parameters(), mine.named_parameters(), strict=True):
        assert name == name2
        if not p.requires_grad:
            assert q.grad is None
            continue
        grads += 1
        assert p.grad is not None and q.grad is not None, name
        assert p.grad.abs().max() > 0, name
        assert (p.grad - q.grad).abs().max() <= 1e-10 * p.grad.abs().max(), name
    assert grads == 2 * (7 * 2 + 1)  # A and B of 7 projections in each of 2 layers, and of lm_head


def test_building_a_decoder_fuses_the_weights_in_place_and_the_module_stack_still_reads_them():
    model = _models()["qwen3"].double().eval().requires_grad_(False)  # frozen, as the sampler's copy
    ids, mask, pos = _batch()
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    run = decoder_of(model)
    assert isinstance(run, FusedDecoder) and decoder_of(model) is run  # one decoder per model
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    qkv = run.layers[0][1].weight
    assert attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert attn.v_proj.weight.data_ptr() == qkv.data_ptr() + (48 + 16) * 48 * qkv.element_size()
    assert mlp.up_proj.weight.data_ptr() == run.layers[0][5].weight.data_ptr() + 80 * 48 * qkv.element_size()
    with torch.no_grad():
        after = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        mine = run(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert torch.equal(before, after)
    assert (mine - before)[mask.bool()].abs().max() < 1e-12


def test_other_models_run_their_own_forward():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50, n_positions=64))
    window = MistralForCausalLM(MistralConfig(**SMALL, sliding_window=4))
    sliding_qwen3 = Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=8, use_sliding_window=True, sliding_window=4))
    gelu = LlamaForCausalLM(LlamaConfig(**SMALL, hidden_act="gelu"))
    for model in (gpt2, window, sliding_qwen3, gelu):
        assert not supports(model.requires_grad_(False))
        assert decoder_of(model) is model
    trainable_base = _models()["qwen2"]  # its weights and q / k / v biases train: only peft's path gives them grads
    assert not supports(trainable_base) and supports(trainable_base.requires_grad_(False))
    llama = _models()["llama"]
    dropout = attach_lora(copy.deepcopy(llama), rank=2, seed=0, train_mlp=True, train_attn=False, train_unembed=False)
    assert supports(dropout)
    dropout.base_model.model.model.layers[0].mlp.up_proj.lora_dropout["default"] = torch.nn.Dropout(0.1)
    assert not supports(dropout)  # peft's path keeps its dropout
    mixed = attach_lora(copy.deepcopy(llama).to(torch.bfloat16), rank=2, seed=0, train_mlp=True, train_attn=True,
                        train_unembed=False)
    assert not supports(mixed)  # float32 adapters on a bfloat16 base: peft's path keeps their precision


def test_the_embedded_backend_uses_it_for_the_built_in_models():
    from sailrl.runtime.backends.local.weights.tiny import BaseModelCache, resolve_base_model

    bases = BaseModelCache(torch.float32, "cpu")
    for name in ("sailrl/tiny", "sailrl/tiny-arith", "sailrl/tiny-judge"):
        assert supports(bases.get(resolve_base_model(name, 0)).requires_grad_(False)), name
    assert decoder.SUPPORTED_TYPES == {"llama", "mistral", "qwen2", "qwen3"}
