"""Choosing and opening a backend: where training runs and where rollouts are sampled.

- ``local``  the embedded backend (``sailrl.runtime.backends.local``): trains and samples in-process; no keys.
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

from sailrl.runtime.backends.tinker_service import other_server, service_client
from sailrl.spec.errors import UserError
from sailrl.spec.files import writable_folder
from sailrl.spec.models import classify
from sailrl.spec.schema import Spec

SAMPLERS = ("sail", "tinker", "local")


class BackendError(UserError, RuntimeError):
    """A backend cannot be opened (missing key, unknown sampler). The message is one plain line."""

    code = "E110"


def required_keys(sampler: str) -> list[str]:
    return {"sail": ["TINKER_API_KEY", "SAIL_API_KEY"], "tinker": ["TINKER_API_KEY"], "local": []}[sampler]


def tinker_key_problem(value: str) -> str | None:
    """Why ``value`` cannot be a ``TINKER_API_KEY``, or None.

    The rule is the tinker SDK's (``tinker.lib._auth_token_provider.ApiKeyAuthProvider``): a key starts with
    ``tml-`` (or ``eyJ``, a JWT credential); any other value makes ``tinker.ServiceClient()`` raise. The key
    itself never appears in the answer.
    """
    if value.startswith(("tml-", "eyJ")):
        return None if value == value.strip() else "it ends with a space or a line break"
    if value.strip().startswith(("tml-", "eyJ")):
        return "it starts with a space or a line break"
    return "a Tinker API key starts with 'tml-'"


def _runs_locally(model_name: str, base_dir: Any) -> bool:
    """A built-in model, a local folder or a GGUF file: the embedded backend runs it without a swap."""
    try:
        return classify(model_name, base_dir).is_local
    except Exception:  # noqa: BLE001 -- a hint only
        return False


def check_keys(sampler: str, spec_path: str | None = None, model_name: str | None = None,
               base_dir: Any = None) -> None:
    """Raise :class:`BackendError` naming the first missing or malformed environment variable, with the
    embedded local backend as the alternative (one line; a key's value is never shown). The alternative swaps in
    ``sailrl/tiny`` only when ``model_name`` (resolved against ``base_dir``) cannot run locally as it is.

    A ``TINKER_API_KEY`` must have the form the tinker SDK accepts (:func:`tinker_key_problem`), unless
    ``TINKER_CREDENTIAL_CMD`` is set (the SDK then asks that command for a credential instead).
    """
    where = spec_path or "SPEC"
    local = f"sailrl run {where} --sampler local"
    if model_name is None or not _runs_locally(model_name, base_dir):
        local += " --set model.name=sailrl/tiny"
    for var in required_keys(sampler):
        value = os.environ.get(var)
        if not value and var == "TINKER_API_KEY" and sampler == "tinker" and other_server():
            continue  # another Tinker server (TINKER_BASE_URL): a placeholder key if it checks none
        if not value:
            raise BackendError(
                f"{var} is not set: the '{sampler}' sampler needs it. Export it, or run on the embedded local "
                f"backend instead: {local}"
            )
        if var == "TINKER_API_KEY" and not os.environ.get("TINKER_CREDENTIAL_CMD"):
            problem = tinker_key_problem(value)
            if problem:
                raise BackendError(
                    f"TINKER_API_KEY does not look like a Tinker API key ({problem}): copy the key from the "
                    f"Tinker console again and export it as TINKER_API_KEY=tml-..., or run on the embedded local "
                    f"backend instead: {local}"
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
    """``$SAILRL_DEVICE`` if set; else the CPU for the built-in models; else CUDA when present; else the CPU
    (``sailrl.runtime.backends.local.weights.device.local_device``)."""
    # lazy: runtime.backends.local imports torch (seconds); `sailrl clean` imports this module for the store folder
    from sailrl.runtime.backends.local.weights.device import local_device as _local_device

    return _local_device(model_name)


def open_backend(spec: Spec, *, sampler: str, checkpoint_dir: Path | None = None,
                 spec_path: str | None = None) -> Backend:
    """Open the backend for ``sampler``. Raises :class:`BackendError` on a missing key.

    checkpoint_dir: the local backend's checkpoint store (default :func:`local_checkpoint_dir`).
    """
    if sampler not in SAMPLERS:
        raise BackendError(f"unknown sampler {sampler!r}: use one of {', '.join(SAMPLERS)}")
    check_keys(sampler, spec_path)
    if sampler == "local":
        # lazy: runtime.backends.local imports torch (seconds); `sailrl clean` imports this module for the store folder
        from sailrl.runtime.backends.local import LocalServiceClient
        from sailrl.runtime.backends.local.weights.sources import check_model_source  # lazy: see above

        # A folder without config.json, a damaged GGUF, an unreachable hub, no chat template, too little memory:
        # a ModelError in one line, before anything is written (a hub model is downloaded here once).
        model_dir = Path(spec_path).parent if spec_path else None
        device = local_device(spec.model.name)
        check_model_source(spec.model.name, spec.model.renderer, base_dir=model_dir, device=device)
        from sailrl.runtime.backends.local.weights.device import use_local_processes  # lazy: see above

        store = writable_folder(checkpoint_dir or local_checkpoint_dir(), "the embedded backend's checkpoint folder",
                                "set SAILRL_HOME to a folder you can write (checkpoints go to "
                                "$SAILRL_HOME/checkpoints)")
        processes = use_local_processes(device, spec.training.max_steps_off_policy)
        return Backend(sampler, LocalServiceClient(spec.model.name, base_dir=store, seed=spec.model.seed,
                                                   device=device, model_dir=model_dir, processes=processes))
    try:
        return Backend(sampler, service_client())
    except Exception as exc:  # e.g. a malformed key: "The api_key must start with the 'tml-' prefix"
        raise BackendError(f"Tinker could not start a client: {exc} (check TINKER_API_KEY / TINKER_BASE_URL)") from exc
