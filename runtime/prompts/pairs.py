"""A preference pair's two completions as text, and why a row cannot be a pair (``method: dpo``). Plain Python,
so the validation stage checks the first data rows with the same words the run skips a row with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["pair_problem", "reply_text"]


def reply_text(row: Mapping[str, Any], field: str) -> str:
    """The completion ``row[field]`` as text (a number as ``str`` writes it; missing or null: empty)."""
    value = row.get(field)
    return "" if value is None else value if isinstance(value, str) else str(value)


def pair_problem(row: Mapping[str, Any], chosen_field: str, rejected_field: str) -> str | None:
    """Why ``row`` cannot be a preference pair (a missing or empty completion, the same text chosen and
    rejected: no preference), or None."""
    for field in (chosen_field, rejected_field):
        if field not in row or row[field] is None:
            return f"it has no {field!r} field"
        if not reply_text(row, field).strip():
            return f"its {field!r} completion is empty"
    if reply_text(row, chosen_field).strip() == reply_text(row, rejected_field).strip():
        return f"its {chosen_field!r} and {rejected_field!r} completions are the same text (no preference)"
    return None
