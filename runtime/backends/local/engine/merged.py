"""A sampler's own model copy: a checkpoint's adapter merged into its base model, ready to sample.

Used by the in-process sampler (:mod:`sailrl.runtime.backends.local.backend`) and the sampling process
(:mod:`sailrl.runtime.backends.local.processes.sampler_process`) alike.
"""

from __future__ import annotations

import json
import os
from typing import Any

from safetensors.torch import load_file

from sailrl.runtime.backends.local.engine.lora import merge_adapter
from sailrl.runtime.backends.local.weights.tiny import BaseModelSpec

__all__ = ["load_merged", "max_context_of", "prepare_for_sampling"]


def max_context_of(model: Any) -> int:
    """The model's context window in tokens (``config.max_position_embeddings``, else 2048)."""
    return int(getattr(model.config, "max_position_embeddings", None) or 2048)


def prepare_for_sampling(model: Any) -> Any:
    """Eval mode and frozen parameters: what a sampler's own model copy needs. Returns ``model``."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_merged(bases: Any, directory: str) -> tuple[BaseModelSpec, Any]:
    """The base model a checkpoint ``directory`` was trained on with its adapter merged into a fresh copy
    (``lora.merge_adapter``), read from the files a save wrote; ``(spec, model)``. ``bases``: a
    ``BaseModelCache``. Raises ``OSError`` / ``ValueError`` for missing or mismatched files."""
    spec = BaseModelSpec.read(directory)
    with open(os.path.join(directory, "adapter_config.json")) as f:
        adapter_config = json.load(f)
    state = load_file(os.path.join(directory, "adapter_model.safetensors"))
    return spec, merge_adapter(bases.get(spec), state, adapter_config)
