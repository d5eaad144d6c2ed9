"""Batched sampling with a shared KV cache: one prefill per distinct prompt, all samples decoded together.

``generate(model, requests, ...)`` takes every request waiting in the sampler (coalesced by
``sampling.SampleBatcher``), prefills each DISTINCT prompt once (left-padded batch), copies the
prompt's KV cache to each of its samples, then decodes all rows one token per step with the
model's ``past_key_values``. Works for any Hugging Face causal LM with a KV cache, on any device
and dtype; Llama-family models run the hand-written forward of ``decoder.py`` (``decoder_of``), the
others their own.

When the distinct prompts all start with the same ``MIN_SHARED_PROMPT`` (32) tokens or more (a
judge's instructions, a system prompt, few-shot examples), that start is prefilled once and its KV
cache copied to each prompt before their own tokens run (``_prefill_shared``): the same logits up to
float rounding, for a fraction of the prefill (``benchmarks/bench_shared_prompt.py``; the figure:
``benchmarks/local_backend.md``). Prompt logprobs turn it off (they need every position), and so
do models with sliding or local attention windows and dynamic RoPE (``_can_share_prompt_start``).

Per decode step the work outside the model is a fixed number of tensor operations on the whole
batch, however many rows it has:

- **Sampling** by inverse CDF: each row's uniforms are drawn up front, one per token it may
  generate (``(num_samples, max_tokens)`` per request from its generator), and the step samples
  every row with one ``cumsum`` + ``searchsorted`` over the (top-k / top-p filtered) probabilities.
- **Stop token ids and max_tokens** from per-row tables (a ``(stop sets, vocab)`` bool table
  indexed by the sampled tokens; the step count against per-row limits).
- **Stop strings** from a per-(tokenizer, stop strings) table of the tokens whose text may
  complete one (``StopStringMatcher``): only rows whose new token is in it decode their last few
  tokens (``4 * len(stop) + 8``) to look for the string.
- **Finished rows** stay in the batch (masked out) until at least 1/8 of it has finished, then the
  batch and its KV cache are compacted in one indexing operation.

KV cache: the model's ``DynamicCache`` layers (transformers >= 4.56) are moved into preallocated
buffers that are written in place (``_GrowingLayer``) instead of concatenated every step; other
layer kinds (sliding window, linear attention) and older caches are used as the model made them.
Decode steps of models on SDPA attention attend with the query heads grouped per key/value head
instead of repeating the key/value heads, and take their one-token causal mask straight from the
padding mask (``_decode_attention``); prefill is unchanged.

Per-row sampling (``tinker.SamplingParams``): ``temperature`` (0 = greedy), ``top_k`` (-1 = off),
``top_p`` (1 = off), ``max_tokens`` (``None`` = up to the context length), ``stop`` (``None`` =
the tokenizer's EOS; ``[]`` = never stop; strings = those strings or EOS, as vLLM does and as
tinker-cookbook's ``role_colon`` parser expects; token ids = exactly those ids), ``seed`` (a
request-private ``torch.Generator``; otherwise the sampler's own generator, drawn in request
order). A seeded request yields the same tokens whatever else is in its batch. A sequence that
stops on a stop string or id keeps the stop tokens at its end (``stop_reason="stop"``), as Tinker
does; one that hits ``max_tokens`` ends with ``stop_reason="length"``.

Sampled logprobs: ``log_softmax(logits / temperature)[token]`` -- the log-probability of the
token under the temperature-scaled distribution it was drawn from, before top-k / top-p
truncation (Tinker returns "the same logprobs used for sampling, even when temperature scaling is
applied", J. Schulman, thinking-machines-lab/tinker-cookbook PR #86). At temperature 1 these are
the model's own logprobs, so the learner's importance ratio is 1 on-policy. Greedy rows
(temperature 0) report the unscaled model logprob. Prompt logprobs are unscaled model logprobs.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tinker import types

from sailrl.runtime.backends.local.engine.decoder import decoder_of

GREEDY_TEMPERATURE = 1e-6
COMPACT_FRACTION = 8  # compact the batch once 1/8 of its rows have finished
_INITIAL_RESERVE = 256  # generated positions preallocated in the KV cache before it grows
#: Tokens every distinct prompt of a batch must start with alike for that part to be prefilled once for all of them
#: (a judge's instructions, a system prompt, few-shot examples); shorter shared starts are not worth the extra pass.
MIN_SHARED_PROMPT = 32


@dataclass
class SampleRequest:
    """One ``SamplingClient.sample`` call: ``num_samples`` sequences continuing ``prompt``."""

    prompt: list[int]
    num_samples: int
    params: types.SamplingParams
    include_prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    prompt_logprobs_last_n: int | None = None
    request_id: str = "r"


@dataclass(frozen=True)
class _Stops:
    token_ids: frozenset[int]
    strings: tuple[str, ...]


def _stops_for(params: types.SamplingParams, eos_token_id: int | None) -> _Stops:
    stop = params.stop
    eos = frozenset() if eos_token_id is None else frozenset([eos_token_id])
    if stop is None:
        return _Stops(eos, ())
    if isinstance(stop, str):
        stop = [stop]
    stop = list(stop)
    if not stop:
        return _Stops(frozenset(), ())
    if all(isinstance(s, str) for s in stop):
        return _Stops(eos, tuple(dict.fromkeys(s for s in stop if s)))
    if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        return _Stops(frozenset(int(s) for s in stop), ())
    raise ValueError("SamplingParams.stop must be a string, a list of strings or a list of token ids.")


# ---------------------------------------------------------------------------------------------- stop strings
class StopStringMatcher:
    """Which tokens may complete one of ``strings``, and the window check for those that may.

    A token may complete a stop string when its text (``tokenizer.decode([token])``, decoded the
    first time the token is sampled and then kept) contains the last character of a stop string.
    Two cases where a token adds text its lone decode does not show are covered too: a token that
    is part of a multi-byte character (lone decode empty or containing U+FFFD) may complete a
    non-ASCII character, and a tokenizer may add a leading space in context -- so a stop string
    ending in a non-ASCII character makes every partial token a candidate, and one ending in
    whitespace makes every token a candidate. ``matches`` decodes the last ``window`` tokens
    (``4 * len(longest stop) + 8``) and looks for any stop string in the text.
    """

    def __init__(self, tokenizer: Any, strings: tuple[str, ...]):
        self._tokenizer = tokenizer
        self.strings = strings
        self.window = max(4 * len(s) + 8 for s in strings)
        self._last_chars = frozenset(s[-1] for s in strings)
        self._every_token = any(c.isspace() for c in self._last_chars)
        self._partial_may_end = any(ord(c) > 127 for c in self._last_chars)
        self._table = torch.full((0,), -1, dtype=torch.int8)  # -1 unknown, 0 no, 1 may complete
        self._lock = threading.Lock()

    def _piece_may_end(self, piece: str) -> bool:
        if any(c in piece for c in self._last_chars):
            return True
        return self._partial_may_end and (piece == "" or "\ufffd" in piece)

    def candidates(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(A,)`` bool CPU tensor: which of ``tokens`` (``(A,)`` int64 CPU) may complete a stop string."""
        if self._every_token:
            return torch.ones(tokens.shape, dtype=torch.bool)
        with self._lock:
            top = int(tokens.max()) + 1 if tokens.numel() else 0
            if top > self._table.numel():
                grown = torch.full((top,), -1, dtype=torch.int8)
                grown[: self._table.numel()] = self._table
                self._table = grown
            flags = self._table[tokens]
            unknown = tokens[flags < 0].unique().tolist()
            if unknown:
                pieces = self._tokenizer.batch_decode([[t] for t in unknown])
                self._table[torch.tensor(unknown)] = torch.tensor(
                    [1 if self._piece_may_end(p) else 0 for p in pieces], dtype=torch.int8
                )
                flags = self._table[tokens]
        return flags > 0

    def matches(self, tail: list[int]) -> bool:
        """True if the text of ``tail`` (a row's last ``window`` tokens) contains a stop string."""
        text = self._tokenizer.decode(tail)
        return any(s in text for s in self.strings)


