"""The model catalogue: every fact sailrl keeps about a base model name, in one place (no torch import).

- :data:`BUILTIN_MODELS`: the embedded backend's built-in models, ``sailrl/tiny`` (random weights drawn from
  ``model.seed``) and ``sailrl/tiny-arith`` (the same architecture with shipped weights, pretrained on
  single-digit sums by ``runtime/backends/local/pretrained/make_tiny_arith.py``), ``sailrl/tiny-tools`` (tiny-arith
  taught by ``runtime/backends/local/pretrained/make_tiny_tools.py`` to call the calculator tool about half the time), and
  ``sailrl/tiny-judge`` (4 layers, trained by ``runtime/backends/local/pretrained/make_tiny_judge.py`` to judge whether a
  completion is only the number a rubric names).
- :func:`classify`: what a ``model.name`` is -- a built-in model, a local Hugging Face model folder, a GGUF
  file, or a remote name (a Hugging Face hub id, or a Tinker model name).
- :func:`default_renderer`: the renderer used when a spec sets no ``model.renderer`` (one rule for every
  caller).
- :func:`context_window`: a model's context window in tokens and where that number comes from.
- :func:`lora_family`: the module-naming family of a model's LoRA adapter (for Sail adapter configs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sailrl.spec.errors import ConfigError
from sailrl.spec.renderers import CHAT_TEMPLATE_RENDERER, KNOWN_RENDERERS

__all__ = [
    "BUILTIN_MODELS",
    "CONTEXT_WINDOWS",
    "TINY_ARITH_MODEL_NAME",
    "TINY_CONFIG",
    "TINY_MODEL_NAME",
    "TINY_JUDGE_MODEL_NAME",
    "TINY_JUDGE_RUBRIC",
    "TINY_TOOLS_MODEL_NAME",
    "BuiltinModel",
    "ModelSource",
    "UnknownModelError",
    "classify",
    "context_window",
    "default_renderer",
    "has_chat_template",
    "is_builtin",
    "is_unknown_builtin",
    "is_local_model",
    "is_remote_only",
    "lora_family",
]

TINY_MODEL_NAME = "sailrl/tiny"
TINY_ARITH_MODEL_NAME = "sailrl/tiny-arith"
TINY_TOOLS_MODEL_NAME = "sailrl/tiny-tools"
TINY_JUDGE_MODEL_NAME = "sailrl/tiny-judge"
#: The one rubric ``sailrl/tiny-judge`` was taught (on the binary scale, with the role_colon renderer); the field
#: names in it may differ, the words may not (validate warns otherwise, W113).
TINY_JUDGE_RUBRIC = "The question was {{ question }}. A good reply is only the number {{ answer }}, nothing else."

#: ``sailrl/tiny``: a Qwen3-architecture causal LM (hidden 128, 2 layers, 4 query / 2 key-value heads of 32,
#: MLP 384, vocabulary 259 = the byte tokenizer's size, untied input/output embeddings; 0.46 M parameters).
TINY_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 259,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 1,
    "pad_token_id": 0,
}


@dataclass(frozen=True)
class BuiltinModel:
    """A model the embedded backend builds itself (no download).

    ``config``: the ``transformers.Qwen3Config`` fields. ``pretrained``: True when sailrl ships its weights
    (else they are drawn from ``model.seed``). ``renderer``: its default renderer. ``tokenizer``: ``"bytes"``
    (``transformers.ByT5Tokenizer(extra_ids=0)``, 259 ids, EOS id 1).
    """

    name: str
    description: str
    config: dict[str, Any] = field(default_factory=lambda: dict(TINY_CONFIG))
    pretrained: bool = False
    renderer: str = "role_colon"
    tokenizer: str = "bytes"
    lora_family: str = "standard"

    @property
    def context_window(self) -> int:
        return int(self.config["max_position_embeddings"])


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    TINY_MODEL_NAME: BuiltinModel(
        TINY_MODEL_NAME,
        "0.46 M-parameter Qwen3-architecture model with random weights drawn from model.seed; byte tokenizer",
    ),
    TINY_ARITH_MODEL_NAME: BuiltinModel(
        TINY_ARITH_MODEL_NAME,
        "sailrl/tiny pretrained (full-parameter, seeded, shipped with sailrl) on single-digit sums in the "
        "'User: a+b=\\n\\nAssistant: c' format, stopped early: it answers with a number but gets about 38% "
        "of the sums right, so RL has something to sharpen",
        pretrained=True,
    ),
    TINY_TOOLS_MODEL_NAME: BuiltinModel(
        TINY_TOOLS_MODEL_NAME,
        "sailrl/tiny-arith taught (full-parameter, seeded, shipped with sailrl) on episodes of the calculator tool "
        "in the role_colon_tools format: on 'a+b=' it calls the calculator about half the time and copies its "
        "result, and otherwise answers directly as tiny-arith does (often wrong), so RL can raise the tool's use",
        pretrained=True,
        renderer="role_colon_tools",
    ),
    TINY_JUDGE_MODEL_NAME: BuiltinModel(
        TINY_JUDGE_MODEL_NAME,
        "a judge model for kind: judge rules (sailrl/tiny's architecture with 4 layers, 0.85 M parameters, trained "
        "from scratch by a seeded script, shipped with sailrl): it reads sailrl's judge prompt and answers "
        "<score>yes</score> when the completion is only the number the rubric names (TINY_JUDGE_RUBRIC: 'The "
        "question was {{ question }}. A good reply is only the number {{ answer }}, nothing else.'), else "
        "<score>no</score>; it judges no other rubric",
        config={**TINY_CONFIG, "num_hidden_layers": 4},
        pretrained=True,
    ),
}

#: Context windows (tokens) of remote models sailrl can vouch for, from their model cards.
CONTEXT_WINDOWS: dict[str, int] = {
    "Qwen/Qwen3-8B": 32768,  # Qwen3-8B model card: "32,768 natively"
    "meta-llama/Llama-3.1-8B": 131072,  # Llama 3.1 model card: 128k context
    "meta-llama/Llama-3.1-8B-Instruct": 131072,
    "moonshotai/Kimi-K2-Instruct": 131072,  # Kimi K2 model card: 128K context
}

# Lower-cased substrings of the base model name -> LoRA module-naming family; first match wins.
# "mla": DeepSeek-V3 / Kimi-K2 multi-head latent attention; "standard": q/k/v/o_proj + gate/up/down_proj.
_FAMILY_PATTERNS: tuple[tuple[str, str], ...] = (
    ("kimi-k2", "mla"),
    ("deepseek-v3", "mla"),
    ("llama", "standard"),
    ("qwen3-", "standard"),  # Qwen3 dense and MoE (not Qwen3.5/3.6, whose linear attention differs)
    ("qwen2", "standard"),
    ("gpt-oss", "standard"),
    ("sailrl/tiny", "standard"),  # sailrl/tiny, sailrl/tiny-arith, sailrl/tiny-tools and sailrl/tiny-judge
)

SourceKind = Literal["builtin", "local_dir", "gguf", "remote"]


class UnknownModelError(ConfigError):
    """No renderer is known for a model name (a ``ValueError``); the message tells the user to set
    model.renderer."""

    code = "E012"


@dataclass(frozen=True)
class ModelSource:
    """What a ``model.name`` refers to.

    ``kind``: ``"builtin"`` (:data:`BUILTIN_MODELS`), ``"local_dir"`` (an existing folder), ``"gguf"`` (a name
    ending in ``.gguf``, existing or not), ``"remote"`` (anything else: a hub id or a Tinker model name).
    ``path``: the resolved absolute path for ``local_dir`` / ``gguf`` (None otherwise).
    """

    name: str
    kind: SourceKind
    path: Path | None = None

    @property
    def is_local(self) -> bool:
        """True when the embedded backend needs no network for it (built-in, folder, GGUF file)."""
        return self.kind != "remote"


#: Lower-cased substrings of models only remote services serve (hundreds of billions of parameters): a
#: ``sampler: local`` judge cannot name them.
REMOTE_ONLY_PATTERNS: tuple[str, ...] = ("kimi-k2", "deepseek-v3", "deepseek-r1", "qwen3-235b", "qwen3-coder-480b",
                                         "gpt-oss-120b", "llama-3.1-405b", "llama-4-maverick")


def is_remote_only(model_name: str) -> bool:
    """Whether ``model_name`` is a model only remote services serve (see :data:`REMOTE_ONLY_PATTERNS`)."""
    low = model_name.lower()
    return any(p in low for p in REMOTE_ONLY_PATTERNS)


def is_builtin(model_name: str) -> bool:
    """True for the embedded backend's built-in model names (``sailrl/tiny``, ``sailrl/tiny-arith``,
    ``sailrl/tiny-tools``)."""
    return model_name in BUILTIN_MODELS


def is_unknown_builtin(model_name: str) -> bool:
    """A name in the built-in models' namespace (``sailrl/...``, any case) that is none of them (a typo)."""
    return model_name.lower().startswith("sailrl/") and model_name not in BUILTIN_MODELS


