"""Issue 18.15: what a run prints -- a resolved run directory, "first step" for one step, and logs without
transformers' GGUF de-quantising bar or peft's tied-embeddings warning on every run. Issue 33.9: the step lines
and the summary go to stdout, the rest to stderr."""

from __future__ import annotations

import importlib.util
import os
import pty
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from tests.conftest import MINIMAL_SPEC

from sailrl.runtime.backends.local.engine.lora import attach_lora
from sailrl.runtime.backends.local.weights.sources import ResolvedModel, load_model
from sailrl.runtime.loop.report import step_line, summary_lines
from sailrl.runtime.rundir.directory import run_dir_path
from sailrl.spec.loader import load_spec
from tests.fakes.tiny_models import save_model_dir, tiny_config, write_llama_gguf

ROOT = Path(__file__).resolve().parents[2]


def test_the_run_directory_is_resolved(tmp_path: Path) -> None:
    (tmp_path / "spec").mkdir()
    (tmp_path / "generated").mkdir()
    path = tmp_path / "spec" / "s.yaml"
    path.write_text(MINIMAL_SPEC)
    spec = load_spec(path).spec
    got = run_dir_path(spec, tmp_path / "generated" / ".." / "spec")  # what a compiled script passes
    assert got == (tmp_path / "spec" / "runs" / spec.name).resolve() and ".." not in str(got)


def test_one_step_is_said_as_one_step() -> None:
    one = [{"reward/total": 0.25, "correct": 0.5}]
    assert summary_lines(one)[:2] == ["reward (the only step): +0.250", "correct (the only step): 0.500"]
    three = [{"reward/total": 0.1 * i, "correct": 0.2 * i} for i in range(3)]
    assert summary_lines(three)[:2] == ["reward (first step -> last step): +0.000 -> +0.200",
                                        "correct (first step -> last step): 0.000 -> 0.400"]
    ten = [{"reward/total": 0.1 * i} for i in range(10)]
    assert summary_lines(ten)[0] == "reward (mean of first 5 steps -> last 5): +0.200 -> +0.700"


def test_an_episode_step_line_says_the_tool_use() -> None:
    """Issue 33.14: an episode run's line shows turns, tool calls and failed tool calls per episode (and feedback
    turns when there were any); a single-turn run's line has none of it."""
    base = {"reward/total": 0.5, "reward/correct": 0.5, "correct": 0.5, "degenerate_frac": 0.25,
            "frac_truncated": 0.0, "tokens/prompt": 2800, "tokens/sampled": 1500, "tokens/trained": 1000}
    episode = {**base, "episode/turns": 2.125, "episode/tool_calls": 1.0625, "episode/tool_errors": 0.125,
               "episode/feedback_turns": 0.0}
    assert step_line(3, 40, episode, ["correct"], 0.9) == (
        "step    3/40 | reward +0.500 = correct +0.500 | correct 50% | degenerate  25% | truncated   0% | "
        "episodes 2.12 turns, 1.06 tool calls (0.12 failed) | tokens 2.8k in, 1.5k out, 1.0k trained | 0.9s")
    fed = {**episode, "episode/tool_calls": 0.0, "episode/tool_errors": 0.0, "episode/feedback_turns": 0.5}
    assert "| episodes 2.12 turns, 0.00 tool calls (0.00 failed), 0.50 feedback turns |" in step_line(
        3, 40, fed, ["correct"], 0.9)
    assert "episodes" not in step_line(3, 40, base, ["correct"], 0.9)


def test_lora_on_a_tied_lm_head_does_not_warn_every_run() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config("qwen2", 320))  # tie_word_embeddings=True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attach_lora(model, rank=4, seed=0, train_mlp=True, train_attn=True, train_unembed=True)
    assert not [w for w in caught if "tie_word_embeddings" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None, reason="the optional gguf package is not installed")
def test_loading_a_gguf_file_draws_no_progress_bar(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    model, tok = save_model_dir("llama", tmp_path / "hf")
    path = write_llama_gguf(model, tok, tmp_path / "tiny.gguf")
    capfd.readouterr()
    loaded = load_model(ResolvedModel(str(path), "gguf", str(path)), torch.float32, "cpu")
    err = capfd.readouterr().err
    assert "de-quantizing" not in err, err
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)  # it did load


