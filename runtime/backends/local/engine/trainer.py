"""``LoraTrainer``: one LoRA model and its optimizer, and what the embedded backend's training client does to them.

``training.LocalTrainingClient`` is the ``tinker.TrainingClient`` interface (futures, checks, names); a
``LoraTrainer`` does the work it queues: forward (+ backward) over prepared datums, the AdamW step, saving and
loading adapter + optimizer files, copying the adapter tensors. It lives in the run's process, or in the training
process (``trainer_process``), which runs the same methods on the same objects; so the two give the same numbers.

Datum convention (as tinker-cookbook builds them): ``model_input`` = tokens[:-1], ``loss_fn_inputs["target_tokens"]``
= tokens[1:], every loss input of length ``model_input.length``; :func:`prepare_data` turns datums into
``(tokens, inputs)`` pairs and raises ``ValueError`` (``losses.LossInputError``) for bad ones. Losses:
``losses.datum_loss``, summed over datums; ``metrics["loss:sum"]`` is that sum. ``cross_entropy`` also takes
``target_tokens`` (and ``weights``) of shape ``(N, K)``: K target tokens per position, their logprobs ``(N, K)``. The optimizer is
``torch.optim.AdamW`` with exactly the ``AdamParams`` given (Tinker documents its Adam as identical).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from tinker import types
from transformers.cache_utils import DynamicCache, DynamicLayer

from sailrl.runtime.backends.local.weights.checkpoints import OPTIMIZER_FILE, TRAINING_STATE_FILE, CheckpointStore, LocalPath
from sailrl.runtime.backends.local.engine.decoder import decoder_of
from sailrl.runtime.backends.local.engine.lora import adapter_state, attach_lora, quiet_peft
from sailrl.runtime.backends.local.engine.losses import check_input_shapes, check_loss_request, datum_loss
from sailrl.runtime.backends.local.weights.tiny import BaseModelSpec

#: How safetensors names the errno of a failed write in its message.
_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)")


def _os_errno(exc: BaseException) -> int | None:
    """The OS error number of a failed write: an ``OSError``'s, or the one safetensors writes in its message."""
    if isinstance(exc, OSError):
        return exc.errno
    m = _OS_ERROR_IN_TEXT.search(str(exc)) if isinstance(exc, Exception) else None
    return int(m[1]) if m else None


Prepared = list[tuple[list[int], dict[str, np.ndarray]]]  # (tokens, loss inputs) per datum; arrays pickle fast


def _datum_arrays(datum: types.Datum, index: int) -> tuple[list[int], dict[str, np.ndarray]]:
    tokens = datum.model_input.to_ints()
    inputs: dict[str, np.ndarray] = {}
    for key, value in datum.loss_fn_inputs.items():
        array = value.to_numpy()
        if array.ndim not in (1, 2) or array.shape[0] != len(tokens):
            raise ValueError(
                f"Datum {index}: loss_fn_inputs[{key!r}] has shape {tuple(array.shape)}, but "
                f"model_input has {len(tokens)} tokens; each loss input needs one value per token "
                "(or, for cross_entropy's target_tokens and weights, K values per token: shape (N, K))."
            )
        inputs[key] = array.astype(np.int64 if key == "target_tokens" else np.float32, copy=False)
    return tokens, inputs


def prepare_data(data: list[types.Datum], loss_fn: str, loss_fn_config: Mapping[str, float | str] | None) -> Prepared:
    """``(tokens, loss inputs)`` per datum, checked against ``loss_fn``; raises ``ValueError`` for a bad datum."""
    prepared = []
    for i, datum in enumerate(data):
        tokens, inputs = _datum_arrays(datum, i)
        check_loss_request(loss_fn, set(inputs), loss_fn_config, i)
        check_input_shapes(loss_fn, {key: array.shape for key, array in inputs.items()}, i)
        if not tokens:
            raise ValueError(f"Datum {i}: model_input is empty.")
        prepared.append((tokens, inputs))
    return prepared


def _new_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)


