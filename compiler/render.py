"""Render a validated spec into a standalone, readable Python training script.

Determinism and safety:

- Same spec bytes and sailrl version -> same script bytes (no timestamps, no absolute paths, sorted nothing
  that the spec orders).
- Spec values enter the script only as Python literals built by :func:`literal` (``repr``-based; strings
  double-quoted where possible), never by pasting text into code. Comments name schema keys; the one comment
  that quotes the spec's text is the reward in plain words (:func:`comment_lines`: every character that is not
  printable, a line break among them, written as its escape, so the text cannot end the comment); the spec path
  appears in comments/docstrings only when it is a plain path.

Layout: ``TRAINING`` above ``main()`` holds the values the loop reads (:func:`read_keys`); the rest of the spec is
one literal, ``CONFIG``, below the loop (its ``training`` is ``TRAINING | {...the other training values}``).
"""

from __future__ import annotations

import hashlib
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import jinja2

from sailrl.spec.methods import METHOD_KEYS
from sailrl.spec.schema import Spec
from sailrl.spec.version import __version__

SECTIONS = ("model", "dataset", "prompt", "reward", "training", "sampling", "pricing", "output")
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./+-]+")
_INDENT = "    "
_WIDTH = 100


def string_literal(s: str) -> str:
    """A Python literal for ``s`` (double quotes unless ``s`` contains one). ``ast.literal_eval`` gives ``s`` back."""
    r = repr(s)
    if r.startswith("'") and '"' not in s:
        return '"' + r[1:-1] + '"'
    return r


def literal(value: Any, indent: int = 0) -> str:
    """A deterministic Python literal for JSON-like ``value``; containers break over lines when long."""
    if isinstance(value, str):
        return string_literal(value)
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        items = [literal(v, indent + 1) for v in value]
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
        one = open_ + ", ".join(items) + ("," if isinstance(value, tuple) and len(items) == 1 else "") + close
        if "\n" not in one and len(one) + indent * 4 <= _WIDTH:
            return one
        pad = _INDENT * (indent + 1)
        return open_ + "\n" + "".join(f"{pad}{i},\n" for i in items) + _INDENT * indent + close
    if isinstance(value, dict):
        items = [f"{string_literal(str(k))}: {literal(v, indent + 1)}" for k, v in value.items()]
        one = "{" + ", ".join(items) + "}"
        if "\n" not in one and len(one) + indent * 4 <= _WIDTH:
            return one
        pad = _INDENT * (indent + 1)
        return "{\n" + "".join(f"{pad}{i},\n" for i in items) + _INDENT * indent + "}"
    raise TypeError(f"cannot render {type(value).__name__} as a literal")


def _entries(section: str, data: dict[str, Any], indent: int) -> list[str]:
    """One line (or more, for a long container) per key of ``data``, each followed by ``# section.key``."""
    lines = []
    pad = _INDENT * indent
    for key, value in data.items():
        rendered = literal(value, indent)
        head, _, rest = rendered.partition("\n")
        comment = f"  # {section}.{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) else ""
        if rest:
            lines.append(f"{pad}{string_literal(key)}: {head}{comment}")
            lines.append(rest + ",")
        else:
            lines.append(f"{pad}{string_literal(key)}: {head},{comment}")
    return lines


def section_block(section: str, data: dict[str, Any]) -> str:
    """``MODEL = {...}`` with each schema key on its own line followed by ``# section.key``."""
    return "\n".join([f"{section.upper()} = {{", *_entries(section, data, 1), "}"])


def config_block(sections: list[tuple[str, Any]], reads: list[str]) -> str:
    """``CONFIG = {...}``: the spec's sections in order (``sections``: (key, value) pairs; a dict is written key by
    key, each followed by its ``# section.key``), the ``training`` keys in ``reads`` left to ``TRAINING``."""
    lines = ["CONFIG = {"]
    for name, value in sections:
        if not isinstance(value, dict):
            comment = f"  # {name}" if name != "version" else ""
            lines.append(f"{_INDENT}{string_literal(name)}: {literal(value, 1)},{comment}")
            continue
        rest = {k: v for k, v in value.items() if not (name == "training" and k in reads)}
        head = "TRAINING | {" if name == "training" else "{"
        lines += [f"{_INDENT}{string_literal(name)}: {head}", *_entries(name, rest, 2), f"{_INDENT}}},"]
    lines.append("}")
    return "\n".join(lines)