#: What a run writes to stdout, line by line: its warm-up and RL steps, then the summary.
RUN_STDOUT = [
    r"warm-up    1/2 \| cross_entropy/token \d+\.\d{3}",
    r"warm-up    2/2 \| cross_entropy/token \d+\.\d{3}",
    r"step    1/2 \| reward [+-]\d\.\d{3} = correct [+-]\d\.\d{3} \+ format [+-]\d\.\d{3} \| correct \d+% \| "
    r"degenerate +\d+% \| truncated +\d+% \| tokens \S+ in, \S+ out, \S+ trained \| \d+\.\ds",
    r"step    2/2 \| reward .*",
    r"reward \(first step -> last step\): [+-]\d\.\d{3} -> [+-]\d\.\d{3}",
    r"correct \(first step -> last step\): \d\.\d{3} -> \d\.\d{3}",
    r"tokens: prompt [\d,]+, sampled [\d,]+, trained [\d,]+(, warmup_trained [\d,]+)?",
    r"run directory: .+",
    r"final state: local://\S+",
    r"final adapter: local://\S+",
    r"  \(a PEFT adapter directory: .+\)",
]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sailrl run", "compiled script"])
def test_the_steps_and_the_summary_go_to_stdout_the_rest_to_stderr(tmp_path: Path, how: str) -> None:
    """``sailrl run spec.yaml > run.log`` (and a compiled script's) keeps every step line and the summary;
    progress and warnings stay on stderr, where none of those lines is."""
    run_dir = tmp_path / "run"
    sets = [f"output.run_dir={run_dir}", "training.steps=2", "training.groups_per_step=4", "training.group_size=4",
            "sampling.max_tokens=6"]
    expected = RUN_STDOUT
    if how == "sailrl run":
        args = [sys.executable, "-m", "sailrl", "run", "spec/examples/quickstart.yaml"]
        sets += ["training.warmup.steps=2", "training.warmup.batch_size=8"]
    else:  # the committed script, compiled without a warm-up (an override cannot turn one on)
        args = [sys.executable, "generated/quickstart.py"]
        expected = [p for p in RUN_STDOUT if not p.startswith("warm-up")]
    for s in sets:
        args += ["--set", s]
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    assert len(out) == len(expected), done.stdout
    for line, pattern in zip(out, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    assert f"run directory: {run_dir}" in out
    starts = ("warm-up ", "step ", "reward (", "correct (", "tokens: ", "run directory:", "final ")
    assert not [line for line in done.stderr.splitlines() if line.startswith(starts)], done.stderr


@pytest.mark.slow
def test_run_into_a_file_from_a_terminal_keeps_the_steps_in_the_file(tmp_path: Path) -> None:
    """``sailrl run spec.yaml > run.log`` typed at a terminal: stderr is the terminal, where the progress bar is
    drawn (rich swaps ``sys.stdout`` for a proxy into it meanwhile); the steps and the summary go to the file,
    not the screen."""
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    args = [sys.executable, "-m", "sailrl", "run", "spec/examples/quickstart.yaml", "--set",
            f"output.run_dir={run_dir}"]
    for s in ("training.steps=2", "training.groups_per_step=4", "training.group_size=4", "sampling.max_tokens=6"):
        args += ["--set", s]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    master, slave = pty.openpty()
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=slave, env={**env, "TERM": "xterm"})
    os.close(slave)
    screen = b""
    while True:  # read the terminal until the run closes it (EIO), so the run never blocks on a full pty
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        screen += chunk
    os.close(master)
    assert proc.wait(timeout=600) == 0, screen.decode(errors="replace")[-3000:]
    lines = log.read_text().splitlines()
    assert [line[:13] for line in lines[:2]] == ["step    1/2 |", "step    2/2 |"], lines
    assert lines[2].startswith("reward (first step -> last step): ") and f"run directory: {run_dir}" in lines
    assert b"step    1/2 |" not in screen
