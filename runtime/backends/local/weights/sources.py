"""Where the embedded backend gets a base model that is not built in: a folder, a GGUF file, the hub.

- a local Hugging Face model folder (``save_pretrained`` output, any causal-LM architecture transformers
  loads): ``AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)``;
- a GGUF file (``model.name: path/to/model.gguf``): ``from_pretrained(folder, gguf_file=name)``, which needs the
  optional ``gguf`` package (``pip install 'sailrl[gguf]'``) and dequantises every tensor;
- a hub id: the snapshot in the Hugging Face cache when there is one (offline too), else downloaded with
  ``huggingface_hub.snapshot_download`` after one metadata request with a short timeout, so an unreachable hub
  fails in seconds with a plain message instead of retrying for a minute. The folder then loads as above.

:func:`check_model_source` runs every check that needs no weights (the folder has ``config.json``, the GGUF
file parses, the hub is reachable or the model is cached, the tokenizer has a chat template when the
``chat_template`` renderer is asked for, the weights fit in memory) and raises :class:`BaseModelError` with one
line saying what to do. Call it before a run writes anything.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import struct
import unittest.mock
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import HfApi, constants, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from sailrl.runtime.backends.local.weights.device import local_dtype
from sailrl.spec.errors import ModelError
from sailrl.spec.models import (
    UnknownModelError,
    classify,
    default_renderer,
    has_chat_template,
)
from sailrl.spec.renderers import CHAT_TEMPLATE_RENDERER

__all__ = [
    "COPIES_HELD",
    "BaseModelError",
    "HUB_TIMEOUT_S",
    "ResolvedModel",
    "available_memory",
    "byte_tokenizer",
    "check_memory",
    "check_model_source",
    "check_parameters",
    "dtype_size",
    "gguf_reader",
    "hub_snapshot",
    "load_model",
    "load_tokenizer",
    "missing_gguf",
    "parameter_count",
    "require_gguf",
    "resolve_model",
]

#: Seconds the metadata request to the hub may take before sailrl gives up (HF_HUB_ETAG_TIMEOUT overrides).
HUB_TIMEOUT_S = 5.0
#: Copies of the base weights the embedded backend holds at once: the pristine base, the model being trained
#: and the merged weights of up to two sampler checkpoints.
COPIES_HELD = 4
GGUF_INSTALL = "pip install 'sailrl[gguf]' (or: pip install gguf)"
_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "tokenizer*"]


class BaseModelError(ModelError):
    """A base model cannot be found, read or loaded by the embedded backend (a ``ValueError``)."""

    code = "E150"


@dataclass(frozen=True)
class ResolvedModel:
    """A model name made concrete. ``kind``: builtin | local_dir | gguf | hub. ``path``: the folder to load
    (local_dir, hub snapshot) or the ``.gguf`` file. ``revision``: the hub commit of a snapshot."""

    name: str
    kind: str
    path: str | None = None
    revision: str | None = None

    @property
    def folder(self) -> str | None:
        """The folder ``from_pretrained`` is given (a GGUF file's parent folder)."""
        if self.path is None:
            return None
        return os.path.dirname(self.path) if self.kind == "gguf" else self.path


# ------------------------------------------------------------------------------------------------ GGUF


def missing_gguf(path: str | os.PathLike) -> BaseModelError:
    """The one-line error for a GGUF file that is not there (``path``: where it was looked up first)."""
    return BaseModelError(f"no GGUF file at {path}: check model.name (a path to a .gguf file; a relative path is "
                          "looked up in the spec's folder, then in the current folder)")


def require_gguf() -> None:
    """Raise :class:`BaseModelError` with the install command when the ``gguf`` package is missing."""
    if importlib.util.find_spec("gguf") is None:
        raise BaseModelError(f"reading a GGUF file needs the optional gguf package: {GGUF_INSTALL}")


def gguf_reader(path: str) -> Any:
    """A ``gguf.GGUFReader`` over ``path``; :class:`BaseModelError` when it is missing, not GGUF or damaged."""
    require_gguf()
    if not os.path.isfile(path):
        raise missing_gguf(path)
    from gguf import GGUFReader  # lazy: gguf is an optional extra (sailrl[gguf])

    try:
        return GGUFReader(path)
    except Exception as exc:  # noqa: BLE001 -- ValueError / struct.error / OverflowError on a damaged file
        raise BaseModelError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc}); download it "
                         "again or point model.name at another file") from None


