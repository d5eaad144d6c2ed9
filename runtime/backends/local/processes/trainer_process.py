"""The embedded backend's training process: ``trainer.LoraTrainer`` objects that live in a child process.

Why a process: see ``child``. The parent's ``LocalTrainingClient`` keeps its interface, checks and futures; its
queued jobs on the training worker thread call a ``RemoteTrainer``, which sends each operation (forward, optim,
save, load, adapter copy) to the child and waits. Datums are checked and turned into tensors in the parent
(``trainer.prepare_data``), so a bad datum fails there, as in process. The child runs the same ``LoraTrainer``
methods in the order they were queued, so a run trains to the same weights either way
(``tests/backends/test_local_processes.py``).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from tinker import types

from sailrl.runtime.backends.local.weights.checkpoints import CheckpointStore
from sailrl.runtime.backends.local.processes.child import ChildProcess, LocalProcessError
from sailrl.runtime.backends.local.weights.tiny import BaseModelCache, BaseModelSpec
from sailrl.runtime.backends.local.engine.trainer import new_trainer, trainer_from_state


class TrainerProcessError(LocalProcessError):
    """The training process stopped or could not start; the message says why in one line."""

    code = "E153"


class TrainerProcess(ChildProcess):
    """A child process holding the backend's LoRA trainers. ``base_dir``: the checkpoint store's folder."""

    HOST = "sailrl.runtime.backends.local.processes.trainer_process:TrainerHost"

    def __init__(self, *, dtype: Any, device: str, threads: int, base_dir: str):
        super().__init__("trainer", {"dtype": str(dtype).removeprefix("torch."), "device": device,
                                     "threads": int(threads), "base_dir": base_dir},
                         what="training process", error=TrainerProcessError)

    def new_trainer(self, spec: BaseModelSpec, lora: types.LoraConfig) -> RemoteTrainer:
        """A fresh LoRA adapter on ``spec``'s base (``trainer.new_trainer``), held by the child."""
        info = self.call("new", (json.dumps(spec.to_json()), lora.model_dump()), "creating a LoRA adapter")
        return RemoteTrainer(self, spec, lora, **info)

    def trainer_from_state(self, spec: BaseModelSpec, path: str, with_optimizer: bool) -> RemoteTrainer:
        """A trainer with the adapter (and optimizer) at ``path`` (``trainer.trainer_from_state``)."""
        info = self.call("from_state", (path, with_optimizer), "loading a training checkpoint")
        lora = types.LoraConfig(**info.pop("lora"))
        return RemoteTrainer(self, spec, lora, **info)


class RemoteTrainer:
    """The parent's handle on a ``LoraTrainer`` in the training process: the same methods, run there."""

    def __init__(self, process: TrainerProcess, spec: BaseModelSpec, lora: types.LoraConfig, *, trainer_id: int,
                 arch: str | None, lora_alpha: float):
        self._process = process
        self._id = trainer_id
        self.spec = spec
        self.lora = lora
        self.arch = arch
        self.lora_alpha = lora_alpha

    def _call(self, method: str, during: str, *args: Any) -> Any:
        return self._process.call("call", (self._id, method, args), during)

    def forward(self, prepared: Any, loss_fn: str, loss_fn_config: Any, backward: bool) -> Any:
        return self._call("forward", "forward_backward" if backward else "forward", prepared, loss_fn,
                          dict(loss_fn_config) if loss_fn_config else None, backward)

    def optim(self, params: types.AdamParams) -> types.OptimStepResponse:
        return self._call("optim", "optim_step", params)

    def save(self, path: str, overwrite: bool, ttl_seconds: int | None, user_metadata: dict | None) -> str:
        return self._call("save", "saving a checkpoint", path, overwrite, ttl_seconds, user_metadata)

    def load(self, path: str, with_optimizer: bool) -> None:
        self._call("load", "loading a checkpoint", path, with_optimizer)

    def adapter_state(self) -> dict:
        return self._call("adapter_state", "copying the adapter")

    @property
    def model(self) -> Any:
        raise AttributeError("this training client's model lives in the embedded backend's training process "
                             "(SAILRL_LOCAL_PROCESSES=1); it cannot be inspected from here")


class TrainerHost:
    """The child's side: trainers by id, a base-model cache and the checkpoint store."""

    _METHODS = ("forward", "optim", "save", "load", "adapter_state")

    def __init__(self, init: dict[str, Any]):
        self._bases = BaseModelCache(getattr(torch, init["dtype"]), init["device"])
        self._store = CheckpointStore(init["base_dir"])
        self._device = init["device"]
        self._trainers: dict[int, Any] = {}

    def _info(self, trainer: Any) -> dict[str, Any]:
        trainer_id = len(self._trainers) + 1
        self._trainers[trainer_id] = trainer
        return {"trainer_id": trainer_id, "arch": trainer.arch, "lora_alpha": trainer.lora_alpha}

    def handle(self, op: str, payload: Any) -> Any:
        if op == "new":
            spec_json, lora = payload
            spec = BaseModelSpec.from_json(json.loads(spec_json))
            return self._info(new_trainer(self._bases, spec, types.LoraConfig(**lora), self._store, self._device))
        if op == "from_state":
            path, with_optimizer = payload
            trainer = trainer_from_state(self._bases, path, self._store, self._device, with_optimizer)
            return {**self._info(trainer), "lora": trainer.lora.model_dump()}
        if op == "call":
            trainer_id, method, args = payload
            if method not in self._METHODS:
                raise ValueError(f"the training process has no method {method!r}")
            return getattr(self._trainers[trainer_id], method)(*args)
        raise ValueError(f"the training process has no request {op!r}")
