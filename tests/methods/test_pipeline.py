"""``sailrl run A.yaml B.yaml``: stages run in order, each in its own run directory, a later one starting from an
earlier one's final weights (``training.init_from: runs/<folder>``); every spec checked before anything runs; a
stage that fails stops the rest. RL -> RL on the embedded backend, a few steps of small groups."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sailrl.cli import main
from sailrl.commands.run import stage_overrides

ROOT = Path(__file__).resolve().parents[2]

SUMS = """\
name: {name}
model:
  name: sailrl/tiny-arith
  renderer: role_colon
  lora_rank: {rank}
  seed: 0
dataset:
  source: data/addition.jsonl
  fields: [question, answer]
prompt:
  user: '{{{{ question }}}}='
  reference_field: answer
reward:
  rules:
{rules}
training:
  steps: 2
  group_size: 4
  groups_per_step: 4
  learning_rate: 2e-3
  loss_fn: importance_sampling
{training}sampling:
  sampler: local
  max_tokens: 12
output:
  run_dir: runs/{name}
"""
SCORED = """\
    - name: correct
      kind: answer
      extract: {from: whole}
      reference: {extract: {from: whole}}
      compare: numeric
      weight: 0.5
    - name: format
      kind: match
      pattern: '^\\s*-?\\d+\\s*$'
      weight: 0.5
"""
# Every completion passes: every group is degenerate, and on_all_degenerate: stop ends the run at step 1 (exit 4,
# state saved, not the final one).
FLAT = """\
    - name: anything
      kind: match
      pattern: '^'
