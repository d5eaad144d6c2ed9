"""A preference pair's two completions as text, and why a row cannot be a pair (``method: dpo``). Plain Python,
so the validation stage checks the first data rows with the same words the run skips a row with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["not_text", "pair_problem", "reply_text"]


def reply_text(row: Mapping[str, Any], field: str) -> str:
    """The completion ``row[field]`` as text (a number as ``str`` writes it; missing or null: empty)."""
    value = row.get(field)
    return "" if value is None else value if isinstance(value, str) else str(value)


def not_text(value: Any) -> str | None:
    """What a completion's value is when it is not text (a string, or a number written as one): ``"a list"`` (a
    list of messages, as many preference datasets hold a conversation), ``"a mapping"``...; None for text."""
    if value is None or isinstance(value, str | int | float):
        return None
    return {list: "a list", dict: "a mapping"}.get(type(value), f"a {type(value).__name__}")


def pair_problem(row: Mapping[str, Any], chosen_field: str, rejected_field: str) -> str | None:
    """Why ``row`` cannot be a preference pair (a missing, empty or not-text completion, the same text chosen and
    rejected: no preference), or None."""
    for field in (chosen_field, rejected_field):
        if field not in row or row[field] is None:
            return f"it has no {field!r} field"
        kind = not_text(row[field])
        if kind is not None:
            return f"its {field!r} completion is {kind}, not text"
        if not reply_text(row, field).strip():
            return f"its {field!r} completion is empty"
    if reply_text(row, chosen_field).strip() == reply_text(row, rejected_field).strip():
        return f"its {chosen_field!r} and {rejected_field!r} completions are the same text (no preference)"
    return None
