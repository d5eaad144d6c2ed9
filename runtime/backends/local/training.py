"""``LocalTrainingClient``: the ``tinker.TrainingClient`` interface over a LoRA trainer of the embedded backend.

``forward_backward`` adds gradients (they accumulate over calls, as on Tinker, until
``optim_step``); ``optim_step`` runs ``torch.optim.AdamW`` with exactly the ``AdamParams`` given
(learning_rate, beta1, beta2, eps, decoupled weight_decay, grad_clip_norm; Tinker documents its
Adam as identical to ``torch.optim.AdamW``) and clears the gradients. The work is done by a
``trainer.LoraTrainer`` (datum convention and losses there) -- in this process, or in the backend's training
process through a ``trainer_process.RemoteTrainer`` -- in the order the calls were made, on the backend's
training worker thread.

As on Tinker, ``load_state`` / ``load_state_with_optimizer`` must be a training client's first request (a client
made by ``create_training_client_from_state*`` has made it); later, a ``ValueError`` says to create a new client
from the checkpoint instead. Loading takes only ``weights/`` checkpoints and sampling only ``sampler_weights/``
ones (``checkpoints.require_kind``).
"""

from __future__ import annotations

import datetime as _dt
import os
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Literal, TypeVar

import numpy as np
import tinker
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture, AwaitableConcurrentFuture

from sailrl.runtime.backends.local.backend import LocalBackend
from sailrl.runtime.backends.local.weights.checkpoints import CheckpointPathError, LocalPath, check_name, require_kind
from sailrl.runtime.backends.local.sampling import LocalSamplingClient
from sailrl.runtime.backends.local.sdk import refuse_the_rest
from sailrl.runtime.backends.local.weights.tiny import BaseModelSpec
from sailrl.runtime.backends.local.engine.trainer import LoraTrainer, prepare_data
from sailrl.runtime.backends.local.processes.trainer_process import RemoteTrainer


def new_run_id(model_name: str) -> str:
    """A fresh run id, e.g. ``tiny-3f9a1c2e``."""
    stem = os.path.basename(model_name.rstrip("/")).replace("_", "-") or "model"
    stem = "".join(c for c in stem if c.isalnum() or c in "-.")[:32] or "model"
    return f"{stem}-{uuid.uuid4().hex[:8]}"


T = TypeVar("T")
U = TypeVar("U")

#: ``forward_backward_custom``'s loss function: ``(data, logprobs) -> (loss, metrics)`` (the SDK's
#: ``CustomLossFnV1``).
CustomLossFn = Callable[[list[types.Datum], list[Any]], tuple[Any, dict[str, float]]]


def custom_forward_data(data: list[types.Datum], loss_type_input: str) -> list[types.Datum]:
    """The datums ``forward_backward_custom`` runs forward: ``target_tokens`` and ``weights`` only (weights zero
    where absent), as the SDK sends them. Raises ``ValueError`` for another ``loss_type_input`` or a datum without
    ``target_tokens``."""
    if loss_type_input != "logprobs":
        raise ValueError(f"Unsupported loss_type_input={loss_type_input!r}. Supported values are: logprobs")
    out = []
    for i, datum in enumerate(data):
        targets = datum.loss_fn_inputs.get("target_tokens")
        if targets is None:
            raise ValueError(f"Datum {i}: forward_backward_custom needs loss_fn_inputs['target_tokens'].")
        weights = datum.loss_fn_inputs.get("weights")
        if weights is None:
            weights = types.TensorData.from_numpy(np.zeros(targets.to_numpy().shape, dtype=np.float32))
        out.append(types.Datum(model_input=datum.model_input,
                               loss_fn_inputs={"target_tokens": targets, "weights": weights}))
    return out


def logprob_tensors(output: types.ForwardBackwardOutput) -> list[torch.Tensor]:
    """Each datum's logprobs from a forward, as a leaf tensor that requires grad (shaped as its targets)."""
    return [torch.from_numpy(out["logprobs"].to_numpy().copy()).requires_grad_(True)
            for out in output.loss_fn_outputs]


def linear_loss_data(data: list[types.Datum], logprobs: list[torch.Tensor]) -> list[types.Datum]:
    """The datums of the backward pass: ``cross_entropy`` weighted by ``-dC/dlogprobs`` (cross_entropy is
    ``-sum(logprobs * weights)``, so its gradient is the custom loss ``C``'s). Raises ``ValueError`` for a logprob
    tensor the loss did not use."""
    out = []
    for i, (datum, lp) in enumerate(zip(data, logprobs, strict=True)):
        if lp.grad is None:
            raise ValueError(f"No gradient computed for logprob tensor {i}: the custom loss does not use it.")
        out.append(types.Datum(model_input=datum.model_input, loss_fn_inputs={
            "target_tokens": datum.loss_fn_inputs["target_tokens"],
            "weights": types.TensorData.from_torch(-lp.grad.detach())}))
    return out


