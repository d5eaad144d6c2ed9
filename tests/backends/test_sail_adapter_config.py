"""adapter_config_for: the PEFT config Sail gets for a Tinker LoRA, checked against peft and real module names."""

from __future__ import annotations

import json

import peft
import pytest
import torch
import transformers

from sailrl.runtime.backends.sail import TINKER_DEFAULT_LORA_ALPHA, adapter_config_for, lora_family

ALL_ON = {"train_attn": True, "train_mlp": True, "train_unembed": True}


def test_kimi_k26_rank_32_all_modules() -> None:
    cfg = adapter_config_for("moonshotai/Kimi-K2.6", 32, **ALL_ON)
    assert cfg == {
        "peft_type": "LORA",
        "auto_mapping": None,
        "base_model_name_or_path": "moonshotai/Kimi-K2.6",
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": 32,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "r": 32,
        "rank_pattern": {},
        "alpha_pattern": {},
        "target_modules": [
            "down_proj", "gate_proj", "kv_a_proj_with_mqa", "kv_b_proj", "lm_head", "o_proj", "q_a_proj",
            "q_b_proj", "up_proj",
        ],
        "task_type": "CAUSAL_LM",
    }
    # JSON-serialisable exactly as the SDK sends it (sorted keys, compact separators).
    assert json.loads(json.dumps(cfg, sort_keys=True, separators=(",", ":"))) == cfg


def test_same_keys_as_tinker_cookbook_peft_export() -> None:
    from tinker_cookbook.weights._adapter import _build_peft_config

    ours = adapter_config_for("Qwen/Qwen3-8B", 16, **ALL_ON)
    theirs = _build_peft_config({"r": 16, "lora_alpha": 32}, "Qwen/Qwen3-8B", ours["target_modules"])
    assert ours == theirs


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"train_attn": True, "train_mlp": False, "train_unembed": False}, ["k_proj", "o_proj", "q_proj", "v_proj"]),
        ({"train_attn": False, "train_mlp": True, "train_unembed": False}, ["down_proj", "gate_proj", "up_proj"]),
        ({"train_attn": False, "train_mlp": False, "train_unembed": True}, ["lm_head"]),
    ],
)
def test_switches_select_module_groups(flags: dict[str, bool], expected: list[str]) -> None:
    assert adapter_config_for("meta-llama/Llama-3.1-8B", 8, **flags)["target_modules"] == expected


def test_alpha_override_and_default() -> None:
    assert adapter_config_for("Qwen/Qwen3-8B", 64, **ALL_ON)["lora_alpha"] == TINKER_DEFAULT_LORA_ALPHA == 32
    assert adapter_config_for("Qwen/Qwen3-8B", 64, lora_alpha=64, **ALL_ON)["lora_alpha"] == 64


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lora_rank": 0}, "positive whole number"),
        ({"lora_rank": True}, "positive whole number"),
        ({"lora_alpha": -1}, "LoRA alpha"),
        ({"train_attn": False, "train_mlp": False, "train_unembed": False}, "trains nothing"),
    ],
)
def test_invalid_settings_are_refused(kwargs: dict, message: str) -> None:
    args = {"base_model": "Qwen/Qwen3-8B", "lora_rank": 8, **ALL_ON, **kwargs}
    with pytest.raises(ValueError, match=message):
        adapter_config_for(**args)


def test_families() -> None:
    assert lora_family("moonshotai/Kimi-K2.6") == "mla"
    assert lora_family("deepseek-ai/DeepSeek-V3.1") == "mla"
    assert lora_family("Qwen/Qwen3-30B-A3B") == "standard"
    assert lora_family("sailrl/tiny") == "standard"
    assert lora_family("Qwen/Qwen3.5-35B-A3B") is None  # linear attention: names not known here
    assert adapter_config_for("some/unknown", 4, **ALL_ON)["target_modules"] == [
        "down_proj", "gate_proj", "k_proj", "lm_head", "o_proj", "q_proj", "up_proj", "v_proj",
    ]


@pytest.mark.parametrize("model", ["moonshotai/Kimi-K2.6", "Qwen/Qwen3-8B"])
def test_peft_accepts_the_config(model: str) -> None:
    cfg = adapter_config_for(model, 32, **ALL_ON)
    lora = peft.LoraConfig(**cfg)
    assert lora.peft_type == peft.PeftType.LORA
    assert lora.task_type == peft.TaskType.CAUSAL_LM
    assert lora.r == 32 and lora.lora_alpha == 32
    assert set(lora.target_modules) == set(cfg["target_modules"])
    # And it round-trips through PEFT's own adapter_config.json reader.
    assert peft.LoraConfig.from_peft_type(**cfg).to_dict()["target_modules"] == lora.to_dict()["target_modules"]


def _lora_wrapped_leaves(model: torch.nn.Module, cfg: dict) -> set[str]:
    """Leaf names of the layers PEFT put a LoRA on."""
    wrapped = peft.get_peft_model(model, peft.LoraConfig(**{**cfg, "inference_mode": False}))
    return {name.rsplit(".", 1)[-1] for name, module in wrapped.named_modules() if hasattr(module, "lora_A")}


def test_standard_names_match_a_real_qwen3_model() -> None:
    config = transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config)
    cfg = adapter_config_for("Qwen/Qwen3-8B", 4, **ALL_ON)
    assert _lora_wrapped_leaves(model, cfg) == set(cfg["target_modules"])


def test_mla_names_are_the_linear_layers_of_a_real_deepseek_v3_model() -> None:
    # Kimi K2.x is the DeepSeek-V3 architecture (MLA attention with q_lora_rank, MoE + shared experts).
    # peft.get_peft_model is not used here: with transformers 5 it rewrites MoE targets for the fused expert
    # tensor, which is not the layout Sail serves (per-expert gate/up/down_proj, as Tinker's PEFT export writes).
    config = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
        topk_group=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=8,
        qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(config)
    linear_leaves = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    cfg = adapter_config_for("moonshotai/Kimi-K2.6", 4, **ALL_ON)
    assert linear_leaves == set(cfg["target_modules"])
    attn_only = adapter_config_for("moonshotai/Kimi-K2.6", 4, train_attn=True, train_mlp=False, train_unembed=False)
    attn_leaves = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and ".self_attn." in n}
    assert attn_leaves == set(attn_only["target_modules"])