class LoraTrainer:
    """A peft LoRA ``model`` on ``device`` with its AdamW optimizer and step count; ``store`` maps checkpoint
    paths to directories."""

    def __init__(self, model: Any, spec: BaseModelSpec, lora: types.LoraConfig, store: CheckpointStore,
                 device: str):
        self.model = model
        self.spec = spec
        self.lora = lora
        self.store = store
        self.device = device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = _new_optimizer(self.params)
        self.steps = 0
        self.run_model = decoder_of(model)  # the model's forward, hand-written where it allows (decoder.py)

    @property
    def arch(self) -> str | None:
        return getattr(self.model.config, "model_type", None)

    @property
    def lora_alpha(self) -> float:
        return self.model.peft_config["default"].lora_alpha

    def forward(self, prepared: Prepared, loss_fn: str, loss_fn_config: Mapping[str, float | str] | None,
                backward: bool) -> types.ForwardBackwardOutput:
        """Loss and per-datum ``logprobs`` (float32 ``(N_i,)``) of ``prepared`` datums; with ``backward``, gradients
        added to the adapter's (they accumulate until :meth:`optim`).

        Datums that start with the same tokens (an RL group: one prompt, several completions) share that prefix's
        forward pass when that pays (:func:`shared_prefixes`: a quarter of the tokens left out, or more than two
        passes cost): each distinct prefix runs once, its KV cache is indexed out to its datums, and only their own
        tokens run after it, in passes of datums of like lengths where padding every datum to the longest would cost more than the extra passes
        (:func:`length_batches`). The same logprobs and gradients up to float rounding (the prefix's gradient is
        summed over its datums before the matmuls instead of inside them).

        A batch whose activations would pass :data:`ACTIVATION_BYTES` runs as consecutive micro-batches
        (:func:`micro_batches`), each forward and backward before the next, so memory stays bounded whatever the
        step's size; the loss is a sum over datums, so the gradients are the same up to float rounding."""
        if not prepared:
            return types.ForwardBackwardOutput("ArrayRecord", [], {"loss:sum": 0.0})
        self.model.eval()  # no dropout; LoRA dropout is 0
        outputs = []
        loss_sum = 0.0
        pass_cost = pass_tokens(self.model.config)
        for chunk in micro_batches([len(t) for t, _ in prepared], tokens_per_chunk(self.model.config)):
            part = prepared[chunk.start:chunk.stop]
            if any(inputs["target_tokens"].ndim == 2 for _, inputs in part):  # cross_entropy over K targets
                with torch.set_grad_enabled(backward):
                    pieces = self._logprobs_k(part)
                    total = sum(datum_loss(loss_fn, lp, _datum_inputs(inputs, self.device), loss_fn_config)
                                for lp, (_, inputs) in zip(pieces, part, strict=True))
                    if backward:
                        total.backward()
                outputs += [{"logprobs": types.TensorData.from_torch(lp.detach().cpu())} for lp in pieces]
                loss_sum += float(total.detach())
                continue
            plan = shared_prefixes([t for t, _ in part], pass_cost)
            lengths = [len(t) for t, _ in part]
            inputs = _joined_inputs(part, self.device)
            with torch.set_grad_enabled(backward):
                flat = self._logprobs(part) if plan is None else self._logprobs_shared(part, *plan, pass_cost)
                # every loss is a sum over tokens: the datums' tokens in one tensor give the sum of their losses
                total = datum_loss(loss_fn, flat, inputs, loss_fn_config)
                if backward:
                    total.backward()  # gradients add up over the micro-batches: the loss is a sum over datums
            outputs += [{"logprobs": types.TensorData.from_torch(lp)} for lp in flat.detach().cpu().split(lengths)]
            loss_sum += float(total.detach())
        return types.ForwardBackwardOutput("ArrayRecord", outputs, {"loss:sum": loss_sum})

    def _logprobs(self, prepared: Prepared) -> torch.Tensor:
        """The datums' target logprobs, one after another (``(sum of lengths,)``), from one right-padded forward
        over every datum."""
        width = max(len(t) for t, _ in prepared)
        ids = torch.zeros((len(prepared), width), dtype=torch.long)
        mask = torch.zeros((len(prepared), width), dtype=torch.long)
        targets = torch.zeros((len(prepared), width), dtype=torch.long)
        for i, (tokens, inputs) in enumerate(prepared):
            ids[i, : len(tokens)] = torch.tensor(tokens)
            mask[i, : len(tokens)] = 1
            targets[i, : len(tokens)] = torch.from_numpy(inputs["target_tokens"])
        device = self.device
        logits = self.run_model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        return _target_logprobs(logits, targets.to(device))[mask.to(device).bool()]  # row by row: datum order

    def _logprobs_k(self, prepared: Prepared) -> list[torch.Tensor]:
        """Each datum's logprobs of its target tokens from one right-padded forward: ``(N,)`` for ``(N,)`` targets,
        ``(N, K)`` for ``(N, K)`` ones (the logprob of each of the K tokens at each position)."""
        width = max(len(t) for t, _ in prepared)
        ks = [inputs["target_tokens"].reshape(len(tokens), -1).shape[1] for tokens, inputs in prepared]
        ids = torch.zeros((len(prepared), width), dtype=torch.long)
        mask = torch.zeros((len(prepared), width), dtype=torch.long)
        targets = torch.zeros((len(prepared), width, max(ks)), dtype=torch.long)
        for i, (tokens, inputs) in enumerate(prepared):
            ids[i, : len(tokens)] = torch.tensor(tokens)
            mask[i, : len(tokens)] = 1
            targets[i, : len(tokens), : ks[i]] = torch.from_numpy(inputs["target_tokens"].reshape(len(tokens), -1))
        device = self.device
        logits = self.run_model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        logprobs = _target_logprobs(logits, targets.to(device))  # (B, T, K)
        return [logprobs[i, : len(tokens), : ks[i]] if inputs["target_tokens"].ndim == 2
                else logprobs[i, : len(tokens), 0] for i, (tokens, inputs) in enumerate(prepared)]

    def _logprobs_shared(self, prepared: Prepared, group_of: list[int], prefix_len: list[int],
                         pass_cost: int) -> torch.Tensor:
        """The datums' target logprobs, one after another, each group's prefix (``prefix_len[g]`` tokens, shared
        by the datums with ``group_of[i] == g``) run once: a left-padded forward over the prefixes with a KV cache,
        the cache indexed out to the datums, then right-padded forwards over each datum's own tokens after its
        prefix -- one, or several of datums of like lengths when that pads less by more than the passes cost
        (:func:`length_batches`; ``pass_cost``: :func:`pass_tokens`)."""
        device = self.device
        n_groups = len(prefix_len)
        first = {}
        for i, g in enumerate(group_of):
            first.setdefault(g, i)
        wp = max(prefix_len)
        p_ids = torch.zeros((n_groups, wp), dtype=torch.long)
        p_mask = torch.zeros((n_groups, wp), dtype=torch.long)
        for g in range(n_groups):
            p = prefix_len[g]
            p_ids[g, wp - p:] = torch.tensor(prepared[first[g]][0][:p])
            p_mask[g, wp - p:] = 1
        p_pos = (p_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.run_model(input_ids=p_ids.to(device), attention_mask=p_mask.to(device),
                             position_ids=p_pos.to(device), use_cache=True)
        # each datum's prefix targets, read from its group's prefix logits: (group, position, target) per token
        head_at = [(group_of[i], wp - prefix_len[group_of[i]] + j, int(t))
                   for i, (_, inputs) in enumerate(prepared)
                   for j, t in enumerate(inputs["target_tokens"][:prefix_len[group_of[i]]])]
        heads = _target_logprobs(out.logits, *torch.tensor(head_at, device=device).T).split(
            [prefix_len[g] for g in group_of])
        own = [len(t) - prefix_len[g] for (t, _), g in zip(prepared, group_of, strict=True)]
        prefix_cache = out.past_key_values
        plain = all(type(layer) is DynamicLayer for layer in getattr(prefix_cache, "layers", [None]))
        batches = length_batches(own, pass_cost) if plain else [list(range(len(prepared)))]
        tails: list[torch.Tensor | None] = [None] * len(prepared)
        for batch in batches:
            groups = [group_of[i] for i in batch]
            rows = torch.tensor(groups, device=device)
            if len(batches) == 1:
                cache = prefix_cache
                cache.batch_select_indices(rows)
            else:  # each pass its own copy of the prefix rows it needs
                cache = DynamicCache()
                for index, layer in enumerate(prefix_cache.layers):
                    cache.update(layer.keys[rows], layer.values[rows], index)
            ws = max(own[i] for i in batch)
            s_ids = torch.zeros((len(batch), ws), dtype=torch.long)
            s_mask = torch.zeros((len(batch), ws), dtype=torch.long)
            s_targets = torch.zeros((len(batch), ws), dtype=torch.long)
            for row, i in enumerate(batch):
                p = prefix_len[group_of[i]]
                s_ids[row, : own[i]] = torch.tensor(prepared[i][0][p:])
                s_mask[row, : own[i]] = 1
                s_targets[row, : own[i]] = torch.from_numpy(prepared[i][1]["target_tokens"][p:])
            starts = torch.tensor([prefix_len[g] for g in groups])
            last = starts + torch.tensor([own[i] for i in batch]) - 1  # a datum's last position: its padding's too
            s_pos = torch.minimum(starts[:, None] + torch.arange(ws)[None, :], last[:, None])
            mask = torch.cat([p_mask[torch.tensor(groups)], s_mask], dim=1)
            logits = self.run_model(input_ids=s_ids.to(device), attention_mask=mask.to(device),
                                    position_ids=s_pos.to(device), past_key_values=cache, use_cache=True).logits
            tail = _target_logprobs(logits, s_targets.to(device))[s_mask.to(device).bool()]
            for i, lp in zip(batch, tail.split([own[i] for i in batch]), strict=True):
                tails[i] = lp
        return torch.cat([piece for head, tail in zip(heads, tails, strict=True) for piece in (head, tail)])

    def optim(self, params: types.AdamParams) -> types.OptimStepResponse:
        """One AdamW step with ``params`` (clipping at ``grad_clip_norm`` when > 0), then clear the gradients.
        ``metrics``: ``grad_norm`` before clipping, ``learning_rate``."""
        for group in self.optimizer.param_groups:
            group.update(lr=params.learning_rate, betas=(params.beta1, params.beta2), eps=params.eps,
                         weight_decay=params.weight_decay)
        max_norm = params.grad_clip_norm if params.grad_clip_norm > 0 else float("inf")
        with_grad = [p for p in self.params if p.grad is not None]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(with_grad, max_norm)) if with_grad else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return types.OptimStepResponse(metrics={"grad_norm": grad_norm, "learning_rate": params.learning_rate})

    def save(self, path: str, overwrite: bool, ttl_seconds: int | None, user_metadata: dict | None) -> str:
        """Write the adapter (PEFT format) to ``path``'s directory, and for a ``weights`` path the optimizer state
        and step count too; then its metadata. Raises ``ValueError`` if it exists and not ``overwrite``.

        A save that fails part-way removes the directory it made (a half-written checkpoint is none); a full or
        failing disk is an ``OSError`` naming the directory (torch's and safetensors' own errors do not say)."""
        lp = LocalPath.parse(path)
        directory = self.store.prepare(lp, overwrite)
        try:
            self.model.save_pretrained(directory, save_embedding_layers=False)
            readme = os.path.join(directory, "README.md")
            if os.path.exists(readme):
                os.remove(readme)
            self.spec.write(directory)
            if lp.kind == "weights":
                buffer = io.BytesIO()  # serialized here, written by Python's I/O, whose errors carry the errno
                torch.save(self.optimizer.state_dict(), buffer)
                with open(os.path.join(directory, OPTIMIZER_FILE), "wb") as f:
                    f.write(buffer.getbuffer())
                with open(os.path.join(directory, TRAINING_STATE_FILE), "w") as f:
                    json.dump({"optimizer_steps": self.steps, "lora": self.lora.model_dump()}, f, indent=2)
            self.store.write_meta(lp, ttl_seconds, user_metadata)
        except BaseException as exc:
            shutil.rmtree(directory, ignore_errors=True)
            code = _os_errno(exc)
            if code is None:
                raise
            raise OSError(code, os.strerror(code), getattr(exc, "filename", None) or directory) from exc
        return str(lp)

    def load(self, path: str, with_optimizer: bool) -> None:
        """Load the adapter weights at ``path``; a fresh optimizer, or with ``with_optimizer`` the saved AdamW state
        and step count. Raises ``ValueError`` for a layout mismatch or a sampler checkpoint (no optimizer state)."""
        # lazy: peft takes seconds past transformers; only a process that trains pays it
        from peft import set_peft_model_state_dict

        directory = self.store.existing(path)
        state = load_file(os.path.join(directory, "adapter_model.safetensors"))
        result = set_peft_model_state_dict(self.model, state)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise ValueError(f"The checkpoint {path} does not match this client's LoRA layout: {unexpected[:3]}")
        self.optimizer = _new_optimizer(self.params)
        self.steps = 0
        if with_optimizer:
            opt_file = os.path.join(directory, OPTIMIZER_FILE)
            if not os.path.exists(opt_file):
                raise ValueError(
                    f"{path} holds no optimizer state (sampler weights only); resume from a "
                    "local://<run>/weights/<name> checkpoint written by save_state."
                )
            self.optimizer.load_state_dict(torch.load(opt_file, weights_only=True))
            with open(os.path.join(directory, TRAINING_STATE_FILE)) as f:
                self.steps = int(json.load(f)["optimizer_steps"])

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """A copy of the adapter's tensors (``lora.adapter_state``)."""
        return adapter_state(self.model)