_MATCHERS: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], StopStringMatcher]] = weakref.WeakKeyDictionary()
_MATCHERS_LOCK = threading.Lock()


def stop_string_matcher(tokenizer: Any, strings: tuple[str, ...]) -> StopStringMatcher:
    """The shared ``StopStringMatcher`` for ``(tokenizer, strings)`` (its token table persists across calls)."""
    with _MATCHERS_LOCK:
        try:
            per_tokenizer = _MATCHERS.setdefault(tokenizer, {})
        except TypeError:  # a tokenizer that cannot be weakly referenced: no sharing
            return StopStringMatcher(tokenizer, strings)
        if strings not in per_tokenizer:
            per_tokenizer[strings] = StopStringMatcher(tokenizer, strings)
        return per_tokenizer[strings]


# ---------------------------------------------------------------------------------------------- KV cache
try:  # transformers >= 4.56: caches are lists of layers
    from transformers.cache_utils import DynamicLayer as _DynamicLayer
except ImportError:  # pragma: no cover - older transformers: the model's own cache is used
    _DynamicLayer = None


if _DynamicLayer is not None:

    class _GrowingLayer(_DynamicLayer):
        """A ``DynamicLayer`` whose keys / values are views of preallocated buffers, written in place.

        ``keys`` / ``values`` are ``buffer[:, :, :length]`` (``(batch, kv_heads, length, head_dim)``),
        so everything that reads a ``DynamicLayer`` reads this one. When the buffer is full it grows
        to twice the generated part (at most ``limit`` positions), so the copies add up to O(length).
        """

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int, limit: int):
            super().__init__()
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True
            self._limit = limit
            self._length = keys.shape[-2]
            self._kbuf = self._alloc(keys, capacity)
            self._vbuf = self._alloc(values, capacity)
            self._views()

        @staticmethod
        def _alloc(src: torch.Tensor, capacity: int) -> torch.Tensor:
            buf = src.new_empty((*src.shape[:2], capacity, src.shape[-1]))
            buf[:, :, : src.shape[-2]] = src
            return buf

        def _views(self) -> None:
            self.keys = self._kbuf[:, :, : self._length]
            self.values = self._vbuf[:, :, : self._length]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            new = key_states.shape[-2]
            end = self._length + new
            if end > self._kbuf.shape[-2]:
                capacity = max(end, min(self._limit, 2 * self._kbuf.shape[-2]))
                self._kbuf = self._alloc(self.keys, capacity)
                self._vbuf = self._alloc(self.values, capacity)
            self._kbuf[:, :, self._length : end] = key_states
            self._vbuf[:, :, self._length : end] = value_states
            self._length = end
            self._views()
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self._kbuf = self._kbuf[indices]
            self._vbuf = self._vbuf[indices]
            self._views()

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            self.batch_select_indices(beam_idx.to(self._kbuf.device))

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._kbuf = self._kbuf.repeat_interleave(repeats, dim=0)
            self._vbuf = self._vbuf.repeat_interleave(repeats, dim=0)
            self._views()

        def crop(self, max_length: int) -> None:
            if max_length < 0:
                max_length = self._length - abs(max_length)
            self._length = max(0, min(self._length, max_length))
            self._views()

        def get_seq_length(self) -> int:
            return self._length


