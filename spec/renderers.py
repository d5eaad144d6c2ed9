"""Renderer names the spec accepts, and the default renderer for a model.

``COOKBOOK_RENDERERS`` mirrors the names ``tinker_cookbook.renderers.get_renderer`` (tinker-cookbook 0.5.8)
accepts. It is a static tuple because importing ``tinker_cookbook.renderers`` imports torch (~5 s), which
``sailrl validate`` must not pay; ``tests/spec/test_spec_errors.py`` parses the installed tinker_cookbook source and
fails when the two drift apart. ``SAILRL_RENDERERS`` are sailrl's own (``chat_template``: the tokenizer's chat
template, see ``sailrl.runtime.backends.chat_template``; ``role_colon_tools``: role_colon with tool calls, see
``sailrl.runtime.backends.role_colon_tools``). ``KNOWN_RENDERERS`` is both.

The default-renderer rule and the model facts live in ``sailrl.spec.models`` (which imports these names; this
module imports nothing of the model catalogue).
"""

from __future__ import annotations

import re

__all__ = [
    "CHAT_TEMPLATE_RENDERER",
    "COOKBOOK_RENDERERS",
    "KNOWN_RENDERERS",
    "NO_TOOL_CALLS",
    "template_tool_support",
    "ROLE_COLON_TOOLS_RENDERER",
    "SAILRL_RENDERERS",
]

#: sailrl's own renderer over the tokenizer's chat template (``tokenizer.apply_chat_template``).
CHAT_TEMPLATE_RENDERER = "chat_template"
#: sailrl's role_colon with tool calls (``sailrl.runtime.backends.role_colon_tools``), for the built-in models' episodes.
ROLE_COLON_TOOLS_RENDERER = "role_colon_tools"

COOKBOOK_RENDERERS: tuple[str, ...] = (
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
SAILRL_RENDERERS: tuple[str, ...] = (CHAT_TEMPLATE_RENDERER, ROLE_COLON_TOOLS_RENDERER)
#: Renderers that cannot write or read tool calls (an environment with tools refuses them).
NO_TOOL_CALLS: tuple[str, ...] = ("role_colon", "llama3", CHAT_TEMPLATE_RENDERER)
KNOWN_RENDERERS: tuple[str, ...] = COOKBOOK_RENDERERS + SAILRL_RENDERERS


_TOOLS_VARIABLE = re.compile(r"\btools\b")


def template_tool_support(template: str | None) -> str | None:
    """None when a chat template declares tools and writes calls as the ``chat_template`` renderer reads them (it
    reads the ``tools`` variable of ``apply_chat_template(..., tools=...)`` and mentions ``<tool_call>``, the
    Hermes / Qwen convention), else why not, in plain words."""
    if not template:
        return "the tokenizer has no chat template"
    if not _TOOLS_VARIABLE.search(template):
        return "its chat template does not declare tools (it never reads the `tools` variable)"
    if "<tool_call>" not in template:
        return ("its chat template writes tool calls in a format sailrl does not read (only <tool_call> JSON "
                "blocks, the Hermes / Qwen convention)")
    return None
