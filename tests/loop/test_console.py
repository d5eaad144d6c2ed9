"""Issue 18.16: output to a pipe or a file was wrapped at 80 columns (rich's default without a terminal), so
``sailrl preflight | tee`` and CI logs broke lines mid-phrase. Without a terminal nothing wraps."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sailrl.runtime.loop.console import PIPE_WIDTH, RunConsole, make_console, panel_expand

ROOT = Path(__file__).resolve().parents[2]


def test_a_console_without_a_terminal_does_not_wrap(monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = make_console(file=out)
    assert not console.is_terminal and console.width == PIPE_WIDTH and not panel_expand(console)
    words = " ".join(f"word{i}" for i in range(60))  # about 400 characters
    console.print(words)
    assert out.getvalue() == words + "\n"


def test_a_terminal_and_columns_keep_their_width(monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert make_console(file=io.StringIO(), force_terminal=True, width=100).width == 100
    monkeypatch.setenv("COLUMNS", "120")
    console = make_console(file=io.StringIO())
    assert console.width == 120 and panel_expand(console)


@pytest.mark.slow
def test_preflight_into_a_pipe_keeps_each_line_whole() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([sys.executable, "-m", "sailrl", "preflight", "spec/examples/quickstart.yaml"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    tokens = [line for line in lines if line.startswith("prompt tokens:")]
    # one line, from "prompt tokens" to the context's source (it was cut after about 80 characters)
    assert len(tokens) == 1 and re.fullmatch(r"prompt tokens: min \d+, .*; context 4096 \(sailrl/tiny-arith config "
                                             r"max_position_embeddings\)", tokens[0]), lines
    assert max(len(line) for line in lines) > 100
    assert any(line.startswith("╰─ reference: ") for line in lines)  # panels fit their content


def test_a_run_console_prints_results_to_stdout_and_the_rest_to_stderr(monkeypatch) -> None:
    """Issue 33.9: a run's step lines and summary go to stdout (``sailrl run spec.yaml > run.log`` keeps them),
    its progress and warnings to stderr."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out, err = io.StringIO(), io.StringIO()
    console = RunConsole(file=err, out_file=out, soft_wrap=True)
    console.print("[yellow]warning: something[/yellow]")
    console.result("step    1/2 | reward +0.500 [not markup]")
    assert out.getvalue() == "step    1/2 | reward +0.500 [not markup]\n"
    assert err.getvalue() == "warning: something\n"
    assert console.width == console.out.width == PIPE_WIDTH  # neither wraps without a terminal


def test_a_run_console_writes_to_the_streams_of_the_moment(capsys) -> None:
    console = RunConsole()
    console.print("note")
    console.result("line")
    assert capsys.readouterr() == ("line\n", "note\n")


def test_on_one_screen_a_result_is_printed_above_the_progress_bar() -> None:
    """stdout and stderr both terminals: the line goes through the stderr console, whose live progress bar a
    write beside it would garble."""
    out, err = io.StringIO(), io.StringIO()
    console = RunConsole(file=err, out_file=out, force_terminal=True, width=100, color_system=None)
    console.result("step    1/2 | reward +0.500")
    assert (out.getvalue(), err.getvalue()) == ("", "step    1/2 | reward +0.500\n")
