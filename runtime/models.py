"""Tokenizer and renderer for a model name.

``sailrl/tiny`` (the embedded backend's default model) uses a byte-level tokenizer,
``transformers.ByT5Tokenizer(extra_ids=0)``: 259 ids (0 pad, 1 ``</s>`` = EOS, 2 unk, 3..258 the
bytes 0..255), built in code with no vocabulary files and no download. Its renderer is
tinker-cookbook's ``role_colon`` (``"User: ...\\n\\nAssistant:"``, stop sequence ``"\\n\\nUser:"``).

A local directory (a Hugging Face model saved with ``save_pretrained``) loads its tokenizer with
``AutoTokenizer.from_pretrained(path, local_files_only=True)``. Any other name goes to
``tinker_cookbook.tokenizer_utils.get_tokenizer`` (the Hugging Face hub, as Tinker itself does).
"""

from __future__ import annotations

import functools
import os
from typing import Any

TINY_MODEL_NAME = "sailrl/tiny"
TINY_RENDERER_NAME = "role_colon"


def is_tiny(model_name: str) -> bool:
    """True for the embedded default model name ``sailrl/tiny``."""
    return model_name == TINY_MODEL_NAME


def is_local_model_dir(model_name: str) -> bool:
    """True if ``model_name`` is an existing directory holding a Hugging Face ``config.json``."""
    return os.path.isdir(model_name) and os.path.isfile(os.path.join(model_name, "config.json"))


@functools.cache
def _byte_tokenizer() -> Any:
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer(extra_ids=0)


def get_tokenizer(model_name: str) -> Any:
    """Return the tokenizer for ``model_name``.

    - ``"sailrl/tiny"`` -> ``ByT5Tokenizer(extra_ids=0)`` (cached; 259 ids, EOS id 1).
    - an existing local directory -> ``AutoTokenizer.from_pretrained(dir, local_files_only=True)``.
    - anything else -> ``tinker_cookbook.tokenizer_utils.get_tokenizer(model_name)`` (may download).

    Raises ``OSError`` (from transformers) when a hub name cannot be loaded, e.g. offline.
    """
    if is_tiny(model_name):
        return _byte_tokenizer()
    if os.path.isdir(model_name):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_name, local_files_only=True)
    from tinker_cookbook import tokenizer_utils

    return tokenizer_utils.get_tokenizer(model_name)


def get_renderer(renderer_name: str, tokenizer: Any) -> Any:
    """Return ``tinker_cookbook.renderers.get_renderer(renderer_name, tokenizer)``.

    Raises ``ValueError`` (from tinker-cookbook) for an unknown renderer name.
    """
    from tinker_cookbook import renderers

    return renderers.get_renderer(renderer_name, tokenizer)


def default_renderer_name(model_name: str) -> str | None:
    """The renderer to use when a spec names none: ``role_colon`` for ``sailrl/tiny``, else
    tinker-cookbook's recommendation for the model (``None`` if it has none)."""
    if is_tiny(model_name) or os.path.isdir(model_name):
        return TINY_RENDERER_NAME
    try:
        from tinker_cookbook import model_info

        return model_info.get_recommended_renderer_name(model_name)
    except (ValueError, KeyError):  # unknown model: the caller asks the user to name a renderer
        return None
