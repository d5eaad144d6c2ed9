"""Choosing and opening a backend: where training runs and where rollouts are sampled.

- ``local``  the embedded backend (``sailrl.runtime.local``): trains and samples in-process; no keys.
- ``tinker`` Tinker trains; Tinker's own sampling client samples (``TINKER_API_KEY``).
- ``sail``   Tinker trains; every rollout is sampled on Sail from the sampler checkpoint just written
             (``TINKER_API_KEY`` and ``SAIL_API_KEY``), as in the Sail guide.

API keys are read from the environment at run time only; nothing here writes them anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sailrl.spec.schema import Spec

SAMPLERS = ("sail", "tinker", "local")


class BackendError(RuntimeError):
    """A backend cannot be opened (missing key, unknown sampler). The message is one plain line."""


def required_keys(sampler: str) -> list[str]:
    return {"sail": ["TINKER_API_KEY", "SAIL_API_KEY"], "tinker": ["TINKER_API_KEY"], "local": []}[sampler]


def check_keys(sampler: str, spec_path: str | None = None) -> None:
    """Raise :class:`BackendError` naming the first missing environment variable and the local alternative."""
    for var in required_keys(sampler):
        if not os.environ.get(var):
            where = spec_path or "SPEC"
            raise BackendError(
                f"{var} is not set: the '{sampler}' sampler needs it. Export it, or run on the embedded local "
                f"backend instead: sailrl run {where} --sampler local --set model.name=sailrl/tiny"
            )


@dataclass
class Backend:
    """What the loop needs from a backend.

    sampler: the sampler name. service_client: a ``tinker.ServiceClient`` or the local stand-in.
    """

    sampler: str
    service_client: Any

    @property
    def is_local(self) -> bool:
        return self.sampler == "local"


def local_checkpoint_dir() -> Path:
    """Where the embedded backend keeps ``local://`` checkpoints: ``$SAILRL_HOME/checkpoints``.

    One store for every run (``SAILRL_HOME`` defaults to ``~/.cache/sailrl``), as Tinker keeps one store for
    ``tinker://`` paths: a path printed by one run can be given to another as ``training.init_from``.
    """
    home = os.environ.get("SAILRL_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "sailrl")
    return Path(home) / "checkpoints"


def local_device(model_name: str) -> str:
    """``$SAILRL_DEVICE`` if set; else CUDA for a local Hugging Face model when a GPU is present; else CPU.

    The built-in ``sailrl/tiny`` stays on the CPU by default: at its size a GPU only adds transfer overhead.
    """
    if os.environ.get("SAILRL_DEVICE"):
        return os.environ["SAILRL_DEVICE"]
    if model_name == "sailrl/tiny":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def open_backend(spec: Spec, *, sampler: str, checkpoint_dir: Path | None = None,
                 spec_path: str | None = None) -> Backend:
    """Open the backend for ``sampler``. Raises :class:`BackendError` on a missing key.

    checkpoint_dir: the local backend's checkpoint store (default :func:`local_checkpoint_dir`).
    """
    if sampler not in SAMPLERS:
        raise BackendError(f"unknown sampler {sampler!r}: use one of {', '.join(SAMPLERS)}")
    check_keys(sampler, spec_path)
    if sampler == "local":
        from sailrl.runtime.local import LocalServiceClient

        name = spec.model.name
        if name != "sailrl/tiny" and not Path(name).is_dir():
            raise BackendError(
                f"the local backend runs 'sailrl/tiny' or a local Hugging Face model directory, not {name!r} "
                f"(a hub/Tinker model): add --set model.name=sailrl/tiny, or point model.name at a downloaded model"
            )

        store = checkpoint_dir or local_checkpoint_dir()
        return Backend(sampler, LocalServiceClient(spec.model.name, base_dir=store, seed=spec.model.seed,
                                                   device=local_device(spec.model.name)))
    import tinker

    try:
        return Backend(sampler, tinker.ServiceClient())
    except Exception as exc:  # e.g. a malformed key: "The api_key must start with the 'tml-' prefix"
        raise BackendError(f"Tinker could not start a client: {exc} (check TINKER_API_KEY / TINKER_BASE_URL)") from exc
