"""A hand-written forward of Llama-family decoders over a transformers model's own weights: the embedded backend's
sampler and learner run it instead of the model's module stack where the model allows (:func:`decoder_of`).

Why: at the sizes the embedded backend trains on a CPU (the built-in models, SmolLM2-135M) a step is many small
matrix products, and the module stack spends a good part again around them: a module call per projection, peft's
LoRA path (two thin products per adapter, its scale multiplied into the full-width output, an add), per-layer mask
and cache bookkeeping. Here each layer runs as four products: query / key / value fused into one, the output
projection, gate / up fused into one, and down. A projection's LoRA adapters are merged into its weight for the
product (``W + (s B) A``, an ``out x r x in`` product: small next to the ``tokens x in x out`` one) and their
gradients come from a hand-written backward (:class:`_LoraLinear`), so the thin rank-wide products run only where
the gradients need them. Qwen3's query and key norms and the rotary embedding run on the query and key heads
together. Attention is ``scaled_dot_product_attention`` with the padding mask made causal, as transformers' SDPA
path does (grouped key / value heads without repeating them); rotary position embeddings come from the model's own
``rotary_emb`` module, so every rope type it knows is computed as it computes it. Eval mode only (no dropout): the
sampler and the learner use no other.

Supported (:func:`supports`): ``llama``, ``mistral``, ``qwen2``, ``qwen3`` configs whose every layer attends to
all earlier positions, with SiLU MLPs, ``nn.Linear`` projections (peft LoRA layers over them: plain LoRA, one
active adapter, no dropout, not merged, in the base weights' dtype) and no tensor-parallel split. Other models run
their own forward. The result is the model's to float rounding: tests check logits, KV caches and every LoRA
gradient against transformers' forward and peft's adapters in float64, and the step figures in
``benchmarks/bench_trl.md``.

Building a decoder fuses the model's projection weights in place: q / k / v (and gate / up) weights become views of
one tensor, so the module stack still runs and reads the same numbers, and no weight is stored twice. A decoder
reads the model as it was when built (:func:`decoder_of` builds one per model object): in-place changes to weights
(an optimizer step, loading a checkpoint into the adapters, adding a merged adapter to an untied weight) reach it;
replacing a weight tensor, untying embeddings, changing dtype or device, or merging / disabling peft adapters after
it was built do not. sailrl's models are set up (merged, frozen, adapters attached) before their first forward.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

__all__ = ["DecoderOutput", "FusedDecoder", "decoder_of", "supports"]

SUPPORTED_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


@dataclass
class DecoderOutput:
    """What the callers read of a transformers ``CausalLMOutputWithPast``."""

    logits: torch.Tensor
    past_key_values: Any = None


def _text_config(model: Any) -> Any:
    config = getattr(model, "config", None)
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _lora_parts(module: Any) -> tuple[torch.nn.Linear, tuple[torch.Tensor, torch.Tensor, float] | None] | None:
    """``(base linear, (A, B, scale) or None)`` of a projection, or ``None`` when it is neither an ``nn.Linear`` nor
    a plain peft LoRA layer over one."""
    if type(module) is torch.nn.Linear:
        return module, None
    base = getattr(module, "base_layer", None)
    if type(base) is not torch.nn.Linear or not hasattr(module, "lora_A"):
        return None
    if getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
        return None
    active = [a for a in module.active_adapters if a in module.lora_A]
    if len(active) != 1 or getattr(module, "lora_variant", {}).get(active[0]) is not None:
        return None
    name = active[0]
    if getattr(module, "fan_in_fan_out", False) or not isinstance(module.lora_dropout[name], torch.nn.Identity):
        return None
    if getattr(module, "lora_bias", {}).get(name, False):
        return None
    a, b = module.lora_A[name], module.lora_B[name]
    if type(a) is not torch.nn.Linear or type(b) is not torch.nn.Linear or a.bias is not None or b.bias is not None:
        return None
    if not a.weight.dtype == b.weight.dtype == base.weight.dtype:  # float32 adapters on a bfloat16 base: peft's path
        return None
    return base, (a.weight, b.weight, float(module.scaling[name]))


def _causal_lm(model: Any) -> Any:
    get_base = getattr(model, "get_base_model", None)  # a peft model: the transformers model it wraps
    return get_base() if callable(get_base) and hasattr(model, "peft_config") else model


def supports(model: Any) -> bool:
    """Whether :class:`FusedDecoder` runs ``model`` (a transformers causal LM, or a peft model over one)."""
    lm = _causal_lm(model)
    config = _text_config(lm)
    if getattr(config, "model_type", None) not in SUPPORTED_TYPES or getattr(config, "hidden_act", None) != "silu":
        return False
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return False
    kinds = getattr(config, "layer_types", None)
    if kinds is not None and any(kind != "full_attention" for kind in kinds):
        return False
    if getattr(config, "use_sliding_window", True) and getattr(config, "sliding_window", None) is not None:
        return False
    if any(p.requires_grad and ".lora_" not in name for name, p in lm.named_parameters()):
        return False  # a trainable base weight or bias: the decoder gives only the adapters gradients
    inner = getattr(lm, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or getattr(inner, "rotary_emb", None) is None or getattr(inner, "embed_tokens", None) is None:
        return False
    if _lora_parts(lm.lm_head) is None or type(inner.embed_tokens) is not torch.nn.Embedding:
        return False
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = [(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
                [(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]
        if any(_lora_parts(getattr(owner, n, None)) is None for owner, n in names):
            return False
        if getattr(attn, "sliding_window", None) is not None:
            return False
    return True


def _merged(weight: torch.Tensor, rows: tuple[tuple[int, int], ...], a: torch.Tensor,
            bs: Sequence[torch.Tensor]) -> torch.Tensor:
    """A copy of ``weight`` with each adapter's ``bs[i] @ A_i`` added to its rows (see :class:`_LoraLinear`)."""
    merged = weight.clone()
    col = 0
    for (start, stop), b in zip(rows, bs, strict=True):
        merged[start:stop].addmm_(b, a[col:col + b.shape[1]])
        col += b.shape[1]
    return merged


