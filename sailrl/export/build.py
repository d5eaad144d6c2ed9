"""Build a run's checkpoint as a PEFT adapter or a merged Hugging Face model, into a folder that appears whole or not
at all.

- A Tinker run (``tinker://`` checkpoint): tinker_cookbook's ``weights.download`` fetches the checkpoint (a sampler
  checkpoint's archive), then ``weights.build_lora_adapter`` converts it to a PEFT adapter keyed as the Hugging Face
  model's modules (what vLLM ``--lora-modules`` / SGLang ``--lora-paths`` load), or ``weights.build_hf_model``
  merges it into the base model's weights. The base model's files come from the Hugging Face cache, or the hub
  (``sailrl.runtime.backends.local.weights.sources.hub_snapshot``: one metadata request with a short timeout).
- An embedded-backend run (``local://`` checkpoint): the adapter files in ``$SAILRL_HOME/checkpoints`` are already
  PEFT's; the base model is read from where the run read it (``base_model.json``: a built-in model, a folder, a GGUF
  file or a hub snapshot). ``merged`` is ``PeftModel.from_pretrained(base, checkpoint).merge_and_unload()``; an
  adapter on a tied output embedding is merged into an untied copy, as the embedded sampler does, so the input
  embedding stays the base's. A built-in base (``sailrl/tiny*``) is not on the hub, so a ``peft`` export carries it
  in ``base/``.

Everything is written to a temporary folder beside the target and renamed into place at the end, so a failure (or
Ctrl-C) leaves no half-written output. An existing folder is replaced only with ``overwrite`` and only when an
earlier export wrote it (its :data:`EXPORT_MARKER`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sailrl.export.runinfo import Checkpoint, ExportError
from sailrl.runtime.backends.backend import local_checkpoint_dir
from sailrl.runtime.rundir.directory import RunFileError, read_run_bytes
from sailrl.spec.models import is_builtin
from sailrl.spec.schema import Spec
from sailrl.spec.version import __version__

FORMATS = ("peft", "merged")
BASE_SUBFOLDER = "base"
#: The file every export leaves in its folder; ``--overwrite`` replaces only a folder that holds it.
EXPORT_MARKER = ".sailrl-export.json"
MARKER_WRITER = "sailrl export"
MARKER_MAX_BYTES = 64 * 1024
ADAPTER_CONFIG_MAX_BYTES = 16 * 2**20


@dataclass
class Built:
    """What a build made. ``base_model``: the base's name (hub id, built-in name or folder); ``base_ref``: where it
    loads from (a built-in's ``<folder>/base``, carried in the export; else the name); ``lora_rank``; ``files``:
    names written (sorted)."""

    base_model: str
    base_ref: str
    lora_rank: int | None
    lora_alpha: float | None = None
    target_modules: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ atomic output


def write_marker(out: Path, ckpt: Checkpoint, fmt: str) -> None:
    """Leave :data:`EXPORT_MARKER` in ``out``: the sign that ``sailrl export`` wrote the folder, which is what
    lets a later ``--overwrite`` replace it."""
    record = {"written_by": MARKER_WRITER, "sailrl_version": __version__, "format": fmt, "checkpoint": ckpt.path,
              "step": ckpt.step}
    (out / EXPORT_MARKER).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def written_by_export(folder: Path) -> bool:
    """Whether ``folder`` holds the marker an export leaves: a regular file (not a link), at most
    :data:`MARKER_MAX_BYTES`, a JSON object whose ``written_by`` is ``sailrl export``."""
    marker = folder / EXPORT_MARKER
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            return False
        fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return False
            raw = f.read(MARKER_MAX_BYTES + 1)
        data = json.loads(raw.decode("utf-8")) if len(raw) <= MARKER_MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("written_by") == MARKER_WRITER


def _has_entries(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is not None
    except OSError:
        return True


def check_target(target: Path, overwrite: bool) -> None:
    """:class:`ExportError` when ``target`` exists and ``overwrite`` is not set, or is set but ``target`` is neither
    a folder an earlier ``sailrl export`` wrote (its :data:`EXPORT_MARKER`) nor empty: ``--overwrite`` deletes the
    folder it replaces, so it replaces only what an export made (never a folder of the user's files, a project,
    the checkpoint store)."""
    if target.exists() or target.is_symlink():
        if not overwrite:
            raise ExportError(f"{target} already exists: pass --overwrite to replace an earlier export, or -o "
                              "another folder")
        if not target.is_dir() or target.is_symlink():
            raise ExportError(f"{target} exists and is not a folder: remove it or pass -o another folder")
        if not written_by_export(target) and _has_entries(target):
            raise ExportError(f"{target} exists and was not written by sailrl export (it has no {EXPORT_MARKER}): "
                              "nothing was replaced; --overwrite replaces only an earlier export, so give -o a "
                              "new folder")


def write_atomically(target: Path, overwrite: bool, fill: Callable[[Path], None]) -> None:
    """Call ``fill(folder)`` on a fresh folder that does not exist yet, beside ``target``, then rename it to
    ``target`` (replacing an existing one only with ``overwrite``). On any failure nothing is left behind."""
    check_target(target, overwrite)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.partial-"))
    except OSError as exc:  # a file where a folder should be, a folder that cannot be made or written
        raise ExportError(f"cannot write {target}: {exc.strerror or exc} ({exc.filename or target.parent}); "
                          "give -o a folder you can write") from None
    try:
        built = staging / "out"
        fill(built)
        if not built.is_dir():
            raise ExportError(f"the export wrote nothing to {built}")  # a build that returned without output
        check_target(target, overwrite)  # again: something may have appeared meanwhile
        if target.exists():
            os.replace(target, staging / "replaced")
        os.replace(built, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------------ embedded backend


def local_checkpoint_directory(ckpt: Checkpoint, have: str) -> str:
    """The folder of the ``local://`` checkpoint ``ckpt`` in the embedded backend's store; :class:`ExportError`
    (ending with ``have``, the checkpoints the run has) when it is gone."""
    # lazy: runtime.backends.local loads torch and transformers (seconds); a bad run or checkpoint is reported first
    from sailrl.runtime.backends.local.weights.checkpoints import CheckpointPathError, CheckpointStore

    store = CheckpointStore(str(local_checkpoint_dir()))
    try:
        directory = store.existing(ckpt.path)
    except CheckpointPathError:
        raise ExportError(
            f"the checkpoint {ckpt.path} is no longer in the embedded backend's store ({store.directory(ckpt.path)}"
            f" is gone: removed by `sailrl clean`, or SAILRL_HOME differs from the run's); {have}") from None
    damage = _local_damage(directory)
    if damage is not None:
        raise ExportError(f"the checkpoint {ckpt.path} is damaged: {damage} (in {directory}; a run killed while it "
                          f"saved leaves one half-written); {have}")
    return directory


def _adapter_config(directory: str) -> Any:
    """``adapter_config.json`` of a checkpoint folder, parsed: read as a regular file of at most
    :data:`ADAPTER_CONFIG_MAX_BYTES` (``RunFileError`` otherwise; ``FileNotFoundError`` when missing)."""
    path = os.path.join(directory, "adapter_config.json")
    raw = read_run_bytes(path, ADAPTER_CONFIG_MAX_BYTES)
    if raw is None:
        raise FileNotFoundError(f"no such file: {path}")
    return json.loads(raw.decode("utf-8"))


def _local_damage(directory: str) -> str | None:
    """What is wrong with the adapter files of the checkpoint in ``directory`` (None: they read): its
    ``adapter_config.json`` is a JSON object and its ``adapter_model.safetensors`` has a whole header and as many
    bytes as the header's tensors need (safetensors' own check on opening; no tensor is read)."""
    from safetensors import SafetensorError, safe_open  # lazy: only a local checkpoint's check needs it

    try:
        data = _adapter_config(directory)
    except (OSError, ValueError, RecursionError, RunFileError) as exc:
        return f"adapter_config.json cannot be read ({exc})"
    if not isinstance(data, dict):
        return "adapter_config.json is not a JSON object"
    weights = os.path.join(directory, "adapter_model.safetensors")
    try:
        if not stat.S_ISREG(os.stat(weights).st_mode):  # a FIFO or a device is never opened
            return "adapter_model.safetensors is not a regular file"
        with safe_open(weights, framework="np"):  # checks the header and that the file holds every tensor's bytes
            pass
    except FileNotFoundError:
        return "adapter_model.safetensors is missing"
    except (OSError, SafetensorError, ValueError) as exc:
        return f"adapter_model.safetensors cannot be read ({exc})"
    return None


def quiet_progress_bars() -> None:
    """No per-file progress bars from transformers and huggingface_hub: an export prints its own lines."""
    # lazy: transformers takes seconds; only an export or sample that loads a model calls this
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging  # lazy: see above

    disable_progress_bars()
    hf_logging.disable_progress_bar()


def _load_local_base(directory: str) -> tuple[Any, Any, Any]:
    """``(BaseModelSpec, model, tokenizer)`` of the base a checkpoint was trained on (float32, CPU)."""
    import torch  # lazy: torch only for the build itself

    # lazy: runtime.backends.local loads torch and transformers (seconds); a bad run or checkpoint is reported first
    from sailrl.runtime.backends.local.weights.sources import BaseModelError
    from sailrl.runtime.backends.local.weights.tiny import BaseModelCache, BaseModelSpec, load_base_model  # lazy: see above

    try:
        spec = BaseModelSpec.read(directory)
    except (OSError, ValueError, KeyError) as exc:
        raise ExportError(f"the checkpoint in {directory} has no readable base_model.json ({exc})") from None
    try:
        model = load_base_model(spec, torch.float32, "cpu")
        tokenizer = BaseModelCache(torch.float32, "cpu").tokenizer(spec)
    except BaseModelError as exc:
        raise ExportError(f"cannot load the base model the run trained on: {exc}") from None
    return spec, model, tokenizer


def _save_tokenizer(spec: Spec, tokenizer: Any, out: Path) -> None:
    """The base's tokenizer files into ``out``: copied from its folder or hub snapshot as they are (tinker_cookbook's
    ``save_tokenizer_and_processor``: a ``save_pretrained`` under transformers 5 rewrites ``tokenizer_class``, which
    vLLM and SGLang then cannot load); for a built-in model or a GGUF file, which have no such files,
    ``tokenizer.save_pretrained``."""
    if not is_builtin(spec.model_name):
        from tinker_cookbook.weights._export import save_tokenizer_and_processor  # lazy: torch

        # lazy: runtime.backends.local loads torch and transformers (seconds); a bad run or checkpoint is reported first
        from sailrl.runtime.backends.local.weights.sources import resolve_model

        resolved = resolve_model(spec.model_name, revision=spec.revision)
        if resolved.kind in ("local_dir", "hub"):
            save_tokenizer_and_processor(str(resolved.path), out, multimodal=False)
            if (out / "tokenizer_config.json").is_file():
                return
    tokenizer.save_pretrained(out)


def _base_name(spec: Spec) -> str:
    """The name a model card and ``adapter_config.json`` give the base: the hub id, the folder, the built-in name."""
    return spec.model_name


def _untie_output_embedding(model: Any, targets: list[str]) -> None:
    """Give the output projection its own weight when the adapter changes it and it shares the input embedding."""
    import torch  # lazy: see _load_local_base

    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    name = next((n for n, m in model.named_modules() if m is out_emb), None)
    if out_emb is None or in_emb is None or name is None or name.split(".")[-1] not in targets:
        return
    if out_emb.weight is in_emb.weight:
        out_emb.weight = torch.nn.Parameter(out_emb.weight.detach().clone(), requires_grad=False)
        model.config.tie_word_embeddings = False
        text_config = getattr(model.config, "get_text_config", None)
        if callable(text_config):
            text_config().tie_word_embeddings = False


def build_local(ckpt: Checkpoint, fmt: str, out: Path, final_target: Path, have: str) -> Built:
    """Write ``ckpt`` (a ``local://`` checkpoint) to the new folder ``out`` as ``fmt``."""
    directory = local_checkpoint_directory(ckpt, have)
    quiet_progress_bars()
    adapter_config = _adapter_config(directory)  # checked by local_checkpoint_directory
    spec, model, tokenizer = _load_local_base(directory)
    builtin = is_builtin(spec.model_name)
    base = _base_name(spec)
    out.mkdir()
    targets = sorted(adapter_config.get("target_modules") or [])
    if fmt == "peft":
        base_ref = f"{final_target.name}/{BASE_SUBFOLDER}" if builtin else base
        shutil.copyfile(os.path.join(directory, "adapter_model.safetensors"), out / "adapter_model.safetensors")
        # the base by a name that stays true when the folder moves: a built-in's name (base/ carries it), a hub
        # id, or the folder or file the run read
        config = {**adapter_config, "base_model_name_or_path": base, "inference_mode": True}
        (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n",
                                                 encoding="utf-8")
        _save_tokenizer(spec, tokenizer, out)
        if builtin:  # not on the hub: the adapter carries its base
            model.save_pretrained(out / BASE_SUBFOLDER)
            tokenizer.save_pretrained(out / BASE_SUBFOLDER)
    else:
        from peft import PeftModel  # lazy: see _load_local_base

        _untie_output_embedding(model, targets)
        merged = PeftModel.from_pretrained(model, directory).merge_and_unload()
        merged.save_pretrained(out)
        _save_tokenizer(spec, tokenizer, out)
        base_ref = base
    return Built(base, base_ref, adapter_config.get("r"), adapter_config.get("lora_alpha"), targets)


# ------------------------------------------------------------------------------------------------ Tinker


def _hub_folder(model_name: str) -> str:
    """The base model's files: a local folder as is, else the Hugging Face cache or the hub (bounded)."""
    # lazy: runtime.backends.local loads torch and transformers (seconds); a bad run or checkpoint is reported first
    from sailrl.runtime.backends.local.weights.sources import BaseModelError, hub_snapshot

    if os.path.isdir(model_name):
        return model_name
    try:
        folder, _ = hub_snapshot(model_name)
    except BaseModelError as exc:
        raise ExportError(f"cannot load the base model the run trained on: {exc}") from None
    return folder


def build_tinker(ckpt: Checkpoint, fmt: str, out: Path, base_model: str, have: str) -> Built:
    """Download ``ckpt`` (a ``tinker://`` checkpoint) with tinker_cookbook and build it into ``out`` as ``fmt``."""
    from tinker_cookbook import weights  # lazy: torch, transformers and the Tinker SDK

    # lazy: tinker_cookbook takes seconds; only a Tinker export needs it
    from tinker_cookbook.exceptions import WeightsDownloadError

    quiet_progress_bars()
    download = Path(tempfile.mkdtemp(dir=out.parent, prefix="tinker-checkpoint-"))
    try:
        try:
            weights.download(tinker_path=ckpt.path, output_dir=str(download))
        except WeightsDownloadError as exc:
            cause = f" ({exc.__cause__})" if exc.__cause__ else ""
            raise ExportError(
                f"cannot download {ckpt.path}: {exc}{cause}. A checkpoint is deleted when its TTL ends "
                f"(training.checkpoint_ttl_s); {have}") from None
        with open(download / "adapter_config.json", encoding="utf-8") as f:
            adapter_config = json.load(f)
        folder = _hub_folder(base_model)
        try:
            if fmt == "peft":
                weights.build_lora_adapter(base_model=folder, adapter_path=str(download), output_path=str(out))
                config_path = out / "adapter_config.json"
                config = json.loads(config_path.read_text(encoding="utf-8"))
                config["base_model_name_or_path"] = base_model  # the hub id serving frameworks resolve
                config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
            else:
                weights.build_hf_model(base_model=folder, adapter_path=str(download), output_path=str(out))
        except (FileNotFoundError, ValueError) as exc:  # WeightsAdapterError is a ValueError subclass
            raise ExportError(f"cannot build {ckpt.path} on {base_model}: {exc}") from None
        targets = sorted(json.loads((out / "adapter_config.json").read_text()).get("target_modules") or []
                         ) if fmt == "peft" else []
        return Built(base_model, base_model, adapter_config.get("r"), adapter_config.get("lora_alpha"), targets)
    finally:
        shutil.rmtree(download, ignore_errors=True)
