"""Base models for the embedded backend: the built-in ones, and the others through ``sources``.

``sailrl/tiny`` is a Qwen3-architecture causal LM (``sailrl.spec.models.TINY_CONFIG``: hidden 128, 2 layers,
vocabulary 259 = the byte tokenizer's size, untied input/output embeddings, 0.46 M parameters), randomly
initialised under ``torch.manual_seed(seed)``: reproducible from ``(TINY_CONFIG, seed)`` on the same torch
version, so a checkpoint stores only its LoRA adapter plus ``base_model.json`` (name, seed, config) and the
base is rebuilt on load. Untied embeddings matter: with LoRA on ``lm_head`` a random base can learn an output
format, with a frozen tied unembedding it cannot (``benchmarks/local_backend.md``).

``sailrl/tiny-arith`` is the same architecture with the weights shipped in ``pretrained/tiny_arith.safetensors``
(made by ``pretrained/make_tiny_arith.py``); ``base_model.json`` records their sha256 as ``revision`` and a
checkpoint made on other weights is refused. ``sailrl/tiny-tools`` likewise ships ``pretrained/tiny_tools.safetensors``
(made by ``pretrained/make_tiny_tools.py`` from tiny-arith's weights: it calls the calculator tool about half
the time). ``sailrl/tiny-judge`` (4 layers, its config in ``BUILTIN_MODELS``) ships
``pretrained/tiny_judge.safetensors`` (made by ``pretrained/make_tiny_judge.py``: a judge for one kind of rubric).
Folders, GGUF files and hub ids load through ``sources``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from sailrl.runtime.backends.local.weights.sources import (
    BaseModelError,
    ResolvedModel,
    byte_tokenizer,
    load_model,
    load_tokenizer,
    resolve_model,
)
from sailrl.spec.models import BUILTIN_MODELS, TINY_CONFIG, is_builtin

__all__ = [
    "BASE_MODEL_FILE",
    "PRETRAINED_WEIGHTS",
    "TINY_CONFIG",
    "BaseModelCache",
    "BaseModelError",
    "BaseModelSpec",
    "build_tiny_model",
    "load_base_model",
    "save_pretrained_weights",
    "resolve_base_model",
    "tiny_config",
]

BASE_MODEL_FILE = "base_model.json"
#: Shipped weights of the pretrained built-in models.
PRETRAINED_WEIGHTS: dict[str, Path] = {
    "sailrl/tiny-arith": Path(__file__).parent.parent / "pretrained" / "tiny_arith.safetensors",
    "sailrl/tiny-tools": Path(__file__).parent.parent / "pretrained" / "tiny_tools.safetensors",
    "sailrl/tiny-judge": Path(__file__).parent.parent / "pretrained" / "tiny_judge.safetensors",
}


@dataclass(frozen=True)
class BaseModelSpec:
    """What is needed to rebuild a base model.

    ``model_name``: a built-in name, an absolute folder or ``.gguf`` path, or a hub id. ``seed``: the init seed
    of ``sailrl/tiny``. ``config``: a built-in model's config. ``revision``: the sha256 of shipped weights, or
    the hub commit of a downloaded snapshot (``None`` for folders and files).
    """

    model_name: str
    seed: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    revision: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "seed": self.seed, "config": self.config, "revision": self.revision}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BaseModelSpec:
        return cls(model_name=data["model_name"], seed=data.get("seed"), config=data.get("config") or {},
                   revision=data.get("revision"))

    def write(self, directory: str) -> None:
        with open(os.path.join(directory, BASE_MODEL_FILE), "w") as f:
            json.dump(self.to_json(), f, indent=2, sort_keys=True)

    @classmethod
    def read(cls, directory: str) -> BaseModelSpec:
        with open(os.path.join(directory, BASE_MODEL_FILE)) as f:
            return cls.from_json(json.load(f))


def tiny_config(overrides: dict[str, Any] | None = None) -> Any:
    """The ``transformers.Qwen3Config`` of ``sailrl/tiny`` (``overrides`` replace fields)."""
    values = {**TINY_CONFIG, **(overrides or {})}
    return Qwen3Config(**values)


def build_tiny_model(seed: int, dtype: torch.dtype = torch.float32, config: dict | None = None):
    """Build ``sailrl/tiny`` with weights drawn under ``torch.manual_seed(seed)``.

    The global torch RNG state is restored afterwards. Same seed + same torch version -> identical
    weights. Returns a ``Qwen3ForCausalLM`` in eval mode.
    """
    cfg = tiny_config(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
    return model.to(dtype).eval()


@functools.cache
def weights_sha256(path: Path) -> str:
    """sha256 (hex) of a shipped weights file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pretrained(spec: BaseModelSpec, dtype: torch.dtype):
    path = PRETRAINED_WEIGHTS[spec.model_name]
    if not path.is_file():
        raise BaseModelError(f"the weights of {spec.model_name} are missing from this install ({path}): "
                             "reinstall sailrl")
    if spec.revision is not None and spec.revision != weights_sha256(path):
        raise BaseModelError(
            f"this checkpoint was trained on other weights of {spec.model_name} (sha256 {spec.revision[:12]}..., "
            f"this install ships {weights_sha256(path)[:12]}...): use the sailrl version that made it")
    model = build_tiny_model(0, dtype=torch.float32, config=spec.config or None)
    model.load_state_dict(load_file(str(path)), strict=True)
    return model.to(dtype).eval()