def then(future: AwaitableConcurrentFuture[T], fn: Callable[[T], U]) -> AwaitableConcurrentFuture[U]:
    """An ``APIFuture`` of ``fn`` applied to ``future``'s result (or its exception)."""
    out: Future = Future()

    def done(f: Future) -> None:
        try:
            out.set_result(fn(f.result()))
        except BaseException as exc:  # noqa: BLE001 -- delivered through the future
            out.set_exception(exc)

    future.future().add_done_callback(done)
    return AwaitableConcurrentFuture(out)


class _SamplersAndInfo:
    """``LocalTrainingClient``'s sampling clients (snapshots, saved sampler weights), info and tokenizer; it
    provides ``_backend``, ``_trainer``, ``_spec``, ``_lora``, ``_info`` and ``_submit``."""

    _backend: LocalBackend
    _trainer: Any
    _spec: BaseModelSpec
    _lora: types.LoraConfig
    _info: types.GetInfoResponse
    _snapshots: int
    _submit: Callable[..., Any]

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
    ) -> LocalSamplingClient:
        """A sampler over a snapshot of the current weights (in memory; ``name`` is ignored, as in
        the SDK); waits for the requests queued before it. Raises ``ValueError`` for ``kind="inflight"``."""
        if kind != "snapshot":
            raise ValueError("The embedded backend supports only kind='snapshot' sampling clients.")
        return self._submit("save_weights_and_get_sampling_client", self._snapshot_sampler).result()

    async def save_weights_and_get_sampling_client_async(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: types.SamplingClientKind = "snapshot",
    ) -> LocalSamplingClient:
        if kind != "snapshot":
            raise ValueError("The embedded backend supports only kind='snapshot' sampling clients.")
        return await self._submit("save_weights_and_get_sampling_client", self._snapshot_sampler)

    def create_sampling_client(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> LocalSamplingClient:
        """A sampler over the sampler weights at ``model_path`` (``local://<run>/sampler_weights/<name>``); raises
        ``checkpoints.CheckpointPathError`` for a bad or missing path or a ``weights/`` one."""
        return self._backend.sample_worker.submit(lambda: self._backend.sampling_client_from_path(model_path)).result()

    async def create_sampling_client_async(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> LocalSamplingClient:
        return await self._backend.sample_worker.submit(lambda: self._backend.sampling_client_from_path(model_path))

    # ------------------------------------------------------------------ info
    def get_info(self) -> types.GetInfoResponse:
        """Base model name, LoRA rank and this run's id (``model_id``)."""
        return self._info

    async def get_info_async(self) -> types.GetInfoResponse:
        return self._info

    def get_tokenizer(self) -> Any:
        """The base model's tokenizer (``runtime.backends.models.get_tokenizer``)."""
        return self._backend.bases.tokenizer(self._spec)

    def get_telemetry(self) -> None:
        """No telemetry: nothing leaves this machine."""
        return None

    @property
    def peft_model(self) -> Any:
        """The underlying ``peft.PeftModel`` (for tests and inspection; do not train it directly). Raises
        ``AttributeError`` when it lives in the backend's training process."""
        return self._trainer.model


class _Checkpoints:
    """The training client's checkpoints (a base of :class:`LocalTrainingClient`): ``save_state`` /
    ``save_weights_for_sampler`` and ``load_state`` (with or without the optimizer), each a request of the client's
    own queue."""

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
        return self._submit(
            "save_state", lambda: types.SaveWeightsResponse(
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
        return self._submit(
            "save_weights_for_sampler", lambda: types.SaveWeightsForSamplerResponse(
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
        if self._first_request is not None:
            raise ValueError(
                f"load_state must be a training client's first request, and this client ({self.model_id}) has "
                f"already made {self._first_request}: create a new training client from the checkpoint "
                f"instead (ServiceClient.create_training_client_from_state_with_optimizer({path!r}), or "
                "create_training_client_from_state for the weights alone).")
        require_kind(path, "weights", "load_state")
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
        """Load adapter weights from the ``weights/`` checkpoint at ``path``; the optimizer restarts fresh. Only as
        the client's first request (else the future fails with ``ValueError``)."""
        return self._submit(f"load_state({path!r})", lambda: self._run_load(path, False))

    async def load_state_async(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[types.LoadWeightsResponse]:
        return self.load_state(path, weights_access_token)

    def load_state_with_optimizer(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[types.LoadWeightsResponse]:
        """Load adapter weights and AdamW state (a ``weights/`` checkpoint from ``save_state``); only as the
        client's first request."""
        return self._submit(f"load_state_with_optimizer({path!r})", lambda: self._run_load(path, True))

    async def load_state_with_optimizer_async(
        self, path: str, weights_access_token: str | None = None
    ) -> APIFuture[types.LoadWeightsResponse]:
        return self.load_state_with_optimizer(path, weights_access_token)


@refuse_the_rest(tinker.TrainingClient)
class LocalTrainingClient(_SamplersAndInfo, _Checkpoints, tinker.TrainingClient):
    """In-process ``tinker.TrainingClient`` (an instance of it). Create it with ``LocalServiceClient``.

    Creating one records a training run (``checkpoints.CheckpointStore.write_run``: base model, LoRA rank,
    ``user_metadata``); ``loaded_from``: the checkpoint a client made from a state loaded (its first request).
    """

    def __init__(
        self,
        backend: LocalBackend,
        trainer: LoraTrainer | RemoteTrainer,
        spec: BaseModelSpec,
        lora: types.LoraConfig,
        run_id: str | None = None,
        user_metadata: dict[str, str] | None = None,
        loaded_from: str | None = None,
    ):
        self._backend = backend
        self._trainer = trainer
        self._spec = spec
        self._lora = lora
        self.model_id = run_id or new_run_id(spec.model_name)
        self._snapshots = 0
        self._first_request: str | None = f"load_state({loaded_from!r})" if loaded_from else None
        now = _dt.datetime.now(_dt.UTC)
        backend.store.write_run(self.model_id, {
            "training_run_id": self.model_id, "base_model": spec.model_name, "lora_rank": lora.rank,
            "user_metadata": dict(user_metadata) if user_metadata else None, "created": now.isoformat()})
        backend.last_requests[self.model_id] = now
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

    # ------------------------------------------------------------------ requests
    def _submit(self, request: str, fn: Callable[[], T]) -> AwaitableConcurrentFuture[T]:
        """Queue ``fn`` on the training worker as the request ``request`` (its name, for the ``load_state``
        refusal), noting when it runs."""

        def job() -> T:
            self._backend.last_requests[self.model_id] = _dt.datetime.now(_dt.UTC)
            try:
                return fn()  # sees the requests made before this one (the load_state check)
            finally:
                if self._first_request is None:
                    self._first_request = request

        return self._backend.worker.submit(job)

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
        return self._submit("forward", lambda: self._run_forward(data, loss_fn, loss_fn_config, False))

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
        return self._submit("forward_backward", lambda: self._run_forward(data, loss_fn, loss_fn_config, True))

    async def forward_backward_async(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """As the SDK: a coroutine returning the ``APIFuture`` (``await (await ...).result_async()``)."""
        return self.forward_backward(data, loss_fn, loss_fn_config)

    def forward_backward_custom(
        self,
        data: list[types.Datum],
        loss_fn: CustomLossFn,
        *,
        loss_type_input: Literal["logprobs"] = "logprobs",
    ) -> APIFuture[types.ForwardBackwardOutput]:
        """Forward + backward of ``loss_fn(data, logprobs)`` -> ``(loss, metrics)``, any differentiable function of
        the datums' target logprobs (each a torch tensor that requires grad, shaped as its ``target_tokens``), as
        the SDK does it: a ``forward`` for the logprobs, ``loss_fn`` here, then ``forward_backward`` with the
        ``cross_entropy`` loss weighted by ``-dloss/dlogprobs``, whose gradient is the custom loss's. Waits for the
        forward; returns an ``APIFuture`` of the backward's ``ForwardBackwardOutput``, its ``metrics`` the
        function's plus ``loss:sum`` (the custom loss) and ``surrogate_loss:sum``."""
        forward_data = custom_forward_data(data, loss_type_input)
        logprobs = logprob_tensors(self.forward(forward_data, "cross_entropy").result())
        return self._custom_backward(data, loss_fn, logprobs)

    async def forward_backward_custom_async(
        self,
        data: list[types.Datum],
        loss_fn: CustomLossFn,
        *,
        loss_type_input: Literal["logprobs"] = "logprobs",
    ) -> APIFuture[types.ForwardBackwardOutput]:
        forward_data = custom_forward_data(data, loss_type_input)
        logprobs = logprob_tensors(await self.forward(forward_data, "cross_entropy").result_async())
        return self._custom_backward(data, loss_fn, logprobs)

    def _custom_backward(self, data: list[types.Datum], loss_fn: CustomLossFn,
                         logprobs: list[torch.Tensor]) -> APIFuture[types.ForwardBackwardOutput]:
        loss, metrics = loss_fn(data, logprobs)
        custom_loss = float(loss.detach().sum())
        loss.backward()
        backward = self.forward_backward(linear_loss_data(data, logprobs), "cross_entropy")

        def with_metrics(out: types.ForwardBackwardOutput) -> types.ForwardBackwardOutput:
            surrogate = out.metrics.pop("loss:sum")
            out.metrics.update(metrics)
            out.metrics.update({"loss:sum": custom_loss, "surrogate_loss:sum": surrogate})
            return out

        return then(backward, with_metrics)

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
        return self._submit("optim_step", lambda: self._run_optim(params))

    async def optim_step_async(
        self,
        optim_params: types.OptimParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> APIFuture[types.OptimStepResponse]:
        return self.optim_step(optim_params, adam_params=adam_params)
