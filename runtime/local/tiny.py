"""Base models for the embedded backend: ``sailrl/tiny`` built from a config, or a local HF dir.

``sailrl/tiny`` is a Qwen3-architecture causal LM (hidden 128, 2 layers, 4 query / 2 key-value
heads of 32, MLP 384, vocabulary 259 = the byte tokenizer's size, untied input/output
embeddings, 0.46 M parameters), randomly initialised under ``torch.manual_seed(seed)``. It is
reproducible from ``(TINY_CONFIG, seed)`` on the same torch version, so a checkpoint stores only
its LoRA adapter plus ``base_model.json`` (name, seed, config) and the base is rebuilt on load.
Untied embeddings matter: with LoRA on ``lm_head`` a random base can learn an output format,
with a frozen tied unembedding it cannot (measured: supervised loss stalls near 3.3 in 300 steps).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from sailrl.runtime.models import TINY_MODEL_NAME, get_tokenizer, is_local_model_dir, is_tiny

BASE_MODEL_FILE = "base_model.json"

TINY_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 259,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 1,
    "pad_token_id": 0,
}


@dataclass(frozen=True)
class BaseModelSpec:
    """What is needed to rebuild a base model: its name, the init seed (``sailrl/tiny``) and config."""

    model_name: str
    seed: int | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "seed": self.seed, "config": self.config}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BaseModelSpec:
        return cls(model_name=data["model_name"], seed=data.get("seed"), config=data.get("config") or {})

    def write(self, directory: str) -> None:
        with open(os.path.join(directory, BASE_MODEL_FILE), "w") as f:
            json.dump(self.to_json(), f, indent=2, sort_keys=True)

    @classmethod
    def read(cls, directory: str) -> BaseModelSpec:
        with open(os.path.join(directory, BASE_MODEL_FILE)) as f:
            return cls.from_json(json.load(f))


def tiny_config(overrides: dict[str, Any] | None = None) -> Any:
    """The ``transformers.Qwen3Config`` of ``sailrl/tiny`` (``overrides`` replace fields)."""
    from transformers import Qwen3Config

    values = {**TINY_CONFIG, **(overrides or {})}
    return Qwen3Config(**values)


def build_tiny_model(seed: int, dtype: torch.dtype = torch.float32, config: dict | None = None):
    """Build ``sailrl/tiny`` with weights drawn under ``torch.manual_seed(seed)``.

    The global torch RNG state is restored afterwards. Same seed + same torch version -> identical
    weights. Returns a ``Qwen3ForCausalLM`` in eval mode.
    """
    from transformers import Qwen3ForCausalLM

    cfg = tiny_config(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
    return model.to(dtype).eval()


class BaseModelError(ValueError):
    """The base model name is neither ``sailrl/tiny`` nor a local model directory."""


def load_base_model(spec: BaseModelSpec, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Build or load the base model described by ``spec`` (see ``resolve_base_model``)."""
    if is_tiny(spec.model_name):
        model = build_tiny_model(spec.seed or 0, dtype=dtype, config=spec.config or None)
    elif is_local_model_dir(spec.model_name):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(spec.model_name, local_files_only=True, dtype=dtype)
        model.eval()
    else:
        raise BaseModelError(
            f"The embedded backend cannot load the model {spec.model_name!r}: it runs "
            f"{TINY_MODEL_NAME!r} or a local Hugging Face model directory (one with config.json). "
            "Use a Tinker API key for hub models, or download the model and give its folder."
        )
    return model.to(device)


def resolve_base_model(model_name: str, seed: int) -> BaseModelSpec:
    """The ``BaseModelSpec`` for a model name: ``sailrl/tiny`` keeps ``seed`` and the config."""
    if is_tiny(model_name):
        return BaseModelSpec(model_name=model_name, seed=seed, config=dict(TINY_CONFIG))
    if is_local_model_dir(model_name):
        return BaseModelSpec(model_name=os.path.abspath(model_name))
    raise BaseModelError(
        f"The embedded backend cannot load the model {model_name!r}: it runs {TINY_MODEL_NAME!r} "
        "or a local Hugging Face model directory (one with config.json). Use a Tinker API key "
        "for hub models, or download the model and give its folder."
    )


class BaseModelCache:
    """Keeps one pristine copy per ``BaseModelSpec``; ``get`` returns a deep copy to modify."""

    def __init__(self, dtype: torch.dtype, device: str):
        self._dtype = dtype
        self._device = device
        self._models: dict[str, Any] = {}
        self._tokenizers: dict[str, Any] = {}

    def _key(self, spec: BaseModelSpec) -> str:
        return json.dumps(spec.to_json(), sort_keys=True)

    def get(self, spec: BaseModelSpec):
        key = self._key(spec)
        if key not in self._models:
            self._models[key] = load_base_model(spec, self._dtype, self._device)
        return copy.deepcopy(self._models[key])

    def tokenizer(self, spec: BaseModelSpec) -> Any:
        if spec.model_name not in self._tokenizers:
            self._tokenizers[spec.model_name] = get_tokenizer(spec.model_name)
        return self._tokenizers[spec.model_name]