"""


def write(folder: Path, file: str, name: str, *, rank: int = 16, rules: str = SCORED, training: str = "") -> str:
    data = folder / "data" / "addition.jsonl"
    if not data.exists():
        data.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "spec" / "examples" / "data" / "addition.jsonl", data)
    (folder / file).write_text(SUMS.format(name=name, rank=rank, rules=rules, training=training), encoding="utf-8")
    return file


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def first_step_completions(run_dir: Path) -> list[str]:
    return [r["completion"] for r in records(run_dir / "rollouts.jsonl") if r["step"] == 1]


@pytest.mark.slow
def test_two_stages_run_in_order_and_the_second_starts_from_the_first_ones_final_state(tmp_path, monkeypatch,
                                                                                     capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a.yaml", "sums-a")
    write(tmp_path, "b.yaml", "sums-b", training="  init_from: runs/sums-a\n")
    assert main(["run", "a.yaml", "b.yaml"]) == 0
    err = capsys.readouterr().err
    a, b = tmp_path / "runs" / "sums-a", tmp_path / "runs" / "sums-b"
    final_a = records(a / "checkpoints.jsonl")[-1]
    assert final_a["final"] and final_a["batch"] == 2
    config_b = json.loads((b / "config.json").read_text(encoding="utf-8"))
    assert config_b["spec"]["training"]["init_from"] == "runs/sums-a"
    assert config_b["init_from"] == {"state_path": final_a["state_path"], "run_dir": str(a)}
    assert records(b / "checkpoints.jsonl")[-1]["final"] and [m["step"] for m in records(b / "metrics.jsonl")] == [1, 2]
    assert f"stage 1/2 (a.yaml): method rl, run directory {a}\n" in err
    assert f"starting from the final weights of {a} ({final_a['state_path']})\n" in err
    assert err.index("stage 1/2") < err.index("stage 2/2") and f"all 2 stages done; the last one's run directory: {b}" in err

    # The second stage sampled its first step from the first one's final weights: a run of the same spec given that
    # checkpoint path samples the same completions (the run is seeded); the base model samples others.
    assert main(["run", "b.yaml", "--set", f"training.init_from={final_a['state_path']}",
                 "--set", "output.run_dir=runs/check"]) == 0
    assert first_step_completions(b) == first_step_completions(tmp_path / "runs" / "check")
    assert first_step_completions(b) != first_step_completions(a)

    # The finished run of another LoRA rank: a located line, nothing written.
    write(tmp_path, "c.yaml", "sums-c", rank=8, training="  init_from: runs/sums-a\n")
    capsys.readouterr()
    assert main(["run", "c.yaml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("c.yaml:32:14: training.init_from: the weights of the run in runs/sums-a are a LoRA of "
                          "rank 16, and this spec's model.lora_rank is 8")
    assert "= hint: Set model.lora_rank: 16 here." in err and "= code: S262 init-from-other-model" in err
    assert not (tmp_path / "runs" / "sums-c").exists()


@pytest.mark.slow
def test_a_stage_that_stops_stops_the_rest_and_an_unfinished_run_cannot_start_another(tmp_path, monkeypatch,
                                                                                      capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "flat.yaml", "sums-flat", rules=FLAT, training="  on_all_degenerate: stop\n")
    write(tmp_path, "b.yaml", "sums-b", training="  init_from: runs/sums-flat\n")
    write(tmp_path, "c.yaml", "sums-c")
    assert main(["run", "flat.yaml", "b.yaml", "c.yaml"]) == 4  # the stopped stage's own exit status
    err = capsys.readouterr().err
    assert err.endswith("stage 2/3 (b.yaml): not run (stage 1 ended with exit status 4)\n"
                        "stage 3/3 (c.yaml): not run (stage 1 ended with exit status 4)\n")
    assert "    sailrl run flat.yaml b.yaml c.yaml --resume\n" in err  # how to resume the pipeline
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["sums-flat"]
    assert not records(tmp_path / "runs" / "sums-flat" / "checkpoints.jsonl")[-1].get("final")

    # Alone, the second stage names a run that has not finished: a located line before anything is written.
    assert main(["run", "b.yaml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("b.yaml:32:14: training.init_from: the run in runs/sums-flat has not finished: it has "
                          "saved no final state\n")
    assert "= hint: Finish it first (`sailrl run flat.yaml --resume`), or name a finished run." in err
    assert "= code: S261 init-from-unfinished" in err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["sums-flat"]


def test_every_problem_of_every_spec_is_reported_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a.yaml", "sums-a", training="  group_size: 1\n")  # a second group_size: S015 duplicate key
    write(tmp_path, "b.yaml", "sums-b", rank=12)  # S213: not a power of two
    assert main(["run", "a.yaml", "b.yaml"]) == 1
    err = capsys.readouterr().err
    assert "a.yaml:" in err and "= code: S015 duplicate-key" in err
    assert "b.yaml:5:14: model.lora_rank" in err and "= code: S213 lora-rank" in err
    assert err.index("a.yaml:") < err.index("b.yaml:")
    assert not (tmp_path / "runs").exists()


def test_a_stage_checked_against_the_earlier_stage_that_writes_its_init_from(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a.yaml", "sums-a")
    write(tmp_path, "b.yaml", "sums-b", training="  init_from: runs/sums-a\n")
    # Another model for stage 2 only (N:KEY=VALUE): refused against stage 1's spec, before stage 1 runs.
    assert main(["run", "a.yaml", "b.yaml", "--set", "2:model.name=sailrl/tiny"]) == 1
    err = capsys.readouterr().err
    assert "b.yaml:32:14: training.init_from: the weights of stage 1 (a.yaml, writing runs/sums-a) are for model " \
           "'sailrl/tiny-arith', and this spec trains 'sailrl/tiny'" in err
    assert "= code: S262 init-from-other-model" in err
    # In the wrong order: the folder is written by a later stage.
    assert main(["run", "b.yaml", "a.yaml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("b.yaml:32:14: training.init_from: runs/sums-a is written by stage 2 (a.yaml), which "
                          "runs after this one\n")
    assert "= hint: List a.yaml before b.yaml on the command line." in err
    # Two stages writing one folder.
    write(tmp_path, "a2.yaml", "sums-a")
    assert main(["run", "a.yaml", "a2.yaml"]) == 1
    assert capsys.readouterr().err == (f"error: stages 1 (a.yaml) and 2 (a2.yaml) both write {tmp_path}/runs/sums-a: "
                                       "give each stage its own output.run_dir (the default, runs/{name}, differs "
                                       "when their names do)\n")
    assert not (tmp_path / "runs").exists()


def test_a_run_directory_that_is_not_there_alone_is_a_located_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "b.yaml", "sums-b", training="  init_from: runs/sums-a\n")
    assert main(["run", "b.yaml"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("b.yaml:32:14: training.init_from: there is no run directory runs/sums-a (a path without "
                          ":// names an earlier run's folder, relative to the spec's folder)\n")
    assert "= code: S261 init-from-unfinished" in err
    (tmp_path / "runs" / "sums-a").mkdir(parents=True)
    assert main(["run", "b.yaml"]) == 1
    assert "training.init_from: runs/sums-a holds no run (it has no config.json)" in capsys.readouterr().err
    assert list((tmp_path / "runs").iterdir()) == [tmp_path / "runs" / "sums-a"]


def test_set_applies_to_every_stage_and_a_numbered_one_to_its_stage():
    assert stage_overrides(["training.steps=1", "2:model.lora_rank=8", "1:name=x:y"], 2) == [
        ["training.steps=1", "name=x:y"], ["training.steps=1", "model.lora_rank=8"]]
    with pytest.raises(ValueError, match=r"^--set 3:training.steps=1: there is no stage 3 \(this command has 2 "
                                         r"specs, stages 1-2\)$"):
        stage_overrides(["3:training.steps=1"], 2)


def test_a_bad_stage_number_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a.yaml", "sums-a")
    assert main(["run", "a.yaml", "--set", "2:training.steps=1"]) == 2
    assert capsys.readouterr().err == ("error: --set 2:training.steps=1: there is no stage 2 (this command has one "
                                       "spec, stage 1)\n")


@pytest.mark.slow
def test_resume_skips_the_finished_stages_and_resumes_the_first_unfinished_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a.yaml", "sums-a")
    write(tmp_path, "b.yaml", "sums-b", training="  init_from: runs/sums-a\n")
    assert main(["run", "a.yaml", "b.yaml", "--set", "2:training.steps=1"]) == 0
    b = tmp_path / "runs" / "sums-b"
    assert [m["step"] for m in records(b / "metrics.jsonl")] == [1]
    capsys.readouterr()
    # Without the override stage 2 has a step to go: stage 1 is skipped, stage 2 resumed at step 2.
    assert main(["run", "a.yaml", "b.yaml", "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"stage 1/2 (a.yaml): finished in {tmp_path}/runs/sums-a; skipped\n" in err
    assert f"stage 2/2 (b.yaml): method rl, run directory {b} (resumed)\n" in err
    assert "at step 2 (1 of 2 steps done)" in err
    assert [m["step"] for m in records(b / "metrics.jsonl")] == [1, 2]
    assert records(b / "checkpoints.jsonl")[-1]["final"] and records(b / "checkpoints.jsonl")[-1]["batch"] == 2
    config = json.loads((b / "config.json").read_text(encoding="utf-8"))
    assert config["init_from"]["run_dir"] == str(tmp_path / "runs" / "sums-a")  # kept on resume


def test_a_bug_in_a_stage_is_exit_70_with_its_traceback_and_the_rest_not_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "a.yaml", "sums-a")
    write(tmp_path, "b.yaml", "sums-b", training="  init_from: runs/sums-a\n")

    def broken(text, spec, options):
        raise KeyError("a bug")

    monkeypatch.setattr("sailrl.launch.run_compiled", broken)
    assert main(["run", "a.yaml", "b.yaml"]) == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last):" in err and "KeyError: 'a bug'" in err
    assert "sailrl run: internal error (a bug in sailrl, not a problem in your files): KeyError: 'a bug'." in err
    assert err.endswith("stage 2/2 (b.yaml): not run (stage 1 ended with exit status 70)\n")
