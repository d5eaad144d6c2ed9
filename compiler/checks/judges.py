"""Judge rules (``kind: judge``): whether the judge model can run where its ``judge.sampler`` runs it, and
whether the built-in ``sailrl/tiny-judge`` is used as it was taught."""

from __future__ import annotations

import re

from sailrl.compiler.checks.model import BUILTIN_HINT
from sailrl.compiler.checks.reader import SpecReader
from sailrl.spec.messages import did_you_mean_text
from sailrl.spec.models import (
    BUILTIN_MODELS,
    TINY_JUDGE_MODEL_NAME,
    TINY_JUDGE_RUBRIC,
    classify,
    is_remote_only,
    is_unknown_builtin,
)


def check_judges(spec: SpecReader) -> None:
    """A judge model that its sampler cannot serve (S231, S232); ``sailrl/tiny-judge`` asked to judge what it
    was not taught (W113)."""
    rules = spec.get(("reward", "rules"))
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        if not isinstance(rule, dict) or rule.get("kind") != "judge" or not isinstance(rule.get("judge"), dict):
            continue
        path = ("reward", "rules", i, "judge")
        model = spec.text((*path, "model"))
        sampler = spec.text((*path, "sampler")) or "sail"
        if not model or sampler not in ("sail", "tinker", "local"):
            continue  # the schema reports these
        if is_unknown_builtin(model):
            spec.add((*path, "model"), "S231", f"'{model}' is not a model built into sailrl, so no judge can "
                     "run it" + did_you_mean_text(model, list(BUILTIN_MODELS)), BUILTIN_HINT)
            continue
        try:
            kind = classify(model, spec.loaded.base_dir).kind
        except OSError:
            continue
        if sampler in ("sail", "tinker") and kind != "remote":
            where = {"builtin": "a model built into sailrl's embedded backend", "local_dir": "a model folder "
                     "on this machine", "gguf": "a .gguf file on this machine"}[kind]
            service = "Sail" if sampler == "sail" else "Tinker"
            spec.add((*path, "model"), "S231",
                     f"the judge model '{model}' is {where}; {service} (judge.sampler: {sampler}) cannot serve it",
                     "Use judge.sampler: local to judge with it on the embedded backend, or name a model "
                     f"{service} hosts (e.g. {'moonshotai/Kimi-K2.6' if sampler == 'sail' else 'Qwen/Qwen3-8B'}).")
        if model == TINY_JUDGE_MODEL_NAME and sampler == "local":
            _tiny_judge(spec, i, rule)
        if sampler == "local" and kind == "remote" and is_remote_only(model):
            spec.add((*path, "model"), "S232",
                     f"the judge model '{model}' is served only by remote services; the embedded backend "
                     "(judge.sampler: local) cannot load a model of that size",
                     "Use judge.sampler: sail (Sail's hosted model) or tinker, or a small local model (a "
                     "Hugging Face folder or .gguf file next to the spec).")


def _tiny_judge(spec: SpecReader, i: int, rule: dict) -> None:
    """W113: ``sailrl/tiny-judge`` with another rubric (the field names aside), scale or renderer."""
    untaught = []
    rubric = spec.text(("reward", "rules", i, "rubric"))
    if rubric is not None and _rubric_words(rubric) != _rubric_words(TINY_JUDGE_RUBRIC):
        untaught.append(("rubric", "its rubric"))
    if rule.get("scale", "binary") != "binary":
        untaught.append(("scale", "its scale"))
    renderer = rule["judge"].get("renderer")
    if renderer not in (None, "role_colon"):
        untaught.append((("judge", "renderer"), f"the renderer {renderer!r}"))
    if not untaught:
        return
    key, _ = untaught[0]
    key = key if isinstance(key, tuple) else (key,)
    spec.warn(("reward", "rules", i, *key), "W113",
              f"judge rule '{rule.get('name') or 'judge'}': sailrl/tiny-judge was taught one rubric only, on the "
              f"binary scale with the role_colon renderer, and {' and '.join(w for _, w in untaught)} "
              f"{'differs' if len(untaught) == 1 else 'differ'}: "
              "its answers here mean nothing",
              f"Write the rubric as '{TINY_JUDGE_RUBRIC}' (your field names in the braces), with scale: binary; "
              "or judge with a real instruction model (a local folder or .gguf, or judge.sampler: sail).")


def _rubric_words(rubric: str) -> str:
    """A rubric's words with each ``{{ ... }}`` as ``{}`` and runs of whitespace as one space (W113 compares them)."""
    return " ".join(re.sub(r"\{\{.*?\}\}", "{}", rubric, flags=re.DOTALL).split())
