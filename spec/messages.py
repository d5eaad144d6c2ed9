"""Pydantic validation errors -> located, plain-words :class:`~sailrl.spec.errors.SpecError` s.

Pydantic ``loc`` tuples contain union member tags (e.g. ``answer`` for a discriminated reward rule, or
``list[str]``) next to real keys; only elements that are keys or indices of the loaded data are kept, so
every error points at the user's text. The model class at a data path is found by walking the schema with
the data (a rule's ``kind`` picks its class), which gives the field names for "did you mean".
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ValidationError

from sailrl.spec.base import Plain
from sailrl.spec.errors import SpecValueError

if typing.TYPE_CHECKING:
    from sailrl.spec.errors import SpecError
    from sailrl.spec.loader import KeyPath, LoadedSpec


_TYPO = 0.8  # a difflib ratio at least this high is a typo of that choice, whatever is preferred


def did_you_mean(word: str, choices: typing.Iterable[str], *, preferred: typing.Iterable[str] = ()) -> str | None:
    """The choice ``word`` most likely stands for, or None.

    Without ``preferred``: the closest of ``choices`` by ``difflib`` ratio, if at least 0.6. With ``preferred``
    (the choices that fit the place, e.g. the fields answer rules read for a reference): a choice that is a typo
    of ``word`` (ratio >= 0.8) still wins; otherwise the closest preferred choice, however different.
    """
    options = [c for c in choices if isinstance(c, str) and c != word]
    liked = [c for c in preferred if isinstance(c, str) and c != word]
    if liked:
        typo = difflib.get_close_matches(word, options, n=1, cutoff=_TYPO)
        if typo:
            return typo[0]
        return max(liked, key=lambda c: difflib.SequenceMatcher(None, word, c).ratio())
    found = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean_text(word: str, choices: typing.Iterable[str], *, preferred: typing.Iterable[str] = ()) -> str:
    """The suggestion as message text: ``" -- did you mean 'answer'?"``, or ``""`` when there is none. Every
    did-you-mean in sailrl's messages (spec problems, data, python rules, commands) is worded by this function."""
    guess = did_you_mean(word, choices, preferred=preferred)
    return f" -- did you mean '{guess}'?" if guess else ""


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _members(annotation: Any) -> list[Any]:
    annotation = _strip(annotation)
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [_strip(a) for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _kind_of(model: type[BaseModel]) -> tuple[str, ...]:
    f = model.model_fields.get("kind")
    if f is None or typing.get_origin(f.annotation) is not Literal:
        return ()
    return tuple(typing.get_args(f.annotation))


def _pick(annotation: Any, value: Any) -> Any:
    """The union member of ``annotation`` that ``value`` is meant to be (by ``kind`` or by shape)."""
    members = _members(annotation)
    if len(members) == 1:
        return members[0]
    if isinstance(value, dict):
        kind = value.get("kind")
        for m in members:
            if isinstance(m, type) and issubclass(m, BaseModel) and kind in _kind_of(m):
                return m
        for m in members:
            if typing.get_origin(m) is dict or (isinstance(m, type) and issubclass(m, BaseModel)):
                return m
    if isinstance(value, list):
        for m in members:
            if typing.get_origin(m) in (list, tuple):
                return m
    return members[0]


def field_map(model: type[BaseModel]) -> dict[str, Any]:
    """Spec key (alias when set) -> pydantic FieldInfo."""
    return {(f.alias or name): f for name, f in model.model_fields.items()}


def model_at(root: type[BaseModel], data: Any, path: KeyPath) -> tuple[Any, Any]:
    """(annotation, field info or None) of the value at ``path``; annotation is a model class for sections."""
    annotation: Any = root
    info = None
    cur = data
    for p in path:
        annotation = _pick(annotation, cur)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            info = field_map(annotation).get(p) if isinstance(p, str) else None
            if info is None:
                return None, None
            annotation = info.annotation
        elif typing.get_origin(annotation) in (list, tuple):
            args = typing.get_args(annotation)
            annotation = args[0] if typing.get_origin(annotation) is list or args[-1] is Ellipsis else (
                args[p] if isinstance(p, int) and p < len(args) else Any)
            info = None
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
            info = None
        else:
            return None, None
        cur = cur.get(p) if isinstance(cur, dict) else (
            cur[p] if isinstance(cur, list) and isinstance(p, int) and p < len(cur) else None)
    return _pick(annotation, cur), info


def _is_tag(cur: dict, elem: str, nxt: Any) -> bool:
    """Whether ``elem`` in a pydantic loc is the tag of a discriminated union rather than a key of ``cur``."""
    inner = cur.get(elem)
    return nxt in cur and not (isinstance(inner, dict) and nxt in inner)


def _data_path(loc: tuple, data: Any) -> tuple[KeyPath, Any]:
    """Keep the loc elements that are keys/indices of ``data``; also return the value there."""
    path: list[str | int] = []
    cur = data
    for i, elem in enumerate(loc):
        if isinstance(cur, dict) and isinstance(elem, str) and cur.get("kind") == elem and i + 1 < len(loc) \
                and _is_tag(cur, elem, loc[i + 1]):
            continue  # a union's tag (the rule's kind), e.g. 'judge' of a kind: judge rule that has a judge: key
        in_dict = isinstance(cur, dict) and elem in cur
        if in_dict or isinstance(cur, list) and isinstance(elem, int) and 0 <= elem < len(cur):
            path.append(elem)
            cur = cur[elem]
        elif isinstance(cur, dict) and isinstance(elem, str) and elem not in cur and elem == loc[-1]:
            path.append(elem)  # a missing key: its own path (located at the parent)
            cur = None
    return tuple(path), cur


def _show(loaded: LoadedSpec, path: KeyPath, value: Any) -> str:
    """How to quote the offending value: the source text for a scalar, else its shape."""
    info = loaded.nodes.get(path)
    if info is not None and info.node.id == "scalar":
        text = info.node.value
        return f"'{text}'" if info.node.style is None else repr(text)
    if isinstance(value, Plain):
        return f"'{value.raw}'"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return repr(value)


_EXPECTED = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "string": "text",
    "dict": "a mapping (indented `key: value` lines)",
    "model": "a mapping (indented `key: value` lines)",
    "model_attributes": "a mapping (indented `key: value` lines)",
    "list": "a list",
    "tuple": "a list",
}