def _expand_cache(cache: Any, index: torch.Tensor, reserve: int, limit: int) -> Any:
    """Rows of the prompt cache for each sample (``index``: sample -> prompt), in preallocated buffers.

    ``reserve``: positions to preallocate past the prompt; ``limit``: the most positions a row can
    reach. Layers that are not plain ``DynamicLayer`` (and caches without layers) are indexed as
    the model made them.
    """
    layers = getattr(cache, "layers", None)
    if _DynamicLayer is None or layers is None:
        cache.batch_select_indices(index)
        return cache
    for i, layer in enumerate(layers):
        if type(layer) is _DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
            length = layer.keys.shape[-2]
            layers[i] = _GrowingLayer(
                layer.keys.index_select(0, index), layer.values.index_select(0, index),
                min(limit, length + reserve), limit,
            )
        else:
            layer.batch_select_indices(index)
    return cache


# ---------------------------------------------------------------------------------------------- attention
_DECODE_ATTENTION = "sailrl_grouped_decode"
_DECODE_REGISTERED: bool | None = None


def _grouped_decode_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                         **kwargs):
    """SDPA attention; for one query token with grouped key/value heads, without repeating them.

    ``query``: ``(B, H, q, D)``; ``key`` / ``value``: ``(B, H_kv, L, D)``. With ``q == 1`` and
    ``H = g * H_kv``, query head ``h`` attends with key/value head ``h // g`` (as ``repeat_kv``), so
    the ``g`` query heads of a group are batched as ``g`` queries of one head. Otherwise the call
    goes to transformers' ``sdpa_attention_forward``. Returns ``((B, q, H, D), None)``.
    """
    # lazy: exists only where this transformers has the attention interface (_decode_attention_available)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1) or 1)
    b, h, q, d = query.shape
    if q != 1 or groups == 1 or kwargs.get("output_attentions") or (module.training and dropout):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
            **kwargs,
        )
    grouped = query.reshape(b, h // groups, groups, d)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask,
                                                           scale=scaling)
    return out.reshape(b, h, 1, d).transpose(1, 2), None