def _resolve_path(model_name: str, base_dir: str | Path | None) -> Path:
    """``model_name`` as a path: ``~`` expanded; a relative one under ``base_dir`` when it exists there, else
    under the current folder when it exists there, else under ``base_dir`` (where the spec says it is, so a
    missing file is reported where it was looked up first)."""
    p = Path(model_name).expanduser()
    if p.is_absolute() or base_dir is None:
        return p.absolute()
    under = Path(base_dir) / p
    return (p if not under.exists() and p.exists() else under).absolute()


def classify(model_name: str, base_dir: str | Path | None = None) -> ModelSource:
    """Classify ``model_name`` (relative paths are looked up under ``base_dir``, the spec's folder, then the
    current folder). A built-in name wins over a folder of the same name."""
    if is_builtin(model_name):
        return ModelSource(model_name, "builtin")
    path = _resolve_path(model_name, base_dir)
    if model_name.lower().endswith(".gguf"):
        return ModelSource(model_name, "gguf", path)
    if path.is_dir():
        return ModelSource(model_name, "local_dir", path)
    return ModelSource(model_name, "remote")


def is_local_model(model_name: str, base_dir: str | Path | None = None) -> bool:
    """True for a built-in model, a local model folder or a GGUF file name (no network needed)."""
    return classify(model_name, base_dir).is_local


