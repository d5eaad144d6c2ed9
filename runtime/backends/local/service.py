"""``LocalServiceClient``: an in-process stand-in for ``tinker.ServiceClient`` (torch + transformers + peft).

Everything runs on this machine with no keys: a built-in model (``sailrl/tiny``, built from a config and a
seed; ``sailrl/tiny-arith``, shipped weights; byte tokenizer), a local Hugging Face model folder, a GGUF file, or
a hub model (cached, or downloaded once; see ``sources``). Device, dtype and torch threads follow
``device.py`` (``SAILRL_DEVICE``, ``SAILRL_DTYPE``, ``SAILRL_THREADS``). Method names, parameters and
return kinds follow tinker 0.35, inside the range pyproject.toml pins (``tests/backends/test_local_drift.py`` checks them
against the installed SDK): the creation methods return the client itself (they wait for it), their ``*_async``
variants are coroutines returning it, and every client is an instance of its SDK class (``sdk``). The constructor
takes the SDK's arguments too (``user_metadata``, ``project_id``, ``display_name``, ``base_url``, ``api_key``,
``default_headers_overrides``), so a script that builds ``tinker.ServiceClient(base_url=..., user_metadata=...)``
runs with this class in its place. Checkpoints and training-run records live under ``base_dir`` (see
``checkpoints``).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Mapping
from typing import Any

import tinker
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture

from sailrl.runtime.backends.local.backend import LocalBackend
from sailrl.runtime.backends.local.weights.checkpoints import require_kind
from sailrl.runtime.backends.local.weights.device import local_device, local_dtype, thread_count
from sailrl.runtime.backends.local.futures import completed
from sailrl.runtime.backends.local.engine.merged import max_context_of
from sailrl.runtime.backends.local.rest import LocalRestClient
from sailrl.runtime.backends.local.sampling import LocalSamplingClient
from sailrl.runtime.backends.local.sdk import refuse_the_rest
from sailrl.runtime.backends.local.weights.tiny import BaseModelSpec, resolve_base_model
from sailrl.runtime.backends.local.engine.trainer import new_trainer, trainer_from_state
from sailrl.runtime.backends.local.training import LocalTrainingClient
from sailrl.spec.models import TINY_MODEL_NAME


@refuse_the_rest(tinker.ServiceClient)
class LocalServiceClient(tinker.ServiceClient):
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
    - ``user_metadata``, ``project_id``, ``display_name``, ``base_url``, ``api_key``, ``default_headers_overrides``:
      ``tinker.ServiceClient``'s arguments, accepted so a script written for it runs here; there is no server, so
      they are kept (``user_metadata``, ``display_name``) or ignored (the rest). Other keyword arguments are
      ignored with a ``FutureWarning``, as the SDK does. The SDK's first two are positional there; here
      ``model_name`` comes first and they are keyword-only.
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
        user_metadata: dict[str, str] | None = None,
        project_id: str | None = None,
        display_name: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        default_headers_overrides: Mapping[str, str] | None = None,
        **kwargs: Any,
    ):
        if kwargs:
            warnings.warn(
                f"ServiceClient ignores unsupported arguments: {', '.join(sorted(kwargs))}. "
                "Passing them will be an error in a future version of the Tinker SDK.",
                FutureWarning,
                stacklevel=2,
            )
        self.user_metadata = dict(user_metadata) if user_metadata else None
        self.display_name = display_name
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
        user_metadata: dict[str, str] | None,
    ) -> LocalTrainingClient:
        spec = resolve_base_model(base_model, self._backend.seed, self.model_dir)
        lora_seed = self._backend.next_lora_seed() if seed is None else seed
        lora = types.LoraConfig(
            rank=rank, seed=lora_seed, train_mlp=train_mlp, train_attn=train_attn, train_unembed=train_unembed
        )
        if self._backend.trainer_process is not None:
            trainer: Any = self._backend.trainer_process.new_trainer(spec, lora)
        else:
            with self._backend.model_lock:  # the LoRA init seeds torch's global RNG; the sampler may load a base
                trainer = new_trainer(self._backend.bases, spec, lora, self._backend.store, self._backend.device)
        return LocalTrainingClient(self._backend, trainer, spec, lora, user_metadata=user_metadata)

    @staticmethod
    def _check_lora_request(train_mlp: bool, train_attn: bool, train_unembed: bool,
                            optimizer: types.OptimizerConfig | None) -> None:
        if not (train_mlp or train_attn or train_unembed):
            raise ValueError("At least one of train_mlp, train_attn or train_unembed must be True.")
        if optimizer is not None and getattr(optimizer, "type", "adamw") != "adamw":
            raise ValueError("The embedded backend supports only the Adam optimizer.")

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
    ) -> LocalTrainingClient:
        """A ``LocalTrainingClient`` with a fresh LoRA adapter (alpha 32, see ``lora``), a new training run
        (``user_metadata`` recorded on it, see ``LocalRestClient.get_training_run``).

        ``seed=None`` derives the LoRA init seed from the service seed. Raises ``ValueError`` if no
        layer family is chosen or ``optimizer`` is not Adam, ``sources.BaseModelError`` (a ``ModelError``) for a
        model the backend cannot load.
        """
        self._check_lora_request(train_mlp, train_attn, train_unembed, optimizer)
        return self._backend.worker.submit(
            lambda: self._new_lora_client(base_model, rank, seed, train_mlp, train_attn, train_unembed,
                                          user_metadata)
        ).result()

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
        self._check_lora_request(train_mlp, train_attn, train_unembed, optimizer)
        return await self._backend.worker.submit(
            lambda: self._new_lora_client(base_model, rank, seed, train_mlp, train_attn, train_unembed,
                                          user_metadata)
        )

    def _client_from_state(self, path: str, with_optimizer: bool,
                           user_metadata: dict[str, str] | None) -> LocalTrainingClient:
        require_kind(path, "weights", "create_training_client_from_state")
        directory = self._backend.store.existing(path)
        spec = BaseModelSpec.read(directory)
        if self._backend.trainer_process is not None:
            trainer: Any = self._backend.trainer_process.trainer_from_state(spec, path, with_optimizer)
        else:
            trainer = trainer_from_state(self._backend.bases, path, self._backend.store, self._backend.device,
                                         with_optimizer)
        # a client made from a state has made its one load_state request (as on Tinker: create, then load)
        return LocalTrainingClient(self._backend, trainer, spec, trainer.lora, user_metadata=user_metadata,
                                   loaded_from=path)

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> LocalTrainingClient:
        """A new training client (a new training run) with the adapter weights of the ``weights/`` checkpoint at
        ``path``; fresh optimizer. Raises ``checkpoints.CheckpointPathError`` for a bad, missing or
        ``sampler_weights/`` path."""
        return self._backend.worker.submit(lambda: self._client_from_state(path, False, user_metadata)).result()

    async def create_training_client_from_state_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
    ) -> LocalTrainingClient:
        return await self._backend.worker.submit(lambda: self._client_from_state(path, False, user_metadata))

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> LocalTrainingClient:
        """A new training client with the adapter AND AdamW state of ``local://<run>/weights/<name>``;
        training continues exactly as the saved run would have."""
        return self._backend.worker.submit(lambda: self._client_from_state(path, True, user_metadata)).result()

    async def create_training_client_from_state_with_optimizer_async(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> LocalTrainingClient:
        return await self._backend.worker.submit(lambda: self._client_from_state(path, True, user_metadata))

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
    ) -> LocalSamplingClient:
        """A sampler over saved sampler weights (``model_path``, ``local://<run>/sampler_weights/<name>``, or a
        checkpoint directory) or a base model.

        Raises ``ValueError`` if neither is given, ``checkpoints.CheckpointPathError`` for a bad or missing path
        or a ``weights/`` (training-state) one.
        """
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided.")
        return self._backend.sample_worker.submit(lambda: self._sampler(model_path, base_model)).result()

    async def create_sampling_client_async(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> LocalSamplingClient:
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided.")
        return await self._backend.sample_worker.submit(lambda: self._sampler(model_path, base_model))

    # ------------------------------------------------------------------ misc
    def create_rest_client(self) -> LocalRestClient:
        """A ``LocalRestClient`` over this service's checkpoints and training runs (its calls run on the backend's
        I/O worker)."""
        return LocalRestClient(self._backend.io_worker, self._backend.store, self._backend.last_requests)

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

    def get_telemetry(self) -> None:
        """No telemetry: nothing leaves this machine."""
        return None

    def __enter__(self) -> LocalServiceClient:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close("errored" if exc and exc[0] is not None else "success")