def _decode_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function: Any = None, attention_mask: torch.Tensor | None = None, **kwargs: Any):
    """transformers' ``sdpa_mask``, except for one causal query token over a 2D padding mask.

    That query sits after every cached position, so its causal mask is the padding mask itself:
    ``attention_mask[:, None, None, :kv_length]`` (``(B, 1, 1, kv_length)`` bool). Any other case
    (prefill, sliding windows, packed or custom masks) goes to ``sdpa_mask`` unchanged.
    """
    from transformers.masking_utils import causal_mask_function, sdpa_mask  # lazy: the same

    if (
        q_length == 1
        and kv_offset == 0
        and mask_function is causal_mask_function
        and attention_mask is not None
        and attention_mask.dim() == 2
        and attention_mask.dtype == torch.bool
        and attention_mask.shape[-1] >= kv_length
    ):
        return attention_mask[:, None, None, :kv_length]
    if mask_function is not None:
        kwargs["mask_function"] = mask_function
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, attention_mask=attention_mask, **kwargs)


def _decode_attention_available() -> bool:
    global _DECODE_REGISTERED
    if _DECODE_REGISTERED is None:
        try:
            # lazy: the ImportError branch is the fallback for a transformers without it
            from transformers import AttentionInterface

            # lazy: the same
            from transformers.masking_utils import AttentionMaskInterface, causal_mask_function, sdpa_mask  # noqa: F401

            AttentionInterface.register(_DECODE_ATTENTION, _grouped_decode_sdpa)
            AttentionMaskInterface.register(_DECODE_ATTENTION, _decode_mask)
            _DECODE_REGISTERED = True
        except ImportError:  # pragma: no cover - transformers without the attention interface
            _DECODE_REGISTERED = False
    return _DECODE_REGISTERED


@contextmanager
def _decode_attention(model: Any) -> Iterator[None]:
    """Within the block, a model on SDPA attention decodes with ``_grouped_decode_sdpa``."""
    config = getattr(model, "config", None)
    if (
        config is None
        or getattr(config, "_attn_implementation", None) != "sdpa"
        or not getattr(model, "_supports_attention_backend", False)
        or not _decode_attention_available()
    ):
        yield
        return
    config._attn_implementation = _DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