def save_pretrained_weights(model: Any, path: str | os.PathLike, meta: dict[str, str]) -> None:
    """Write a built-in model's weights as shipped (float32 safetensors, ``meta`` -- the recipe's settings and
    measures, as strings -- in the file's metadata); what the ``pretrained/make_tiny_*.py`` recipes end with."""
    state = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata=meta)


def _resolved(spec: BaseModelSpec) -> ResolvedModel:
    return resolve_model(spec.model_name, revision=spec.revision)


def load_base_model(spec: BaseModelSpec, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Build or load the base model described by ``spec`` (see ``resolve_base_model``), in eval mode.

    Raises :class:`BaseModelError` (a ``ModelError``) when it cannot be found or loaded.
    """
    if is_builtin(spec.model_name):
        if BUILTIN_MODELS[spec.model_name].pretrained:
            model = _pretrained(spec, dtype)
        else:
            model = build_tiny_model(spec.seed or 0, dtype=dtype, config=spec.config or None)
        return model.to(device)
    return load_model(_resolved(spec), dtype, device)


def resolve_base_model(model_name: str, seed: int, base_dir: str | os.PathLike | None = None) -> BaseModelSpec:
    """The ``BaseModelSpec`` for a model name: ``sailrl/tiny`` keeps ``seed`` and its config; a pretrained
    built-in model records its weights' sha256; a folder or GGUF file its absolute path; a hub id the commit
    of its snapshot (downloaded here when not cached). Relative paths are looked up under ``base_dir``, then
    the current folder. Raises :class:`BaseModelError` (see ``sources.resolve_model``)."""
    if is_builtin(model_name):
        info = BUILTIN_MODELS[model_name]
        if info.pretrained:
            return BaseModelSpec(model_name, config=dict(info.config),
                                 revision=weights_sha256(PRETRAINED_WEIGHTS[model_name]))
        return BaseModelSpec(model_name=model_name, seed=seed, config=dict(info.config))
    resolved = resolve_model(model_name, base_dir)
    if resolved.kind == "hub":
        return BaseModelSpec(model_name=model_name, revision=resolved.revision)
    return BaseModelSpec(model_name=str(resolved.path))


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
        """The tokenizer of ``spec``'s model (built-in: the byte tokenizer; else ``sources.load_tokenizer``)."""
        key = self._key(spec)
        if key not in self._tokenizers:
            if is_builtin(spec.model_name):
                self._tokenizers[key] = byte_tokenizer()
            else:
                self._tokenizers[key] = load_tokenizer(_resolved(spec))
        return self._tokenizers[key]
