"""The PEFT ``adapter_config`` Sail needs with every request that samples a Tinker LoRA checkpoint."""

from __future__ import annotations

from typing import Any

from sailrl.spec.models import lora_family

__all__ = ["TINKER_DEFAULT_LORA_ALPHA", "adapter_config_for", "lora_family"]

#: Tinker's LoRA alpha. Tinker's API takes no alpha (``tinker.types.LoraConfig`` has rank, seed, train_unembed,
#: train_mlp and train_attn only). 32 is the default tinker-cookbook documents (its weights README, "LoRA Rank
#: and Alpha", and ``hyperparam_utils.get_lora_lr_over_full_finetune_lr(..., lora_alpha=32)``). The archive
#: Tinker writes carries its own ``adapter_config.json`` with the real value; pass ``lora_alpha=`` to
#: `adapter_config_for` if it ever differs.
TINKER_DEFAULT_LORA_ALPHA = 32

# Leaf module names (PEFT ``target_modules``) per LoRA family (`sailrl.spec.models.lora_family`). Tinker's
# adapter keys are the Hugging Face parameter names (``tinker_cookbook.weights._adapter`` keeps them, remapping
# only ``unembed_tokens`` -> ``lm_head`` and the 3-D expert tensors ``w1/w3/w2`` -> ``gate_proj/up_proj/
# down_proj``), and its ``_add_peft_weight`` writes the leaf name of each into ``target_modules``.
_STANDARD_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
# DeepSeek-V3 / Kimi-K2 multi-head latent attention (HF DeepseekV3Attention with q_lora_rank set).
_MLA_ATTN = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
_GATED_MLP = ("gate_proj", "up_proj", "down_proj")  # dense MLPs, MoE experts and shared experts alike
_UNEMBED = ("lm_head",)

_MODULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "mla": (_MLA_ATTN, _GATED_MLP),
    "standard": (_STANDARD_ATTN, _GATED_MLP),
}


def adapter_config_for(
    base_model: str,
    lora_rank: int,
    *,
    train_attn: bool,
    train_mlp: bool,
    train_unembed: bool,
    lora_alpha: int | None = None,
) -> dict[str, Any]:
    """The PEFT ``adapter_config.json`` contents for the LoRA Tinker trains on ``base_model``.

    Sail needs it with every request that samples a Tinker checkpoint (``metadata.tinker_adapter_config``).
    Keys and fixed values are those tinker-cookbook writes when it converts a Tinker adapter to PEFT
    (``tinker_cookbook.weights._adapter._build_peft_config``): ``peft_type`` "LORA", ``task_type`` "CAUSAL_LM",
    ``bias`` "none", ``lora_dropout`` 0.0, ``inference_mode`` True, empty rank/alpha patterns.
    ``r`` = ``lora_rank`` (``tinker.types.LoraConfig.rank``); ``lora_alpha`` = `TINKER_DEFAULT_LORA_ALPHA`
    unless given. ``target_modules`` = the sorted leaf module names of the enabled parts: attention
    (``train_attn``), MLP and MoE experts (``train_mlp``) and the unembedding ``lm_head`` (``train_unembed``) --
    the three switches of ``tinker.types.LoraConfig`` -- named per LoRA family (`lora_family`; a model of no
    known family gets the standard Llama/Qwen names). ``base_model_name_or_path`` = ``base_model``.

    Raises ValueError when ``lora_rank`` or ``lora_alpha`` is not a positive integer or every switch is off.
    The result is accepted by ``peft.LoraConfig(**config)``.
    """
    if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank <= 0:
        raise ValueError(f"LoRA rank must be a positive whole number, got {lora_rank!r}.")
    alpha = TINKER_DEFAULT_LORA_ALPHA if lora_alpha is None else lora_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, int) or alpha <= 0:
        raise ValueError(f"LoRA alpha must be a positive whole number, got {lora_alpha!r}.")
    if not (train_attn or train_mlp or train_unembed):
        raise ValueError(
            "The LoRA trains nothing: train_attn, train_mlp and train_unembed are all false. Turn at least one on."
        )
    attn, mlp = _MODULES[lora_family(base_model) or "standard"]
    modules: list[str] = []
    if train_attn:
        modules += attn
    if train_mlp:
        modules += mlp
    if train_unembed:
        modules += _UNEMBED
    return {
        "peft_type": "LORA",
        "auto_mapping": None,
        "base_model_name_or_path": base_model,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "r": lora_rank,
        "rank_pattern": {},
        "alpha_pattern": {},
        "target_modules": sorted(set(modules)),
        "task_type": "CAUSAL_LM",
    }