def comment_lines(sentences: list[str], indent: int, width: int = _WIDTH + 16) -> list[str]:
    """``sentences`` as comment lines at ``indent`` spaces, each wrapped to ``width`` (continuations indented two
    more). A character that is not printable (a line break, a tab, a lone surrogate) is written as its escape, so
    no text can end the comment or make the file unwritable."""
    pad = " " * indent + "#   "
    out = []
    for sentence in sentences:
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in sentence)
        out += textwrap.wrap(text, width, initial_indent=pad, subsequent_indent=pad + "  ", break_on_hyphens=False)
    return out


#: The loop features a script is compiled with; each adds its lines to ``main()`` only when the spec uses it.
FEATURES: dict[str, str] = {
    "warmup": "training.warmup (supervised steps before RL)",
    "off_policy": "training.max_steps_off_policy > 0 (sampling ahead while earlier steps train)",
    "scale": "training.advantage_scale other than none",
    "kl": "training.kl_penalty_coef > 0 (KL penalty to the base model)",
    "schedule": "training.lr_schedule other than constant, or training.lr_warmup_steps > 0",
    "eval": "dataset.eval (a held-out split)",
    "budget": "training.max_cost_usd (the budget stop)",
    "episodes": "environment: (episodes of more than one turn: tools, feedback turns)",
    "dynamic_sampling": "training.dynamic_sampling (more groups drawn until the step has groups_per_step with signal)",
    "difficulty_filter": "training.difficulty_filter (rows whose groups keep coming out degenerate rest)",
}


def features(spec: Spec) -> dict[str, bool]:
    """Which of :data:`FEATURES` ``spec`` uses (the template renders their lines only when True)."""
    t = spec.training
    return {
        "warmup": bool(t.warmup and t.warmup.steps > 0),
        "off_policy": t.max_steps_off_policy > 0,
        "scale": t.advantage_scale != "none",
        "kl": t.kl_penalty_coef > 0,
        "schedule": t.lr_schedule != "constant" or t.lr_warmup_steps > 0,
        "eval": spec.dataset.eval is not None,
        "budget": t.max_cost_usd is not None,
        "episodes": spec.environment is not None,
        "dynamic_sampling": t.dynamic_sampling is not None,
        "difficulty_filter": t.difficulty_filter is not None,
    }


#: The ``training`` keys the loop's lines read (``t["key"]`` in ``main()`` and ``train_step()``), per feature; they
#: stand in ``TRAINING`` above the loop.
READS: dict[str, tuple[str, ...]] = {
    "always": ("learning_rate", "beta1", "beta2", "eps", "loss_fn", "loss_fn_config", "num_substeps", "save_every"),
    "warmup": ("warmup",),
    "off_policy": ("max_steps_off_policy",),
    "scale": ("advantage_scale",),
    "kl": ("kl_penalty_coef", "kl_discount_factor"),
    "schedule": ("steps", "lr_schedule", "lr_warmup_steps"),
    "eval": ("eval_every",),
    "budget": (),
    "episodes": (),
    "dynamic_sampling": ("dynamic_sampling",),
    "difficulty_filter": ("difficulty_filter",),
}


def read_keys(spec: Spec) -> list[str]:
    """The ``training`` keys the script's loop reads for ``spec`` (:data:`READS`; another method's
    :data:`METHOD_READS`), in the schema's order."""
    if spec.method != "rl":
        schedule = spec.training.lr_schedule != "constant" or spec.training.lr_warmup_steps > 0
        # A constant rate reads no schedule (and distillation's loop reads training.steps only for one).
        unread: tuple[str, ...] = () if schedule else (
            "lr_schedule", "lr_warmup_steps", *(("steps",) if spec.method == "distill" else ()))
        if spec.method == "distill" and spec.dataset.eval is None:
            unread += ("eval_every",)  # its loop evaluates only with a held-out split
        return [k for k in spec.resolved()["training"] if k in METHOD_READS[spec.method] and k not in unread]
    on = {"always", *(k for k, v in features(spec).items() if v)}
    wanted = {key for feature in on for key in READS[feature]}
    return [k for k in spec.resolved()["training"] if k in wanted]


