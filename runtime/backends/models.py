"""Tokenizer and renderer for a model name (the model facts themselves are in ``sailrl.spec.models``).

The built-in models (``sailrl/tiny``, ``sailrl/tiny-arith``) use a byte-level tokenizer,
``transformers.ByT5Tokenizer(extra_ids=0)``: 259 ids (0 pad, 1 ``</s>`` = EOS, 2 unk, 3..258 the bytes
0..255), built in code with no vocabulary files and no download. Their renderer is tinker-cookbook's
``role_colon`` (``"User: ...\\n\\nAssistant:"``, stop sequence ``"\\n\\nUser:"``).

A local folder (a Hugging Face model saved with ``save_pretrained``) loads its tokenizer with
``AutoTokenizer.from_pretrained(path, local_files_only=True)``, a ``.gguf`` file with ``gguf_file=``. Any other
name goes to ``tinker_cookbook.tokenizer_utils.get_tokenizer`` (the Hugging Face hub, as Tinker itself does).
The renderer ``chat_template`` is sailrl's :class:`~sailrl.runtime.backends.chat_template.ChatTemplateRenderer`; every
other name is tinker-cookbook's.
"""

from __future__ import annotations

import os
from typing import Any

from sailrl.spec.models import (
    UnknownModelError,
    classify,
    default_renderer,
    is_builtin,
)
from sailrl.spec.renderers import CHAT_TEMPLATE_RENDERER, ROLE_COLON_TOOLS_RENDERER

__all__ = ["default_renderer_name", "get_renderer", "get_tokenizer"]


def get_tokenizer(model_name: str, base_dir: str | os.PathLike | None = None) -> Any:
    """Return the tokenizer for ``model_name``.

    - a built-in model -> ``ByT5Tokenizer(extra_ids=0)`` (cached; 259 ids, EOS id 1);
    - a local folder or ``.gguf`` file (relative paths under ``base_dir``, then the current folder) ->
      ``AutoTokenizer`` from its files (``sources.load_tokenizer``; raises ``ModelError``);
    - anything else -> ``tinker_cookbook.tokenizer_utils.get_tokenizer(model_name)`` (may download; raises
      ``OSError`` from transformers when a hub name cannot be loaded, e.g. offline).
    """
    # Judge clients import this module when validate and the studio start, and call it only when a local judge judges.
    # lazy: tinker_cookbook and runtime.backends.local load torch and transformers (seconds); see the line above
    from tinker_cookbook import tokenizer_utils

    # lazy: the same
    from sailrl.runtime.backends.local.weights.sources import (
        ResolvedModel,
        byte_tokenizer,
        load_tokenizer,
        missing_gguf,
        require_gguf,
    )

    if is_builtin(model_name):
        return byte_tokenizer()
    source = classify(model_name, base_dir)
    if source.kind in ("local_dir", "gguf"):
        if source.kind == "gguf":
            require_gguf()
            if source.path is None or not source.path.is_file():
                raise missing_gguf(source.path or model_name)
        return load_tokenizer(ResolvedModel(model_name, source.kind, str(source.path)))
    return tokenizer_utils.get_tokenizer(model_name)


def get_renderer(renderer_name: str, tokenizer: Any) -> Any:
    """The renderer ``renderer_name`` over ``tokenizer``.

    ``chat_template`` -> :class:`~sailrl.runtime.backends.chat_template.ChatTemplateRenderer` (raises ``ModelError`` when
    the tokenizer has no chat template); ``role_colon_tools`` -> :class:`~sailrl.runtime.backends.role_colon_tools.
    RoleColonToolsRenderer`; else ``tinker_cookbook.renderers.get_renderer`` (raises ``ValueError``
    for an unknown name).
    """
    from tinker_cookbook import renderers  # lazy: see get_tokenizer

    from sailrl.runtime.backends.chat_template import ChatTemplateRenderer  # lazy: tinker_cookbook, see get_tokenizer
    from sailrl.runtime.backends.role_colon_tools import RoleColonToolsRenderer  # lazy: the same

    if renderer_name == CHAT_TEMPLATE_RENDERER:
        return ChatTemplateRenderer(tokenizer)
    if renderer_name == ROLE_COLON_TOOLS_RENDERER:
        return RoleColonToolsRenderer(tokenizer)
    return renderers.get_renderer(renderer_name, tokenizer)


def default_renderer_name(model_name: str, base_dir: str | os.PathLike | None = None, *,
                          embedded: bool = False) -> str | None:
    """The renderer to use when a spec names none (``sailrl.spec.models.default_renderer``; ``embedded``: the
    model runs on the embedded backend), or ``None`` when none is known (the caller asks the user to name one)."""
    try:
        return default_renderer(model_name, base_dir, embedded=embedded)
    except UnknownModelError:
        return None