def _expected_of(etype: str) -> str | None:
    for suffix in ("_type", "_parsing", "_from_float"):
        if etype.endswith(suffix):
            base = etype[: -len(suffix)]
            if etype == "int_from_float":
                return "a whole number"
            return _EXPECTED.get(base)
    return None


def _join(words: list[str], last: str = "or") -> str:
    words = list(dict.fromkeys(words))
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + f" {last} " + words[-1]


def _one(err: dict, loaded: LoadedSpec, root: type[BaseModel]) -> tuple[KeyPath, str, str | None, str, str]:
    """(path, message, hint, at, code) for one pydantic error."""
    etype = err["type"]
    ctx = err.get("ctx") or {}
    path, value = _data_path(tuple(err["loc"]), loaded.data)
    shown = _show(loaded, path, err.get("input"))
    name = str(path[-1]) if path else "spec"
    if etype == "missing":
        annotation, info = model_at(root, loaded.data, path)
        is_section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        what = "section" if is_section or len(path) == 1 else "key"
        desc = info.description if info is not None and info.description else None
        where = f" in {'.'.join(map(str, path[:-1]))}" if len(path) > 1 else ""
        hint = f"Add `{name}:`{where}" + (f" -- {desc}" if desc else ".")
        return path, f"missing required {what} '{name}'", hint, "key", "S102"
    if etype == "extra_forbidden":
        parent, _ = model_at(root, loaded.data, path[:-1])
        known = list(field_map(parent)) if isinstance(parent, type) and issubclass(parent, BaseModel) else []
        section = ".".join(map(str, path[:-1])) or "the top level"
        message = f"unknown key '{name}'" + (did_you_mean_text(name, known) or f" in {section}")
        hint = f"Keys allowed here: {', '.join(known)}." if known else None
        return path, message, hint, "key", "S101"
    if etype == "union_tag_invalid":
        tags = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",") if t.strip()]
        tag = str(ctx.get("tag", ""))
        kind_path = (*path, "kind") if isinstance(value, dict) and "kind" in value else path
        message = f"unknown kind '{tag}'" + did_you_mean_text(tag, tags)
        return kind_path, message, f"kind must be one of: {', '.join(tags)}.", "value", "S105"
    if etype == "union_tag_not_found":
        annotation, _ = model_at(root, loaded.data, path[:-1]) if path else (None, None)
        return path, "this entry needs a 'kind' (what sort of rule it is)", (
            "Add e.g. `kind: answer`, `kind: match`, `kind: termination`, `kind: length`, `kind: all_of` or "
            "`kind: any_of`."
        ), "value", "S106"
    if etype == "literal_error":
        choices = [c.strip(" '") for c in str(ctx.get("expected", "")).replace(" or ", ", ").split(",")]
        choices = [c for c in choices if c]
        message = (f"must be one of {_join([repr(c) for c in choices])}; got {shown}"
                   + did_you_mean_text(str(getattr(value, "raw", value)), choices))
        return path, message, None, "value", "S104"
    expected = _expected_of(etype)
    if expected:
        return path, f"expected {expected}, got {shown}", _section_hint(root, loaded, path, expected), "value", "S103"
    bounds = {"greater_than": ("gt", "greater than"), "greater_than_equal": ("ge", "at least"),
              "less_than": ("lt", "less than"), "less_than_equal": ("le", "at most")}
    if etype in bounds:
        key, words = bounds[etype]
        bound = ctx.get(key)
        bound = f"{bound:g}" if isinstance(bound, float) else bound
        return path, f"must be {words} {bound}, got {shown}", None, "value", "S107"
    if etype in ("too_short", "too_long"):
        annotation, _ = model_at(root, loaded.data, path)
        if typing.get_origin(annotation) is tuple:
            n = len(typing.get_args(annotation))
            return path, f"expected a list of exactly {n} values, got {ctx.get('actual_length')}", None, "value", "S108"
        if etype == "too_short":
            n = ctx.get("min_length")
            return path, f"needs at least {n} item{'s' if n != 1 else ''}", None, "value", "S108"
        n = ctx.get("max_length")
        return path, f"allows at most {n} item{'s' if n != 1 else ''}", None, "value", "S108"
    if etype == "value_error":
        exc = ctx.get("error")
        code = exc.code if isinstance(exc, SpecValueError) else "S109"  # a validator's own problem code
        return path, str(exc if exc is not None else err["msg"]), None, "value", code
    if etype == "finite_number":
        return path, f"expected a finite number, got {shown}", "Write an ordinary number such as 1e-5.", "value", "S110"
    return path, f"{err['msg'][0].lower()}{err['msg'][1:]}, got {shown}", None, "value", "S119"


