"""LoRA adapters for the embedded backend (peft), mirroring Tinker's ``LoraConfig``.

``train_attn`` / ``train_mlp`` / ``train_unembed`` select the linear layers that get an adapter:
attention projections (modules under a path containing ``attn``/``attention``), MLP projections
(under ``mlp``/``feed_forward``/``ffn``), and the output embedding (``lm_head``). Linear layers are
``torch.nn.Linear`` and transformers' ``Conv1D`` (GPT-2 style, weight stored transposed: the adapter is
then created with ``fan_in_fan_out=True``). ``lora_alpha`` is
fixed at 32 -- the value tinker-cookbook's ``hyperparam_utils.get_lora_lr_over_full_finetune_lr``
assumes for Tinker -- so the adapter scale is ``32 / rank``. No dropout. peft's default init:
``A`` Kaiming-uniform (drawn under ``torch.manual_seed(seed)``), ``B`` zeros, so a fresh adapter
leaves the base model unchanged.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from transformers.pytorch_utils import Conv1D

LORA_ALPHA = 32
_ATTN_WORDS = ("attn", "attention")
_MLP_WORDS = ("mlp", "feed_forward", "ffn")


def _linear_types() -> tuple[type, ...]:
    return (torch.nn.Linear, Conv1D)


def _has_conv1d(model: Any, targets: list[str]) -> bool:
    return any(isinstance(m, Conv1D) and n.split(".")[-1] in targets for n, m in model.named_modules())


def lora_target_modules(model: Any, *, train_mlp: bool, train_attn: bool, train_unembed: bool) -> list[str]:
    """Module-name suffixes (as peft ``target_modules``) for the chosen layer families.

    Raises ``ValueError`` if no family is chosen or the model has no matching linear layer.
    """
    if not (train_mlp or train_attn or train_unembed):
        raise ValueError("At least one of train_mlp, train_attn or train_unembed must be True.")
    out_emb = model.get_output_embeddings()
    targets: set[str] = set()
    for name, module in model.named_modules():
        if not isinstance(module, _linear_types()):
            continue
        parts = name.split(".")
        if module is out_emb:
            if train_unembed:
                targets.add(parts[-1])
            continue
        path = [p.lower() for p in parts[:-1]]
        if (
            train_attn
            and any(w in p for p in path for w in _ATTN_WORDS)
            or train_mlp
            and any(w in p for p in path for w in _MLP_WORDS)
        ):
            targets.add(parts[-1])
    if not targets:
        raise ValueError("The model has no linear layers of the chosen kinds to put LoRA adapters on.")
    return sorted(targets)


#: peft's warning about LoRA on a tied lm_head / embedding, printed on every run of a model with tied embeddings
#: (SmolLM2): it is about merging an adapter into other formats, which sailrl does not do, so it is not shown.
TIED_EMBEDDINGS_WARNING = r".*tie_word_embeddings=True.*"


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """Run a peft call without its tied-embeddings warning (:data:`TIED_EMBEDDINGS_WARNING`); other warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TIED_EMBEDDINGS_WARNING)
        yield


def attach_lora(
    base: Any, *, rank: int, seed: int, train_mlp: bool, train_attn: bool, train_unembed: bool
) -> Any:
    """Wrap ``base`` in a ``peft.PeftModel`` with a fresh LoRA adapter of ``rank`` (seeded init)."""
    # lazy: peft takes seconds past transformers; only a process that trains pays it
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise ValueError(f"LoRA rank must be at least 1, got {rank}.")
    targets = lora_target_modules(base, train_mlp=train_mlp, train_attn=train_attn, train_unembed=train_unembed)
    config = LoraConfig(
        r=rank,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=targets,
        fan_in_fan_out=_has_conv1d(base, targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]), quiet_peft():
        torch.manual_seed(seed)
        return get_peft_model(base, config)


def adapter_state(peft_model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors, keyed as in ``adapter_model.safetensors`` (detached copies)."""
    # lazy: peft takes seconds past transformers; only a process that trains pays it
    from peft import get_peft_model_state_dict

    return {
        k: v.detach().clone()
        for k, v in get_peft_model_state_dict(peft_model, save_embedding_layers=False).items()
    }


def merge_adapter(base: Any, state: dict[str, torch.Tensor], adapter_config: dict[str, Any]) -> Any:
    """Add each adapter's ``(lora_alpha / r) * B @ A`` to ``base``'s weights in place; return ``base``.

    ``state`` uses peft's saved keys (``base_model.model.<module>.lora_A.weight``);
    ``adapter_config`` is the content of ``adapter_config.json``. The result equals
    ``PeftModel.from_pretrained(base, dir).merge_and_unload()`` for the adapters this backend
    writes (plain LoRA, no rank/alpha patterns, no rsLoRA, no DoRA); others raise ``ValueError``.
    An adapter on a tied output embedding unties it first, so the input embedding stays the base's.
    """
    if adapter_config.get("use_rslora") or adapter_config.get("use_dora"):
        raise ValueError("Only plain LoRA adapters can be merged (no rsLoRA / DoRA).")
    if adapter_config.get("rank_pattern") or adapter_config.get("alpha_pattern"):
        raise ValueError("Only adapters with one rank and one alpha can be merged.")

    scale = float(adapter_config["lora_alpha"]) / float(adapter_config["r"])
    modules = dict(base.named_modules())
    out_emb, in_emb = base.get_output_embeddings(), base.get_input_embeddings()
    prefix = "base_model.model."
    with torch.no_grad():
        for key, a in state.items():
            if not key.endswith(".lora_A.weight"):
                continue
            name = key[len(prefix) : -len(".lora_A.weight")] if key.startswith(prefix) else key
            b = state[key.replace(".lora_A.", ".lora_B.")]
            module = modules.get(name)
            if module is None:
                raise ValueError(f"The adapter targets {name!r}, which the base model does not have.")
            delta = (b.to(torch.float32) @ a.to(torch.float32)) * scale
            if module is out_emb and in_emb is not None and module.weight is in_emb.weight:
                # tied embeddings: the adapter changes the output projection only, so untie before adding
                module.weight = torch.nn.Parameter(module.weight.detach().clone(), requires_grad=False)
            if isinstance(module, Conv1D):  # weight stored (in, out): peft's fan_in_fan_out layers
                delta = delta.T
            module.weight += delta.to(module.weight.dtype)
    return base