def chat_template_text(folder: str | Path) -> str | None:
    """The chat template a saved tokenizer in ``folder`` carries (``chat_template.jinja``, ``chat_template.json``'s
    ``chat_template``, or ``tokenizer_config.json``'s; the first one found), or None."""
    folder = Path(folder)
    try:
        if (folder / "chat_template.jinja").is_file():
            return (folder / "chat_template.jinja").read_text(encoding="utf-8")
        for name in ("chat_template.json", "tokenizer_config.json"):
            if (folder / name).is_file():
                value = json.loads((folder / name).read_text(encoding="utf-8")).get("chat_template")
                if isinstance(value, str) and value:
                    return value
                if isinstance(value, list):  # named templates: the "default" one, or the first
                    named = {d.get("name"): d.get("template") for d in value if isinstance(d, dict)}
                    text = named.get("default") or next(iter(named.values()), None)
                    if isinstance(text, str):
                        return text
    except (OSError, ValueError, AttributeError):
        return None
    return None


def has_chat_template(folder: str | Path) -> bool:
    """True when a saved tokenizer in ``folder`` carries a chat template: ``chat_template.jinja`` or
    ``chat_template.json``, or a ``chat_template`` entry in ``tokenizer_config.json`` (the places
    ``transformers`` reads it from)."""
    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return False
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def _cached_hub_folder(model_name: str) -> Path | None:
    """The folder of a hub model's snapshot in the Hugging Face cache (the one holding its config.json), or None
    when it is not cached (no network: a cache lookup only)."""
    from huggingface_hub import try_to_load_from_cache  # lazy: only for hub ids on the embedded backend

    try:
        found = try_to_load_from_cache(model_name, "config.json")
    except Exception:  # noqa: BLE001 -- an id the cache cannot hold (e.g. not owner/name): not cached
        return None
    return Path(found).parent if isinstance(found, str) else None


