"""`sailrl validate` refuses a local dataset.source that the loader (the run, preflight) refuses, located at the
key: a file of a type it does not read, a file outside the spec's folder with no data suffix (/etc/shadow), a
folder that Dataset.save_to_disk did not write. What the loader reads validates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sailrl.cli import main
from sailrl.compiler.validate import validate_text
from sailrl.runtime.data import DatasetError, load_rows
from sailrl.spec.errors import SpecErrors
from sailrl.spec.schema import Spec

SPEC = """\
name: t
model: {{name: sailrl/tiny, renderer: role_colon}}
dataset: {{source: '{source}', fields: [question, answer], shuffle: false}}
prompt: {{user: '{{{{ question }}}}='}}
reward: {{rules: [{{name: c, kind: answer}}]}}
"""
ROWS = [{"question": "1+2", "answer": "3"}, {"question": "4+4", "answer": "8"}]


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "max.txt").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "data" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "rows.jsonl").write_text("")
    (tmp_path / "noext").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path


@pytest.mark.parametrize(("source", "message"), [
    ("data/max.txt", "{dir}/data/max.txt is not a file type sailrl reads (.txt)"),
    ("{dir}/noext", "{dir}/noext is not a file type sailrl reads (no suffix)"),
    ("plain", "{dir}/plain is a folder but not one written by Dataset.save_to_disk"),
])
def test_what_the_loader_refuses_validate_refuses_at_the_key(tmp_path, source, message):
    folder = _folder(tmp_path)
    source = source.format(dir=folder)
    spec = folder / "spec.yaml"
    text = SPEC.format(source=source)
    spec.write_text(text)  # validate reads local data files beside a spec file
    with pytest.raises(SpecErrors) as exc:
        validate_text(text, "spec.yaml", path=spec)
    (e,) = [e for e in exc.value.errors if not e.is_warning]
    assert (e.key_path, e.code, e.line, e.column) == ("dataset.source", "S229", 3, 19)
    assert e.message == message.format(dir=folder)
    with pytest.raises(DatasetError):  # the run and preflight refuse it too
        load_rows(_spec_of(text), folder)


def _spec_of(text: str) -> Spec:
    return Spec.model_validate(yaml.safe_load(text))


def test_etc_shadow_is_refused_by_validate_with_exit_1(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(source="/etc/shadow"))
    assert main(["validate", str(spec)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{spec}:3:19: dataset.source: /etc/shadow is not a file type sailrl reads (no suffix)\n")
    assert "= code: S229 data-file-type" in err


def test_what_the_loader_reads_validates(tmp_path):
    import datasets

    folder = _folder(tmp_path)
    datasets.Dataset.from_list(ROWS).save_to_disk(str(folder / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(folder / "saved_dict"))
    for source in ("data/rows.jsonl", "saved", "saved_dict", "data/../data/rows.jsonl"):
        text = SPEC.format(source=source)
        (folder / "spec.yaml").write_text(text)
        assert validate_text(text, "spec.yaml", path=folder / "spec.yaml").spec is not None
        assert len(load_rows(_spec_of(text), folder).train) == 2
