"""Renderer names the spec accepts, and the default renderer for a model.

``KNOWN_RENDERERS`` mirrors the names ``tinker_cookbook.renderers.get_renderer`` (tinker-cookbook 0.5.8)
accepts. It is a static tuple because importing ``tinker_cookbook.renderers`` imports torch (~5 s), which
``sailrl validate`` must not pay; ``tests/test_spec_errors.py`` parses the installed tinker_cookbook source and
fails when the two drift apart.
"""

from __future__ import annotations

from pathlib import Path

KNOWN_RENDERERS: tuple[str, ...] = (
    "role_colon",
    "llama3",
    "qwen3",
    "qwen3_vl",
    "qwen3_vl_instruct",
    "qwen3_disable_thinking",
    "qwen3_instruct",
    "qwen3_5",
    "qwen3_5_disable_thinking",
    "qwen3_5_preserve_thinking",
    "qwen3_8_xhigh_reasoning",
    "qwen3_8_medium_reasoning",
    "qwen3_8_low_reasoning",
    "qwen3_8_disable_thinking",
    "deepseekv3",
    "deepseekv3_disable_thinking",
    "deepseekv3_thinking",
    "deepseekv4_1",
    "deepseekv4_1_low_reasoning",
    "deepseekv4_1_max_reasoning",
    "deepseekv4_1_disable_thinking",
    "deepseekv4_1_preserve_thinking",
    "glm5_3_max_reasoning",
    "glm5_3_low_reasoning",
    "glm5_3_high_reasoning",
    "kimi_k2",
    "kimi_k25",
    "kimi_k25_disable_thinking",
    "kimi_k26",
    "kimi_k26_disable_thinking",
    "kimi_k26_preserve_thinking",
    "nemotron3",
    "nemotron3_low_thinking",
    "nemotron3_disable_thinking",
    "nemotron3_preserve_thinking",
    "nemotron3_ultra",
    "nemotron3_ultra_disable_thinking",
    "nemotron3_ultra_medium_thinking",
    "nemotron3_ultra_preserve_thinking",
    "gpt_oss_no_sysprompt",
    "gpt_oss_low_reasoning",
    "gpt_oss_medium_reasoning",
    "gpt_oss_high_reasoning",
    "tml_v0",
)

# Models the embedded local backend builds itself; they use the plain "User: ... Assistant:" format.
LOCAL_MODELS: tuple[str, ...] = ("sailrl/tiny",)


class UnknownModelError(ValueError):
    """No renderer is known for a model name; the message tells the user to set model.renderer."""


def is_local_model(model_name: str, base_dir: str | Path | None = None) -> bool:
    """True for the embedded backend's built-in models and for local model directories.

    A relative directory is looked up under ``base_dir`` (the spec's folder) and the current folder.
    """
    if model_name in LOCAL_MODELS:
        return True
    p = Path(model_name).expanduser()
    candidates = [p] if p.is_absolute() or base_dir is None else [Path(base_dir) / p, p]
    return any(c.is_dir() for c in candidates)


def default_renderer(model_name: str, base_dir: str | Path | None = None) -> str:
    """The renderer used when a spec does not set ``model.renderer``.

    'sailrl/tiny' and local model directories -> 'role_colon'; other names -> the first renderer
    ``tinker_cookbook.model_info.get_recommended_renderer_name`` recommends (cheap import, no torch).
    Raises UnknownModelError (a ValueError) when tinker_cookbook does not know the model.
    """
    if is_local_model(model_name, base_dir):
        return "role_colon"
    from tinker_cookbook.model_info import get_recommended_renderer_name

    try:
        return get_recommended_renderer_name(model_name)
    except Exception as exc:  # ConfigurationError, KeyError, ValueError from tinker_cookbook's tables
        raise UnknownModelError(
            f"no renderer is known for model '{model_name}'; set model.renderer to one of: "
            + ", ".join(KNOWN_RENDERERS)
        ) from exc
