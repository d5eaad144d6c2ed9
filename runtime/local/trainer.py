"""``LoraTrainer``: one LoRA model and its optimizer, and what the embedded backend's training client does to them.

``training.LocalTrainingClient`` is the ``tinker.TrainingClient`` interface (futures, checks, names); a
``LoraTrainer`` does the work it queues: forward (+ backward) over prepared datums, the AdamW step, saving and
loading adapter + optimizer files, copying the adapter tensors. It lives in the run's process, or in the training
process (``trainer_process``), which runs the same methods on the same objects; so the two give the same numbers.

Datum convention (as tinker-cookbook builds them): ``model_input`` = tokens[:-1], ``loss_fn_inputs["target_tokens"]``
= tokens[1:], every loss input of length ``model_input.length``; :func:`prepare_data` turns datums into
``(tokens, inputs)`` pairs and raises ``ValueError`` (``losses.LossInputError``) for bad ones. Losses:
``losses.datum_loss``, summed over datums; ``metrics["loss:sum"]`` is that sum. The optimizer is
``torch.optim.AdamW`` with exactly the ``AdamParams`` given (Tinker documents its Adam as identical).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tinker import types

from sailrl.runtime.local.checkpoints import OPTIMIZER_FILE, TRAINING_STATE_FILE, CheckpointStore, LocalPath
from sailrl.runtime.local.lora import adapter_state, attach_lora, quiet_peft
from sailrl.runtime.local.losses import check_loss_request, datum_loss
from sailrl.runtime.local.tiny import BaseModelSpec

Prepared = list[tuple[list[int], dict[str, np.ndarray]]]  # (tokens, loss inputs) per datum; arrays pickle fast


def _datum_arrays(datum: types.Datum, index: int) -> tuple[list[int], dict[str, np.ndarray]]:
    tokens = datum.model_input.to_ints()
    inputs: dict[str, np.ndarray] = {}
    for key, value in datum.loss_fn_inputs.items():
        array = value.to_numpy()
        if array.ndim != 1 or array.shape[0] != len(tokens):
            raise ValueError(
                f"Datum {index}: loss_fn_inputs[{key!r}] has shape {tuple(array.shape)}, but "
                f"model_input has {len(tokens)} tokens; each loss input needs one value per token."
            )
        inputs[key] = array.astype(np.int64 if key == "target_tokens" else np.float32, copy=False)
    return tokens, inputs


def prepare_data(data: list[types.Datum], loss_fn: str, loss_fn_config: Mapping[str, float | str] | None) -> Prepared:
    """``(tokens, loss inputs)`` per datum, checked against ``loss_fn``; raises ``ValueError`` for a bad datum."""
    prepared = []
    for i, datum in enumerate(data):
        tokens, inputs = _datum_arrays(datum, i)
        check_loss_request(loss_fn, set(inputs), loss_fn_config, i)
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

    @property
    def arch(self) -> str | None:
        return getattr(self.model.config, "model_type", None)

    @property
    def lora_alpha(self) -> float:
        return self.model.peft_config["default"].lora_alpha

    def forward(self, prepared: Prepared, loss_fn: str, loss_fn_config: Mapping[str, float | str] | None,
                backward: bool) -> types.ForwardBackwardOutput:
        """Loss and per-datum ``logprobs`` (float32 ``(N_i,)``) of ``prepared`` datums; with ``backward``, gradients
        added to the adapter's (they accumulate until :meth:`optim`)."""
        if not prepared:
            return types.ForwardBackwardOutput("ArrayRecord", [], {"loss:sum": 0.0})
        width = max(len(t) for t, _ in prepared)
        ids = torch.zeros((len(prepared), width), dtype=torch.long)
        mask = torch.zeros((len(prepared), width), dtype=torch.long)
        targets = torch.zeros((len(prepared), width), dtype=torch.long)
        for i, (tokens, inputs) in enumerate(prepared):
            ids[i, : len(tokens)] = torch.tensor(tokens)
            mask[i, : len(tokens)] = 1
            targets[i, : len(tokens)] = torch.from_numpy(inputs["target_tokens"])
        device = self.device
        self.model.eval()  # no dropout; LoRA dropout is 0
        with torch.set_grad_enabled(backward):
            logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            if logits.dtype in (torch.float16, torch.bfloat16):
                logits = logits.float()
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.to(device)[..., None]).squeeze(-1)
            total = torch.zeros((), device=logits.device)
            outputs = []
            for i, (tokens, inputs) in enumerate(prepared):
                lp = logprobs[i, : len(tokens)]
                total = total + datum_loss(
                    loss_fn, lp, {k: torch.from_numpy(v).to(device) for k, v in inputs.items()}, loss_fn_config
                )
                outputs.append({"logprobs": types.TensorData.from_torch(lp.detach().cpu())})
            if backward:
                total.backward()
        return types.ForwardBackwardOutput("ArrayRecord", outputs, {"loss:sum": float(total.detach())})

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
        and step count too; then its metadata. Raises ``ValueError`` if it exists and not ``overwrite``."""
        lp = LocalPath.parse(path)
        directory = self.store.prepare(lp, overwrite)
        self.model.save_pretrained(directory, save_embedding_layers=False)
        readme = os.path.join(directory, "README.md")
        if os.path.exists(readme):
            os.remove(readme)
        self.spec.write(directory)
        if lp.kind == "weights":
            torch.save(self.optimizer.state_dict(), os.path.join(directory, OPTIMIZER_FILE))
            with open(os.path.join(directory, TRAINING_STATE_FILE), "w") as f:
                json.dump({"optimizer_steps": self.steps, "lora": self.lora.model_dump()}, f, indent=2)
        self.store.write_meta(lp, ttl_seconds, user_metadata)
        return str(lp)

    def load(self, path: str, with_optimizer: bool) -> None:
        """Load the adapter weights at ``path``; a fresh optimizer, or with ``with_optimizer`` the saved AdamW state
        and step count. Raises ``ValueError`` for a layout mismatch or a sampler checkpoint (no optimizer state)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

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


def new_trainer(bases: Any, spec: BaseModelSpec, lora: types.LoraConfig, store: CheckpointStore,
                device: str) -> LoraTrainer:
    """A fresh LoRA adapter (``lora.attach_lora``, seeded with ``lora.seed``) on a copy of ``spec``'s base."""
    model = attach_lora(bases.get(spec), rank=lora.rank, seed=lora.seed, train_mlp=lora.train_mlp,
                        train_attn=lora.train_attn, train_unembed=lora.train_unembed)
    return LoraTrainer(model, spec, lora, store, device)


def trainer_from_state(bases: Any, path: str, store: CheckpointStore, device: str,
                       with_optimizer: bool) -> LoraTrainer:
    """A trainer with the adapter at ``path`` (and its optimizer state with ``with_optimizer``)."""
    from peft import PeftModel

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