def _joined_inputs(part: Prepared, device: str) -> dict[str, torch.Tensor]:
    """The datums' loss inputs, each key's arrays one after another; a datum without the optional ``weights`` of
    ``cross_entropy`` weighs its tokens 1 (as ``losses.datum_loss`` does)."""
    keys = sorted({key for _, inputs in part for key in inputs})
    return {key: torch.from_numpy(np.concatenate([
        inputs[key] if key in inputs else np.ones(len(tokens), dtype=np.float32) for tokens, inputs in part
    ])).to(device) for key in keys}


def _datum_inputs(inputs: dict[str, np.ndarray], device: str) -> dict[str, torch.Tensor]:
    """One datum's loss inputs as tensors on ``device``."""
    return {key: torch.from_numpy(array).to(device) for key, array in inputs.items()}


def _target_logprobs(logits: torch.Tensor, *index: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of target tokens under ``logits`` (upcast to float32 from half precision):
    ``_target_logprobs(logits, targets)`` with ``targets`` shaped as ``logits`` without its last axis, or
    ``_target_logprobs(logits, rows, positions, targets)`` for the tokens at those places of ``(B, T, V)``
    logits."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)  # once over the logits: indexing first would copy a row per token
    if len(index) == 1 and index[0].dim() == logits.dim():  # K targets per position: (B, T, K)
        return logprobs.gather(-1, index[0])
    if len(index) == 1:
        return logprobs.gather(-1, index[0][..., None]).squeeze(-1)
    rows, positions, targets = index
    return logprobs[rows, positions, targets]


#: Activation memory one learner pass may take (bytes, as :func:`tokens_per_chunk` estimates it): a step whose datums
#: need more runs as micro-batches. By that estimate SmolLM2-135M (30 layers, vocabulary 49,152) needs about 2 MB a
#: token, so an RL step of its rollouts splits; the built-in models (~25 KB a token) never do. The peak memory and
#: step time with and without micro-batches: benchmarks/local_backend.md.
ACTIVATION_BYTES = 2 << 30


def _dims(config: Any) -> tuple[int, int, int, int]:
    """``(hidden, layers, mlp, vocab)`` sizes of a transformers config (its text model's; 0 where it has none, the
    MLP 4x hidden by default)."""
    get = getattr(config, "get_text_config", None)
    config = get() if callable(get) else config
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    mlp = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    return hidden, layers, mlp, vocab


def tokens_per_chunk(config: Any, budget: int | None = None) -> int:
    """How many tokens one learner pass of a model with ``config`` (a transformers config) may take within
    ``budget`` bytes (default :data:`ACTIVATION_BYTES`): float32 activations kept for the backward pass, estimated
    per token as 12 hidden-sized and 4 MLP-sized vectors a layer plus 4 vocabulary-sized ones (logits,
    log-probabilities and their gradients)."""
    hidden, layers, mlp, vocab = _dims(config)
    per_token = 4 * (layers * (12 * hidden + 4 * mlp) + 4 * vocab)
    budget = ACTIVATION_BYTES if budget is None else budget
    return max(1, budget // per_token) if per_token > 0 else 1 << 30


def micro_batches(lengths: list[int], tokens: int) -> list[range]:
    """Consecutive ranges of datums (their token ``lengths``), each within ``tokens`` tokens as the learner pads it
    (its datums x its longest one; a longer datum alone); one range when everything fits, none for no datums. A
    group of datums that share a prompt is cut only where the padded size passes the limit."""
    out: list[range] = []
    start, longest = 0, 0
    for i, n in enumerate(lengths):
        if i > start and (i - start + 1) * max(longest, n) > tokens:
            out.append(range(start, i))
            start, longest = i, 0
        longest = max(longest, n)
    if lengths:
        out.append(range(start, len(lengths)))
    return out


MIN_SHARED_PREFIX = 4  # tokens two datums must start with alike to share a prefix pass
MIN_SAVING = 0.25  # share prefixes when that leaves out at least this fraction of the tokens, ...
SAVING_PASSES = 2  # ... or more tokens than this many learner passes cost (pass_tokens)


def shared_prefixes(tokens: list[list[int]], pass_cost: int | None = None) -> tuple[list[int], list[int]] | None:
    """``(group_of, prefix_len)`` for a shared-prefix forward over ``tokens`` (each datum's model input), or
    ``None`` when it would save less than ``MIN_SAVING`` of the tokens and, given the cost of a learner pass in
    tokens (``pass_cost``, :func:`pass_tokens`), fewer tokens than ``SAVING_PASSES`` passes cost. (A step of 16
    groups of 4 sailrl/tiny datums, a 22-token prompt before 64-token completions, leaves out 19% of its tokens,
    ~1,000, more than the 222 that two passes cost: it shares.)

    Groups are runs of consecutive datums (an RL step lists each group's rollouts together). A group's prefix is
    the longest start its datums share, less one token so that every datum keeps at least one token of its own;
    a datum alone is a group of one (prefix: all but its last token). The next datum joins the current group
    when it shares at least ``MIN_SHARED_PREFIX`` tokens with the group's first datum and joining runs fewer
    tokens than starting a group of its own: with ``k`` members and prefix ``p``, the shorter prefix ``p'``
    still saves ``k * p' > (k - 1) * p``."""
    group_of: list[int] = []
    prefix_len: list[int] = []
    lead: list[int] = []
    members = 0
    for seq in tokens:
        if lead:
            common = 0
            limit = min(len(lead), len(seq))
            while common < limit and lead[common] == seq[common]:
                common += 1
            shorter = min(prefix_len[-1], common, len(seq) - 1)
            if common >= MIN_SHARED_PREFIX and members * shorter > (members - 1) * prefix_len[-1]:
                prefix_len[-1] = shorter
                group_of.append(len(prefix_len) - 1)
                members += 1
                continue
        lead, members = seq, 1
        group_of.append(len(prefix_len))
        prefix_len.append(len(seq) - 1)
    if any(p < 1 for p in prefix_len) or len(prefix_len) == len(tokens):
        return None
    total = sum(len(t) for t in tokens)
    saved = total - sum(prefix_len) - sum(len(t) - prefix_len[g] for t, g in zip(tokens, group_of, strict=True))
    pays = saved >= MIN_SAVING * total or (pass_cost is not None and saved > SAVING_PASSES * pass_cost)
    return (group_of, prefix_len) if pays else None


#: What one more learner pass costs beyond its tokens: the Python and dispatch of a forward and backward through every
#: layer, counted as the tokens that take as long. The smaller a layer, the more tokens a pass is worth, so
#: :func:`pass_tokens` is ``PASS_COST`` parameter-tokens over a layer's parameters, and at least
#: ``MIN_PASS_TOKENS`` (the calibration on sailrl/tiny and SmolLM2-135M: benchmarks/local_backend.md).
PASS_COST = 24_000_000
MIN_PASS_TOKENS = 20


def pass_tokens(config: Any) -> int:
    """What one more learner pass of the model with ``config`` (a transformers config) costs, in tokens."""
    hidden, _, mlp, _ = _dims(config)
    per_layer = 4 * hidden * hidden + 3 * hidden * mlp
    return max(MIN_PASS_TOKENS, PASS_COST // per_layer) if per_layer else MIN_PASS_TOKENS


def length_batches(lengths: list[int], pass_cost: int) -> list[list[int]]:
    """The datums (their own ``lengths`` after the shared prefix) in passes of like lengths, each pass padded to its
    longest: the split that minimises the padded tokens plus ``pass_cost`` tokens a pass (one pass of every datum in
    order when nothing beats it). An RL step whose completions stop early (SmolLM2: 4 to 64 tokens) runs them in a
    few passes instead of padding every one to the longest."""
    n = len(lengths)
    if n < 2:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: lengths[i])
    best = [0] + [0] * n  # best[k]: the cost of the k shortest datums
    cut = [0] * (n + 1)
    for k in range(1, n + 1):
        longest = lengths[order[k - 1]]
        best[k], cut[k] = min((best[j] + (k - j) * longest + pass_cost, j) for j in range(k))
    if cut[n] == 0:
        return [list(range(n))]
    out: list[list[int]] = []
    k = n
    while k > 0:
        out.append(order[cut[k]:k])
        k = cut[k]
    return out[::-1]


def new_trainer(bases: Any, spec: BaseModelSpec, lora: types.LoraConfig, store: CheckpointStore,
                device: str) -> LoraTrainer:
    """A fresh LoRA adapter (``lora.attach_lora``, seeded with ``lora.seed``) on a copy of ``spec``'s base."""
    model = attach_lora(bases.get(spec), rank=lora.rank, seed=lora.seed, train_mlp=lora.train_mlp,
                        train_attn=lora.train_attn, train_unembed=lora.train_unembed)
    return LoraTrainer(model, spec, lora, store, device)


def trainer_from_state(bases: Any, path: str, store: CheckpointStore, device: str,
                       with_optimizer: bool) -> LoraTrainer:
    """A trainer with the adapter at ``path`` (and its optimizer state with ``with_optimizer``)."""
    from peft import PeftModel  # lazy: peft takes seconds past transformers; only a process that trains pays it

    directory = store.existing(path)
    spec = BaseModelSpec.read(directory)
    with quiet_peft():
        model = PeftModel.from_pretrained(bases.get(spec), directory, is_trainable=True)
    with open(os.path.join(directory, "adapter_config.json")) as f:
        lora = types.LoraConfig(rank=int(json.load(f)["r"]))
    state_file = os.path.join(directory, TRAINING_STATE_FILE)
    if os.path.exists(state_file):
        with open(state_file) as f:
            lora = types.LoraConfig(**json.load(f)["lora"])
    trainer = LoraTrainer(model, spec, lora, store, device)
    trainer.load(path, with_optimizer)
    return trainer
