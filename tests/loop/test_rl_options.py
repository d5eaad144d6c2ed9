"""The RL options in the spec: advantage scaling, KL penalty to the base model, learning-rate schedule, bounded
off-policy sampling -- hand-computed values for the helpers, and the compiled script showing each only when the
spec uses it."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import tinker
import torch
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.data_processing import assemble_training_data, compute_advantages
from tinker_cookbook.rl.metrics import incorporate_kl_penalty
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from sailrl.cli import main
from sailrl.compiler.render import features, render_script
from sailrl.compiler.words import reward_words
from sailrl.launch import apply_overrides
from sailrl.runtime import rl
from sailrl.spec.loader import load_spec
from sailrl.spec.schema import Spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "spec/examples/quickstart.yaml"


def _group(rewards, prompt=(5, 6), tokens=(10, 11), logprobs=(-0.5, -0.25)) -> TrajectoryGroup:
    trajs = []
    for r in rewards:
        tr = Transition(ob=tinker.ModelInput.from_ints(list(prompt)),
                        ac=TokensWithLogprobs(tokens=list(tokens), maybe_logprobs=list(logprobs)),
                        reward=r, episode_done=True, metrics={})
        trajs.append(Trajectory(transitions=[tr], final_ob=tinker.ModelInput.from_ints([])))
    return TrajectoryGroup(trajs, [0.0] * len(rewards), [{} for _ in rewards])


# ------------------------------------------------------------------------------------------ advantage scaling
def test_group_std_divides_each_group_by_its_own_reward_std():
    groups = [_group([0.0, 1.0, 0.0, 1.0]), _group([0.0, 0.0, 0.0, 3.0])]
    adv = compute_advantages(groups)  # reward - group mean
    scaled = rl.scale_advantages(groups, adv, "group_std")
    # group 1: std 0.5 -> (-0.5, 0.5) / 0.5 = (-1, 1); group 2: mean 0.75, std sqrt(27/16) = 1.299038...
    assert scaled[0].tolist() == pytest.approx([-1.0, 1.0, -1.0, 1.0], abs=1e-5)
    std2 = math.sqrt(((0.75 ** 2) * 3 + 2.25 ** 2) / 4)
    assert scaled[1].tolist() == pytest.approx([-0.75 / std2, -0.75 / std2, -0.75 / std2, 2.25 / std2], abs=1e-5)


def test_batch_std_divides_by_the_std_of_every_reward_of_the_step():
    groups = [_group([0.0, 1.0]), _group([2.0, 4.0])]
    adv = compute_advantages(groups)
    scaled = rl.scale_advantages(groups, adv, "batch_std")
    std = torch.tensor([0.0, 1.0, 2.0, 4.0]).std(unbiased=False).item()  # 1.4790199...
    assert scaled[0].tolist() == pytest.approx([-0.5 / std, 0.5 / std], abs=1e-6)
    assert scaled[1].tolist() == pytest.approx([-1.0 / std, 1.0 / std], abs=1e-6)
    assert rl.scale_advantages(groups, adv, "none") == adv


def test_a_zero_std_group_never_divides_by_zero():
    groups = [_group([1.0, 1.0, 1.0])]
    scaled = rl.scale_advantages(groups, compute_advantages(groups), "group_std")
    assert scaled[0].tolist() == [0.0, 0.0, 0.0]
    kept, degenerate = rl.split_degenerate(groups)
    assert kept == [] and degenerate == groups  # and the loop drops it before scaling
    with pytest.raises(ValueError, match="advantage_scale"):
        rl.scale_advantages(groups, compute_advantages(groups), "std")


# ------------------------------------------------------------------------------------------ KL penalty
class _FixedLogprobs:
    """A base-model sampling client whose logprobs for a sequence are given per datum (by its first token)."""

    def __init__(self, by_first_token: dict[int, list[float]]):
        self.by_first_token = by_first_token

    async def compute_logprobs_async(self, model_input):
        return [None, *self.by_first_token[model_input.to_ints()[0]]]


def test_kl_penalty_adjusts_advantages_as_a_hand_computation():
    # Two rollouts of prompt [5, 6] (tokens 10, 11 / 12, 13), advantages -0.5 / +0.5.
    g = TrajectoryGroup(
        [Trajectory(transitions=[Transition(ob=tinker.ModelInput.from_ints([p, 6]),
                                            ac=TokensWithLogprobs(tokens=toks, maybe_logprobs=lps), reward=r,
                                            episode_done=True, metrics={})],
                    final_ob=tinker.ModelInput.from_ints([]))
         for p, toks, lps, r in [(5, [10, 11], [-0.5, -0.25], 0.0), (7, [12, 13], [-1.0, -2.0], 1.0)]],
        [0.0, 0.0], [{}, {}])
    data, _ = assemble_training_data([g], compute_advantages([g]))
    # Sequence positions: [p, 6, t1, t2] -> targets [6, t1, t2]; the mask is on the two sampled tokens.
    base = _FixedLogprobs({5: [-3.0, -0.7, -0.05], 7: [-3.0, -1.5, -1.0]})
    metrics = asyncio.run(incorporate_kl_penalty(data, base, kl_penalty_coef=0.1, kl_discount_factor=0.0))
    # per-token log p_policy - log p_base on sampled tokens: (-0.5+0.7, -0.25+0.05) = (0.2, -0.2); (0.5, -1.0)
    diffs = [[0.2, -0.2], [0.5, -1.0]]
    mean = sum(sum(d) for d in diffs) / 4  # -0.125
    assert metrics["kl_policy_base"] == pytest.approx(mean)
    for datum, d, a in zip(data, diffs, [-0.5, 0.5], strict=True):
        expected = [0.0] + [a + 0.1 * (mean - x) for x in d]
        assert datum.loss_fn_inputs["advantages"].tolist() == pytest.approx(expected, abs=1e-6)
    # with a discount, each token's penalty is the discounted sum of its own and the later tokens' penalties
    data2, _ = assemble_training_data([g], compute_advantages([g]))
    asyncio.run(incorporate_kl_penalty(data2, base, kl_penalty_coef=0.1, kl_discount_factor=0.5))
    for datum, d, a in zip(data2, diffs, [-0.5, 0.5], strict=True):
        pen = [0.1 * (mean - x) for x in d]
        expected = [0.0 + 0.5 * pen[0] + 0.25 * pen[1], a + pen[0] + 0.5 * pen[1], a + pen[1]]
        assert datum.loss_fn_inputs["advantages"].tolist() == pytest.approx(expected, abs=1e-6)


# ------------------------------------------------------------------------------------------ schedule, off-policy
def test_learning_rate_schedule_with_warmup():
    lr = [rl.learning_rate(1.0, s, 10, "cosine", 2) for s in range(1, 11)]
    assert lr[:2] == pytest.approx([1 / 3, 2 / 3])
    assert lr[2] == pytest.approx(1.0)  # the first step after warm-up has the full rate
    assert lr[2:] == pytest.approx([0.5 * (1 + math.cos(math.pi * i / 8)) for i in range(8)])
    assert [rl.learning_rate(2.0, s, 4, "linear") for s in (1, 2, 3, 4)] == pytest.approx([2.0, 1.5, 1.0, 0.5])
    assert {rl.learning_rate(3e-4, s, 5) for s in range(1, 6)} == {3e-4}


def test_groups_older_than_k_steps_are_dropped_and_counted():
    gs = [_group([0.0, 1.0]) for _ in range(4)]
    fresh, steps, dropped = rl.drop_stale(gs, [5, 4, 3, 5], step=5, max_steps_off_policy=1)
    assert fresh == [gs[0], gs[1], gs[3]] and steps == [5, 4, 5] and dropped == 1
    assert rl.drop_stale(gs, [5, 4, 3, 5], step=5, max_steps_off_policy=0)[2] == 2


# ------------------------------------------------------------------------------------------ the compiled script
def _spec_with(*overrides: str) -> Spec:
    loaded = load_spec(QUICKSTART)
    return Spec.model_validate(apply_overrides(loaded.spec.resolved(), list(overrides)))


def _main_source(spec: Spec) -> str:
    text = render_script(spec, spec_path="spec/examples/quickstart.yaml", spec_bytes=b"", output_path="x.py",
                         reward_words=reward_words(spec))
    return text[text.index("async def main"):text.index("async def train_step")]


def test_the_script_shows_each_option_only_when_the_spec_uses_it():
    plain = _main_source(_spec_with())
    for line in ("incorporate_kl_penalty", "scale_advantages", "rl.learning_rate(", "asyncio.create_task",
                 "drop_stale"):
        assert line not in plain, line
    full = _main_source(_spec_with("training.kl_penalty_coef=0.05", "training.advantage_scale=group_std",
                                   "training.lr_schedule=cosine", "training.max_steps_off_policy=2"))
    for line in ('incorporate_kl_penalty(data, reference, t["kl_penalty_coef"], t["kl_discount_factor"])',
                 "run.records.kl_penalty(step, data, kl)",
                 'rl.scale_advantages(groups, advantages, t["advantage_scale"])',
                 'rl.learning_rate(t["learning_rate"], step, t["steps"], t["lr_schedule"], t["lr_warmup_steps"])',
                 "asyncio.create_task(run.rewards.score(later, run.sampler.sample(policy, later)))", "rl.drop_stale("):
        assert line in full, line
    assert features(_spec_with("training.lr_warmup_steps=2"))["schedule"]


@pytest.mark.slow
def test_turning_an_option_on_with_set_on_a_script_compiled_without_it_is_refused(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "generated/quickstart.py"), "--set",
                        f"output.run_dir={tmp_path / 'run'}", "--set", "training.kl_penalty_coef=0.1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "turn on training.kl_penalty_coef > 0 (KL penalty to the base model)" in r.stderr
    assert "sailrl compile spec/examples/quickstart.yaml" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_with_every_option_logs_what_each_did(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "run"
    sets = ["training.steps=3", "training.warmup=null", "training.groups_per_step=4", "training.group_size=4",
            "training.kl_penalty_coef=0.05", "training.advantage_scale=group_std", "training.lr_schedule=linear",
            "training.lr_warmup_steps=1", "training.max_steps_off_policy=1", f"output.run_dir={run_dir}"]
    assert main(["run", str(QUICKSTART), *sum((["--set", s] for s in sets), [])]) == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    lr = load_spec(QUICKSTART).spec.training.learning_rate
    trained = [m for m in lines if m.get("datums")]
    for m in trained:
        assert m["learning_rate"] == pytest.approx(rl.learning_rate(lr, m["step"], 3, "linear", 1))
        assert m["optim/learning_rate"] == pytest.approx(m["learning_rate"])
        assert "kl_policy_base" in m and m["tokens/trained"] > 0
        assert m["tokens/reference"] == m["tokens/trained"] + m["datums"]  # each full sequence, scored by the base
    # step 1 samples from its own checkpoint; step k > 1 from the one before (started while k - 1 trained)
    assert [m["staleness/max"] for m in lines] == [0.0, 1.0, 1.0]
    assert [m["sampler_step"] for m in lines] == [1.0, 1.0, 2.0]
    assert all(m["off_policy_k"] == 1.0 and m["groups_stale_dropped"] == 0.0 for m in lines)
    if lines[0].get("kl_policy_base") is not None:  # a fresh LoRA is the base model: KL to it is ~0 at step 1
        assert abs(lines[0]["kl_policy_base"]) < 1e-5
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert {(r["step"], r["sampler_step"], r["staleness"]) for r in rollouts} == {(1, 1, 0), (2, 1, 1), (3, 2, 1)}


# The resume tests below run off-policy steps in process (SAILRL_LOCAL_PROCESSES=0): what they check is the loop's
# resume logic, the same in both modes; an off-policy run on the CPU would otherwise start the two child processes
# (seconds of imports each, twice a test). The child processes' own kill and resume, and that they train exactly as
# in process, are tested in test_local_processes.py; the run with every option above uses them.

@pytest.mark.slow
@pytest.mark.parametrize("first,then", [(0, 1), (1, 0)])
def test_switching_off_policy_mode_on_resume_continues_and_records_each_steps_mode(tmp_path, monkeypatch,
                                                                                   first, then, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("SAILRL_LOCAL_PROCESSES", "0")  # in process: see the comment above these tests
    run_dir = tmp_path / "run"
    base = ["training.warmup=null", "training.groups_per_step=4", "training.group_size=4", "sampling.max_tokens=6",
            "training.save_every=1", f"output.run_dir={run_dir}"]

    def run(k: int, steps: int, *extra: str) -> int:
        sets = [*base, f"training.max_steps_off_policy={k}", f"training.steps={steps}"]
        return main(["run", str(QUICKSTART), *sum((["--set", s] for s in sets), []), *extra])

    assert run(first, 2) == 0
    assert run(then, 4, "--resume") == 0
    assert "resuming with a spec that differs" in capsys.readouterr().err
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert [m["off_policy_k"] for m in lines] == [float(first)] * 2 + [float(then)] * 2
    # the first step after a resume samples from its own checkpoint: nothing sampled before the kill survives
    assert lines[2]["sampler_step"] == 3.0


@pytest.mark.slow
def test_an_off_policy_run_killed_after_a_periodic_save_resumes_exactly_as_it_would_have_run(tmp_path, monkeypatch):
    """K=1: the first step after resuming samples from the snapshot one step behind (recorded with the state), as
    the uninterrupted run did, so the resumed steps repeat it: same rollouts, same rewards, same updates."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("SAILRL_LOCAL_PROCESSES", "0")  # in process: see the comment above these tests
    run_dir = tmp_path / "run"
    sets = ["training.warmup=null", "training.groups_per_step=4", "training.group_size=4", "sampling.max_tokens=6",
            "training.max_steps_off_policy=1", "training.steps=5", "training.save_every=3",
            f"output.run_dir={run_dir}"]
    args = ["run", str(QUICKSTART), *sum((["--set", s] for s in sets), [])]
    assert main(args) == 0
    whole = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    records = (run_dir / "checkpoints.jsonl").read_text().splitlines()
    saved = json.loads(records[0])
    assert saved["batch"] == 3 and sorted(saved["off_policy_snapshots"]["paths"]) == ["3"]
    # what a kill right after the periodic save of step 3 leaves: that record is the last
    (run_dir / "checkpoints.jsonl").write_text(records[0] + "\n")
    assert main([*args, "--resume"]) == 0
    resumed = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in resumed] == [1, 2, 3, 4, 5]
    again = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]

    def same(m: dict) -> dict:  # what the run computed (not how long it took)
        return {k: v for k, v in m.items() if not k.startswith(("time/", "wall", "sail/")) and "_s" not in k
                and k not in ("timestamp", "steps_per_min")}

    assert [same(m) for m in resumed[3:]] == [same(m) for m in whole[3:]]
    assert resumed[3]["sampler_step"] == 3.0  # step 4 sampled one step behind, from step 3's snapshot

    def logged(rs: list[dict], step: int) -> list[tuple]:
        return [(r["completion"], r["total"], r["sampler_step"]) for r in rs if r["step"] == step]

    assert logged(again, 4) == logged(rollouts, 4) and logged(again, 5) == logged(rollouts, 5)
