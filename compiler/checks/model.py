"""The ``model:`` section: a built-in model name sailrl knows (S212), a LoRA rank that is a power of two (S213), a
known renderer (S211), or a model whose renderer sailrl can pick (S212)."""

from __future__ import annotations

from yaml.nodes import ScalarNode

from sailrl.compiler.checks.reader import SpecReader
from sailrl.spec.messages import did_you_mean_text, number_text
from sailrl.spec.models import BUILTIN_MODELS, UnknownModelError, default_renderer, is_unknown_builtin
from sailrl.spec.renderers import KNOWN_RENDERERS
from sailrl.spec.schema import ModelSpec

#: The hint of a model name that is not built in (the spec's model and a judge rule's model alike).
BUILTIN_HINT = ("Built-in models (names starting sailrl/): " + ", ".join(BUILTIN_MODELS) + ". Otherwise name a "
                "model folder or .gguf file next to the spec, or a Hugging Face hub id.")


def check_model(spec: SpecReader) -> None:
    named = spec.text(("model", "name"))
    if named is not None and is_unknown_builtin(named):
        spec.add(("model", "name"), "S212", f"'{named}' is not a model built into sailrl"
                 + did_you_mean_text(named, list(BUILTIN_MODELS)), BUILTIN_HINT)
    rank = spec.integer(("model", "lora_rank"))
    if rank is not None and (rank < 1 or rank & (rank - 1)):
        spec.add(("model", "lora_rank"), "S213",
                 f"LoRA rank must be a positive power of two, got {number_text(rank)}",
                 "Use 1, 2, 4, 8, 16, 32 (the Tinker default), 64, 128, ... For RL small ranks are enough.")
    renderer = spec.text(("model", "renderer"))
    if renderer is not None:
        if renderer not in KNOWN_RENDERERS:
            spec.add(("model", "renderer"), "S211", f"unknown renderer '{renderer}'"
                     + did_you_mean_text(renderer, KNOWN_RENDERERS),
                     "Known renderers: " + ", ".join(KNOWN_RENDERERS) + ".")
        return
    info = spec.loaded.nodes.get(("model", "name"))
    if info is not None and not isinstance(info.node, ScalarNode):
        return  # the schema reports the wrong type
    if not spec.whole("model"):
        return  # cut by a syntax error: model.renderer may come after it
    if not spec.path_ok(("model", "name")):
        return

    name = spec.text(("model", "name")) or ModelSpec.model_fields["name"].default
    if is_unknown_builtin(name):
        return  # said above
    try:
        default_renderer(name, spec.loaded.base_dir, embedded=spec.text(("sampling", "sampler")) == "local")
    except UnknownModelError as exc:
        spec.add(("model", "name"), "S212", f"no renderer is known for model '{name}'; set model.renderer",
                 f"{exc} Add `renderer:` under model:, e.g. qwen3, llama3, kimi_k26 or role_colon.")
    except OSError as exc:  # an unreadable local model folder
        spec.add(("model", "name"), "S212", f"cannot look at model '{name}': {exc.strerror or exc}",
                 "Check the path, or set model.renderer.")