def feature_changes(compiled: Spec, run: Spec) -> list[str]:
    """The features (plain words) ``run`` uses that the spec a script was compiled from did not. (A feature turned
    off is fine: its lines then do nothing, e.g. no warm-up steps, ``advantage_scale: none``.)"""
    a, b = features(compiled), features(run)
    return [FEATURES[k] for k in FEATURES if b[k] and not a[k]]


def _template(name: str = "train.py.j2") -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env.get_template(name)


def _doc_path(p: str) -> str:
    return p if _PLAIN_PATH.fullmatch(p) else "<SPEC_PATH>"


def _common_context(spec: Spec, spec_path: str, spec_bytes: bytes, output_path: str,
                    reward_words: list[str]) -> dict[str, Any]:
    """What every method's script header and footer show: the version, the spec's path and sha256, the script's
    path, the spec folder relative to the script, and the reward in plain words."""
    sha256 = hashlib.sha256(spec_bytes).hexdigest()
    spec_dir = Path(spec_path).parent
    script_dir = Path(output_path).parent
    rel = Path(os.path.relpath(spec_dir if str(spec_dir) else ".", script_dir if str(script_dir) else ".")).as_posix()
    return {
        "version": __version__,
        "spec_path_comment": _doc_path(spec_path),
        "sha256": sha256,
        "name_doc": string_literal(spec.name) if _PLAIN_PATH.fullmatch(spec.name) else "(see NAME)",
        "script_path_doc": _doc_path(Path(output_path).as_posix()),
        "spec_path_doc": _doc_path(Path(spec_path).as_posix()),
        "spec_path_literal": string_literal(Path(spec_path).as_posix()),
        "sha256_literal": string_literal(sha256),
        "spec_dir_literal": string_literal(rel),
        "reward_comment": "\n".join(comment_lines(reward_words, 8)),
    }


def render_script(spec: Spec, *, spec_path: str, spec_bytes: bytes, output_path: str,
                  reward_words: list[str]) -> str:
    """The training script for ``spec`` as text.

    spec_path: the spec's path as the user gave it (recorded in the script). output_path: where the script will
    be written; used to make the spec directory relative to the script, so the pair can move together.
    reward_words: the reward rules in plain words, one sentence each (``sailrl explain``'s; the validation stage's
    :func:`sailrl.compiler.words.reward_words` makes them), shown above the loop's sampling and scoring.
    """
    if spec.method != "rl":
        return render_method_script(spec, spec_path=spec_path, spec_bytes=spec_bytes, output_path=output_path,
                                    reward_words=reward_words)
    resolved = spec.resolved()
    # Sections list every value (defaults included); a reward rule reads as the spec wrote it, every key it set
    # kept, a default it left out left out (each rule's full set of defaults would bury what it says).
    resolved["reward"]["rules"] = [r.model_dump(mode="json", by_alias=True, exclude_unset=True)
                                   for r in spec.reward.rules]
    reads = read_keys(spec)
    sections: list[tuple[str, Any]] = [("version", resolved["version"]), ("name", spec.name)]
    if spec.description is not None:
        sections.append(("description", spec.description))
    sections += [(name, resolved[name]) for name in SECTIONS]
    if spec.environment is not None:  # episodes: only a spec with environment: has the section
        sections.append(("environment", resolved["environment"]))
    sampler = spec.sampling.sampler
    keys = {"sail": "TINKER_API_KEY and SAIL_API_KEY", "tinker": "TINKER_API_KEY", "local": ""}[sampler]
    judge_keys = [k for k, where in (("TINKER_API_KEY", "tinker"), ("SAIL_API_KEY", "sail"))
                  if k not in keys and any(getattr(r, "kind", None) == "judge" and r.judge.sampler == where
                                           for r in spec.reward.rules)]
    if judge_keys:  # kind: judge rules on a service the policy does not use
        keys = " and ".join([*([keys] if keys else []), *judge_keys]) + " (for the judge rules)"
    backend_doc = {
        "sail": "Tinker trains, Sail samples every rollout",
        "tinker": "Tinker trains and samples",
        "local": "the embedded local backend trains and samples on this machine",
    }[sampler]
    resolve_doc = {
        "sail": "a signed checkpoint URL served on Sail",
        "tinker": "a Tinker sampling client",
        "local": "a local sampling client",
    }[sampler]
    return _template().render(
        **_common_context(spec, spec_path, spec_bytes, output_path, reward_words),
        backend_doc=backend_doc,
        resolve_doc=resolve_doc,
        keys=keys,
        training_block=section_block("training", {k: resolved["training"][k] for k in reads}),
        config_block=config_block(sections, reads),
        **features(spec),
    )


