"""Bounded reading of dataset files and specs: devices, named pipes and sockets refused up front (``stat``), a
line-length and a file-size limit stated with the line number, and rows read only as far as the range / limit
reach (the rest of the file is never read; a run keeps two integers a row, not the rows)."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
from pathlib import Path

import pytest

from sailrl.cli import main
from sailrl.runtime.data import DatasetError, RowList, load_rows, readers, sources
from sailrl.spec.schema import Spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "spec" / "examples" / "quickstart.yaml"


def make_spec(source: str, **dataset) -> Spec:
    return Spec.model_validate({
        "name": "t",
        "dataset": {"source": source, "shuffle": False, **dataset},
        "prompt": {"user": "{{ question }}=?"},
        "reward": {"rules": [{"name": "correct", "kind": "answer", "extract": {"from": "last_number"}}]},
    })


def rows(n: int) -> list[dict]:
    return [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(n)]


def write_jsonl(path: Path, data: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in data) + tail)
    return path


def in_thread(fn, timeout: float = 10.0):
    """``fn()``'s result or exception, failing the test (instead of hanging it) when it blocks."""
    out: dict = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- handed to the test
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    return t.is_alive(), out


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)
    yield path
    try:  # unblock a reader that opened it (so a failing test does not leave a thread stuck in open())
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


# ------------------------------------------------------------------------------------- devices and pipes


def test_a_fifo_as_dataset_is_refused_without_blocking(fifo, tmp_path):
    stuck, out = in_thread(lambda: load_rows(make_spec(fifo.name), tmp_path))
    assert not stuck, "load_rows blocked opening a named pipe"
    err = out["error"]
    assert isinstance(err, DatasetError) and err.key == "dataset.source"
    assert str(err) == (f"dataset.source {fifo} is a named pipe (FIFO), not a data file; point it at a .jsonl, "
                        f".json, .csv or .parquet file")


@pytest.mark.parametrize("name", ["/dev/zero", "zero.jsonl"])
def test_dev_zero_is_refused_before_reading(tmp_path, name):
    if name == "zero.jsonl":
        (tmp_path / name).symlink_to("/dev/zero")
    stuck, out = in_thread(lambda: load_rows(make_spec(name), tmp_path))
    assert not stuck
    assert "is a character device, not a data file" in str(out["error"])


def test_validate_refuses_a_device_or_a_fifo_as_dataset_source(tmp_path, fifo, capsys):
    text = QUICKSTART.read_text()
    source = next(line for line in text.splitlines() if line.strip().startswith("source:"))
    for target, kind in (("/dev/zero", "a character device"), (str(fifo), "a named pipe (FIFO)")):
        spec = tmp_path / "spec.yaml"
        spec.write_text(text.replace(source, source.split("source:")[0] + f"source: {target}"))
        assert main(["validate", str(spec)]) == 1
        err = capsys.readouterr().err
        assert f"{target} is {kind}, not a data file" in err and "S228" in err


def test_validate_refuses_a_fifo_given_as_the_spec_without_blocking(fifo, capsys):
    stuck, out = in_thread(lambda: main(["validate", str(fifo)]))
    assert not stuck, "validate blocked opening a named pipe"
    assert out["value"] == 1
    assert "this is a named pipe (FIFO), not a spec file" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- limits


def test_a_line_over_the_length_limit_is_refused_with_its_number(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 1000)
    path = write_jsonl(tmp_path / "rows.jsonl", rows(2), tail="x" * 5000)  # no newline: a file of one huge line
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("rows.jsonl"), tmp_path)
    assert str(err.value) == (f"{path}:3: line 3 is longer than 1,000 bytes, the most sailrl reads in one line; a "
                              f".jsonl or .csv file has one row per line (is this a data file?)")
    assert err.value.line == 3
    (tmp_path / "rows.csv").write_text("question,answer\n" + "y" * 5000 + ",1\n")
    with pytest.raises(DatasetError, match=r"rows.csv:2: line 2 is longer than 1,000 bytes"):
        load_rows(make_spec("rows.csv"), tmp_path)


def test_a_line_at_the_length_limit_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 200)
    line = json.dumps({"question": "1+1", "answer": "2", "pad": ""})
    line = line[:-2] + "x" * (199 - len(line)) + '"}'
    (tmp_path / "rows.jsonl").write_text(line + "\n")
    assert len(line.encode()) + 1 == 200
    assert len(load_rows(make_spec("rows.jsonl"), tmp_path).train) == 1


def test_a_file_over_the_size_limit_is_refused_with_the_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_STREAM_BYTES", 300)
    path = write_jsonl(tmp_path / "rows.jsonl", rows(20))
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("rows.jsonl"), tmp_path)
    assert str(err.value).startswith(f"{path}:{err.value.line}: the file is larger than 300 bytes, the most sailrl "
                                     f"reads from one data file")
    assert 5 < err.value.line < 20


def test_a_json_file_over_its_size_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "MAX_JSON_BYTES", 100)
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows(20), indent=1))
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("rows.json"), tmp_path)
    assert str(err.value).startswith(f"{path}:{err.value.line}: the file is larger than 100 bytes, the most sailrl "
                                     f"reads from a .json file (read whole); write the rows as JSON Lines")


# ----------------------------------------------------------------------------------- read only as needed


def test_reading_stops_at_the_limit(tmp_path):
    write_jsonl(tmp_path / "rows.jsonl", rows(5), tail="this line is not JSON\n")
    out = load_rows(make_spec("rows.jsonl", limit=5), tmp_path)
    assert [r["question"] for r in out.train] == [f"{i}+1" for i in range(5)]
    assert out.loaded is None and out.selected == 5
    out = load_rows(make_spec("rows.jsonl", range=[2, 4]), tmp_path)
    assert [r["_index"] for r in out.train] == [2, 3]
    with pytest.raises(DatasetError, match=r"rows.jsonl:6:1: malformed JSON line"):
        load_rows(make_spec("rows.jsonl"), tmp_path)  # without a limit the whole file is read, and checked


def test_csv_reading_stops_at_the_limit_and_rereads_multiline_records(tmp_path):
    (tmp_path / "rows.csv").write_text('question,answer\n"two\nlines",2\n3+3,6\nragged\n')
    out = load_rows(make_spec("rows.csv", limit=2), tmp_path)
    assert out.train == [{"question": "two\nlines", "answer": "2", "_index": 0},
                         {"question": "3+3", "answer": "6", "_index": 1}]


def test_rows_are_kept_as_keys_not_dicts(tmp_path):
    write_jsonl(tmp_path / "rows.jsonl", rows(50))
    out = load_rows(make_spec("rows.jsonl", shuffle=True, shuffle_seed=3), tmp_path)
    assert isinstance(out.train, RowList) and out.train.keys.itemsize == 8 and len(out.train.keys) == 50
    expected = [{**r, "_index": i} for i, r in enumerate(rows(50))]
    random.Random(3).shuffle(expected)  # the order a list of the rows is shuffled into
    assert out.train == expected and out.train[7] == expected[7] and out.train[10:12] == expected[10:12]


def test_a_file_replaced_by_a_shorter_one_is_one_line(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", rows(5))
    out = load_rows(make_spec("rows.jsonl"), tmp_path)
    shutil.copy(write_jsonl(tmp_path / "short.jsonl", rows(1)), path)
    with pytest.raises(DatasetError, match="changed while the run reads it"):
        out.train[4]
