"""``LocalTrainingClient``: the ``tinker.TrainingClient`` interface over a LoRA trainer of the embedded backend.

``forward_backward`` adds gradients (they accumulate over calls, as on Tinker, until
``optim_step``); ``optim_step`` runs ``torch.optim.AdamW`` with exactly the ``AdamParams`` given
(learning_rate, beta1, beta2, eps, decoupled weight_decay, grad_clip_norm; Tinker documents its
Adam as identical to ``torch.optim.AdamW``) and clears the gradients. The work is done by a
``trainer.LoraTrainer`` (datum convention and losses there) -- in this process, or in the backend's training
process through a ``trainer_process.RemoteTrainer`` -- in the order the calls were made, on the backend's
training worker thread.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture

from sailrl.runtime.local.backend import LocalBackend
from sailrl.runtime.local.checkpoints import CheckpointPathError, LocalPath, check_name
from sailrl.runtime.local.futures import ClientFuture
from sailrl.runtime.local.sampling import LocalSamplingClient
from sailrl.runtime.local.tiny import BaseModelSpec
from sailrl.runtime.local.trainer import LoraTrainer, prepare_data
from sailrl.runtime.local.trainer_process import RemoteTrainer


def new_run_id(model_name: str) -> str:
    """A fresh run id, e.g. ``tiny-3f9a1c2e``."""
    stem = os.path.basename(model_name.rstrip("/")).replace("_", "-") or "model"
    stem = "".join(c for c in stem if c.isalnum() or c in "-.")[:32] or "model"
    return f"{stem}-{uuid.uuid4().hex[:8]}"


class LocalTrainingClient:
    """In-process ``tinker.TrainingClient``. Create it with ``LocalServiceClient``."""

    def __init__(
        self,
        backend: LocalBackend,
        trainer: LoraTrainer | RemoteTrainer,
        spec: BaseModelSpec,
        lora: types.LoraConfig,
        run_id: str | None = None,
    ):
        self._backend = backend
        self._trainer = trainer
        self._spec = spec
        self._lora = lora
        self.model_id = run_id or new_run_id(spec.model_name)
        self._snapshots = 0
        self._info = types.GetInfoResponse(
            model_data=types.ModelData(
                arch=trainer.arch,
                model_name=spec.model_name,
                tokenizer_id=spec.model_name,
            ),
            model_id=self.model_id,
            is_lora=True,
            lora_rank=lora.rank,
            model_name=spec.model_name,
        )

    # ------------------------------------------------------------------ forward / backward
    def _run_forward(
        self,
        data: list[types.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None,
        backward: bool,
    ) -> types.ForwardBackwardOutput:
        return self._trainer.forward(prepare_data(data, loss_fn, loss_fn_config), loss_fn, loss_fn_config, backward)

    def forward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """Loss and per-datum ``logprobs`` without gradients; an ``APIFuture`` of ``ForwardBackwardOutput``.

        Bad inputs fail the future with ``ValueError`` (``losses.LossInputError``).
        """
        data = list(data)
        return self._backend.worker.submit(lambda: self._run_forward(data, loss_fn, loss_fn_config, False))

    async def forward_async(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[types.ForwardBackwardOutput]:
        return self.forward(data, loss_fn, loss_fn_config)

    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """Forward + backward; gradients accumulate until ``optim_step``.

        Returns an ``APIFuture`` of ``ForwardBackwardOutput`` with ``loss_fn_outputs[i]["logprobs"]``
        (float32 ``(N_i,)``) and ``metrics["loss:sum"]``. Bad inputs fail the future with ``ValueError``.
        """
        data = list(data)
        return self._backend.worker.submit(lambda: self._run_forward(data, loss_fn, loss_fn_config, True))

    async def forward_backward_async(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """As the SDK: a coroutine returning the ``APIFuture`` (``await (await ...).result_async()``)."""
        return self.forward_backward(data, loss_fn, loss_fn_config)

    # ------------------------------------------------------------------ optimizer
    def _run_optim(self, params: types.AdamParams) -> types.OptimStepResponse:
        return self._trainer.optim(params)

    def optim_step(
        self,
        optim_params: types.OptimParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> APIFuture[types.OptimStepResponse]:
        """One AdamW step with ``AdamParams``; an ``APIFuture`` of ``OptimStepResponse``
        (``metrics``: ``grad_norm`` before clipping, ``learning_rate``). Raises ``ValueError`` if
        both or neither parameter is given, ``TypeError`` for a non-Adam optimizer."""
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both.")
        params = optim_params if optim_params is not None else adam_params
        if params is None:
            raise ValueError(
                "optim_step needs AdamParams (for example tinker.AdamParams(learning_rate=1e-4))."
            )
        if not isinstance(params, types.AdamParams):
            raise TypeError("The embedded backend supports only Adam: pass tinker.AdamParams.")
        return self._backend.worker.submit(lambda: self._run_optim(params))

    async def optim_step_async(
        self,
        optim_params: types.OptimParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> APIFuture[types.OptimStepResponse]:
        return self.optim_step(optim_params, adam_params=adam_params)

    # ------------------------------------------------------------------ checkpoints
    def _run_save(
        self, kind: str, name: str, ttl_seconds: int | None, overwrite: bool, user_metadata: dict | None
    ) -> str:
        return self._trainer.save(str(LocalPath(self.model_id, kind, name)), overwrite, ttl_seconds, user_metadata)

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> APIFuture[types.SaveWeightsResponse]:
        """Save adapter + optimizer state to ``local://<run>/weights/<name>``.

        Raises ``ValueError`` for a bad name; the future fails with ``ValueError`` if the name is
        taken and ``overwrite`` is False.
        """
        check_name(name)
        return self._backend.worker.submit(
            lambda: types.SaveWeightsResponse(
                path=self._run_save("weights", name, ttl_seconds, overwrite, user_metadata)
            )
        )

    async def save_state_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> APIFuture[types.SaveWeightsResponse]:
        return self.save_state(
            name, ttl_seconds=ttl_seconds, overwrite=overwrite, user_metadata=user_metadata
        )

    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        """Save the adapter (PEFT format) to ``local://<run>/sampler_weights/<name>``."""
        check_name(name)
        return self._backend.worker.submit(
            lambda: types.SaveWeightsForSamplerResponse(
                path=self._run_save("sampler_weights", name, ttl_seconds, False, user_metadata)
            )
        )

    async def save_weights_for_sampler_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        return self.save_weights_for_sampler(name, ttl_seconds=ttl_seconds, user_metadata=user_metadata)

    def _run_load(self, path: str, with_optimizer: bool) -> types.LoadWeightsResponse:
        directory = self._backend.store.existing(path)
        if BaseModelSpec.read(directory) != self._spec:
            raise CheckpointPathError(
                f"The checkpoint {path} was trained on a different base model than this client "
                f"({BaseModelSpec.read(directory).model_name}, not {self._spec.model_name}).")
        self._trainer.load(path, with_optimizer)
        return types.LoadWeightsResponse(path=path, model_id=self.model_id)

    def load_state(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[types.LoadWeightsResponse]:
        """Load adapter weights from ``path``; the optimizer restarts fresh."""
        return self._backend.worker.submit(lambda: self._run_load(path, False))

    async def load_state_async(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[types.LoadWeightsResponse]:
        return self.load_state(path, weights_access_token)

    def load_state_with_optimizer(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[types.LoadWeightsResponse]:
        """Load adapter weights and AdamW state (a ``weights/`` checkpoint from ``save_state``)."""
        return self._backend.worker.submit(lambda: self._run_load(path, True))

    async def load_state_with_optimizer_async(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[types.LoadWeightsResponse]:
        return self.load_state_with_optimizer(path, weights_access_token)

    # ------------------------------------------------------------------ sampling clients
    def _snapshot_sampler(self) -> LocalSamplingClient:
        config = {"r": self._lora.rank, "lora_alpha": self._trainer.lora_alpha}
        merged = self._backend.merged_model(self._spec, self._trainer.adapter_state(), config)
        self._snapshots += 1
        return self._backend.sampling_client(merged, self._spec, None)

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: types.SamplingClientKind = "snapshot",
    ) -> ClientFuture[LocalSamplingClient]:
        """A sampler over a snapshot of the current weights (in memory; ``name`` is ignored, as in
        the SDK). Raises ``ValueError`` for ``kind="inflight"``."""
        if kind != "snapshot":
            raise ValueError("The embedded backend supports only kind='snapshot' sampling clients.")
        return ClientFuture(self._backend.worker.submit(self._snapshot_sampler))

    async def save_weights_and_get_sampling_client_async(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: types.SamplingClientKind = "snapshot",
    ) -> LocalSamplingClient:
        return await self.save_weights_and_get_sampling_client(
            name, retry_config=retry_config, record_stability_info=record_stability_info, kind=kind
        )

    def create_sampling_client(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> ClientFuture[LocalSamplingClient]:
        """A sampler over saved weights at ``model_path`` (``local://...``)."""
        return ClientFuture(
            self._backend.sample_worker.submit(lambda: self._backend.sampling_client_from_path(model_path))
        )

    async def create_sampling_client_async(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> LocalSamplingClient:
        return await self.create_sampling_client(model_path)

    # ------------------------------------------------------------------ info
    def get_info(self) -> types.GetInfoResponse:
        """Base model name, LoRA rank and this run's id (``model_id``)."""
        return self._info

    async def get_info_async(self) -> types.GetInfoResponse:
        return self._info

    def get_tokenizer(self) -> Any:
        """The base model's tokenizer (``runtime.models.get_tokenizer``)."""
        return self._backend.bases.tokenizer(self._spec)

    @property
    def peft_model(self) -> Any:
        """The underlying ``peft.PeftModel`` (for tests and inspection; do not train it directly). Raises
        ``AttributeError`` when it lives in the backend's training process."""
        return self._trainer.model
