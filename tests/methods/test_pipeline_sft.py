"""The worked pipeline, ``spec/examples/pipeline/``: SFT, then RL from the SFT stage's final weights
(``training.init_from: runs/sums-sft``), on the embedded backend with a few steps of small groups."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sailrl.cli import main
from sailrl.runtime.backends.backend import local_checkpoint_dir

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--set", "1:training.steps=4", "--set", "1:training.eval_every=0", "--set", "2:training.steps=2",
         "--set", "2:training.groups_per_step=4", "--set", "2:training.group_size=4"]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def adapter(local_path: str) -> dict[str, torch.Tensor]:
    """The LoRA tensors of a ``local://RUN/sampler_weights/NAME`` checkpoint."""
    run, kind, name = local_path.removeprefix("local://").split("/")
    return load_file(local_checkpoint_dir() / run / kind / name / "adapter_model.safetensors")


@pytest.mark.slow
def test_the_rl_stage_samples_its_first_step_from_the_sft_stage_s_final_weights(tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "spec" / "examples" / "pipeline", tmp_path / "pipeline")
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "spec" / "examples" / "data" / "addition.jsonl", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "pipeline/sft.yaml", "pipeline/rl.yaml", *SMALL]) == 0
    err = capsys.readouterr().err
    sft, rl = tmp_path / "pipeline" / "runs" / "sums-sft", tmp_path / "pipeline" / "runs" / "sums-rl"
    final = records(sft / "checkpoints.jsonl")[-1]
    assert final["final"] and final["batch"] == 4
    assert json.loads((sft / "config.json").read_text(encoding="utf-8"))["spec"]["method"] == "sft"
    config = json.loads((rl / "config.json").read_text(encoding="utf-8"))
    assert config["init_from"] == {"state_path": final["state_path"], "run_dir": str(sft)}
    assert f"stage 1/2 (pipeline/sft.yaml): method sft, run directory {sft}\n" in err
    assert f"stage 2/2 (pipeline/rl.yaml): method rl, run directory {rl}\n" in err

    # The RL stage's step-1 snapshot, the weights its first rollouts were sampled from, is the SFT stage's final
    # adapter, tensor for tensor; its step-2 snapshot has moved on.
    snapshots = {r["step"]: r["sampler_path"] for r in records(rl / "rollouts.jsonl")}
    start, trained = adapter(final["sampler_path"]), adapter(snapshots[1])
    assert start.keys() == trained.keys() and len(start) > 0
    assert all(torch.equal(start[k], trained[k]) for k in start)
    assert not all(torch.equal(start[k], v) for k, v in adapter(snapshots[2]).items())

    # And its first step is that of the same spec given the SFT checkpoint path: the same rollouts, the same reward.
    assert main(["run", "pipeline/rl.yaml", *[a.removeprefix("2:") for a in SMALL[4:]],
                 "--set", f"training.init_from={final['state_path']}", "--set", "output.run_dir=runs/check"]) == 0
    check = tmp_path / "pipeline" / "runs" / "check"
    first = [(r["row"], r["completion"]) for r in records(rl / "rollouts.jsonl") if r["step"] == 1]
    assert first == [(r["row"], r["completion"]) for r in records(check / "rollouts.jsonl") if r["step"] == 1]
    assert records(rl / "metrics.jsonl")[0]["reward/total"] == records(check / "metrics.jsonl")[0]["reward/total"]


def test_an_rl_key_set_for_every_stage_names_the_stage_that_refuses_it_and_the_numbered_form(tmp_path, monkeypatch,
                                                                                          capsys):
    """``--set training.group_size=4`` reaches the SFT stage too, which refuses it (S257): the lines under the
    problem say which stage's overrides they are and how to aim one at one stage; nothing runs."""
    shutil.copytree(ROOT / "spec" / "examples" / "pipeline", tmp_path / "pipeline")
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "spec" / "examples" / "data" / "addition.jsonl", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "pipeline/sft.yaml", "pipeline/rl.yaml", "--set", "training.group_size=4"]) == 2
    err = capsys.readouterr().err
    assert "training.group_size: training.group_size is read only by method distill and rl; this spec's method " \
           "is sft" in err and "= code: S257 key-of-another-method" in err
    assert err.endswith("(these come from the --set overrides of stage 1, pipeline/sft.yaml: training.group_size=4)\n"
                        "(--set KEY=VALUE applies to every stage; --set N:KEY=VALUE to stage N only)\n")
    assert not (tmp_path / "pipeline" / "runs").exists()
