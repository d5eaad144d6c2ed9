"""The loop's pure parts: degenerate groups, per-step metrics, run-directory bookkeeping, overrides."""

from __future__ import annotations

import json

import pytest
import tinker
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.data_processing import assemble_training_data, compute_advantages
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from sailrl.launch import apply_overrides
from sailrl.runtime.backends.backend import BackendError, check_keys
from sailrl.runtime.loop.report import rollout_metrics, sampled_tokens
from sailrl.runtime.rl import split_degenerate
from sailrl.runtime.rollouts.rollout import RolloutBatch
from sailrl.runtime.rundir.directory import RunDirectory, spec_changes


def _group(rewards: list[float], prompt=(1, 2, 3), truncated=None) -> TrajectoryGroup:
    trajs = []
    for i, r in enumerate(rewards):
        cut = bool(truncated and truncated[i])
        tr = Transition(ob=tinker.ModelInput.from_ints(list(prompt)),
                        ac=TokensWithLogprobs(tokens=[10 + i, 11], maybe_logprobs=[-0.5, -0.25],
                                              stop_reason="length" if cut else "stop"),
                        reward=r, episode_done=True,
                        metrics={"reward/correct": r, "truncated": float(cut), "regex_timeouts": 0.0,
                                 "correct": float(r > 0)})
        trajs.append(Trajectory(transitions=[tr], final_ob=tinker.ModelInput.from_ints([])))
    return TrajectoryGroup(trajs, [0.0] * len(rewards), [{} for _ in rewards])


def test_degenerate_groups_are_dropped_and_the_rest_trained():
    groups = [_group([1, 1, 1, 1]), _group([0, 1, 0, 1])]
    kept, degenerate = split_degenerate(groups)
    assert kept == [groups[1]] and degenerate == [groups[0]]
    advantages = compute_advantages(kept)
    assert [float(a) for a in advantages[0]] == [-0.5, 0.5, -0.5, 0.5]
    data, _ = assemble_training_data(kept, advantages)
    assert len(data) == 4
    adv = [d.loss_fn_inputs["advantages"].tolist() for d in data]
    # advantages apply to the sampled tokens only (the prompt's positions carry 0)
    assert [a[-2:] for a in adv] == [[-0.5, -0.5], [0.5, 0.5], [-0.5, -0.5], [0.5, 0.5]]


def test_all_degenerate_step_has_nothing_to_train():
    kept, degenerate = split_degenerate([_group([0, 0, 0, 0])])
    assert kept == [] and len(degenerate) == 1


def test_rollout_metrics_are_means_over_every_rollout():
    batch = RolloutBatch(groups=[_group([1, 1, 1, 1]), _group([0, 1, 0, 1], truncated=[1, 0, 0, 0])],
                         rows=[{}, {}], failed=[(7, "SailRolloutError: expired")])
    m = rollout_metrics(batch.groups, len(batch.failed), ["correct"])
    assert m["reward/total"] == pytest.approx(6 / 8)
    assert m["reward/correct"] == pytest.approx(6 / 8)
    assert m["correct"] == pytest.approx(6 / 8)
    assert m["frac_truncated"] == pytest.approx(1 / 8)
    assert m["groups"] == 2 and m["groups_failed"] == 1
    assert sampled_tokens(batch.groups) == (8 * 3, 16)  # each rollout sends its 3-token prompt, samples 2


def test_metrics_truncation_on_resume_drops_partial_and_rerun_steps(tmp_path):
    run = RunDirectory(tmp_path)
    for s in range(5):
        run.append_metrics({"step": s, "reward/total": s / 10})
    with open(run.metrics_path, "a") as f:
        f.write('{"step": 5, "reward/to')  # a writer killed mid-line
    assert [m["step"] for m in run.read_metrics()] == [0, 1, 2, 3, 4]
    run.truncate_metrics(3)  # last saved state: 3 completed steps; steps 3.. are re-run
    assert [m["step"] for m in run.read_metrics()] == [0, 1, 2]
    assert run.metrics_path.read_text().count("\n") == 3


