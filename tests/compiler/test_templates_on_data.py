"""validate renders the prompt templates on the first rows of a local dataset file and refuses a template that
fails on every one of them (S209); a template that fails on some rows only, or rows missing a field, pass (the
run skips those rows and preflight lists them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sailrl.compiler.validate import validate_file
from sailrl.spec.errors import SpecErrors

SPEC = """name: t
model: {{name: sailrl/tiny, renderer: role_colon}}
dataset: {{source: rows.{suffix}, fields: [question, answer]}}
prompt:
  user: "{template}"
reward:
  rules:
    - {{name: correct, kind: answer, extract: {{from: last_number}}}}
"""


def write(tmp_path: Path, template: str, rows: list[dict], suffix: str = "jsonl") -> Path:
    if suffix == "jsonl":
        (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        (tmp_path / "rows.csv").write_text("question,answer\n" + "".join(f"{r['question']},{r['answer']}\n"
                                                                         for r in rows))
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(template=template, suffix=suffix))
    return path


ROWS = [{"question": f"{i}+{i}", "answer": str(2 * i)} for i in range(8)]


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_a_template_that_overflows_on_every_row_is_refused_at_its_key(tmp_path, suffix):
    path = write(tmp_path, "{{ (question|length) ** 10000 * 1.5 }}", ROWS, suffix)
    with pytest.raises(SpecErrors) as err:
        validate_file(path)
    (e,) = [e for e in err.value.errors if e.code == "S209"]
    assert (e.key_path, e.line) == ("prompt.user", 5)
    assert e.message == ("fails on every one of the first 5 dataset rows it was rendered on: failed on this row: "
                         "OverflowError: int too large to convert to float")


def test_a_template_that_fails_on_some_rows_only_validates(tmp_path):
    bad_first = [{"question": "q" * 400, "answer": "1"}, *ROWS]  # 10**400 * 1.5 overflows; 10**3 * 1.5 does not
    validate_file(write(tmp_path, "{{ 10 ** (question|length) * 1.5 }}", bad_first))  # fails on row 0 only


def test_rows_without_the_field_are_not_counted_as_template_failures(tmp_path):
    path = write(tmp_path, "{{ question|int }}", [{"answer": "1"}] * 5)
    validate_file(path)  # the field is missing on those rows: the run skips them and says so


def test_the_starter_and_examples_stay_valid():
    root = Path(__file__).resolve().parents[2]
    for spec in sorted((root / "spec" / "examples").glob("*.yaml")):
        validate_file(spec)
