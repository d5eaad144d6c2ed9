"""``method: dpo``: the pairs of the first rows of a local dataset file can train.

- ``dpo.chosen_field`` and ``dpo.rejected_field`` must be declared dataset fields when ``dataset.fields`` is
  written (S263);
- on the data rows, neither completion may be empty or other than text (S264), and the two may not be the same
  text (S265): the run skips such a row (it holds no preference), and data full of them trains on nothing.

Each problem is reported once, for the first row that has it, at the key that names the field (``dpo.chosen_field``
/ ``dpo.rejected_field``, or ``dpo`` / ``method`` where the spec leaves the default).
"""

from __future__ import annotations

from sailrl.compiler.checks.reader import SpecReader
from sailrl.compiler.checks.templates_on_data import data_rows
from sailrl.runtime.prompts.pairs import not_text, reply_text
from sailrl.spec.loader import KeyPath

DEFAULTS = {"chosen_field": "chosen", "rejected_field": "rejected"}


def _where(spec: SpecReader, key: str) -> KeyPath:
    """The key that names the field: ``dpo.<key>`` as written, else the ``dpo`` section, else ``method``."""
    if spec.get(("dpo", key)) is not None:
        return ("dpo", key)
    return ("dpo",) if spec.get(("dpo",)) is not None else ("method",)


def check_dpo(spec: SpecReader) -> None:
    if spec.get(("method",)) != "dpo":
        return
    fields = {key: spec.text(("dpo", key)) or DEFAULTS[key] for key in DEFAULTS}
    declared = spec.declared_fields()
    if declared is not None:
        missing = [key for key, field in fields.items() if field not in declared]
        where: dict[KeyPath, list[str]] = {}
        for key in missing:  # one problem per location (the pipeline keeps one per location and code)
            where.setdefault(_where(spec, key), []).append(key)
        for path, keys in where.items():
            what = " and ".join(f"dpo.{key} {fields[key]!r}" for key in keys)
            verb = "is not a declared dataset field" if len(keys) == 1 else "are not declared dataset fields"
            spec.add(path, "S263", f"{what} {verb} (dataset.fields: {', '.join(declared) or 'none'})",
                     f"Add {' and '.join(fields[k] for k in keys)} to dataset.fields, or set "
                     f"{' and '.join(f'dpo.{k}' for k in keys)} to the fields that hold each row's chosen and "
                     "rejected completions.")
        if missing:
            return
    chosen, rejected = fields["chosen_field"], fields["rejected_field"]
    empty_seen = same_seen = False
    for row in data_rows(spec):
        if chosen not in row or rejected not in row:
            continue  # a row without the field is skipped by the run, and said so
        for key, field in (("chosen_field", chosen), ("rejected_field", rejected)):
            kind = not_text(row[field])
            if not empty_seen and kind is not None:
                empty_seen = True
                spec.add(_where(spec, key), "S264", f"dataset row {row['_index']}'s {field} completion is {kind}, "
                         "not text, so that pair cannot train", f"Give each row's {field} reply as text (the "
                         "assistant's reply after the prompt); a list of {role, content} messages is not read as one.")
            if not empty_seen and not reply_text(row, field).strip():
                empty_seen = True
                spec.add(_where(spec, key), "S264", f"dataset row {row['_index']}'s {field} completion is empty, so "
                         "that pair cannot train", f"Give every row a non-empty {field} completion, or drop the "
                         "rows without one.")
        if not same_seen and reply_text(row, chosen).strip() == reply_text(row, rejected).strip() \
                and reply_text(row, chosen).strip():
            same_seen = True
            spec.add(_where(spec, "rejected_field"), "S265", f"dataset row {row['_index']}'s {chosen} and "
                     f"{rejected} completions are the same text, so the pair states no preference",
                     "Each row's rejected completion must differ from its chosen one; drop the rows where they "
                     "agree.")
        if empty_seen and same_seen:
            return
