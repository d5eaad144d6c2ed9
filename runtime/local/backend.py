"""Shared state of one ``LocalServiceClient``: worker thread, checkpoint store, base models, samplers."""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import Any

import torch

from sailrl.runtime.local.checkpoints import CheckpointStore
from sailrl.runtime.local.futures import Worker
from sailrl.runtime.local.lora import merge_adapter
from sailrl.runtime.local.sampling import LocalSamplingClient, SampleBatcher
from sailrl.runtime.local.tiny import BaseModelCache, BaseModelSpec


def max_context_of(model: Any) -> int:
    """The model's context window in tokens (``config.max_position_embeddings``, else 2048)."""
    return int(getattr(model.config, "max_position_embeddings", None) or 2048)


class LocalBackend:
    """Everything the local clients share; all model work runs on ``self.worker`` in order."""

    def __init__(
        self,
        base_dir: str,
        device: str,
        dtype: torch.dtype,
        seed: int,
        coalesce_window_s: float = 0.003,
        sampler_cache_size: int = 2,
    ):
        self.worker = Worker()
        self.store = CheckpointStore(base_dir)
        self.bases = BaseModelCache(dtype, device)
        self.device = device
        self.dtype = dtype
        self.seed = seed
        self.sample_generator = torch.Generator().manual_seed(seed)
        self.coalesce_window_s = coalesce_window_s
        self._samplers: OrderedDict[str, LocalSamplingClient] = OrderedDict()
        self._sampler_cache_size = sampler_cache_size
        self._clients_made = 0

    def next_lora_seed(self) -> int:
        """Seed for a LoRA init when the caller gives none: derived from the backend seed."""
        self._clients_made += 1
        return self.seed * 1_000_003 + self._clients_made

    def sampling_client(self, model: Any, spec: BaseModelSpec, model_path: str | None) -> LocalSamplingClient:
        """A sampling client over ``model`` (already merged, eval mode, never trained in place)."""
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        batcher = SampleBatcher(
            self.worker,
            model,
            self.bases.tokenizer(spec),
            max_context_of(model),
            self.sample_generator,
            coalesce_window_s=self.coalesce_window_s,
        )
        return LocalSamplingClient(batcher, self.bases.tokenizer(spec), spec.model_name, model_path)

    def merged_model(self, spec: BaseModelSpec, state: dict[str, torch.Tensor], adapter_config: dict) -> Any:
        """A fresh copy of the base with the adapter merged into its weights (fast decode)."""
        return merge_adapter(self.bases.get(spec), state, adapter_config)

    def sampling_client_from_path(self, model_path: str) -> LocalSamplingClient:
        """Load ``local://...`` (or an adapter directory) and return a sampler; cached per path.

        Raises ``CheckpointPathError`` for a bad or missing path. Runs on the worker thread.
        """
        if model_path in self._samplers:
            self._samplers.move_to_end(model_path)
            return self._samplers[model_path]
        from safetensors.torch import load_file

        directory = model_path if os.path.isdir(model_path) else self.store.existing(model_path)
        spec = BaseModelSpec.read(directory)
        with open(os.path.join(directory, "adapter_config.json")) as f:
            adapter_config = json.load(f)
        state = load_file(os.path.join(directory, "adapter_model.safetensors"))
        client = self.sampling_client(self.merged_model(spec, state, adapter_config), spec, model_path)
        self._samplers[model_path] = client
        while len(self._samplers) > self._sampler_cache_size:
            self._samplers.popitem(last=False)
        return client
