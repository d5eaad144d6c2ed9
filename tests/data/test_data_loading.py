"""Loading a spec's dataset in every supported format: jsonl, json, csv, parquet, a save_to_disk folder, a hub id
(through a monkeypatched ``datasets.load_dataset``: tests never touch the network), and plain-words errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sailrl.runtime.data import DatasetError, load_rows
from sailrl.spec.schema import Spec

ROWS = [
    {"question": "1+2", "answer": "3"},
    {"question": "4+4", "answer": "8"},
    {"question": "9+0", "answer": "9"},
    {"question": "2+5", "answer": "007"},
]
REPO = Path(__file__).resolve().parents[2]


def make_spec(source: str, **dataset) -> Spec:
    return Spec.model_validate({
        "name": "t",
        "dataset": {"source": source, "shuffle": False, **dataset},
        "prompt": {"user": "{{ question }}=?"},
        "reward": {"rules": [{"name": "correct", "kind": "answer", "extract": {"from": "last_number"}}]},
    })


def expected(rows=ROWS):
    return [{**r, "_index": i} for i, r in enumerate(rows)]


def test_jsonl_relative_to_spec_dir(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n\n")
    out = load_rows(make_spec("data/rows.jsonl"), tmp_path)
    assert out.train == expected()
    assert out.columns == ["question", "answer"]
    assert out.eval == [] and out.skipped == []
    assert out.loaded == 4 and out.selected == 4


def test_json_array(tmp_path):
    (tmp_path / "rows.json").write_text(json.dumps(ROWS, indent=2))
    assert load_rows(make_spec("rows.json"), tmp_path).train == expected()


def test_json_file_holding_json_lines(tmp_path):
    (tmp_path / "rows.json").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert load_rows(make_spec("rows.json"), tmp_path).train == expected()


def test_csv_keeps_cells_as_typed_text(tmp_path):
    text = "question,answer\n" + "".join(f"{r['question']},{r['answer']}\n" for r in ROWS)
    (tmp_path / "rows.csv").write_text(text)
    out = load_rows(make_spec("rows.csv"), tmp_path)
    assert out.train == expected()  # "007" stays "007", not 7
    assert out.columns == ["question", "answer"]


def test_parquet(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "rows.parquet"))
    assert load_rows(make_spec("rows.parquet"), tmp_path).train == expected()


def test_absolute_path(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert load_rows(make_spec(str(path)), Path("/nonexistent-spec-dir")).train == expected()


def test_save_to_disk_datasetdict_with_named_eval_split(tmp_path):
    import datasets

    test_rows = [{"question": "5+5", "answer": "10"}, {"question": "6+1", "answer": "7"}]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS),
                               "test": datasets.Dataset.from_list(test_rows)})
    dd.save_to_disk(str(tmp_path / "addition_ds"))
    out = load_rows(make_spec("addition_ds", eval={"split": "test"}), tmp_path)
    assert out.train == expected()
    assert out.eval == expected(test_rows)


def test_save_to_disk_unknown_split_suggests(tmp_path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("ds", split="trian"), tmp_path)
    assert "no split 'trian'" in str(err.value) and "did you mean 'train'" in str(err.value)
    assert err.value.key == "dataset.split"


@pytest.fixture
def reachable_hub(monkeypatch):
    from sailrl.runtime.data import readers

    monkeypatch.setattr(readers, "hub_problem", lambda source: None)


def test_hub_id_goes_through_load_dataset_with_config_and_split(tmp_path, monkeypatch, reachable_hub):
    import datasets

    calls = []
    splits = {"train": ROWS, "test": ROWS[:1]}

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return datasets.Dataset.from_list(splits[split])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    spec = make_spec("openai/gsm8k", config="main", range=[1, 3], eval={"split": "test"})
    out = load_rows(spec, tmp_path)
    assert calls == [("openai/gsm8k", "main", "train"), ("openai/gsm8k", "main", "test")]
    assert out.train == [{**ROWS[1], "_index": 1}, {**ROWS[2], "_index": 2}]
    assert out.eval == [{**ROWS[0], "_index": 0}]
    assert out.source == "openai/gsm8k (main) [train]"


def test_hub_failure_is_one_plain_sentence(tmp_path, monkeypatch, reachable_hub):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/missing' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # a reachable hub, even where CI sets it offline
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("someone/missing"), tmp_path)
    msg = str(err.value)
    assert msg.startswith("cannot load dataset 'someone/missing' from the Hugging Face hub: ConnectionError")
    assert ".jsonl" in msg and err.value.key == "dataset.source"


def test_an_unreachable_hub_is_one_line_in_seconds(tmp_path, monkeypatch):
    import time

    import datasets
    import httpx
    from huggingface_hub import HfApi

    def unreachable(self, repo_id, **kwargs):
        assert kwargs["timeout"] == 5.0
        raise httpx.ConnectError("[Errno -2] Name or service not known")

    def never(*args, **kwargs):
        raise AssertionError("load_dataset must not be called: it retries for half a minute")

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # online (CI exports HF_HUB_OFFLINE=1)
    monkeypatch.setattr(HfApi, "dataset_info", unreachable)
    monkeypatch.setattr(datasets, "load_dataset", never)
    started = time.perf_counter()
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("openai/gsm8k"), tmp_path)
    assert time.perf_counter() - started < 2.0
    assert str(err.value) == (
        "cannot load dataset 'openai/gsm8k': the Hugging Face hub is unreachable (ConnectError: [Errno -2] Name or "
        "service not known); connect to the network, or with a cached copy set HF_HUB_OFFLINE=1; for a local file "
        "give a path ending in .jsonl, .json, .csv or .parquet (relative to the spec file)")
    assert err.value.key == "dataset.source"


def test_offline_and_not_cached_does_not_suggest_going_offline(tmp_path, monkeypatch):
    """Issue 18.12: with HF_HUB_OFFLINE=1 set and the dataset not cached, the error said "check the id and your
    network"; it says why (offline, not cached) and what to do, without suggesting what is already set."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("someone/not-cached-anywhere"), tmp_path)
    assert str(err.value) == (
        "cannot load dataset 'someone/not-cached-anywhere': it is not in the datasets cache and HF_HUB_OFFLINE is "
        "set (so the hub is not asked); load it once where the hub is reachable, or for a local file give a path "
        "ending in .jsonl, .json, .csv or .parquet (relative to the spec file)")
    assert err.value.key == "dataset.source"


