"""The prompt templates rendered on the first rows of a local dataset file: a template that fails on every one of
them is an error (S209), found before a run skips every row."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sailrl.compiler.checks.reader import SpecReader
from sailrl.runtime.data.base import DatasetError
from sailrl.runtime.data.readers import json_rows, read_text
from sailrl.runtime.data.sources import CsvSource, JsonlSource, ListSource
from sailrl.runtime.prompts import PromptError, render_template
from sailrl.spec.files import special_kind
from sailrl.spec.loader import dotted

#: Dataset rows validate renders the prompt templates on (a template failing on all of them is S209).
DATA_ROWS_CHECKED = 5
#: Seconds validate spends rendering templates on dataset rows.
DATA_RENDER_BUDGET_S = 1.0


def check_templates_on_data(spec: SpecReader) -> None:
    """Render the prompt templates on the first :data:`DATA_ROWS_CHECKED` rows of a local ``.jsonl`` /
    ``.csv`` / ``.json`` dataset: a template that fails on every one of them (an ``OverflowError``, a forbidden
    attribute reached through ``|attr``, a limit; not a missing or empty field, which skips the row) is an
    error (S209) quoting the failure. Within :data:`DATA_RENDER_BUDGET_S` seconds of rendering."""
    paths = [p for p in (("prompt", "system"), ("prompt", "user")) if spec.text(p) is not None
             and not any(e.key_path == dotted(p) for e in spec.errors)]
    rows = data_rows(spec) if paths else []
    if not rows:
        return
    deadline = time.monotonic() + DATA_RENDER_BUDGET_S
    for path in paths:
        template = dotted(path)
        tried, failures = 0, []
        for row in rows:
            if time.monotonic() > deadline:
                break
            try:
                render_template(spec.text(path) or "", row, template=template)
            except PromptError as exc:
                if exc.kind in ("missing-field", "null-field"):
                    continue
                failures.append(exc)
            tried += 1
        if tried and len(failures) == tried:
            first = str(failures[0]).removeprefix(f"{template} ")
            spec.at_offset(path, "S209", 0, f"fails on every one of the first {tried} dataset rows it was "
                           f"rendered on: {first}",
                           "Every row would fail the same way and be skipped; fix the template (sailrl "
                           "preflight shows rows and their prompts).")


def data_rows(spec: SpecReader) -> list[dict[str, Any]]:
    """The first rows of a local dataset file under the spec's field names (``_index`` included), or ``[]``
    when there is none or it cannot be read (the run and preflight report that)."""
    source = spec.text(("dataset", "source"))
    if not source or not spec.loaded.path.is_file() or not spec.path_ok(("dataset", "source")):
        return []
    p = Path(source.strip()).expanduser()
    full = p if p.is_absolute() else spec.loaded.base_dir / p
    suffix = full.suffix.lower()
    fields = spec.get(("dataset", "fields"))
    mapping = ({str(f): str(f) for f in fields} if isinstance(fields, list) else
               {str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else None)
    rng = spec.get(("dataset", "range"))
    start = rng[0] if isinstance(rng, list) and rng and isinstance(rng[0], int) and rng[0] >= 0 else 0
    try:
        if special_kind(full) is not None or not full.is_file():
            return []
        if suffix == ".jsonl":
            src: Any = JsonlSource(full)
        elif suffix == ".csv":
            src = CsvSource(full)
        elif suffix == ".json":
            src = ListSource(json_rows(read_text(full), full, lines=False))
        else:
            return []
        raw = [(i, r) for i, _, r in src.scan(start, start + DATA_ROWS_CHECKED)]
    except (DatasetError, OSError, ValueError):
        return []
    out = []
    for i, r in raw:
        row = dict(r) if mapping is None else {name: r[col] for name, col in mapping.items() if col in r}
        row["_index"] = i
        out.append(row)
    return out
