"""method: sft end to end on the embedded backend: `sailrl run` of the example trains (the NLL falls, train and
held-out), writes the run directory a later stage reads (metrics, checkpoints with the final sampler weights), and a
run stopped and resumed logs the same steps as one that was not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(run_dir: Path, *overrides: str, resume: bool = False) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "sailrl", "run", "spec/examples/sft_sums.yaml", "--set", f"output.run_dir={run_dir}"]
    for o in overrides:
        args += ["--set", o]
    if resume:
        args.append("--resume")
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x]


def test_sailrl_run_of_the_example_trains_and_writes_the_run_directory(tmp_path):
    run_dir = tmp_path / "sft"
    r = _run(run_dir, "training.steps=30", "training.eval_every=15", "training.save_every=15")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints.jsonl", "config.json", "metrics.jsonl",
                                                          "train.py"]
    lines = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in lines] == list(range(1, 31))
    assert all(m["schema"] == "metrics/2" and m["conversations"] == 32 for m in lines)
    first, last = lines[0], lines[-1]
    assert last["train/nll"] < first["train/nll"] - 1.0  # from ~5.5 nats a token (random weights)
    assert last["eval/nll"] < first["eval/nll_start"] - 1.0
    assert [m["step"] for m in lines if "eval/nll" in m] == [15, 30]
    assert "eval/correct_start" in first and "eval/correct" in last  # the reward rules score held-out samples
    assert "eval/train_correct_start" in first and "eval/train_correct" in last  # and a fixed training sample
    assert last["tokens_cum/trained"] == sum(m["tokens/trained"] for m in lines)
    records = _lines(run_dir / "checkpoints.jsonl")
    assert [(c["batch"], c.get("final", False)) for c in records] == [(15, False), (30, False), (30, True)]
    assert records[-1]["sampler_path"].endswith("/sampler_weights/sft_sums-final")
    config = json.loads((run_dir / "config.json").read_text())
    assert config["spec"]["method"] == "sft" and config["spec"]["training"]["steps"] == 30
    assert "eval nll: " in r.stdout and "train nll: " in r.stdout


def test_a_resumed_run_logs_what_an_uninterrupted_one_does(tmp_path):
    # constant lr: the example's cosine schedule runs over training.steps, which the stopped run sets to 3
    small = ("training.eval_every=0", "training.save_every=0", "sft.batch_size=8", "training.lr_schedule=constant",
             "training.lr_warmup_steps=0")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    r = _run(whole, "training.steps=6", *small)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run(parts, "training.steps=3", *small)  # stops after 3 steps, its final state saved
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run(parts, "training.steps=6", *small, resume=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "at step 4 (3 of 6 steps done)" in r.stderr
    keys = ("step", "train/nll", "learning_rate", "conversations", "assistant_tokens", "tokens/trained",
            "tokens_cum/trained")
    a = [{k: m[k] for k in keys} for m in _lines(whole / "metrics.jsonl")]
    b = [{k: m[k] for k in keys} for m in _lines(parts / "metrics.jsonl")]
    assert a == b and len(a) == 6
