"""Ctrl-C and kills at the awkward moments: during the supervised warm-up, and after the last periodic save but
before the final one. Every case exits cleanly (130 for Ctrl-C) and resumes to a complete run, each step logged
once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
SMALL = ["training.groups_per_step=4", "training.group_size=4", "sampling.max_tokens=6",
         "training.warmup.batch_size=8"]


def _args(run_dir: Path, *sets: str) -> list[str]:
    args = [sys.executable, "-m", "sailrl", "run", "spec/examples/quickstart.yaml", "--set", f"output.run_dir={run_dir}"]
    for s in [*SMALL, *sets]:
        args += ["--set", s]
    return args


def _steps(path: Path) -> list[int]:
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()]


def _run_here(run_dir: Path, *sets: str, resume: bool = False) -> int:
    """``sailrl run`` in this process (no interrupt to send: the seconds of a new interpreter's imports saved)."""
    from sailrl.cli import main

    return main(_args(run_dir, *sets)[3:] + (["--resume"] if resume else []))


def test_ctrl_c_during_the_warmup_saves_state_and_resume_finishes_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "run"
    sets = ("training.warmup.steps=60", "training.steps=2")  # interrupted after 5: 55 steps of margin
    proc = subprocess.Popen(_args(run_dir, *sets), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    warmup = run_dir / "warmup.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (warmup.exists() and len(warmup.read_text().splitlines()) >= 5):
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "terminate called" not in err and "Traceback" not in err
    assert "warm-up steps; state saved. Resume with:" in err and "--resume" in err
    done = len(_steps(warmup))
    record = json.loads((run_dir / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert record["batch"] == 0 and record["warmup"] == done and "interrupted" in record["name"]
    code = _run_here(run_dir, *sets, resume=True)
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    assert f"at warm-up step {done + 1}" in err
    assert _steps(warmup) == list(range(1, 61))  # each warm-up step once
    assert _steps(run_dir / "metrics.jsonl") == [1, 2]


def test_a_kill_after_the_last_periodic_save_resumes_to_the_final_adapter(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "run"
    sets = ("training.warmup=null", "training.steps=2", "training.save_every=2")
    assert _run_here(run_dir, *sets) == 0, capsys.readouterr().err[-2000:]
    records = (run_dir / "checkpoints.jsonl").read_text().splitlines()
    assert json.loads(records[-1]).get("final") and json.loads(records[-2])["batch"] == 2
    # what a kill between the periodic save of step 2 and the final save leaves behind
    (run_dir / "checkpoints.jsonl").write_text("\n".join(records[:-1]) + "\n")
    capsys.readouterr()
    code = _run_here(run_dir, *sets, resume=True)
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    assert "all 2 steps were done; saving the final adapter" in err and "final adapter:" in out
    assert json.loads((run_dir / "checkpoints.jsonl").read_text().splitlines()[-1]).get("final")
    assert _steps(run_dir / "metrics.jsonl") == [1, 2]
    # and a complete run says so instead of training again
    code = _run_here(run_dir, *sets, resume=True)
    err = capsys.readouterr().err
    assert code == 1 and "already completed 2 steps" in err and "Traceback" not in err