class _LoraLinear(torch.autograd.Function):
    """``x (W + sum_i P_i (s_i B_i) A_i)^T + bias``: a frozen weight ``W`` (``(out, in)``) with LoRA adapters whose
    ``A_i`` are the rows of ``a`` (``(r, in)``, adapter after adapter) and whose scaled ``s_i B_i`` (``bs``) write the
    output rows ``rows[i]`` (``P_i`` places them). The adapters are merged into the weight for one matrix product
    each way (an ``(out, r) x (r, in)`` product: little next to the ``tokens x in x out`` ones); the backward gives
    ``x``, ``a`` and each ``bs[i]`` their gradients (none to ``W`` and ``bias``, which are frozen)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                rows: tuple[tuple[int, int], ...], a: torch.Tensor, *bs: torch.Tensor) -> torch.Tensor:
        ctx.rows = rows
        ctx.save_for_backward(x, weight, a, *bs)  # the merged weight is made again for the backward: no copy kept
        return F.linear(x, _merged(weight, rows, a, bs), bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, a, *bs = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        grad_x = (grad @ _merged(weight, ctx.rows, a, bs)) if ctx.needs_input_grad[0] else None
        mid = x2 @ a.t()  # (tokens, r): every adapter's x A^T
        if len(bs) == 1 and ctx.rows[0] == (0, weight.shape[0]):
            stacked = bs[0]
        else:  # every adapter's B in its rows and its columns of one (out, r) matrix
            stacked = weight.new_zeros((weight.shape[0], a.shape[0]))
            col = 0
            for (start, stop), b in zip(ctx.rows, bs, strict=True):
                stacked[start:stop, col:col + b.shape[1]] = b
                col += b.shape[1]
        grad_a = (g @ stacked).t() @ x2  # (r, in), every adapter's rows at once
        grad_bs, col = [], 0
        for (start, stop), b in zip(ctx.rows, bs, strict=True):
            grad_bs.append(g[:, start:stop].t() @ mid[:, col:col + b.shape[1]])  # (out_i, r_i)
            col += b.shape[1]
        return (grad_x, None, None, None, grad_a, *grad_bs)


class _Projection:
    """Projections of one input run as one matrix product (their base weights views of one tensor), with their
    LoRA adapters merged into it (:class:`_LoraLinear`), each scaled by ``alpha / r`` on its ``B``."""

    def __init__(self, modules: list[Any]):
        parts = [_lora_parts(m) for m in modules]
        bases = [p[0] for p in parts]  # type: ignore[index]
        self.sizes = [b.out_features for b in bases]
        if len(bases) == 1:
            self.weight = bases[0].weight
        else:
            with torch.no_grad():
                fused = torch.cat([b.weight.detach() for b in bases])
            start = 0
            for b, n in zip(bases, self.sizes, strict=True):  # the modules read views of the fused weight
                b.weight = torch.nn.Parameter(fused[start:start + n], requires_grad=b.weight.requires_grad)
                start += n
            self.weight = fused
        self.bias: torch.Tensor | None = None
        if any(b.bias is not None for b in bases):
            self.bias = torch.cat([b.bias if b.bias is not None else b.weight.new_zeros(n)
                                   for b, n in zip(bases, self.sizes, strict=True)]).detach()
        self.lora: list[tuple[tuple[int, int], tuple[torch.Tensor, torch.Tensor, float]]] = []
        start = 0
        for n, p in zip(self.sizes, parts, strict=True):
            if p[1] is not None:  # type: ignore[index]
                self.lora.append(((start, start + n), p[1]))  # type: ignore[index]
            start += n

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.lora:
            return F.linear(x, self.weight, self.bias)
        a = self.lora[0][1][0] if len(self.lora) == 1 else torch.cat([ab[0] for _, ab in self.lora])
        bs = [b * scale for _, (_, b, scale) in self.lora]
        rows = tuple(r for r, _ in self.lora)
        return _LoraLinear.apply(x, self.weight.detach(), self.bias, rows, a, *bs)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama / Qwen RMSNorm: normalised in float32, cast back, then scaled by ``weight``."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin``: ``rotate_half(x)`` is ``x`` rolled by half its width with
    the first half negated, and the negation is in ``signed_sin`` (``sin`` with its first half negated)."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin


class FusedDecoder:
    """``model``'s forward (a :func:`supports` model) as four matrix products a layer; called as the model is by
    the sampler and the learner: ``input_ids``, a 2D ``attention_mask`` over the cached and new positions,
    ``position_ids``, ``past_key_values`` (a transformers cache, updated in place), ``use_cache``,
    ``logits_to_keep``. Returns :class:`DecoderOutput`."""

    def __init__(self, model: Any):
        lm = _causal_lm(model)
        inner = lm.model
        config = _text_config(lm)
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = inner.norm
        self.head = _Projection([lm.lm_head])
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                layer.input_layernorm, _Projection([attn.q_proj, attn.k_proj, attn.v_proj]),
                self._head_norms(attn), _Projection([attn.o_proj]),
                layer.post_attention_layernorm, _Projection([mlp.gate_proj, mlp.up_proj]),
                _Projection([mlp.down_proj]),
            ))

    def _head_norms(self, attn: Any) -> tuple[torch.Tensor, float] | None:
        """Qwen3's per-head RMSNorms of the queries and keys as one: ``((heads + kv_heads, head_dim) weight, eps)``
        over the query and key heads side by side; ``None`` for a model without them."""
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        if q_norm is None:
            return None
        weight = torch.cat([q_norm.weight.detach().expand(self.heads, -1),
                            k_norm.weight.detach().expand(self.kv_heads, -1)])
        return weight, float(q_norm.variance_epsilon)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, past_key_values: Any = None, use_cache: bool = False,
                 logits_to_keep: int = 0) -> DecoderOutput:
        batch, length = input_ids.shape
        cache = past_key_values
        if cache is None and use_cache:
            cache = DynamicCache()
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + length, device=input_ids.device)[None].expand(batch, -1)
        h = F.embedding(input_ids, self.embed.weight)
        cos, sin = self.rotary(h, position_ids)
        half = sin.shape[-1] // 2
        signed_sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)[:, None]
        cos = cos[:, None]  # (B, 1, T, D): broadcast over heads
        mask = self._mask(attention_mask, batch, length, past, h.device)
        heads = self.heads + self.kv_heads
        for index, (norm1, qkv, head_norm, o_proj, norm2, gate_up, down) in enumerate(self.layers):
            x = _rms_norm(h, norm1.weight, norm1.variance_epsilon)
            qk, v = qkv(x).split([heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
            qk = qk.view(batch, length, heads, self.head_dim)  # query heads, then key heads
            if head_norm is not None:
                qk = _rms_norm(qk, *head_norm)
            q, k = _rotate(qk.transpose(1, 2), cos, signed_sin).split([self.heads, self.kv_heads], dim=1)
            v = v.view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
            if cache is not None:
                k, v = cache.update(k, v, index)
            h = h + o_proj(self._attend(q, k, v, mask))
            x = _rms_norm(h, norm2.weight, norm2.variance_epsilon)
            gate, up = gate_up(x).chunk(2, dim=-1)
            h = h + down(F.silu(gate) * up)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        h = _rms_norm(h, self.norm.weight, self.norm.variance_epsilon)
        return DecoderOutput(self.head(h), cache if use_cache else None)

    @staticmethod
    def _mask(attention_mask: torch.Tensor | None, batch: int, length: int, past: int,
              device: Any) -> torch.Tensor | None:
        """A bool ``(B, 1, T, past + T)`` mask: padding from ``attention_mask`` and causal order; a query with no
        position to attend to (padding before a left-padded prompt) attends to all, as transformers' SDPA mask
        does, so no row is all masked. ``None`` when nothing is masked."""
        total = past + length
        if attention_mask is None:
            if length == 1:
                return None
            keys = torch.ones((batch, total), dtype=torch.bool, device=device)
        else:
            keys = attention_mask[:, -total:].to(device=device, dtype=torch.bool)
        if length == 1:
            return keys[:, None, None, :]
        rows = torch.arange(past, total, device=device)[:, None]
        causal = torch.arange(total, device=device)[None, :] <= rows  # (T, total)
        mask = keys[:, None, None, :] & causal[None, None]
        return mask | ~mask.any(-1, keepdim=True)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of ``q`` ``(B, H, T, D)`` over ``k`` / ``v`` ``(B, H_kv, L, D)``; ``(B, T, H * D)``."""
        batch, heads, length, dim = q.shape
        groups = heads // self.kv_heads
        if length == 1 and groups > 1:  # decode: the query heads of a key / value head as that head's queries
            grouped = q.reshape(batch, self.kv_heads, groups, dim)
            out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask, scale=dim ** -0.5)
            return out.reshape(batch, 1, heads * dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=dim ** -0.5, enable_gqa=groups > 1)
        return out.transpose(1, 2).reshape(batch, length, heads * dim)


_DECODERS: weakref.WeakKeyDictionary[Any, FusedDecoder | None] = weakref.WeakKeyDictionary()


def decoder_of(model: Any) -> Any:
    """What to call for ``model``'s forward: its :class:`FusedDecoder` (built once per model, which fuses its
    projection weights in place) when :func:`supports` says so, else ``model`` itself."""
    try:
        decoder = _DECODERS[model]
    except KeyError:
        decoder = FusedDecoder(model) if supports(model) else None
        _DECODERS[model] = decoder
    return model if decoder is None else decoder
