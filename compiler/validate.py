"""The validation stage: a spec file -> every problem in it, located and coded, or a spec ready to compile and run.

:func:`validate_file` / :func:`validate_text` run, in one pass:

1. YAML and the schema (:func:`sailrl.spec.loader.parse_spec_text`): after a YAML syntax error, the part of the
   file before it is still read, so the syntax error and every problem before it are reported together;
2. the semantic checks (:func:`sailrl.compiler.checks.check_spec`): regexes, templates rendered on an example row
   in the runtime's bounded sandbox, model, training, sampling, data, and warnings for unusual values;
3. the budget checks (``sailrl.compiler.cost_checks``) and the ``environment:`` checks
   (``sailrl.compiler.episode_checks``: feedback rules, tool files and functions, a renderer that writes tool calls);
4. the reward rules' own checks and the worked reward ``examples:`` (``sailrl.compiler.reward_checks``), on the
   valid rules, also when other parts of the spec are not. An example that expects a score of a broken rule (or
   the total, while any rule is broken) is skipped, and one warning says which and why.

Problems are de-duplicated by (location, code); a schema complaint about a pattern that a check located more
precisely is dropped. Warnings never fail validation: they are returned on ``LoadedSpec.warnings`` (and listed
with the errors in :class:`~sailrl.spec.errors.SpecErrors` when there are errors too).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from sailrl.compiler import reward_checks
from sailrl.compiler.checks import check_spec
from sailrl.compiler.cost_checks import check_costs
from sailrl.compiler.episode_checks import check_environment
from sailrl.spec.errors import SpecError, SpecErrors
from sailrl.spec.loader import LoadedSpec, dedupe, parse_spec_text, read_spec_file
from sailrl.spec.rewards import RewardExample, RewardRule, RewardSpec
from sailrl.spec.schema import PromptSpec, Spec

__all__ = ["problems", "validate_file", "validate_text"]

_PATTERN_CODES = frozenset({"S201", "S202"})
# Check problems that make a rule unusable for scoring (the schema's own complaints are found per rule).
_RULE_CODES = _PATTERN_CODES
# The top-level sections whose value is a mapping (a model of the schema, or None where it may be absent).
_MAPPING_SECTIONS = frozenset(
    name for name, f in Spec.model_fields.items()
    if any(isinstance(t, type) and issubclass(t, BaseModel)
           for t in (f.annotation, *(get_args(f.annotation) if get_origin(f.annotation) is not list else ()))))
_SAYS_NOTHING: dict[str, dict[str, Any]] = {"model": {"name": None}}


def validate_file(path: str | Path, *, judges: Any = None) -> LoadedSpec:
    """Every check of ``sailrl validate`` on the spec file at ``path``.

    Returns the :class:`LoadedSpec` (``.spec`` validated, ``.warnings`` possibly non-empty). Raises
    :class:`SpecErrors` with every problem (warnings included) when there is at least one error; a missing,
    unreadable, oversized or non-UTF-8 file is one problem.

    judges: a callable ``(reward_fn) -> {rule: why not connected}`` that connects ``kind: judge`` rules to their
    models (``sailrl validate`` passes one for local judges, and for every judge with ``--judge``); a judge rule
    left unconnected has its examples listed as not checked (W112) and no injection probes.
    """
    text, digest = read_spec_file(path)
    return validate_text(text, str(path), path=Path(path), sha256=digest, judges=judges)


def validate_text(text: str, filename: str = "<string>", *, path: Path | None = None,
                  sha256: str | None = None, judges: Any = None) -> LoadedSpec:
    """Every check of ``sailrl validate`` on spec source ``text`` (``filename`` names it in error locations).

    Relative paths in the spec resolve against ``path``'s folder (default: the current one). Returns or raises
    as :func:`validate_file` does.
    """
    loaded, found = problems(text, filename, path=path, sha256=sha256, judges=judges)
    if any(not e.is_warning for e in found):
        raise SpecErrors(found, loaded.text)
    loaded.warnings = [e for e in found if e.is_warning]
    return loaded


def problems(text: str, filename: str = "<string>", *, path: Path | None = None,
             sha256: str | None = None, judges: Any = None) -> tuple[LoadedSpec, list[SpecError]]:
    """(the loaded spec, every problem of ``text``: errors and warnings). Never raises for a user error."""
    loaded, schema_errors = parse_spec_text(text, filename, path=path, sha256=sha256)
    if loaded.tree is None or not isinstance(loaded.tree, dict):
        return loaded, schema_errors
    check_errors = check_spec(loaded)
    check_errors += _cost_checks(loaded)
    check_errors += _episode_checks(loaded)
    found = _drop_covered(schema_errors, check_errors) + check_errors
    found += _reward_checks(loaded, found, judges)  # the rules' own checks (python, answer, judge) and the examples
    wrong = {e.key_path for e in found if not e.is_warning}
    return loaded, dedupe([e for e in found if not (e.is_warning and e.key_path in wrong)])


def _cost_checks(loaded: LoadedSpec) -> list[SpecError]:
    return list(check_costs(loaded))


def _episode_checks(loaded: LoadedSpec) -> list[SpecError]:
    return list(check_environment(_mapping_sections(loaded)))


def _mapping_sections(loaded: LoadedSpec) -> LoadedSpec:
    """``loaded`` with every top-level section that must be a mapping and is not (``model: Qwen/Qwen3-8B``) read
    as one that says nothing: the schema reports that section at its place, and a check that reads it as a mapping
    finds no values in it instead of failing on a plain value. A ``model:`` that says nothing names no model (left
    out, it would name the default one, and the checks would speak of a model the spec does not name)."""
    data = loaded.data if isinstance(loaded.data, dict) else {}
    shaped = {k: v if k not in _MAPPING_SECTIONS or v is None or isinstance(v, dict) else _SAYS_NOTHING.get(k, {})
              for k, v in data.items()}
    return loaded if shaped == data else dataclasses.replace(loaded, data=shaped)


def _drop_covered(schema_errors: list[SpecError], check_errors: list[SpecError]) -> list[SpecError]:
    """Drop a schema validator's pattern complaint where a check already located the same pattern precisely,
    and its duplicate-rule-name complaint (at ``reward``) where the check located it at the repeating rule."""
    patterns = [e.key_path for e in check_errors if e.code in _PATTERN_CODES]
    duplicate_names = any(e.code == "S221" for e in check_errors)
    duplicate_tools = any(e.code == "S250" for e in check_errors)

    def covered(e: SpecError) -> bool:
        if e.code == "S221":
            return duplicate_names
        if e.code == "S250":
            return duplicate_tools
        if e.code not in _PATTERN_CODES:
            return False
        return any(p == e.key_path or p.startswith(e.key_path + ".") for p in patterns)

    return [e for e in schema_errors if not covered(e)]


def _reward_checks(loaded: LoadedSpec, found: list[SpecError], judges: Any = None) -> list[SpecError]:
    """The reward rules' own checks (``check_reward_rules``: python rules that cannot load, answer rules that
    can be gamed) and the worked examples' problems, both on the valid rules; one W104 warning names the examples
    skipped. Nothing runs on a reward section a YAML syntax error cut short.
    """
    raw = loaded.data.get("examples") if isinstance(loaded.data, dict) else None
    has_examples = isinstance(raw, list) and bool(raw)
    if not loaded.complete and "reward" not in loaded.complete_sections:
        if not has_examples:
            return []
        return [loaded.error(("examples",), "the worked examples were not scored: the YAML syntax error stops the "
                             "file before the reward rules are complete",
                             "Fix the syntax error; `sailrl validate` then scores every example.", code="W104",
                             severity="warning", at="key")]
    view = _examples_view(loaded, found)
    if view is None:
        if not has_examples:
            return []
        return [loaded.error(("examples",), "the worked examples were not scored: the reward section has problems "
                             "(listed here) that stop sailrl from building the reward",
                             "Fix the reward rules; `sailrl validate` then scores every example.", code="W104",
                             severity="warning", at="key")]
    spec_view, skipped, broken = view
    if spec_view.reward is None or spec_view.prompt is None:
        return []  # a method that reads no reward rules (sft and dpo may leave them out): nothing to check
    if not loaded.complete and "examples" not in loaded.complete_sections:
        spec_view = spec_view.model_copy(update={"examples": []})
        if has_examples:
            skipped, broken = list(range(len(raw))), []
    with_view = dataclasses.replace(loaded, spec=spec_view)
    fn, unconnected = reward_checks.reward_function(with_view, judges)  # one, shared: judges connect once
    try:
        out: list[SpecError] = list(reward_checks.check_reward_rules(with_view, fn=fn, unconnected=unconnected))
        out += reward_checks.check_reward_examples(with_view, fn=fn, unconnected=unconnected)
    finally:
        fn.close_judges()  # what connecting opened (a local judge's backend) does not outlive the validation
    if skipped:
        which = ", ".join(str(i + 1) for i in skipped)
        why = (f"they expect a score of rule {', '.join(repr(b) for b in broken)} or the total, and that rule has "
               "problems (listed here)") if broken else "the YAML syntax error cuts the examples short"
        out.append(loaded.error(
            ("examples",),
            f"{len(skipped)} of {len(raw)} worked examples (number {which}) were not scored: {why}",
            "Fix that first; `sailrl validate` then scores these examples too.",
            code="W104", severity="warning", at="key",
        ))
    return out


def _examples_view(loaded: LoadedSpec, found: list[SpecError]) -> tuple[Any, list[int], list[str]] | None:
    """(a Spec carrying what the examples need, indices of skipped examples, names of broken rules), or None.

    The view holds the valid rules, the reward settings, ``prompt.reference_field`` and the examples, with
    ``None`` in place of every example that is invalid or depends on a broken rule.
    """
    from pydantic import TypeAdapter, ValidationError


    rule_problems = [e for e in found if e.code in _RULE_CODES and e.key_path.startswith("reward.rules.")]
    if loaded.spec is not None and not rule_problems:
        return loaded.spec, [], []
    tree = loaded.tree if isinstance(loaded.tree, dict) else {}
    reward = tree.get("reward")
    if not isinstance(reward, dict) or not isinstance(reward.get("rules"), list):
        return None
    adapter: TypeAdapter[Any] = TypeAdapter(RewardRule)
    valid_rules: list[Any] = []
    broken: list[str] = []
    flagged = {int(e.key_path.split(".")[2]) for e in rule_problems if e.key_path.split(".")[2].isdigit()}
    for i, rule in enumerate(reward["rules"]):
        try:
            if i in flagged:
                raise ValueError("the checks found a problem in this rule")
            adapter.validate_python(rule)
        except (ValidationError, ValueError):
            data = loaded.data["reward"]["rules"][i] if isinstance(loaded.data.get("reward"), dict) else {}
            name = (data.get("name") or data.get("kind")) if isinstance(data, dict) else None
            broken.append(str(name) if name else f"rule {i + 1}")
            continue
        valid_rules.append(rule)
    if not valid_rules:
        return None
    try:
        reward_spec = RewardSpec.model_validate({**reward, "rules": valid_rules})
    except ValidationError:
        return None
    valid_names = {str(r.name) for r in reward_spec.rules}
    if len(valid_names) != len(reward_spec.rules):
        return None
    prompt = tree.get("prompt")
    try:
        reference_field = PromptSpec.model_validate(prompt).reference_field if isinstance(prompt, dict) else "answer"
    except ValidationError:
        ref = prompt.get("reference_field") if isinstance(prompt, dict) else None
        reference_field = ref if isinstance(ref, str) else "answer"
    examples: list[Any] = []
    skipped: list[int] = []
    items = tree.get("examples")
    for i, raw in enumerate(items if isinstance(items, list) else []):
        try:
            ex = RewardExample.model_validate(raw)
        except ValidationError:
            examples.append(None)  # its own problems are reported by the schema
            continue
        if broken and (ex.expect_total is not None or not set(ex.expect) <= valid_names):
            examples.append(None)
            skipped.append(i)
            continue
        examples.append(ex)
    view = Spec.model_construct(name=str(loaded.data.get("name") or "spec"), reward=reward_spec,
                                prompt=PromptSpec.model_construct(user="", system=None,
                                                                  reference_field=reference_field),
                                examples=examples)
    return view, skipped, broken
