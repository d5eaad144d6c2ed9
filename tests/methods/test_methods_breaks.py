"""Hostile input to the training methods and pipelines: each test is an attack that once broke the contract (a
located user error, exit 1; a bug exits 70; records that stay true), kept so it cannot come back."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from sailrl.cli import main
from tests.methods.test_pipeline import write

ROOT = Path(__file__).resolve().parents[2]


def test_a_symbolic_link_loop_as_init_from_is_one_located_line_not_a_bug(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "b.yaml", "sums-b", training="  init_from: runs/loop-a\n")
    (tmp_path / "runs").mkdir()
    os.symlink("loop-b", tmp_path / "runs" / "loop-a")
    os.symlink("loop-a", tmp_path / "runs" / "loop-b")
    assert main(["run", "b.yaml"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("b.yaml:32:14: training.init_from: runs/loop-a is a symbolic link that leads to no folder "
                          "(a loop of links, or its target is gone)\n"), err
    assert "= code: S261 init-from-unfinished" in err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["loop-a", "loop-b"]


def test_a_symbolic_link_loop_as_the_run_directory_is_one_line_not_a_bug(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a.yaml", "sums-a")
    (tmp_path / "runs").mkdir()
    os.symlink("sums-a", tmp_path / "runs" / "sums-a")  # a link to itself
    assert main(["run", "a.yaml"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert err.splitlines()[-1] == (f"error: {tmp_path}/runs/sums-a/metrics.jsonl cannot be read (Too many levels "
                                    "of symbolic links): check the run directory"), err
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["sums-a"]