def _gguf_value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


# ------------------------------------------------------------------------------------------------ hub


def _hub_error(name: str, why: str) -> BaseModelError:
    from huggingface_hub import constants  # lazy: huggingface_hub only for hub models

    offline = "" if constants.HF_HUB_OFFLINE else (
        ", or set HF_HUB_OFFLINE=1 to use only what is already in the Hugging Face cache")
    return BaseModelError(
        f"cannot load the model '{name}' from the Hugging Face hub ({why}): download it where the hub is "
        f"reachable and set model.name to its folder{offline}"
    )


def _hub_parameter_count(api: Any, name: str, revision: str, timeout: float) -> int | None:
    """Parameters of a hub model from its safetensors headers (``HfApi.get_safetensors_metadata``: a few range
    requests, no weights), or None when the repository has none or the request fails."""
    try:
        meta = api.get_safetensors_metadata(name, revision=revision)
        return int(sum(meta.parameter_count.values()))
    except Exception:  # noqa: BLE001 -- no safetensors / old hub: the memory check is skipped
        return None


def hub_snapshot(name: str, revision: str | None = None,
                 before_download: Callable[[int | None], None] | None = None) -> tuple[str, str]:
    """``(folder, commit)`` of a hub model's snapshot: the cached one when present, else downloaded.

    Only configs, tokenizer files and safetensors weights are fetched (``*.bin`` when the repository has no
    safetensors). ``before_download(parameter_count or None)`` runs before anything is downloaded (a memory
    check raises there). Raises :class:`BaseModelError` in one line, within about :data:`HUB_TIMEOUT_S`
    seconds, when the model is not cached and the hub is offline (``HF_HUB_OFFLINE``), unreachable or does not
    have it.
    """
    try:
        folder = snapshot_download(name, revision=revision, local_files_only=True, allow_patterns=_HUB_FILES)
        if os.path.isfile(os.path.join(folder, "config.json")):
            return folder, os.path.basename(folder.rstrip("/"))
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass

    if constants.HF_HUB_OFFLINE:
        raise _hub_error(name, "it is not in the Hugging Face cache and HF_HUB_OFFLINE is set")
    timeout = float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or HUB_TIMEOUT_S)
    api = HfApi()
    try:
        info = api.model_info(name, revision=revision, timeout=timeout, files_metadata=False)
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise _hub_error(name, f"the hub has no model of that name you can read: {type(exc).__name__}") from None
    except RevisionNotFoundError:
        raise _hub_error(name, f"it has no revision {revision!r}") from None
    except HfHubHTTPError as exc:
        raise _hub_error(name, f"the hub answered {exc.response.status_code if exc.response is not None else '?'}"
                         ) from None
    except Exception as exc:  # noqa: BLE001 -- connection refused / timeout / DNS: the hub is unreachable
        raise _hub_error(name, f"the hub at {constants.ENDPOINT} is unreachable: {type(exc).__name__}") from None
    files = [s.rfilename for s in (info.siblings or [])]
    patterns = list(_HUB_FILES) + ([] if any(f.endswith(".safetensors") for f in files) else ["*.bin"])
    if before_download is not None:
        before_download(_hub_parameter_count(api, name, str(info.sha), timeout))
    try:
        folder = snapshot_download(name, revision=info.sha, allow_patterns=patterns, etag_timeout=timeout)
    except Exception as exc:  # noqa: BLE001 -- a download that broke off
        raise _hub_error(name, f"the download failed: {type(exc).__name__}: {exc}") from None
    return folder, str(info.sha)


# ------------------------------------------------------------------------------------------------ resolving


