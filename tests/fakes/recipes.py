"""The seeded recipes that make sailrl's shipped built-in models (``runtime/backends/local/pretrained/make_tiny_*.py``) and the
metadata their weights files carry, for the tests that recompute a shipped model's measures or rerun its recipe."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from safetensors import safe_open

from sailrl.runtime.backends.local.weights.tiny import PRETRAINED_WEIGHTS


def recipe(model_name: str) -> ModuleType:
    """The recipe that makes ``model_name`` (e.g. ``sailrl/tiny-judge`` -> ``make_tiny_judge.py``), imported."""
    weights = PRETRAINED_WEIGHTS[model_name]
    name = "make_" + model_name.removeprefix("sailrl/").replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, weights.with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def weights_metadata(path: Path) -> dict[str, str]:
    """The metadata of a shipped weights file (the recipe's settings and measures)."""
    with safe_open(str(path), "pt") as f:
        return f.metadata()