# ---------------------------------------------------------------------------------------------- sampling
def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half-precision logits to float32; float32 / float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _filter_logprobs(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k / nucleus. ``scaled``: ``(A, V)`` logprobs.

    ``top_k``: ``(A,)`` int (``<= 0`` = off); ``top_p``: ``(A,)`` float (``>= 1`` = off). The nucleus
    keeps the most likely tokens until their mass reaches ``top_p`` (always at least one).
    """
    needs_k = top_k > 0
    needs_p = top_p < 1.0
    sorted_lp, order = torch.sort(scaled, dim=-1, descending=True)
    probs = sorted_lp.exp()
    before = probs.cumsum(-1) - probs  # mass strictly above each token
    remove = needs_p[:, None] & (before > top_p[:, None])
    ranks = torch.arange(scaled.shape[-1], device=scaled.device).expand_as(scaled)
    remove |= needs_k[:, None] & (ranks >= top_k[:, None])
    remove[:, 0] = False
    mask = torch.zeros_like(remove).scatter(-1, order, remove)
    return scaled.masked_fill(mask, float("-inf"))


@dataclass
class _RowParams:
    """Per-row sampling parameters on the model's device (``(B,)`` each) and batch-wide flags."""

    temps: torch.Tensor  # greedy rows hold 1.0
    greedy: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    any_greedy: bool
    all_greedy: bool
    any_filter: bool

    def select(self, pos: torch.Tensor) -> _RowParams:
        return _RowParams(self.temps[pos], self.greedy[pos], self.top_k[pos], self.top_p[pos],
                          self.any_greedy, self.all_greedy, self.any_filter)


def _sample(logits: torch.Tensor, rp: _RowParams, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row. ``logits``: ``(B, V)``; ``uniforms``: ``(B,)`` in ``[0, 1)``.

    Returns ``(tokens (B,) int64, logprobs (B,) float)`` with the logprob of each token under
    ``log_softmax(logits / temperature)``. Sampled rows take the first token whose cumulative
    filtered probability exceeds ``u * total`` (inverse CDF); greedy rows take the argmax.
    """
    logits = _upcast(logits)
    if rp.all_greedy:
        scaled = torch.log_softmax(logits, dim=-1)
        choice = scaled.argmax(-1)
        return choice, scaled.gather(-1, choice[:, None]).squeeze(-1)
    scaled = torch.log_softmax(logits / rp.temps[:, None], dim=-1)
    filtered = _filter_logprobs(scaled, rp.top_k, rp.top_p) if rp.any_filter else scaled
    exact = torch.float32 if filtered.device.type == "mps" else torch.float64
    cdf = filtered.exp().cumsum(-1, dtype=exact)
    target = uniforms.to(exact) * cdf[:, -1]
    choice = torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)
    if rp.any_greedy:
        choice = torch.where(rp.greedy, scaled.argmax(-1), choice)
    return choice, scaled.gather(-1, choice[:, None]).squeeze(-1)


def _prompt_logprob_outputs(
    req: SampleRequest, logits_row: torch.Tensor, pad: int
) -> tuple[np.ndarray | None, list | None]:
    """Prompt logprobs (NaN at position 0 and outside the last-n window) and top-k lists."""
    n = len(req.prompt)
    lp = torch.log_softmax(logits_row[pad : pad + n - 1], dim=-1)  # predicts prompt[1:]
    first = 1 if req.prompt_logprobs_last_n is None else n - req.prompt_logprobs_last_n
    out_lp = None
    if req.include_prompt_logprobs:
        vals = np.full(n, np.nan, dtype=np.float32)
        if n > 1:
            got = lp.gather(-1, torch.tensor(req.prompt[1:], device=lp.device).unsqueeze(-1)).squeeze(-1)
            vals[1:] = got.float().cpu().numpy()
            vals[:first] = np.nan
        out_lp = vals
    out_topk = None
    if req.topk_prompt_logprobs > 0:
        k = min(req.topk_prompt_logprobs, lp.shape[-1])
        out_topk = [None] * n
        if n > 1:
            top_v, top_i = lp.topk(k, dim=-1)
            top_v, top_i = top_v.tolist(), top_i.tolist()
            for pos in range(max(first, 1), n):
                out_topk[pos] = list(zip(top_i[pos - 1], top_v[pos - 1], strict=False))
    return out_lp, out_topk


def _check_prompts(requests: Sequence[SampleRequest], max_context: int, vocab: int | None) -> None:
    for req in requests:
        if not req.prompt:
            raise ValueError("Cannot sample from an empty prompt: give at least one token.")
        if len(req.prompt) >= max_context:
            raise ValueError(
                f"The prompt has {len(req.prompt)} tokens, which fills the model's context window "
                f"of {max_context}; shorten the prompt."
            )
        if vocab is not None and not 0 <= min(req.prompt) <= max(req.prompt) < vocab:
            bad = next(t for t in req.prompt if not 0 <= t < vocab)
            raise ValueError(
                f"The prompt holds the token id {bad}, outside the model's vocabulary (0..{vocab - 1}); "
                "encode prompts with this model's tokenizer."
            )


@dataclass
class _Rows:
    """The decode inputs of every row (one row per sample, in request order), built from the requests."""

    req_of_row: torch.Tensor  # (n,) request index
    prompt_of_row: torch.Tensor  # (n,) distinct-prompt index
    limits: torch.Tensor  # (n,) most new tokens (max_tokens, at most the room left in the context)
    uniforms: torch.Tensor  # (n, max(limits)) one draw per token a row may generate
    stops: list[_Stops]  # per request

    @classmethod
    def build(cls, requests: Sequence[SampleRequest], prompt_of_req: list[int], max_context: int,
              eos: int | None, generator: torch.Generator) -> _Rows:
        counts = torch.tensor([r.num_samples for r in requests])
        req_of_row = torch.repeat_interleave(torch.arange(len(requests)), counts)
        req_limit = []
        for req in requests:
            room = max_context - len(req.prompt)
            mt = req.params.max_tokens
            req_limit.append(max(0, room if mt is None else min(int(mt), room)))
        limits = torch.tensor(req_limit, dtype=torch.long)[req_of_row]
        uniforms = torch.zeros((req_of_row.numel(), max(req_limit, default=0) or 1))
        start = 0
        for req, limit in zip(requests, req_limit, strict=True):
            if float(req.params.temperature) > GREEDY_TEMPERATURE and limit > 0:
                g = generator if req.params.seed is None else torch.Generator().manual_seed(int(req.params.seed))
                uniforms[start : start + req.num_samples, :limit] = torch.rand((req.num_samples, limit), generator=g)
            start += req.num_samples
        stops = [_stops_for(r.params, eos) for r in requests]
        return cls(req_of_row, torch.tensor(prompt_of_req)[req_of_row], limits, uniforms, stops)


@torch.inference_mode()
def generate(
    model: Any,
    requests: Sequence[SampleRequest],
    *,
    tokenizer: Any,
    max_context: int,
    generator: torch.Generator,
) -> list[types.SampleResponse]:
    """Serve ``requests`` with one batched prefill + decode; returns one ``SampleResponse`` each.

    ``generator``: a CPU ``torch.Generator`` for requests without ``SamplingParams.seed``.
    Raises ``ValueError`` for an empty prompt, a prompt that fills the context window of
    ``max_context`` tokens, a token id outside the model's vocabulary, or a malformed ``stop``.
    """
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    _check_prompts(requests, max_context, getattr(embeddings, "num_embeddings", None))
    device = next(model.parameters()).device

    # Distinct prompts, prefilled once each (left-padded).
    prompt_index: dict[tuple[int, ...], int] = {}
    for req in requests:
        prompt_index.setdefault(tuple(req.prompt), len(prompt_index))
    prompt_of_req = [prompt_index[tuple(r.prompt)] for r in requests]
    rows = _Rows.build(requests, prompt_of_req, max_context, getattr(tokenizer, "eos_token_id", None), generator)
    prompts = list(prompt_index)
    lens = torch.tensor([len(p) for p in prompts])
    want_prompt = any(r.include_prompt_logprobs or r.topk_prompt_logprobs > 0 for r in requests)
    shared = 0 if want_prompt or not _can_share_prompt_start(model) else shared_prompt_length(prompts)
    forward = decoder_of(model)
    out, mask = (_prefill_shared(forward, prompts, shared, device) if shared
                 else _prefill(forward, prompts, device, want_prompt))
    width = mask.shape[1]

    n_rows, max_new = rows.uniforms.shape
    tokens_out = torch.zeros((n_rows, max_new), dtype=torch.long)
    logprobs_out = torch.zeros((n_rows, max_new), dtype=torch.float32)
    final_len = torch.zeros(n_rows, dtype=torch.long)
    stopped = torch.zeros(n_rows, dtype=torch.bool)
    live = torch.nonzero(rows.limits > 0).squeeze(-1)
    if live.numel():
        with _decode_attention(model):
            _decode(forward, out, mask, lens, requests, rows, live, tokenizer, tokens_out, logprobs_out, final_len,
                    stopped)

    tokens_np = tokens_out.numpy().astype(np.int32)
    logprobs_np = logprobs_out.numpy()
    final, stopped_l = final_len.tolist(), stopped.tolist()
    responses: list[types.SampleResponse] = []
    row = 0
    for req, p_i in zip(requests, prompt_of_req, strict=True):
        seqs = []
        for s in range(req.num_samples):
            n = final[row]
            seqs.append(
                types.SampledSequence(
                    stop_reason="stop" if stopped_l[row] else "length",
                    sequence_id=f"{req.request_id}-{s}",
                    tokens_np=tokens_np[row, :n].copy(),
                    logprobs_np=logprobs_np[row, :n].copy(),
                )
            )
            row += 1
        prompt_lp, topk = None, None
        if req.include_prompt_logprobs or req.topk_prompt_logprobs > 0:
            prompt_lp, topk = _prompt_logprob_outputs(req, _upcast(out.logits[p_i]), width - len(req.prompt))
        responses.append(
            types.SampleResponse(sequences=seqs, prompt_logprobs_np=prompt_lp, _topk_prompt_logprobs_list=topk)
        )
    return responses


def shared_prompt_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many tokens at the start of every prompt in ``prompts`` to prefill once for all of them: the tokens they
    all start with (each keeping at least one of its own), when there are at least :data:`MIN_SHARED_PROMPT` of
    them and two or more prompts; else 0."""
    if len(prompts) < 2:
        return 0
    first = prompts[0]
    common = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = 0
        while n < common and p[n] == first[n]:
            n += 1
        common = n
        if common < MIN_SHARED_PROMPT:
            return 0
    return common


#: Config fields that give some layers a window of recent positions (GPT-Neo's ``window_size``, Longformer,
#: Llama 4's chunked attention); ``sliding_window`` counts unless ``use_sliding_window`` is off (Qwen2 / Qwen3).
_WINDOW_FIELDS = ("window_size", "attention_window", "attention_window_size", "attention_chunk_size")


def _can_share_prompt_start(model: Any) -> bool:
    """Whether a shared prompt start may be prefilled apart from each prompt's own tokens (``_prefill_shared``):
    only when every layer attends to all earlier positions and positions are plain token indices. In a sliding or
    local window, the padding between the shared start and a prompt's own tokens would take places that real
    tokens fill in a plain forward; dynamic RoPE scales by the length of the pass, which the shared start would run
    without its own tokens."""
    config = getattr(model, "config", None)
    get = getattr(config, "get_text_config", None)
    config = get() if callable(get) else config
    for field in ("layer_types", "attention_layers"):  # transformers' per-layer kinds; GPT-Neo's global / local
        kinds = getattr(config, field, None)
        if kinds is not None and any(kind not in ("full_attention", "global") for kind in kinds):
            return False
    if any(getattr(config, field, None) for field in _WINDOW_FIELDS):
        return False
    if getattr(config, "use_sliding_window", True) and getattr(config, "sliding_window", None) is not None:
        return False
    for field in ("rope_parameters", "rope_scaling"):
        rope = getattr(config, field, None)
        if isinstance(rope, dict) and "dynamic" in (rope.get("rope_type"), rope.get("type")):
            return False
    return True


def left_padded(seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``, both ``(len(seqs), longest)`` long tensors: each sequence at the right end of its row, zeros
    (mask 0) before it."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):
        ids[i, width - len(seq) :] = torch.tensor(seq)
        mask[i, width - len(seq) :] = 1
    return ids, mask


def _prefill(forward: Any, prompts: list[tuple[int, ...]], device: Any, want_prompt: bool) -> tuple[Any, torch.Tensor]:
    """One left-padded forward over ``prompts`` (``forward``: the model, or its ``decoder.FusedDecoder``); returns the
    output and the ``(prompts, width)`` padding mask."""
    ids, mask = left_padded(prompts)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = forward(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        use_cache=True,
        logits_to_keep=0 if want_prompt else 1,
    )
    return out, mask


def _prefill_shared(forward: Any, prompts: list[tuple[int, ...]], shared: int, device: Any) -> tuple[Any, torch.Tensor]:
    """The first ``shared`` tokens of ``prompts`` (the same in each) in one forward, its KV cache copied to every
    prompt, then each prompt's own tokens left-padded after it: padding sits between the shared part and a shorter
    prompt's tokens, masked out, and positions count real tokens only. Returns the model output (the last
    position's logits) and the ``(prompts, shared + width)`` padding mask."""
    head = forward(input_ids=torch.tensor([prompts[0][:shared]], device=device), use_cache=True, logits_to_keep=1)
    cache = head.past_key_values
    cache.batch_repeat_interleave(len(prompts))
    ids, own = left_padded([p[shared:] for p in prompts])
    mask = torch.cat([torch.ones((len(prompts), shared), dtype=torch.long), own], dim=1)
    positions = shared + (own.cumsum(-1) - 1).clamp(min=0)
    out = forward(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out, mask


def _decode(
    forward: Any,
    prefill: Any,
    mask: torch.Tensor,
    lens: torch.Tensor,
    requests: Sequence[SampleRequest],
    rows: _Rows,
    live: torch.Tensor,
    tokenizer: Any,
    tokens_out: torch.Tensor,
    logprobs_out: torch.Tensor,
    final_len: torch.Tensor,
    stopped: torch.Tensor,
) -> None:
    """Decode the ``live`` rows (those with ``limits > 0``) from the ``prefill`` output with ``forward`` (the model,
    or its ``decoder.FusedDecoder``).

    Fills ``tokens_out`` / ``logprobs_out`` ``(n, max_new)``, ``final_len`` and ``stopped`` ``(n,)`` in
    place. The batch holds the rows still decoding (``batch_rows``: batch position -> row) plus the
    finished rows not yet compacted away (``alive`` False).
    """
    device = prefill.logits.device
    width = mask.shape[1]
    prompt_of_row = rows.prompt_of_row[live]
    max_new = int(rows.limits[live].max())
    cache = _expand_cache(prefill.past_key_values, prompt_of_row.to(device), reserve=min(max_new, _INITIAL_RESERVE),
                          limit=width + max_new)
    logits = prefill.logits[:, -1, :][prompt_of_row.to(device)]

    # Per-request sampling parameters and stop tables, indexed per row.
    r_rows = rows.req_of_row[live]
    greedy = torch.tensor([float(r.params.temperature) <= GREEDY_TEMPERATURE for r in requests])[r_rows]
    temps = torch.tensor([float(r.params.temperature) for r in requests])[r_rows].masked_fill(greedy, 1.0)
    top_k = torch.tensor([int(r.params.top_k) for r in requests])[r_rows]
    top_p = torch.tensor([float(r.params.top_p) for r in requests])[r_rows]
    rp = _RowParams(
        temps.to(device), greedy.to(device), top_k.to(device), top_p.to(device),
        any_greedy=bool(greedy.any()), all_greedy=bool(greedy.all()),
        any_filter=bool((((top_k > 0) | (top_p < 1.0)) & ~greedy).any()),
    )
    vocab = logits.shape[-1]
    id_sets = list(dict.fromkeys(s.token_ids for s in rows.stops))
    id_table = torch.zeros((len(id_sets), vocab), dtype=torch.bool)
    for k, token_ids in enumerate(id_sets):
        valid = [i for i in token_ids if 0 <= i < vocab]
        if valid:
            id_table[k, valid] = True
    id_set = torch.tensor([id_sets.index(s.token_ids) for s in rows.stops])[r_rows]
    string_sets = list(dict.fromkeys(s.strings for s in rows.stops if s.strings))
    matchers = [stop_string_matcher(tokenizer, strings) for strings in string_sets]
    string_set = torch.tensor([string_sets.index(s.strings) if s.strings else -1 for s in rows.stops])[r_rows]
    limit = rows.limits[live]
    uniforms = rows.uniforms[live].to(device)

    batch_rows = live.clone()
    alive = torch.ones(live.numel(), dtype=torch.bool)
    attn = torch.zeros((live.numel(), width + max_new), dtype=torch.long, device=device)  # room for every token
    attn[:, :width] = mask[prompt_of_row].to(device)
    next_pos = lens[prompt_of_row].to(device)[:, None]

    step = 0
    while True:
        choice, lp = _sample(logits, rp, uniforms[:, step])
        choice_c = choice.cpu()
        tokens_out[batch_rows, step] = choice_c
        logprobs_out[batch_rows, step] = lp.float().cpu()
        hit = id_table[id_set, choice_c]
        for m_i, matcher in enumerate(matchers):
            check = alive & (string_set == m_i) & ~hit
            if bool(check.any()):
                pos = torch.nonzero(check).squeeze(-1)
                lo = max(0, step + 1 - matcher.window)
                for p in pos[matcher.candidates(choice_c[pos])].tolist():
                    if matcher.matches(tokens_out[batch_rows[p], lo : step + 1].tolist()):
                        hit[p] = True
        done = alive & (hit | (limit <= step + 1))
        if bool(done.any()):
            final_len[batch_rows[done]] = step + 1
            stopped[batch_rows[done]] = hit[done]
            alive &= ~done
            n_alive = int(alive.sum())
            if n_alive == 0:
                return
            if alive.numel() - n_alive >= max(1, alive.numel() // COMPACT_FRACTION):
                keep = torch.nonzero(alive).squeeze(-1)
                keep_d = keep.to(device)
                cache.batch_select_indices(keep_d)
                batch_rows, alive, limit, id_set, string_set = (
                    batch_rows[keep], alive[keep], limit[keep], id_set[keep], string_set[keep])
                rp, uniforms, attn, next_pos, choice = (
                    rp.select(keep_d), uniforms[keep_d], attn[keep_d], next_pos[keep_d], choice[keep_d])
        attn[:, width + step] = 1
        out = forward(
            input_ids=choice[:, None],
            attention_mask=attn[:, : width + step + 1],
            position_ids=next_pos,
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1
        step += 1
