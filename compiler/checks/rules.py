"""The reward rules' fields that the rule engine cannot check alone: every ``pattern`` under ``reward:`` compiles
within the pattern limits (S201), no two rules share a name (S221), and each ``reference.field`` is a declared
dataset field (S219)."""

from __future__ import annotations

from typing import Any

from sailrl.compiler.checks.reader import SpecReader
from sailrl.spec.constants import REGEX_FLAGS
from sailrl.spec.loader import KeyPath
from sailrl.spec.patterns import PatternError, compile_pattern


def check_regexes(spec: SpecReader) -> None:
    """Every `pattern` under reward: compiles with `regex`, within the pattern limits."""
    reward = spec.get(("reward",))
    if not isinstance(reward, dict):
        return
    for path, owner in walk_dicts(reward, ("reward",)):
        if "pattern" not in owner:
            continue
        p_path = (*path, "pattern")
        pattern = spec.text(p_path)
        if pattern is None:
            continue
        flags = owner.get("flags") if isinstance(owner.get("flags"), list) else []
        _compile(spec, p_path, pattern, [f for f in flags if f in REGEX_FLAGS])


def _compile(spec: SpecReader, path: KeyPath, pattern: str, flags: list[str]) -> Any:
    try:
        return compile_pattern(pattern, flags)
    except PatternError as exc:
        pos = exc.pos
        where = f" at position {pos}" if pos is not None else ""
        hint = None
        if pos is not None and len(pattern) <= 200:
            hint = f"In the pattern:\n{pattern}\n{' ' * pos}^ {exc.message}"
        info = spec.loaded.nodes.get(path)
        if "\\" in pattern and info is not None and getattr(info.node, "style", None) == '"':
            tip = "Write patterns in single quotes: inside double quotes YAML interprets backslashes."
            hint = f"{hint}\n{tip}" if hint else tip
        if exc.limit:
            message = f"this regular expression is over a limit: {exc.message}"
        else:
            message = f"this regular expression does not compile: {exc.message}{where}"
        if pos is not None:
            spec.at_offset(path, "S201", pos, message, hint)
        else:
            spec.add(path, "S201", message, hint)
        return None


def check_rules(spec: SpecReader) -> None:
    """Rule names are unique (each is the metric key ``reward/<name>``); references read declared fields."""
    rules = spec.get(("reward", "rules"))
    if not isinstance(rules, list):
        return
    declared = spec.declared_fields()
    first_with_name: dict[str, int] = {}
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        path = ("reward", "rules", i)
        name = spec.text((*path, "name")) or spec.text((*path, "kind"))
        if name is not None and name in first_with_name:
            at = ("name",) if spec.text((*path, "name")) is not None else ("kind",)
            line = (spec.loaded.locate(("reward", "rules", first_with_name[name])) or (0, 0))[0]
            spec.add((*path, *at), "S221", f"two rules are named '{name}' (the first is at line {line}): give "
                     "each rule its own `name`; it is the metric key reward/<name>")
        elif name is not None:
            first_with_name[name] = i
        for sub_path, _owner in walk_dicts(rule, path):
            if sub_path[-1] == "reference" and declared is not None:
                ref_field = spec.text((*sub_path, "field"))
                if ref_field is not None and ref_field not in declared:
                    spec.unknown_field((*sub_path, "field"), ref_field, declared, reference=True)


def walk_dicts(value: Any, path: KeyPath):
    """Yield (path, dict) for ``value`` and every dict nested in it."""
    if isinstance(value, dict):
        yield path, value
        for k, v in value.items():
            yield from walk_dicts(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk_dicts(v, (*path, i))