#: The ``training`` keys each other method's ``main()`` reads (``TRAINING`` above its loop).
METHOD_READS: dict[str, tuple[str, ...]] = {
    "sft": ("steps", "learning_rate", "beta1", "beta2", "eps", "lr_schedule", "lr_warmup_steps", "save_every",
            "eval_every"),
    "dpo": ("steps", "learning_rate", "beta1", "beta2", "eps", "lr_schedule", "lr_warmup_steps", "save_every",
            "eval_every"),
    "distill": ("steps", "learning_rate", "beta1", "beta2", "eps", "lr_schedule", "lr_warmup_steps", "loss_fn",
                "loss_fn_config", "num_substeps", "save_every", "eval_every"),
}
#: The sections a method's ``CONFIG`` holds, in this order, each when the spec has it.
METHOD_SECTIONS = ("model", "dataset", "prompt", "sft", "dpo", "distill", "reward", "training", "sampling",
                   "pricing", "output")


def render_method_script(spec: Spec, *, spec_path: str, spec_bytes: bytes, output_path: str,
                         reward_words: list[str]) -> str:
    """The script of a method other than RL, from ``templates/<method>.py.j2``: the same header, ``TRAINING``
    (:data:`METHOD_READS`) and ``CONFIG`` as the RL script, the method's own ``main()``."""
    resolved = spec.resolved()
    for path, methods in METHOD_KEYS.items():  # the script shows only what its method reads
        if spec.method not in methods and len(path) == 2 and isinstance(resolved.get(path[0]), dict):
            resolved[path[0]].pop(path[1], None)
    if spec.reward is not None:
        resolved["reward"]["rules"] = [r.model_dump(mode="json", by_alias=True, exclude_unset=True)
                                       for r in spec.reward.rules]
    reads = read_keys(spec)
    sections: list[tuple[str, Any]] = [("version", resolved["version"]), ("method", spec.method),
                                       ("name", spec.name)]
    if spec.description is not None:
        sections.append(("description", spec.description))
    sections += [(name, resolved[name]) for name in METHOD_SECTIONS if name in resolved]
    sampler = spec.sampling.sampler
    keys = {"sail": "TINKER_API_KEY and SAIL_API_KEY", "tinker": "TINKER_API_KEY", "local": ""}[sampler]
    return _template(f"{spec.method}.py.j2").render(
        **_common_context(spec, spec_path, spec_bytes, output_path, reward_words),
        keys=keys,
        local=sampler == "local",
        training_block=section_block("training", {k: resolved["training"][k] for k in reads}),
        config_block=config_block(sections, reads),
        schedule=spec.training.lr_schedule != "constant" or spec.training.lr_warmup_steps > 0,
        eval=spec.dataset.eval is not None,
        budget=spec.training.max_cost_usd is not None,
        has_reward=spec.reward is not None,
        conversation_doc="the messages in the row's sft.messages_field" if spec.sft and spec.sft.messages_field
        else "the prompt, then sft.completion as the assistant's reply",
    )


def default_output_path(spec_path: str | Path, spec: Spec) -> str:
    """``generated/<spec file stem>.py`` next to the current directory's ``generated/`` folder."""
    return (Path("generated") / (Path(spec_path).stem + ".py")).as_posix()
