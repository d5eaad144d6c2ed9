"""The learning rate tinker_cookbook recommends for a LoRA on a model it knows, and how far a spec's is from it.

``RECOMMENDED_LORA_LR`` holds ``tinker_cookbook.hyperparam_utils.get_lr(model, is_lora=True)`` for every model whose
hidden size tinker_cookbook 0.5.8 lists (``_KNOWN_HIDDEN_SIZES``) and whose family it has calibrated (Llama, Qwen), so
``sailrl validate`` advises without importing transformers and without the network (``get_lr`` reads a config from
the hub for any other model). ``tests/spec/test_lr_advice.py`` recomputes every value with ``get_lr`` and fails when
tinker_cookbook changes them. ``get_lr`` is calibrated on supervised LoRA fine-tuning ("LoRA Without Regret": 10x
the full fine-tuning rate); RL recipes often run a few times lower.
"""

from __future__ import annotations

#: A learning rate more than this factor above the recommendation gets a warning (W120): a LoRA trained that hot
#: tends to collapse.
FAR_ABOVE = 10.0
#: ... or more than this factor below it. RL runs sit well below get_lr's supervised calibration: tinker_cookbook's
#: own RL recipes use 1e-5 (``recipes/math_rl``) and 4e-5 (``recipes/rl_loop.py``) on 8B models, 28x and 12x below,
#: and the Sail guide 1e-5, so only a rate that low again (the adapter would hardly move) is worth a warning.
FAR_BELOW = 100.0

#: model name -> ``hyperparam_utils.get_lr(model, is_lora=True)`` (tinker_cookbook 0.5.8).
RECOMMENDED_LORA_LR: dict[str, float] = {
    "meta-llama/Llama-3.2-1B": 0.0004908239409722158,
    "meta-llama/Llama-3.2-3B": 0.00035760078614950245,
    "meta-llama/Llama-3.1-8B": 0.0002856415043086949,
    "meta-llama/Llama-3.1-8B-Instruct": 0.0002856415043086949,
    "meta-llama/Llama-3.1-70B": 0.0001662328630957161,
    "meta-llama/Llama-3.3-70B-Instruct": 0.0001662328630957161,
    "Qwen/Qwen3-235B-A22B-Instruct-2507": 0.00047297908091376354,
    "Qwen/Qwen3-30B-A3B-Instruct-2507": 0.0004990818286656736,
    "Qwen/Qwen3-30B-A3B": 0.0004990818286656736,
    "Qwen/Qwen3-30B-A3B-Base": 0.0004990818286656736,
    "Qwen/Qwen3-32B": 0.000464869878799652,
    "Qwen/Qwen3-8B": 0.00047297908091376354,
    "Qwen/Qwen3-8B-Base": 0.00047297908091376354,
    "Qwen/Qwen3-4B-Instruct-2507": 0.0004905250962784578,
    "Qwen/Qwen3-VL-235B-A22B-Instruct": 0.00047297908091376354,
    "Qwen/Qwen3-VL-30B-A3B-Instruct": 0.0004990818286656736,
    "Qwen/Qwen3.5-397B-A17B": 0.00047297908091376354,
    "Qwen/Qwen3.5-35B-A3B": 0.0004990818286656736,
    "Qwen/Qwen3.5-35B-A3B-Base": 0.0004990818286656736,
    "Qwen/Qwen3.5-27B": 0.000464869878799652,
    "Qwen/Qwen3.5-9B": 0.00047297908091376354,
    "Qwen/Qwen3.5-9B-Base": 0.00047297908091376354,
    "Qwen/Qwen3.5-4B": 0.0004905250962784578,
    "Qwen/Qwen3.6-27B": 0.000464869878799652,
    "Qwen/Qwen3.6-35B-A3B": 0.0004990818286656736,
    "Qwen/Qwen3.8-27B": 0.000464869878799652,
}


def recommended_lora_lr(model_name: str) -> float | None:
    """tinker_cookbook's recommended LoRA learning rate for ``model_name`` (a Tinker ``:peft:...`` suffix is
    ignored, as ``get_lr`` does), or None for a model it has no calibrated value for."""
    return RECOMMENDED_LORA_LR.get(model_name.split(":", 1)[0])


def lr_ratio(model_name: str, learning_rate: float) -> tuple[float, float] | None:
    """``(recommended, factor)``: the recommendation and how many times larger or smaller ``learning_rate`` is
    (``factor >= 1``; direction from comparing the two), or None when there is no recommendation."""
    rec = recommended_lora_lr(model_name)
    if rec is None or not learning_rate > 0:
        return None
    return rec, max(rec / learning_rate, learning_rate / rec)


def lr_advice(model_name: str, learning_rate: float) -> str | None:
    """One sentence: where ``learning_rate`` stands against the recommendation, or None without one.

    ``lr_advice("Qwen/Qwen3-8B", 4e-5)`` -> ``"learning_rate 4e-05 is 11.8x below the 4.7e-04 tinker_cookbook
    recommends for a LoRA on Qwen/Qwen3-8B (hyperparam_utils.get_lr)"``.
    """
    found = lr_ratio(model_name, learning_rate)
    if found is None:
        return None
    rec, factor = found
    where = "within 10% of" if factor < 1.1 else f"{factor:.1f}x {'above' if learning_rate > rec else 'below'}"
    return (f"learning_rate {learning_rate:g} is {where} the {rec:.1e} tinker_cookbook recommends for a LoRA on "
            f"{model_name.split(':', 1)[0]} (hyperparam_utils.get_lr)")


def lr_far(model_name: str, learning_rate: float) -> bool:
    """Whether ``learning_rate`` is more than :data:`FAR_ABOVE` times above or :data:`FAR_BELOW` times below the
    recommendation."""
    found = lr_ratio(model_name, learning_rate)
    if found is None:
        return False
    rec, factor = found
    return factor > (FAR_ABOVE if learning_rate > rec else FAR_BELOW)


def far_limit(model_name: str, learning_rate: float) -> float:
    """The factor past which ``learning_rate`` is far on its side of the recommendation (for messages)."""
    found = lr_ratio(model_name, learning_rate)
    return FAR_ABOVE if found is not None and learning_rate > found[0] else FAR_BELOW
