"""Batched sampling with a shared KV cache: one prefill per distinct prompt, all samples decoded together.

``generate(model, requests, ...)`` takes every request waiting in the sampler (coalesced by
``sampling.SampleBatcher``), prefills each DISTINCT prompt once (left-padded batch), copies the
prompt's KV cache to each of its samples (``DynamicCache.batch_select_indices`` with repeated
indices), then decodes all rows one token per step with the model's ``past_key_values``.
Finished rows are dropped from the cache so later steps only compute live rows.

Per-row sampling (``tinker.SamplingParams``): ``temperature`` (0 = greedy), ``top_k`` (-1 = off),
``top_p`` (1 = off), ``max_tokens`` (``None`` = up to the context length), ``stop`` (``None`` =
the tokenizer's EOS; ``[]`` = never stop; strings = those strings or EOS, as vLLM does and as
tinker-cookbook's ``role_colon`` parser expects; token ids = exactly those ids), ``seed`` (a
request-private ``torch.Generator``; otherwise the sampler's own generator). A sequence that
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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tinker import types

GREEDY_TEMPERATURE = 1e-6


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


@dataclass
class _Stops:
    token_ids: frozenset[int]
    strings: tuple[str, ...]
    trigger_chars: frozenset[str] = field(default_factory=frozenset)
    window: int = 0


def _stops_for(params: types.SamplingParams, eos_token_id: int | None) -> _Stops:
    stop = params.stop
    if stop is None:
        return _Stops(frozenset() if eos_token_id is None else frozenset([eos_token_id]), ())
    if isinstance(stop, str):
        stop = [stop]
    stop = list(stop)
    if not stop:
        return _Stops(frozenset(), ())
    if all(isinstance(s, str) for s in stop):
        strings = tuple(s for s in stop if s)
        return _Stops(
            frozenset() if eos_token_id is None else frozenset([eos_token_id]),
            strings,
            frozenset(s[-1] for s in strings),
            max((4 * len(s) + 8 for s in strings), default=0),
        )
    if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        return _Stops(frozenset(int(s) for s in stop), ())
    raise ValueError("SamplingParams.stop must be a string, a list of strings or a list of token ids.")


class _PieceCache:
    """Lone-token decodes, to skip the window decode when a token cannot end a stop string."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._pieces: dict[int, str] = {}

    def may_end(self, token: int, stops: _Stops) -> bool:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._tokenizer.decode([token])
            self._pieces[token] = piece
        if piece == "" or "\ufffd" in piece:
            return True  # part of a multi-byte character: decide on the window
        return any(c in piece for c in stops.trigger_chars)


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Half-precision logits to float32; float32 / float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _filter_logprobs(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k / nucleus. ``scaled``: ``(A, V)`` logprobs."""
    needs_k = top_k > 0
    needs_p = top_p < 1.0
    if not bool(needs_k.any() or needs_p.any()):
        return scaled
    sorted_lp, order = torch.sort(scaled, dim=-1, descending=True)
    probs = sorted_lp.exp()
    before = probs.cumsum(-1) - probs  # mass strictly above each token
    remove = needs_p[:, None] & (before > top_p[:, None])
    ranks = torch.arange(scaled.shape[-1]).expand_as(scaled)
    remove |= needs_k[:, None] & (ranks >= top_k[:, None])
    remove[:, 0] = False
    mask = torch.zeros_like(remove).scatter(-1, order, remove)
    return scaled.masked_fill(mask, float("-inf"))


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
            got = lp.gather(-1, torch.tensor(req.prompt[1:]).unsqueeze(-1)).squeeze(-1)
            vals[1:] = got.numpy()
            vals[:first] = np.nan
        out_lp = vals
    out_topk = None
    if req.topk_prompt_logprobs > 0:
        k = min(req.topk_prompt_logprobs, lp.shape[-1])
        out_topk = [None] * n
        if n > 1:
            top_v, top_i = lp.topk(k, dim=-1)
            for pos in range(max(first, 1), n):
                out_topk[pos] = list(zip(top_i[pos - 1].tolist(), top_v[pos - 1].tolist(), strict=False))
    return out_lp, out_topk


@torch.no_grad()
def generate(
    model: Any,
    requests: Sequence[SampleRequest],
    *,
    tokenizer: Any,
    max_context: int,
    generator: torch.Generator,
) -> list[types.SampleResponse]:
    """Serve ``requests`` with one batched prefill + decode; returns one ``SampleResponse`` each.

    Raises ``ValueError`` for an empty prompt or a prompt that fills the context window.
    """
    device = next(model.parameters()).device
    eos = getattr(tokenizer, "eos_token_id", None)
    pieces = _PieceCache(tokenizer)

    # Distinct prompts, prefilled once each.
    prompt_index: dict[tuple[int, ...], int] = {}
    for req in requests:
        if not req.prompt:
            raise ValueError("Cannot sample from an empty prompt: give at least one token.")
        if len(req.prompt) >= max_context:
            raise ValueError(
                f"The prompt has {len(req.prompt)} tokens, which fills the model's context window "
                f"of {max_context}; shorten the prompt."
            )
        prompt_index.setdefault(tuple(req.prompt), len(prompt_index))
    prompts = list(prompt_index)
    lens = [len(p) for p in prompts]
    width = max(lens)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    want_prompt = any(r.include_prompt_logprobs or r.topk_prompt_logprobs > 0 for r in requests)
    out = model(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        use_cache=True,
        logits_to_keep=0 if want_prompt else 1,
    )
    cache = out.past_key_values
    prefill_logits = _upcast(out.logits).cpu() if want_prompt else None
    last_logits = _upcast(out.logits[:, -1, :]).cpu()

    # Rows: one per sample, in request order.
    row_prompt: list[int] = []
    row_req: list[int] = []
    for r_i, req in enumerate(requests):
        p_i = prompt_index[tuple(req.prompt)]
        row_prompt += [p_i] * req.num_samples
        row_req += [r_i] * req.num_samples
    n_rows = len(row_prompt)
    stops = [_stops_for(r.params, eos) for r in requests]
    gens = [
        generator if r.params.seed is None else torch.Generator().manual_seed(int(r.params.seed))
        for r in requests
    ]
    temps = torch.tensor([float(requests[r].params.temperature) for r in row_req])
    top_k = torch.tensor([int(requests[r].params.top_k) for r in row_req])
    top_p = torch.tensor([float(requests[r].params.top_p) for r in row_req])
    limits = []
    for r in row_req:
        room = max_context - len(requests[r].prompt)
        mt = requests[r].params.max_tokens
        limits.append(room if mt is None else min(int(mt), room))
    tokens: list[list[int]] = [[] for _ in range(n_rows)]
    logprobs: list[list[float]] = [[] for _ in range(n_rows)]
    reasons: list[str] = ["length"] * n_rows

    index = torch.tensor(row_prompt)
    if n_rows:
        cache.batch_select_indices(index.to(device))
    logits = last_logits[index]
    attn = mask[index]
    next_pos = torch.tensor([lens[p] for p in row_prompt])
    active = [i for i in range(n_rows) if limits[i] > 0]
    if len(active) < n_rows and active:
        sel = torch.tensor([row for row in range(n_rows) if limits[row] > 0])
        cache.batch_select_indices(sel.to(device))
        logits, attn, next_pos = logits[sel], attn[sel], next_pos[sel]

    while active:
        act = torch.tensor(active)
        t = temps[act]
        greedy = t <= GREEDY_TEMPERATURE
        scaled = torch.log_softmax(logits / torch.where(greedy, 1.0, t)[:, None], dim=-1)
        filtered = _filter_logprobs(scaled, top_k[act], top_p[act])
        # Gumbel-max sampling, noise from each request's generator (rows in request order).
        noise = torch.empty_like(filtered)
        groups: dict[int, list[int]] = {}
        for pos, row in enumerate(active):
            groups.setdefault(id(gens[row_req[row]]), []).append(pos)
        for pos_list in groups.values():
            g = gens[row_req[active[pos_list[0]]]]
            u = torch.rand((len(pos_list), filtered.shape[-1]), generator=g)
            noise[pos_list] = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
        choice = torch.where(greedy, filtered.argmax(-1), (filtered + noise).argmax(-1))
        chosen_lp = scaled.gather(-1, choice[:, None]).squeeze(-1)
        choice_l, lp_l = choice.tolist(), chosen_lp.tolist()

        still: list[int] = []
        keep: list[int] = []
        for pos, row in enumerate(active):
            tok = choice_l[pos]
            tokens[row].append(tok)
            logprobs[row].append(lp_l[pos])
            st = stops[row_req[row]]
            done = tok in st.token_ids
            if not done and st.strings and pieces.may_end(tok, st):
                text = tokenizer.decode(tokens[row][-st.window :])
                done = any(s in text for s in st.strings)
            if done:
                reasons[row] = "stop"
            elif len(tokens[row]) >= limits[row]:
                reasons[row] = "length"
            else:
                still.append(row)
                keep.append(pos)
        if not still:
            break
        if len(keep) < len(active):
            sel = torch.tensor(keep)
            cache.batch_select_indices(sel.to(device))
            attn, next_pos, choice = attn[sel], next_pos[sel], choice[sel]
        active = still
        attn = torch.cat([attn, torch.ones((len(active), 1), dtype=attn.dtype)], dim=1)
        out = model(
            input_ids=choice[:, None].to(device),
            attention_mask=attn.to(device),
            position_ids=next_pos[:, None].to(device),
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values
        logits = _upcast(out.logits[:, -1, :]).cpu()
        next_pos = next_pos + 1

    responses: list[types.SampleResponse] = []
    row = 0
    pad_of = {p_i: width - lens[p_i] for p_i in range(len(prompts))}
    for req in requests:
        seqs = []
        for s in range(req.num_samples):
            seqs.append(
                types.SampledSequence(
                    stop_reason=reasons[row],  # type: ignore[arg-type]
                    sequence_id=f"{req.request_id}-{s}",
                    tokens_np=np.asarray(tokens[row], dtype=np.int32),
                    logprobs_np=np.asarray(logprobs[row], dtype=np.float32),
                )
            )
            row += 1
        prompt_lp, topk = None, None
        if req.include_prompt_logprobs or req.topk_prompt_logprobs > 0:
            p_i = prompt_index[tuple(req.prompt)]
            assert prefill_logits is not None
            prompt_lp, topk = _prompt_logprob_outputs(req, prefill_logits[p_i], pad_of[p_i])
        responses.append(
            types.SampleResponse(
                sequences=seqs, prompt_logprobs_np=prompt_lp, _topk_prompt_logprobs_list=topk
            )
        )
    return responses