def test_last_state_ignores_sampler_only_records(tmp_path):
    run = RunDirectory(tmp_path)
    with open(run.checkpoints_path, "w") as f:
        f.write(json.dumps({"name": "a", "batch": 2, "state_path": "local://r/weights/a"}) + "\n")
        f.write(json.dumps({"name": "b", "batch": 3, "sampler_path": "local://r/sampler_weights/b"}) + "\n")
    assert run.last_state()["state_path"] == "local://r/weights/a"
    assert run.last_sampler_path() == "local://r/sampler_weights/b"


def test_resume_with_changed_spec_warns_with_the_changed_keys(tmp_path):
    run = RunDirectory(tmp_path)
    run.write_config({"training": {"learning_rate": 1e-5, "steps": 7}}, "aaa", {})
    with pytest.warns(UserWarning, match=r"training.learning_rate: 1e-05 -> 2e-05"):
        changes = run.check_resume_config({"training": {"learning_rate": 2e-5, "steps": 7}}, "bbb")
    assert changes == ["training.learning_rate: 1e-05 -> 2e-05"]
    assert run.check_resume_config({"training": {"learning_rate": 1e-5, "steps": 7}}, "aaa") == []
    assert spec_changes({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == ["a.c: '<unset>' -> 2"]


def test_missing_api_key_is_one_line_naming_the_variable(monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.delenv("SAIL_API_KEY", raising=False)
    with pytest.raises(BackendError) as e:
        check_keys("sail", "spec/examples/gsm8k.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("TINKER_API_KEY is not set")
    assert "sailrl run spec/examples/gsm8k.yaml --sampler local" in msg
    monkeypatch.setenv("TINKER_API_KEY", "tml-k")
    with pytest.raises(BackendError, match="^SAIL_API_KEY is not set"):
        check_keys("sail")
    check_keys("tinker")
    check_keys("local")


def test_overrides_are_yaml_values_by_dotted_key():
    cfg = {"training": {"steps": 7, "learning_rate": 1e-5}, "model": {"name": "a"}}
    out = apply_overrides(cfg, ["training.steps=2", "model.name=sailrl/tiny", "sampling.sampler=local"])
    assert out == {"training": {"steps": 2, "learning_rate": 1e-5}, "model": {"name": "sailrl/tiny", "renderer": None},
                   "sampling": {"sampler": "local"}}
    assert cfg["training"]["steps"] == 7
    with pytest.raises(ValueError):
        apply_overrides(cfg, ["training.steps"])


def test_resume_ignores_the_worked_examples_which_do_not_change_training():
    old = {"training": {"steps": 5}, "examples": [{"completion": " 7"}]}
    assert spec_changes(old, {"training": {"steps": 5}}) == []
    assert spec_changes(old, {"training": {"steps": 6}}) == ["training.steps: 5 -> 6"]


def test_a_metrics_line_that_is_not_utf8_too_deep_or_too_long_is_skipped(tmp_path, monkeypatch):
    """The tolerant reader read the whole file as UTF-8 text: one byte that is not UTF-8 (a damaged disk block)
    made export, plot and --resume exit 70 with a UnicodeDecodeError; a line nested past the recursion limit a
    RecursionError; and a newline-less file was read whole into memory."""
    import sailrl.runtime.rundir.directory as rundir

    monkeypatch.setattr(rundir, "MAX_LINE_BYTES", 64)
    run = RunDirectory(tmp_path)
    run.append_metrics({"step": 0})
    with open(run.metrics_path, "ab") as f:
        f.write(b'\xff\xfe{"step": 9}\n' + b"[" * 5000 + b"\n" + b'{"step": "' + b"x" * 200 + b'"}\n')
    run.append_metrics({"step": 1})
    with open(run.metrics_path, "ab") as f:
        f.write(b'{"step": 2, "pad": "' + b"y" * 100)  # a torn, over-long last line
    assert [m["step"] for m in run.read_metrics()] == [0, 1]
