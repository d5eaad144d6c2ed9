"""``LocalServiceClient``: an in-process stand-in for ``tinker.ServiceClient`` (torch + transformers + peft).

Everything runs on this machine with no keys: a built-in model (``sailrl/tiny``, built from a config and a
seed; ``sailrl/tiny-arith``, shipped weights; byte tokenizer), a local Hugging Face model folder, a GGUF file, or
a hub model (cached, or downloaded once; see ``sources``). Device, dtype and torch threads follow
``device.py`` (``SAILRL_DEVICE``, ``SAILRL_DTYPE``, ``SAILRL_THREADS``). Method names, parameters and
return kinds follow tinker 0.35, inside the range pyproject.toml pins (``tests/test_local_drift.py`` checks them
against the installed SDK): the creation methods return a future of the client that can also be used as the
client; their ``*_async`` variants are coroutines returning the client itself. Checkpoints live under ``base_dir`` (see ``checkpoints``).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture

from sailrl.runtime.local.backend import LocalBackend
from sailrl.runtime.local.device import local_device, local_dtype, thread_count
from sailrl.runtime.local.futures import ClientFuture, completed
from sailrl.runtime.local.merged import max_context_of
from sailrl.runtime.local.rest import LocalRestClient
from sailrl.runtime.local.sampling import LocalSamplingClient
from sailrl.runtime.local.tiny import BaseModelSpec, resolve_base_model
from sailrl.runtime.local.trainer import new_trainer, trainer_from_state
from sailrl.runtime.local.training import LocalTrainingClient
from sailrl.spec.models import TINY_MODEL_NAME


class LocalServiceClient:
    """Create local training / sampling / rest clients.

    Args:
    - ``model_name``: the default base model (a built-in name, a folder, a ``.gguf`` file or a hub id),
      used by ``get_server_capabilities`` and the device / thread defaults; each ``create_*`` call names
      its own base model.
    - ``device``: torch device; default ``device.local_device(model_name)``.
    - ``dtype``: parameter dtype; default ``device.local_dtype(device)`` (bfloat16 on a CUDA device that
      supports it, else float32).
    - ``base_dir``: directory for checkpoints (``local://<run>/...`` maps below it); default a
      fresh temporary directory.
    - ``seed``: seeds the ``sailrl/tiny`` base weights, LoRA inits given no seed, and sampling
      without ``SamplingParams.seed``.
    - ``num_threads``: ``torch.set_num_threads`` value (process-wide); default
      ``device.thread_count(model_name)`` (``SAILRL_THREADS``, else the measured policy there).
    - ``model_dir``: the folder relative model paths are looked up in first (the spec's folder).
    - ``processes``: train in one child process and sample in another (``child``, ``trainer_process``,
      ``sampler_process``), so training, sampling and the caller's own Python overlap without sharing this
      interpreter's GIL; the run turns it on for bounded off-policy runs on the CPU
      (``device.use_local_processes``). They start at once (about 2 s of imports, overlapping what follows) and
      stop with ``close()``; a training client's ``peft_model`` is then not inspectable.
    """

    def __init__(
        self,
        model_name: str = TINY_MODEL_NAME,
        *,
        device: str | None = None,
        dtype: torch.dtype | None = None,
        base_dir: str | os.PathLike | None = None,
        seed: int = 0,
        num_threads: int | None = None,
        coalesce_window_s: float = 0.003,
        model_dir: str | os.PathLike | None = None,
        processes: bool = False,
    ):
        if num_threads is None:
            num_threads = thread_count(model_name)
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        device = device or local_device(model_name)
        dtype = dtype or local_dtype(device)
        self.model_name = model_name
        self.model_dir = os.fspath(model_dir) if model_dir is not None else None
        self.base_dir = (
            os.fspath(base_dir) if base_dir is not None else tempfile.mkdtemp(prefix="sailrl-local-")
        )
        os.makedirs(self.base_dir, exist_ok=True)
        self._backend = LocalBackend(self.base_dir, device, dtype, seed, coalesce_window_s=coalesce_window_s,
                                     processes=processes)

    # ------------------------------------------------------------------ training clients
    def _new_lora_client(
        self,
        base_model: str,
        rank: int,
        seed: int | None,
        train_mlp: bool,
        train_attn: bool,
        train_unembed: bool,
    ) -> LocalTrainingClient:
        spec = resolve_base_model(base_model, self._backend.seed, self.model_dir)
        lora_seed = self._backend.next_lora_seed() if seed is None else seed
        lora = types.LoraConfig(
            rank=rank, seed=lora_seed, train_mlp=train_mlp, train_attn=train_attn, train_unembed=train_unembed
        )
        if self._backend.trainer_process is not None:
            return LocalTrainingClient(self._backend, self._backend.trainer_process.new_trainer(spec, lora), spec, lora)
        with self._backend.model_lock:  # the LoRA init seeds torch's global RNG; the sampling worker may load a base
            trainer = new_trainer(self._backend.bases, spec, lora, self._backend.store, self._backend.device)
        return LocalTrainingClient(self._backend, trainer, spec, lora)

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """A future of a ``LocalTrainingClient`` with a fresh LoRA adapter (alpha 32, see ``lora``).

        ``seed=None`` derives the LoRA init seed from the service seed. Raises ``ValueError`` if no
        layer family is chosen or ``optimizer`` is not Adam; the future fails with
        ``sources.BaseModelError`` (a ``ModelError``) for a model the backend cannot load.
        """
        if not (train_mlp or train_attn or train_unembed):
            raise ValueError("At least one of train_mlp, train_attn or train_unembed must be True.")
        if optimizer is not None and getattr(optimizer, "type", "adamw") != "adamw":
            raise ValueError("The embedded backend supports only the Adam optimizer.")
        return ClientFuture(
            self._backend.worker.submit(
                lambda: self._new_lora_client(base_model, rank, seed, train_mlp, train_attn, train_unembed)
            )
        )

    async def create_lora_training_client_async(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> LocalTrainingClient:
        return await self.create_lora_training_client(
            base_model, rank, seed, train_mlp, train_attn, train_unembed, user_metadata, optimizer
        )

    def _client_from_state(self, path: str, with_optimizer: bool) -> LocalTrainingClient:
        directory = self._backend.store.existing(path)
        spec = BaseModelSpec.read(directory)
        if self._backend.trainer_process is not None:
            trainer: Any = self._backend.trainer_process.trainer_from_state(spec, path, with_optimizer)
        else:
            trainer = trainer_from_state(self._backend.bases, path, self._backend.store, self._backend.device,
                                         with_optimizer)
        return LocalTrainingClient(self._backend, trainer, spec, trainer.lora)

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """A new training client (new run id) with the adapter weights at ``path``; fresh optimizer."""
        return ClientFuture(self._backend.worker.submit(lambda: self._client_from_state(path, False)))

    async def create_training_client_from_state_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> LocalTrainingClient:
        return await self.create_training_client_from_state(
            path, base_model, user_metadata, weights_access_token
        )

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """A new training client with the adapter AND AdamW state of ``local://<run>/weights/<name>``;
        training continues exactly as the saved run would have."""
        return ClientFuture(self._backend.worker.submit(lambda: self._client_from_state(path, True)))

    async def create_training_client_from_state_with_optimizer_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> LocalTrainingClient:
        return await self.create_training_client_from_state_with_optimizer(
            path, base_model, user_metadata, weights_access_token
        )

    # ------------------------------------------------------------------ sampling clients
    def _sampler(self, model_path: str | None, base_model: str | None) -> LocalSamplingClient:
        if model_path is not None:
            return self._backend.sampling_client_from_path(model_path)
        assert base_model is not None
        spec = resolve_base_model(base_model, self._backend.seed, self.model_dir)
        return self._backend.base_sampling_client(spec)

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> ClientFuture[LocalSamplingClient]:
        """A future of a sampler over saved weights (``model_path``, ``local://...``) or a base model.

        Raises ``ValueError`` if neither is given; the future fails with
        ``checkpoints.CheckpointPathError`` for a bad path.
        """
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided.")
        return ClientFuture(self._backend.sample_worker.submit(lambda: self._sampler(model_path, base_model)))

    async def create_sampling_client_async(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> LocalSamplingClient:
        return await self.create_sampling_client(model_path=model_path, base_model=base_model)

    # ------------------------------------------------------------------ misc
    def create_rest_client(self) -> LocalRestClient:
        """A ``LocalRestClient`` over this service's checkpoints (its calls run on the backend's I/O worker)."""
        return LocalRestClient(self._backend.io_worker, self._backend.store)

    def _capabilities(self) -> types.GetServerCapabilitiesResponse:
        spec = resolve_base_model(self.model_name, self._backend.seed, self.model_dir)
        context = max_context_of(self._backend.bases.get(spec))
        return types.GetServerCapabilitiesResponse(
            supported_models=[
                types.SupportedModel(
                    model_name=spec.model_name, max_context_length=context, trainable=True, sampleable=True
                )
            ]
        )

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The one model this service runs (``model_name``), with its context length."""
        return self._backend.worker.submit(self._capabilities).result()

    async def get_server_capabilities_async(self) -> types.GetServerCapabilitiesResponse:
        return await self._backend.worker.submit(self._capabilities)

    def close(self, status: str, detail: str | None = None) -> APIFuture[None]:
        """Stop the worker threads once queued work is done (``status`` / ``detail`` are ignored)."""
        self._backend.close()
        return completed(None)

    def __enter__(self) -> LocalServiceClient:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close("errored" if exc and exc[0] is not None else "success")