def resolve_model(model_name: str, base_dir: str | os.PathLike | None = None, revision: str | None = None,
                  before_download: Callable[[int | None], None] | None = None) -> ResolvedModel:
    """Classify ``model_name`` (see ``sailrl.spec.models.classify``) and find its files.

    A folder must hold ``config.json``; a GGUF file must exist; a hub id is found in the cache or downloaded
    (:func:`hub_snapshot`, which calls ``before_download``). Raises :class:`BaseModelError` otherwise.
    """
    source = classify(model_name, base_dir)
    if source.kind == "builtin":
        return ResolvedModel(model_name, "builtin")
    if source.kind == "local_dir":
        path = str(source.path)
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise BaseModelError(f"the folder {path} has no config.json, so it is not a Hugging Face model folder: "
                             "point model.name at the folder save_pretrained wrote (or at a .gguf file)")
        return ResolvedModel(model_name, "local_dir", path)
    if source.kind == "gguf":
        path = str(source.path)
        require_gguf()
        if not os.path.isfile(path):
            raise missing_gguf(path)
        return ResolvedModel(model_name, "gguf", path)
    if model_name.startswith((".", "/", "~")) or model_name.count("/") > 1:
        raise BaseModelError(f"model.name '{model_name}' looks like a path but there is no folder there")
    folder, commit = hub_snapshot(model_name, revision, before_download)
    return ResolvedModel(model_name, "hub", folder, commit)


# ------------------------------------------------------------------------------------------------ memory


def dtype_size(dtype: Any) -> int:
    """Bytes per element of a torch dtype (``torch.float32`` -> 4)."""
    return torch.empty((), dtype=dtype).element_size()


def _safetensors_numel(path: str) -> int:
    """Elements in a .safetensors file, read from its JSON header (no tensor is loaded)."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > 100_000_000:
            raise ValueError("header too large")
        header = json.loads(f.read(size))
    total = 0
    for key, value in header.items():
        if key != "__metadata__":
            n = 1
            for d in value["shape"]:
                n *= int(d)
            total += n
    return total


def parameter_count(resolved: ResolvedModel) -> int | None:
    """Parameters of the model's weights from file headers (safetensors headers, GGUF tensor shapes);
    ``None`` when only pickled weights (``*.bin``) are there."""
    if resolved.kind == "builtin":
        return None  # 0.46 M parameters: always fits
    if resolved.kind == "gguf":
        reader = gguf_reader(str(resolved.path))
        return int(sum(int(t.n_elements) for t in reader.tensors))
    folder = Path(str(resolved.path))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    try:
        return sum(_safetensors_numel(str(f)) for f in files)
    except (OSError, ValueError, KeyError, struct.error):
        return None


def available_memory(device: str) -> int | None:
    """Free bytes on ``device``: ``torch.cuda.mem_get_info`` on CUDA, ``MemAvailable`` (psutil) on the CPU."""
    if device.startswith("cuda"):
        try:
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except Exception:  # noqa: BLE001 -- no CUDA here: the device check reports that
            return None
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001
        return None


def check_memory(resolved: ResolvedModel, device: str, dtype: Any) -> None:
    """Raise :class:`BaseModelError` when ``COPIES_HELD`` copies of the weights in ``dtype`` exceed the free memory
    of ``device`` (parameters x bytes per parameter x copies, against :func:`available_memory`)."""
    check_parameters(resolved.name, parameter_count(resolved), device, dtype)


def check_parameters(name: str, params: int | None, device: str, dtype: Any) -> None:
    """:func:`check_memory` for a known parameter count (``None``: nothing to check)."""
    free = available_memory(device)
    if params is None or free is None:
        return
    need = params * dtype_size(dtype) * COPIES_HELD
    if need > free:
        raise BaseModelError(
            f"the model '{name}' does not fit in memory: {params / 1e6:.1f} M parameters x "
            f"{dtype_size(dtype)} bytes x {COPIES_HELD} copies the embedded backend holds = {need / 2**30:.1f} GiB, "
            f"but {device} has {free / 2**30:.1f} GiB free; use a smaller model, a GPU (SAILRL_DEVICE=cuda), or "
            "train it on Tinker"
        )


# ------------------------------------------------------------------------------------------------ loading


@functools.cache
def byte_tokenizer() -> Any:
    """The built-in models' tokenizer: ``ByT5Tokenizer(extra_ids=0)`` (259 ids, EOS id 1), built once."""
    from transformers import ByT5Tokenizer  # lazy: transformers takes seconds; only a tokenizer's user pays it

    return ByT5Tokenizer(extra_ids=0)


