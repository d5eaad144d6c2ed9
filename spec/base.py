"""Base model and scalar types shared by every section of the spec.

YAML 1.1 (PyYAML's default) turns ``yes`` into ``True``, ``010`` into 8 and keeps ``1e-5`` a string.
``sailrl.spec.loader`` resolves plain scalars by YAML 1.2 core rules instead and wraps every plain scalar
that did not resolve to a string in :class:`Plain`, which remembers the exact text the user typed.
:class:`SpecModel` unwraps a ``Plain`` per field: a field typed :data:`Text` gets the raw text
(``yes`` stays ``"yes"``, ``010`` stays ``"010"``), any other field gets the resolved value.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, model_validator


@dataclass(frozen=True)
class Plain:
    """A plain (unquoted) YAML scalar that resolved to a non-string value.

    value: the YAML 1.2 core value (bool, int, float or None). raw: the text as typed.
    """

    value: Any
    raw: str


class _TextMarker:
    """Annotation marker: this string field keeps the user's exact text."""


Text = Annotated[str, _TextMarker()]


def _wants_text(annotation: Any) -> bool:
    if annotation is str:
        return True
    if typing.get_origin(annotation) is Annotated:
        args = typing.get_args(annotation)
        if any(isinstance(a, _TextMarker) for a in args[1:]) or args[0] is str:
            return True
        return _wants_text(args[0])
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return any(_wants_text(a) for a in typing.get_args(annotation) if a is not type(None))
    return False


def _allows_none(annotation: Any) -> bool:
    if annotation is Any or annotation is None or annotation is type(None):
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _allows_none(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return any(a is type(None) for a in typing.get_args(annotation))
    return False


def _wants_number(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _wants_number(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(_wants_number(a) for a in args)
    return False


def unwrap(value: Any, annotation: Any) -> Any:
    """Replace :class:`Plain` values inside ``value`` according to the field ``annotation``."""
    if isinstance(value, Plain):
        if value.value is None:
            # `key: null` / `key: ~` / `key:` means "not set" wherever None is allowed.
            return None if _allows_none(annotation) or not _wants_text(annotation) else value.raw
        if _wants_text(annotation):
            return value.raw
        if isinstance(value.value, bool) and _wants_number(annotation):
            return value.raw  # `steps: true` is an error ("expected a whole number, got 'true'"), not 1
        return value.value
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return unwrap(value, typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return unwrap(value, args[0])
        # Mixed unions: a str member wins for plain scalars; containers recurse with Any.
        if isinstance(value, list):
            inner = next((a for a in args if typing.get_origin(a) in (list, tuple)), Any)
            return unwrap(value, inner)
        if isinstance(value, dict):
            inner = next((a for a in args if typing.get_origin(a) is dict), Any)
            return unwrap(value, inner)
        return value
    if isinstance(value, list):
        if origin in (list, tuple):
            args = typing.get_args(annotation)
            if origin is tuple and args and args[-1] is not Ellipsis:
                return [unwrap(v, args[i] if i < len(args) else Any) for i, v in enumerate(value)]
            return [unwrap(v, args[0] if args else Any) for v in value]
        return [unwrap(v, Any) for v in value]
    if isinstance(value, dict):
        if origin is dict:
            _, vt = typing.get_args(annotation) or (Any, Any)
            return {_key(k): unwrap(v, vt) for k, v in value.items()}
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return value  # the nested model unwraps its own fields
        return {_key(k): unwrap(v, Any) for k, v in value.items()}
    return value


def _key(k: Any) -> Any:
    return k.raw if isinstance(k, Plain) else k


class SpecModel(BaseModel):
    """Base of every spec section: unknown keys are errors, Plain scalars are unwrapped per field."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=False, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _unwrap_plain(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out: dict[Any, Any] = {}
        by_alias = {(f.alias or n): f for n, f in cls.model_fields.items()}
        for key, value in data.items():
            key = _key(key)
            field = cls.model_fields.get(key) or by_alias.get(key)
            if field is None:
                out[key] = unwrap(value, Any)
                continue
            annotation = field.annotation
            if field.metadata:
                annotation = Annotated[(annotation, *field.metadata)]  # type: ignore[valid-type]
            out[key] = unwrap(value, annotation)
        return out


def usual_range(low: float, high: float, *, off: float | None = None) -> dict[str, Any]:
    """``json_schema_extra`` for a number field: the range its values usually lie in.

    Outside it the validation stage warns (code W101); ``off`` is a value that means "disabled" and is never
    warned about (e.g. ``0`` for a penalty). The JSON Schema gets ``x-usual-range`` (and ``x-usual-off``), which
    the spec reference lists.
    """
    extra: dict[str, Any] = {"x-usual-range": [low, high]}
    if off is not None:
        extra["x-usual-off"] = off
    return extra
