"""Checks of the ``environment:`` section that need other sections or the files next to the spec.

Each problem is located at its key and coded (:mod:`sailrl.spec.codes`):

- ``S250`` two tools with one name (located at the repeating tool; the schema says it at ``environment``);
- ``S251`` a feedback entry names a rule that is not a reward rule (with a did-you-mean);
- ``S203`` / ``S206`` a feedback message that does not parse, or reads a name that is neither a declared dataset
  field nor ``why`` / ``rule``;
- ``S252`` tools with a renderer that cannot write or read tool calls (``role_colon``, ``llama3``, and
  ``chat_template`` unless the model is a local folder whose chat template declares tools and writes
  ``<tool_call>`` blocks): for the built-in models the hint names ``role_colon_tools``;
- ``W130`` (warning) a feedback message that shows ``why`` of an answer rule (its reason names the reference);
- ``W131`` (warning) ``sandbox: sail`` without a tool that runs code there (the built-in python tool);
- ``W132`` (warning) feedback with ``max_turns: 1``, where no feedback turn can ever be given;
- ``S255`` the python tool with ``sandbox: worker`` (the default) where its isolation is unavailable (no bubblewrap,
  not Linux, namespaces refused): refused rather than run unisolated; ``W133`` (warning) ``sandbox:
  unisolated_worker``; ``W134`` (warning) a python tool with ``network: true``;
- ``S254`` a ``function:`` tool whose file or function does not exist, whose file raises on import, or whose
  parameters cannot be described to the model (loaded in a worker process, bounded in time, as python rules are).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sailrl.runtime.prompts import PromptError, template_variables
from sailrl.runtime.sandbox.bubblewrap import sandbox_problem
from sailrl.runtime.tools.functions import ToolFunction
from sailrl.spec.environment import SANDBOXED_TOOLS, EnvironmentSpec, ToolEntry
from sailrl.spec.errors import SpecError
from sailrl.spec.loader import LoadedSpec
from sailrl.spec.messages import did_you_mean_text
from sailrl.spec.models import BUILTIN_MODELS, UnknownModelError, chat_template_text, classify, default_renderer
from sailrl.spec.renderers import (
    CHAT_TEMPLATE_RENDERER,
    NO_TOOL_CALLS,
    ROLE_COLON_TOOLS_RENDERER,
    template_tool_support,
)

__all__ = ["check_environment"]

_FEEDBACK_NAMES = frozenset({"why", "rule"})
_TOOL_HINTS = {
    "missing_module": "Put the file next to the spec, or fix the module part of `function: file:name`.",
    "missing_function": "Define the function in that file, or fix the name after ':'.",
    "signature": "Write the tool as a plain def with a type hint on every parameter, e.g. "
                 "def lookup(city: str) -> str, and a docstring that tells the model what it does.",
}
_TOOL_HINT = "Fix the tool's file so that it imports cleanly; `sailrl validate` loads it the way the run will."


def _rule_names(data: dict[str, Any]) -> list[str] | None:
    reward = data.get("reward")
    rules = reward.get("rules") if isinstance(reward, dict) else None
    if not isinstance(rules, list):
        return None
    names = []
    for r in rules:
        if isinstance(r, dict):
            name = r.get("name") or r.get("kind")
            if isinstance(name, str):
                names.append(name)
    return names


def _answer_rules(data: dict[str, Any]) -> set[str]:
    reward = data.get("reward")
    rules = reward.get("rules") if isinstance(reward, dict) else None
    return {str(r.get("name") or r.get("kind")) for r in rules or [] if isinstance(r, dict) and r.get("kind") ==
            "answer"}


def _declared(data: dict[str, Any]) -> list[str] | None:
    ds = data.get("dataset")
    fields = ds.get("fields") if isinstance(ds, dict) else None
    if isinstance(fields, dict):
        return [str(k) for k in fields]
    if isinstance(fields, list):
        return [str(v) for v in fields]
    return None


def _renderer(data: dict[str, Any], spec_dir: Path) -> tuple[str | None, str | None]:
    """(the renderer the run will use, the model name) -- None when neither is known."""
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    name = model.get("name", "moonshotai/Kimi-K2.6")
    renderer = model.get("renderer")
    if isinstance(renderer, str):
        return renderer, name if isinstance(name, str) else None
    if not isinstance(name, str):
        return None, None
    sampling = data.get("sampling") if isinstance(data.get("sampling"), dict) else {}
    try:
        return default_renderer(name, spec_dir, embedded=sampling.get("sampler") == "local"), name
    except (UnknownModelError, OSError, ValueError):
        return None, name


def _template_problem(model: str | None, spec_dir: Path) -> str | None:
    """Why the ``chat_template`` renderer cannot declare tools for ``model`` (a local folder's template is read
    and checked, :func:`~sailrl.spec.renderers.template_tool_support`), or None when it can."""
    if model is None:
        return "the model is not known"
    try:
        source = classify(model, spec_dir)
    except (OSError, ValueError):
        return "the model cannot be found"
    if source.kind == "builtin":
        return template_tool_support(None)  # the built-in models' byte tokenizer has no chat template
    if source.kind != "local_dir" or source.path is None:
        return ("its chat template cannot be read before the run (only a local model folder's is checked "
                "offline)")
    return template_tool_support(chat_template_text(source.path))


def check_environment(loaded: LoadedSpec) -> list[SpecError]:
    """Every problem of the ``environment:`` section beyond its schema (see the module docstring)."""
    data = loaded.data if isinstance(loaded.data, dict) else {}
    env = data.get("environment")
    if not isinstance(env, dict):
        return []
    errors: list[SpecError] = []
    spec_dir = Path(loaded.path).parent if loaded.path is not None else Path(".")

    tools = env.get("tools")
    tools = tools if isinstance(tools, list) else []
    seen: dict[str, int] = {}
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            continue
        ref = t.get("function")
        name = t.get("builtin") if isinstance(t.get("builtin"), str) else (
            ref.partition(":")[2] if isinstance(ref, str) else None)
        if not name:
            continue
        if name in seen:
            key = "builtin" if "builtin" in t else "function"
            errors.append(loaded.error(("environment", "tools", i, key),
                                       f"two tools are named '{name}' (tools {seen[name] + 1} and {i + 1}): the model "
                                       "calls a tool by its name, so each needs its own",
                                       "Remove the repeated tool, or give one of the functions another name.",
                                       code="S250"))
        else:
            seen[name] = i

    rules = _rule_names(data)
    declared = _declared(data)
    feedback = env.get("feedback")
    for i, fb in enumerate(feedback if isinstance(feedback, list) else []):
        if not isinstance(fb, dict):
            continue
        rule = fb.get("rule")
        if isinstance(rule, str) and rules is not None and rule not in rules:
            errors.append(loaded.error(("environment", "feedback", i, "rule"),
                                       f"feedback names the rule '{rule}', which is not a reward rule"
                                       + did_you_mean_text(rule, rules),
                                       "The reward rules are: " + (", ".join(rules) or "(none)") + ".", code="S251"))
        message = fb.get("message")
        if isinstance(message, str):
            try:
                names = template_variables(message)
            except PromptError as exc:
                errors.append(loaded.error(("environment", "feedback", i, "message"), str(exc),
                                           "Simplify the message.", code="S208"))
                continue
            except Exception as exc:  # noqa: BLE001 - jinja2's TemplateSyntaxError and kin
                errors.append(loaded.error(("environment", "feedback", i, "message"),
                                           f"the feedback message does not parse: {exc}",
                                           "Write {{ why }} for the rule's reason, {{ field }} for a dataset field.",
                                           code="S203"))
                continue
            if "why" in names and isinstance(rule, str) and rule in _answer_rules(data):
                errors.append(loaded.error(("environment", "feedback", i, "message"),
                                           f"the feedback shows {{{{ why }}}} of the answer rule '{rule}', whose "
                                           "reason names the reference answer (\"answer '8' != reference 7\"): "
                                           "the model would be told the answer it is scored on",
                                           "Leave {{ why }} out (e.g. 'Not quite. Try again.'), or use a format "
                                           "rule's reason.", code="W130", severity="warning"))
            if declared is not None:
                unknown = sorted(n for n in names if n not in declared and n not in _FEEDBACK_NAMES)
                if unknown:
                    allowed = sorted(set(declared) | _FEEDBACK_NAMES)
                    errors.append(loaded.error(("environment", "feedback", i, "message"),
                                               f"the feedback message uses '{unknown[0]}', which is not a dataset "
                                               "field nor why / rule" + did_you_mean_text(unknown[0], allowed),
                                               "It may use: " + ", ".join(allowed) + ".", code="S206"))

    if tools:
        renderer, model = _renderer(data, spec_dir)
        template_why = _template_problem(model, spec_dir) if renderer == CHAT_TEMPLATE_RENDERER else None
        if renderer in NO_TOOL_CALLS and not (renderer == CHAT_TEMPLATE_RENDERER and template_why is None):
            builtin = model in BUILTIN_MODELS
            why = ("has no tool-calling convention" if renderer != "chat_template"
                   else f"cannot give this model tools: {template_why}")
            hint = (f"Set model.renderer: {ROLE_COLON_TOOLS_RENDERER} (role_colon with <tool_call> blocks) for the "
                    "built-in models." if builtin or renderer == "role_colon" else
                    "Choose a renderer that writes tool calls for this model (e.g. qwen3, kimi_k26, deepseekv3).")
            key = ("model", "renderer") if isinstance((data.get("model") or {}).get("renderer"), str) \
                else ("environment", "tools")
            errors.append(loaded.error(key, f"the spec has tools, but the renderer '{renderer}' {why}, so the "
                                       f"model{' ' + model if model else ''} cannot call them", hint, code="S252"))

    max_turns = env.get("max_turns", EnvironmentSpec.model_fields["max_turns"].default)
    if isinstance(feedback, list) and feedback and max_turns == 1:
        errors.append(loaded.error(("environment", "max_turns") if "max_turns" in env else ("environment", "feedback"),
                                   "the spec has feedback, but environment.max_turns is 1: a feedback turn is "
                                   "followed by another answer, so an episode of one assistant turn never gets it",
                                   "Set environment.max_turns: 2 or more (one more than the answers you allow), or "
                                   "remove the feedback.", code="W132", severity="warning"))

    if env.get("sandbox") == "sail" and not any(isinstance(t, dict) and t.get("builtin") in SANDBOXED_TOOLS
                                                 for t in tools):
        errors.append(loaded.error(("environment", "sandbox"), "environment.sandbox is sail, but no tool runs code "
                                   "there (only the built-in python tool does), so no Sailbox would start",
                                   "Add `- builtin: python` to environment.tools, or remove sandbox: sail.",
                                   code="W131", severity="warning"))

    errors += _sandbox_problems(loaded, env, tools)

    for i, raw in enumerate(tools):
        try:
            t = ToolEntry.model_validate(raw)
        except ValidationError:
            continue  # the schema reports it; only the tool entries valid on their own are loaded
        if t.function is None or seen.get(t.name, i) != i:
            continue
        problem = ToolFunction(spec_dir, t.function, timeout_s=t.timeout_s, memory_mb=t.memory_mb,
                               max_output_chars=t.max_output_chars).load()[1]
        if problem is not None:
            code, words = problem
            errors.append(loaded.error(("environment", "tools", i, "function"), f"tool '{t.name}': {words}",
                                       _TOOL_HINTS.get(code, _TOOL_HINT), code="S254"))
    return errors


def _sandbox_problems(loaded: LoadedSpec, env: dict[str, Any], tools: list[Any]) -> list[SpecError]:
    """S255 when the python tool's isolation is unavailable here (never a silent downgrade), W133 when the spec
    opts out of it, W134 for a python tool with network access."""
    errors: list[SpecError] = []
    sandbox = env.get("sandbox", EnvironmentSpec.model_fields["sandbox"].default)
    python = [i for i, t in enumerate(tools) if isinstance(t, dict) and t.get("builtin") == "python"]
    if not python:
        return errors
    if sandbox == "worker":
        problem = sandbox_problem()
        if problem is not None:
            errors.append(loaded.error(("environment", "tools", python[0], "builtin"), f"the python tool runs the "
                                       f"model's code isolated from this machine, and {problem}",
                                       "Install what it names, or set environment.sandbox: sail (a Sailbox), or "
                                       "environment.sandbox: unisolated_worker to run the model's code without "
                                       "isolation (it can then read this machine's files and keys).", code="S255"))
    elif sandbox == "unisolated_worker":
        errors.append(loaded.error(("environment", "sandbox"), "environment.sandbox is unisolated_worker: the "
                                   "model's code runs on this machine without isolation, so it can read your files "
                                   "and keys (and edit the reward rules' files) and reach the network",
                                   "Remove sandbox: unisolated_worker to run it isolated (the default, bubblewrap), "
                                   "or use sandbox: sail.", code="W133", severity="warning"))
    for i in python:
        if tools[i].get("network") is True:
            errors.append(loaded.error(("environment", "tools", i, "network"), "the python tool has network: true, "
                                       "so the model's code can send what it finds and fetch what it likes from "
                                       "this machine's network", "Remove network: true unless the task needs it.",
                                       code="W134", severity="warning"))
    return errors