def load_tokenizer(resolved: ResolvedModel) -> Any:
    """The tokenizer of a folder, hub snapshot or GGUF file (``AutoTokenizer``, local files only).

    For a GGUF file the EOS token is the file's ``tokenizer.ggml.eos_token_id`` (transformers' conversion can
    report another). Raises :class:`BaseModelError` when no tokenizer can be built.
    """
    try:
        if resolved.kind == "gguf":
            require_gguf()
            tok = AutoTokenizer.from_pretrained(resolved.folder, gguf_file=os.path.basename(str(resolved.path)))
            eos = _gguf_value(gguf_reader(str(resolved.path)), "tokenizer.ggml.eos_token_id")
            if eos is not None and tok.eos_token_id != int(eos):
                tok.eos_token = tok.convert_ids_to_tokens(int(eos))
            return tok
        return AutoTokenizer.from_pretrained(resolved.folder, local_files_only=True)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 -- OSError, ValueError, KeyError from the tokenizer classes
        raise BaseModelError(f"cannot build the tokenizer of '{resolved.name}' from {resolved.path} "
                         f"({type(exc).__name__}: {exc})") from None


@contextlib.contextmanager
def no_gguf_progress_bar() -> Iterator[None]:
    """transformers' "Converting and de-quantizing GGUF tensors..." progress bar (a tqdm over the tensors, redrawn
    on stderr every run) left out of the logs; everything else transformers prints still shows."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils  # lazy: transformers only when loading

    if not hasattr(gguf_utils, "tqdm"):
        yield
        return
    with unittest.mock.patch.object(gguf_utils, "tqdm", lambda iterable, *args, **kwargs: iterable):
        yield


def load_model(resolved: ResolvedModel, dtype: Any, device: str) -> Any:
    """``AutoModelForCausalLM.from_pretrained`` of a folder, hub snapshot or GGUF file, in eval mode on
    ``device``. Raises :class:`BaseModelError` when transformers cannot build it."""
    try:
        if resolved.kind == "gguf":
            require_gguf()
            with no_gguf_progress_bar():
                model = AutoModelForCausalLM.from_pretrained(
                    resolved.folder, gguf_file=os.path.basename(str(resolved.path)), dtype=dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(resolved.folder, local_files_only=True, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 -- unknown architecture, missing weights, damaged files
        raise BaseModelError(f"transformers cannot load '{resolved.name}' from {resolved.path} as a causal LM "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    return model.to(device).eval()


def _template_in(resolved: ResolvedModel) -> bool:
    if resolved.kind == "gguf":
        return bool(_gguf_value(gguf_reader(str(resolved.path)), "tokenizer.chat_template"))
    return has_chat_template(str(resolved.path))


def check_model_source(model_name: str, renderer: str | None = None, *, base_dir: str | os.PathLike | None = None,
                       device: str = "cpu", dtype: Any = None) -> ResolvedModel:
    """Every check of a base model that needs no weights; returns the :class:`ResolvedModel`.

    ``renderer``: the spec's ``model.renderer`` (``None`` means the default, which for a folder or GGUF file is
    ``chat_template``). ``dtype``: default ``device.local_dtype(device)``. Raises :class:`BaseModelError` (one
    line): a folder without ``config.json``, a missing, damaged or unreadable GGUF file (or no ``gguf`` package),
    a hub model neither cached nor reachable, a ``chat_template`` renderer for a tokenizer without a chat
    template, weights larger than free memory. A hub model not yet cached is downloaded here.
    """
    dtype = dtype or local_dtype(device)
    resolved = resolve_model(model_name, base_dir,
                             before_download=lambda params: check_parameters(model_name, params, device, dtype))
    if resolved.kind == "gguf":
        gguf_reader(str(resolved.path))  # parses the header and tensor table: a damaged file fails here
    if renderer is None and resolved.kind == "hub":
        try:  # the snapshot is cached now: the default sees its tokenizer (sailrl.spec.models.default_renderer)
            renderer = default_renderer(model_name, base_dir, embedded=True)
        except UnknownModelError as exc:
            raise BaseModelError(str(exc)) from None
    if resolved.kind != "builtin" and renderer in (None, CHAT_TEMPLATE_RENDERER) and not _template_in(resolved):
        raise BaseModelError(f"the tokenizer of '{model_name}' has no chat template, so the chat_template renderer "
                         "cannot build prompts: set model.renderer (role_colon works with any tokenizer)")
    check_memory(resolved, device, dtype)
    return resolved