def test_a_hub_id_the_hub_does_not_have(tmp_path, monkeypatch):
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    def missing(self, repo_id, **kwargs):
        response = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co/api/datasets/x"))
        raise RepositoryNotFoundError("404 Client Error", response=response)

    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # online (CI exports HF_HUB_OFFLINE=1)
    monkeypatch.setattr(HfApi, "dataset_info", missing)
    with pytest.raises(DatasetError, match=r"^cannot load dataset 'someone/nope': the hub has no dataset of that "
                                           r"name you can read \(check the id; a private one needs HF_TOKEN\)"):
        load_rows(make_spec("someone/nope"), tmp_path)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("data/nope.jsonl"), tmp_path)
    assert str(err.value) == (f"dataset file not found: {tmp_path / 'data' / 'nope.jsonl'}. Relative paths are "
                              f"relative to the spec file's folder.")


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "1+1", "answer": "2"}\n\n{"question": "2+2", "answer": 4\n')
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("rows.jsonl"), tmp_path)
    assert str(err.value).startswith(f"{path}:3:")
    assert "malformed JSON line" in str(err.value)
    assert err.value.line == 3 and err.value.path == str(path)


def test_jsonl_line_that_is_not_an_object(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1", "answer": "2"}\n[1, 2]\n')
    with pytest.raises(DatasetError, match=r"rows.jsonl:2: the line is a JSON list, not an object"):
        load_rows(make_spec("rows.jsonl"), tmp_path)


def test_non_utf8_file(tmp_path):
    (tmp_path / "rows.jsonl").write_bytes(b'{"question": "a", "answer": "b"}\n{"question": "\xff"}\n')
    with pytest.raises(DatasetError, match=r"rows.jsonl:2: not UTF-8 text"):
        load_rows(make_spec("rows.jsonl"), tmp_path)


def test_unsupported_suffix(tmp_path):
    (tmp_path / "rows.txt").write_text("hello\n")
    with pytest.raises(DatasetError, match=r"unsupported file type \.txt"):
        load_rows(make_spec("./rows.txt"), tmp_path)


def test_named_split_on_a_single_file_is_explained(tmp_path):
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("rows.jsonl", eval={"split": "test"}), tmp_path)
    assert "split 'test' does not exist" in str(err.value) and "eval.count" in str(err.value)
    assert err.value.key == "dataset.eval.split"


def test_empty_file(tmp_path):
    (tmp_path / "rows.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="the train split is empty"):
        load_rows(make_spec("rows.jsonl"), tmp_path)


def test_committed_quickstart_data():
    spec = make_spec("data/addition.jsonl")
    out = load_rows(spec, REPO / "spec" / "examples")
    assert len(out.train) == 100
    pairs = {r["question"] for r in out.train}
    assert pairs == {f"{a}+{b}" for a in range(10) for b in range(10)}
    assert all(r["answer"] == str(sum(map(int, r["question"].split("+")))) for r in out.train)


def test_generator_is_deterministic(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_addition", REPO / "spec/examples/data/make_addition.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--out", str(tmp_path / "a.jsonl")])
    assert (tmp_path / "a.jsonl").read_bytes() == (REPO / "spec/examples/data/addition.jsonl").read_bytes()
    assert len(mod.make_rows(max_operand=2, seed=5)) == 9


def test_json_object_wrapping_rows_is_explained(tmp_path):
    (tmp_path / "rows.json").write_text(json.dumps({"version": 1, "data": ROWS}, indent=2))
    with pytest.raises(DatasetError) as err:
        load_rows(make_spec("rows.json"), tmp_path)
    assert str(err.value) == (f"{tmp_path / 'rows.json'}: the file is one JSON object whose rows are under 'data'; "
                              f"write the rows as a JSON array or as JSON Lines (one object per line)")
