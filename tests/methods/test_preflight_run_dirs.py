"""``sailrl preflight`` reads the run directories a spec starts from, as ``sailrl run SPEC`` does before its first
step: ``training.init_from``'s (S261 / S262, located at the key) and a distillation teacher's
(``distill.teacher.checkpoint``). A spec whose run would stop there is "not ready" (exit 1), not "ready"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sailrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "spec" / "examples"


def _flat(text: str) -> str:
    """The report with its line breaks as spaces: rich wraps it at the terminal's width, which tests do not fix."""
    return " ".join(text.split())


def _pipeline(tmp_path: Path) -> Path:
    """The worked pipeline's folder, with its data, and no run of its SFT stage."""
    shutil.copytree(EXAMPLES / "pipeline", tmp_path / "pipeline")
    (tmp_path / "data").mkdir()
    shutil.copy(EXAMPLES / "data" / "addition.jsonl", tmp_path / "data")
    return tmp_path / "pipeline"


def _finished_run(folder: Path, *, model: str, lora_rank: int) -> None:
    """A run directory as a finished embedded-backend run leaves it: its config and a final checkpoint record."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"spec": {"model": {"name": model, "lora_rank": lora_rank}}}))
    (folder / "checkpoints.jsonl").write_text(json.dumps({
        "name": "sums-sft-final", "batch": 30, "final": True,
        "state_path": "local://tiny-arith-0/weights/sums-sft-final",
        "sampler_path": "local://tiny-arith-0/sampler_weights/sums-sft-final"}) + "\n")


def test_a_second_stage_whose_first_has_not_run_is_not_ready(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(_pipeline(tmp_path))
    assert main(["preflight", "rl.yaml"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("rl.yaml:46:14: training.init_from: there is no run directory runs/sums-sft (a path "
                          "without :// names an earlier run's folder, relative to the spec's folder)\n")
    assert "= code: S261 init-from-unfinished" in err
    assert ("not ready: training.init_from: there is no run directory runs/sums-sft (a path without :// names an "
            "earlier run's folder, relative to the spec's folder) -- Run the spec that writes it first") in _flat(out)
    assert "ready: no problems found" not in out


def test_a_finished_run_of_another_rank_is_located_s262(tmp_path, monkeypatch, capsys):
    folder = _pipeline(tmp_path)
    _finished_run(folder / "runs" / "sums-sft", model="sailrl/tiny-arith", lora_rank=8)
    monkeypatch.chdir(folder)
    assert main(["preflight", "rl.yaml"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("rl.yaml:46:14: training.init_from: the weights of the run in runs/sums-sft are a LoRA of "
                          "rank 8, and this spec's model.lora_rank is 16")
    assert "= hint: Set model.lora_rank: 8 here." in err and "= code: S262 init-from-other-model" in err
    assert "not ready: training.init_from: the weights of the run in runs/sums-sft are a LoRA of rank 8" in _flat(out)


def test_a_finished_run_of_this_model_and_rank_is_ready(tmp_path, monkeypatch, capsys):
    folder = _pipeline(tmp_path)
    _finished_run(folder / "runs" / "sums-sft", model="sailrl/tiny-arith", lora_rank=16)
    monkeypatch.chdir(folder)
    assert main(["preflight", "rl.yaml"]) == 0
    out, err = capsys.readouterr()
    assert "init_from" not in err + out
    assert out.rstrip().endswith("ready: no problems found")


def test_an_init_from_set_on_the_command_line_is_checked_too(tmp_path, monkeypatch, capsys):
    folder = _pipeline(tmp_path)
    _finished_run(folder / "runs" / "sums-sft", model="sailrl/tiny-arith", lora_rank=16)
    monkeypatch.chdir(folder)
    assert main(["preflight", "rl.yaml", "--set", "training.init_from=runs/other"]) == 1
    out, err = capsys.readouterr()
    assert "rl.yaml:46" not in err  # the file's value is not the one that fails
    assert "not ready: training.init_from: there is no run directory runs/other" in _flat(out)


def test_a_distillation_teacher_folder_that_is_not_there_is_not_ready(tmp_path, monkeypatch, capsys):
    shutil.copy(EXAMPLES / "distill_sums.yaml", tmp_path)
    (tmp_path / "data").mkdir()
    shutil.copy(EXAMPLES / "data" / "addition.jsonl", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    assert main(["preflight", "distill_sums.yaml", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    teacher = tmp_path / "runs" / "quickstart"
    assert report["blocking"] is True
    assert report["verdict"] == (f"not ready: distill.teacher.checkpoint: there is no folder {teacher} (a path "
                                 "without :// names a finished run's folder, relative to the spec's folder): run "
                                 "the teacher's spec first, or name a tinker:// or local:// sampler checkpoint")


def test_a_teacher_run_of_another_model_is_not_ready_with_the_name_to_set(tmp_path, monkeypatch, capsys):
    shutil.copy(EXAMPLES / "distill_sums.yaml", tmp_path)
    (tmp_path / "data").mkdir()
    shutil.copy(EXAMPLES / "data" / "addition.jsonl", tmp_path / "data")
    _finished_run(tmp_path / "runs" / "quickstart", model="sailrl/tiny", lora_rank=16)
    monkeypatch.chdir(tmp_path)
    assert main(["preflight", "distill_sums.yaml", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == ("not ready: distill.teacher.checkpoint: the run in runs/quickstart trained "
                                 "sailrl/tiny, not distill.teacher.name sailrl/tiny-arith: its adapter loads only "
                                 "into sailrl/tiny -- set distill.teacher.name: sailrl/tiny")


def test_a_teacher_run_of_the_teacher_s_model_is_ready(tmp_path, monkeypatch, capsys):
    shutil.copy(EXAMPLES / "distill_sums.yaml", tmp_path)
    (tmp_path / "data").mkdir()
    shutil.copy(EXAMPLES / "data" / "addition.jsonl", tmp_path / "data")
    _finished_run(tmp_path / "runs" / "quickstart", model="sailrl/tiny-arith", lora_rank=16)
    monkeypatch.chdir(tmp_path)
    assert main(["preflight", "distill_sums.yaml", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "ready: no problems found"