def default_renderer(model_name: str, base_dir: str | Path | None = None, *, embedded: bool = False) -> str:
    """The renderer used when a spec does not set ``model.renderer``.

    - a built-in model: its renderer (``role_colon``; ``role_colon_tools`` for ``sailrl/tiny-tools``);
    - a local folder whose tokenizer has a chat template, or a GGUF file: ``chat_template`` (the
      tokenizer's own template; a GGUF file without one is reported when it is loaded);
    - a hub id on the embedded backend (``embedded``: ``sampling.sampler: local``), which loads the model with
      transformers: ``chat_template`` too, the tokenizer's own template, unless the snapshot in the Hugging Face
      cache has a tokenizer without one (then as a remote name below); a model not yet cached is checked when it
      is downloaded;
    - a remote name: the first renderer ``tinker_cookbook.model_info.get_recommended_renderer_name``
      recommends (a cheap import, no torch).

    Raises :class:`UnknownModelError` (a ``ValueError``) for a folder whose tokenizer has no chat template and
    for a remote name tinker_cookbook does not know; the message says what to set.
    """
    source = classify(model_name, base_dir)
    no_template = False
    if embedded and source.kind == "remote":
        cached = _cached_hub_folder(model_name)
        if cached is None or has_chat_template(cached):
            return CHAT_TEMPLATE_RENDERER
        no_template = True
    if source.kind == "builtin":
        return BUILTIN_MODELS[model_name].renderer
    if source.kind == "gguf":
        return CHAT_TEMPLATE_RENDERER
    if source.kind == "local_dir":
        assert source.path is not None
        if has_chat_template(source.path):
            return CHAT_TEMPLATE_RENDERER
        raise UnknownModelError(
            f"the tokenizer in '{model_name}' has no chat template, so no renderer is known for it; set "
            "model.renderer (role_colon works with any tokenizer)"
        )
    # lazy: tinker_cookbook (~0.3 s); validate asks it only for a hub model whose renderer is not known
    from tinker_cookbook.model_info import get_recommended_renderer_name

    try:
        return get_recommended_renderer_name(model_name)
    except Exception as exc:  # ConfigurationError, KeyError, ValueError from tinker_cookbook's tables
        why = (f"the tokenizer of '{model_name}' in the Hugging Face cache has no chat template and no renderer "
               "is known for it" if no_template else f"no renderer is known for model '{model_name}'")
        raise UnknownModelError(f"{why}; set model.renderer to one of: " + ", ".join(KNOWN_RENDERERS)) from exc


def _gguf_context_length(path: Path) -> tuple[int | None, str]:
    try:
        from gguf import GGUFReader  # lazy: gguf is an optional extra (sailrl[gguf])
    except ImportError:
        return None, f"unknown for {path.name} (install the gguf package to read it: pip install 'sailrl[gguf]')"
    try:
        reader = GGUFReader(str(path))
        arch = reader.fields["general.architecture"].contents()
        value = reader.fields[f"{arch}.context_length"].contents()
    except Exception:  # noqa: BLE001 -- a corrupt or odd file: unknown here, reported when it is loaded
        return None, f"unknown for {path.name} (no {{arch}}.context_length in the GGUF metadata)"
    return int(value), f"{path} {arch}.context_length"


def context_window(model_name: str, base_dir: str | Path | None = None) -> tuple[int | None, str]:
    """``(tokens, where the number comes from)``; ``(None, reason)`` when unknown.

    A built-in model: its config's ``max_position_embeddings``; a local model folder: its ``config.json``
    ``max_position_embeddings``; a GGUF file: its ``<arch>.context_length`` metadata (needs the ``gguf``
    package); a remote name: :data:`CONTEXT_WINDOWS`.
    """
    source = classify(model_name, base_dir)
    if source.kind == "builtin":
        return BUILTIN_MODELS[model_name].context_window, f"{model_name} config max_position_embeddings"
    if source.kind == "gguf" and source.path is not None and source.path.is_file():
        return _gguf_context_length(source.path)
    if source.kind == "local_dir" and source.path is not None:
        config = source.path / "config.json"
        if config.is_file():
            try:
                value = json.loads(config.read_text()).get("max_position_embeddings")
            except (OSError, ValueError, AttributeError):
                value = None
            if isinstance(value, int):
                return value, f"{config} max_position_embeddings"
    if model_name in CONTEXT_WINDOWS:
        return CONTEXT_WINDOWS[model_name], "model card (sailrl's table)"
    return None, f"unknown for {model_name} (not in sailrl's table)"


def lora_family(base_model: str) -> str | None:
    """The LoRA module-naming family of ``base_model`` (``"mla"`` or ``"standard"``), or None when not known.

    Matched on lower-cased substrings of the name, first match wins (e.g. ``kimi-k2`` -> ``mla``,
    ``qwen3-`` / ``llama`` -> ``standard``).
    """
    name = base_model.lower()
    for pattern, family in _FAMILY_PATTERNS:
        if pattern in name:
            return family
    return None
