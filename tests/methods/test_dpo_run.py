"""method: dpo end to end on the embedded backend: `sailrl run` of the example trains (the loss falls, the
implicit reward ranks more pairs right, the sampled chosen rate rises), writes the run directory (metrics with the
DPO metrics, checkpoints with the final sampler weights), and a run stopped and resumed logs the same steps as one
that was not (the reference reopened from the same starting weights)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
DPO_KEYS = ("dpo/loss", "dpo/accuracy", "dpo/margin", "dpo/chosen_reward", "dpo/rejected_reward")


def _run(run_dir: Path, *overrides: str, resume: bool = False) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "sailrl", "run", "spec/examples/dpo_sums.yaml", "--set", f"output.run_dir={run_dir}"]
    for o in overrides:
        args += ["--set", o]
    if resume:
        args.append("--resume")
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x]


def _mean(lines: list[dict], key: str) -> float:
    return sum(m[key] for m in lines) / len(lines)


def test_sailrl_run_of_the_example_trains_and_writes_the_run_directory(tmp_path):
    run_dir = tmp_path / "dpo"
    r = _run(run_dir, "training.steps=40", "training.eval_every=20", "training.save_every=20")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints.jsonl", "config.json", "metrics.jsonl",
                                                          "train.py"]
    lines = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in lines] == list(range(1, 41))
    assert all(m["schema"] == "metrics/2" and m["pairs"] == 16 and set(DPO_KEYS) <= set(m) for m in lines)
    # step 1: the policy is the reference, so every margin is 0 (up to float rounding) and the loss log 2
    assert lines[0]["dpo/loss"] == pytest.approx(0.6931, abs=1e-3) and abs(lines[0]["dpo/margin"]) < 1e-3
    first, last = lines[:10], lines[-10:]
    assert _mean(last, "dpo/loss") < _mean(first, "dpo/loss") - 0.15
    assert _mean(last, "dpo/accuracy") > _mean(first, "dpo/accuracy") + 0.1
    assert _mean(last, "dpo/margin") > 1.0
    assert [m["step"] for m in lines if "eval/accuracy" in m] == [20, 40]
    assert lines[-1]["eval/accuracy"] > lines[0]["eval/accuracy_start"] + 0.2
    assert 0.0 <= lines[-1]["eval/chosen_rate"] <= 1.0 and "eval/chosen_rate_start" in lines[0]
    # the reference reads each pair once: 640 draws cover all 332 training pairs, plus the 64 held out; a reply's
    # sequence is "User: <q>=\n\nAssistant: <reply>\n\nUser:", one byte a token
    rows = _lines(ROOT / "spec/examples/data/addition_pairs.jsonl")
    once = sum(len(f"User: {r['question']}=\n\nAssistant: {r[k]}\n\nUser:") for r in rows
               for k in ("chosen", "rejected"))
    assert lines[-1]["tokens_cum/reference"] == once == 24915
    assert lines[-1]["tokens_cum/trained"] == sum(m["tokens/trained"] for m in lines)
    records = _lines(run_dir / "checkpoints.jsonl")
    assert [(c["batch"], c.get("final", False)) for c in records] == [(20, False), (40, False), (40, True)]
    assert records[-1]["sampler_path"].endswith("/sampler_weights/dpo_sums-final")
    config = json.loads((run_dir / "config.json").read_text())
    assert config["spec"]["method"] == "dpo" and config["spec"]["dpo"]["chosen_field"] == "chosen"
    assert "loss: 0.693 -> " in r.stdout and "eval chosen rate: " in r.stdout


def test_a_resumed_run_logs_what_an_uninterrupted_one_does(tmp_path):
    small = ("training.eval_every=0", "training.save_every=0", "dpo.batch_size=4")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    r = _run(whole, "training.steps=6", *small)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run(parts, "training.steps=3", *small)  # stops after 3 steps, its final state saved
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run(parts, "training.steps=6", *small, resume=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "at step 4 (3 of 6 steps done)" in r.stderr
    keys = ("step", *DPO_KEYS, "learning_rate", "pairs", "tokens/trained", "tokens_cum/trained")
    a = [{k: m[k] for k in keys} for m in _lines(whole / "metrics.jsonl")]
    b = [{k: m[k] for k in keys} for m in _lines(parts / "metrics.jsonl")]
    assert a == b and len(a) == 6
    assert a[3]["dpo/margin"] != 0.0  # the resumed steps train from the saved weights against the same reference


def test_the_reference_is_the_starting_weights_of_init_from(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    small = ("training.eval_every=0", "training.save_every=0", "dpo.batch_size=4")
    r = _run(first, "training.steps=5", "training.learning_rate=1e-2", *small)
    assert r.returncode == 0, r.stderr[-3000:]
    assert abs(_lines(first / "metrics.jsonl")[-1]["dpo/margin"]) > 0.05  # the first run moved its weights
    r = _run(second, "training.steps=1", f"training.init_from={first}", *small)
    assert r.returncode == 0, r.stderr[-3000:]
    # the second run starts from the first one's weights and so does its reference: no margin at its first step
    step1 = _lines(second / "metrics.jsonl")[0]
    assert step1["dpo/loss"] == pytest.approx(0.6931, abs=1e-3) and abs(step1["dpo/margin"]) < 1e-3