def _section_hint(root: type[BaseModel], loaded: LoadedSpec, path: KeyPath, expected: str) -> str | None:
    """For a section written as a plain value (``dynamic_sampling: true``): how to write it, with its keys."""
    if not expected.startswith("a mapping") or not path:
        return None
    annotation, _ = model_at(root, loaded.data, path)
    sections = [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
    if len(sections) != 1:
        return None
    fields = field_map(sections[0])
    first = next((k for k, f in fields.items() if f.is_required()), next(iter(fields), None))
    if first is None:
        return None
    return f"Write it as a section of its own keys, e.g. `{path[-1]}: {{{first}: ...}}`; its keys: {', '.join(fields)}."


def pydantic_errors(exc: ValidationError, loaded: LoadedSpec, root: type[BaseModel]) -> list[SpecError]:
    """Plain-words SpecErrors for every error of ``exc`` (raised validating ``loaded.tree`` as ``root``).

    Errors that several union members report for the same value ("expected a mapping", "expected a list")
    are merged into one ("expected a mapping or a list").
    """
    grouped: dict[KeyPath, list[tuple[str, str | None, str, str]]] = {}
    for err in exc.errors(include_url=False):
        path, message, hint, at, code = _one(err, loaded, root)
        grouped.setdefault(path, []).append((message, hint, at, code))
    out: list[SpecError] = []
    for path, items in grouped.items():
        typed = [m for m in items if m[3] == "S103"]
        if len(typed) > 1:
            exps = [m[0][len("expected "): m[0].rindex(", got ")] for m in typed]
            got = typed[0][0][typed[0][0].rindex(", got ") + 2:]
            items = [m for m in items if m not in typed]
            items.insert(0, (f"expected {_join(exps)}, {got}", None, "value", "S103"))
        seen = set()
        for message, hint, at, code in items:
            if message in seen:
                continue
            seen.add(message)
            out.append(loaded.error(path, message, hint, at=at, code=code))
    return out


def number_text(value: int) -> str:
    """``value`` as written in a message: itself, or "a number of N digits" when it has more than 24 digits."""
    text = str(value)
    digits = len(text.lstrip("-"))
    return text if digits <= 24 else f"a number of {digits:,} digits"
