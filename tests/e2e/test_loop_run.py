"""The loop on the embedded backend, in process: eval metrics, init_from, faults named by step and phase,
failed groups dropped and counted, and the plot."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch

from sailrl.cli import main
from sailrl.launch import apply_overrides
from sailrl.runtime import rl
from sailrl.runtime.loop.errors import RunError
from sailrl.runtime.loop.records import update_metrics
from sailrl.runtime.rollouts.rollout import rollout_groups
from sailrl.runtime.run import Run, RunOptions, open_run
from sailrl.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "spec/examples/quickstart.yaml"
SMALL = ["training.groups_per_step=2", "training.group_size=4", "sampling.max_tokens=12", "training.warmup=null"]


def _spec(tmp_path: Path, *overrides: str):
    from sailrl.spec.schema import Spec

    loaded = load_spec(QUICKSTART)
    cfg = apply_overrides(loaded.spec.resolved(), [f"output.run_dir={tmp_path / 'run'}", *SMALL, *overrides])
    return Spec.model_validate(cfg), loaded


async def _start(tmp_path: Path, *overrides: str) -> Run:
    spec, loaded = _spec(tmp_path, *overrides)
    return await open_run(spec, RunOptions(spec_path=str(QUICKSTART), spec_dir=QUICKSTART.parent,
                                           spec_sha256=loaded.sha256))


async def _train(run: Run, step: int, data: list):
    t = run.spec.training
    adam = __import__("tinker").AdamParams(learning_rate=t.learning_rate)

    async def update():
        fb = await run.training_client.forward_backward_async(rl.without_mask(data), loss_fn=t.loss_fn)
        opt = await run.training_client.optim_step_async(adam)
        return [(await fb.result_async(), await opt.result_async())]

    return await run.checkpoints.apply_update(step, data, update())


def test_eval_every_logs_eval_metrics_from_the_held_out_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc = main(["run", str(QUICKSTART), "--set", f"output.run_dir={tmp_path / 'run'}", *sum((["--set", o] for o in SMALL), []),
               "--set", "training.steps=2", "--set", "training.eval_every=1", "--set", "dataset.eval={count: 6}"])
    assert rc == 0
    lines = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["eval/groups"] == 6.0 and "eval/reward/total" in m and "eval/reward/correct" in m
        assert "time/eval" in m


def test_a_backend_fault_names_its_step_and_phase(tmp_path):
    async def go():
        run = await _start(tmp_path, "training.steps=3")

        async def broken(*args, **kwargs):
            raise ConnectionError("service unavailable")

        run.training_client.forward_backward_async = broken
        datum = run.prompts.supervised_datum(run.train_rows[0], "{{ answer }}")
        with pytest.raises(RunError, match=r"^step 2, phase 'train': ConnectionError: service unavailable"):
            await _train(run, 2, [datum])

    asyncio.run(go())


def test_a_failed_group_is_dropped_and_counted_and_the_step_goes_on(tmp_path):
    from sailrl.runtime.backends.sail import SailRolloutError
    from sailrl.runtime.rollouts.rollout import SamplingPolicy

    async def go():
        run = await _start(tmp_path, "training.steps=1")
        path = await run.sampler.save_checkpoint(1)
        good = (await run.sampler.policy_for(path, 1)).completer
        rows = run.sampler.rows(1)
        bad_prompt = tuple(run.prompts.model_input(rows[0]).to_ints())

        class FlakyPolicy(SamplingPolicy):
            async def __call__(self, model_input, stop, *, max_tokens=None):
                if tuple(model_input.to_ints()) == bad_prompt:
                    raise SailRolloutError("expired after 3 attempts", reasons=["expired"] * 3, attempts=3,
                                           response_ids=[])
                return await super().__call__(model_input, stop, max_tokens=max_tokens)

        policy = FlakyPolicy(good.sampling_client, max_tokens=12)
        batch = await rollout_groups(policy, [run.sampler.group_builder(r, 4, None) for r in rows])
        assert len(batch.groups) == 1 and [i for i, _ in batch.failed] == [rows[0]["_index"]]
        assert "SailRolloutError: expired after 3 attempts" in batch.failed[0][1]
        batch.sampler_steps = [1] * len(batch.groups)
        batch.sampler_paths = [path] * len(batch.groups)
        run.records.rollouts(1, batch, [], [])
        run.records.end_step(1)
        m = run.records.history[-1]
        assert m["groups_failed"] == 1.0 and m["groups"] == 1.0 and m["step"] == 1

    asyncio.run(go())


def test_init_from_starts_at_step_zero_with_those_weights_and_a_fresh_optimizer(tmp_path):
    async def go():
        first = await _start(tmp_path / "a", "training.steps=1", "training.learning_rate=0.05")
        # nudge the weights with a supervised step
        data = [first.prompts.supervised_datum(first.train_rows[0], "{{ answer }}")]
        fb = await first.training_client.forward_backward_async(data, loss_fn="cross_entropy")
        opt = await first.training_client.optim_step_async(__import__("tinker").AdamParams(learning_rate=0.05))
        await fb.result_async()
        await opt.result_async()
        state = await first.checkpoints.save_state(1)
        second = await _start(tmp_path / "b", "training.steps=1", f"training.init_from={state}")
        assert second.start_step == 1 and second.completed == 0
        a = {k: v for k, v in first.training_client.peft_model.state_dict().items() if "lora" in k}
        b = {k: v for k, v in second.training_client.peft_model.state_dict().items() if "lora" in k}
        assert a.keys() == b.keys() and a
        assert all(torch.equal(a[k], b[k]) for k in a)
        fresh = await _start(tmp_path / "c", "training.steps=1")
        c = {k: v for k, v in fresh.training_client.peft_model.state_dict().items() if "lora" in k}
        assert any(not torch.equal(a[k], c[k]) for k in a)

    asyncio.run(go())


def test_plot_writes_a_png_of_reward_and_degenerate_fraction(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(6):
            f.write(json.dumps({"step": s, "reward/total": s / 10, "reward/correct": s / 20,
                                "reward/format": s / 20, "degenerate_frac": 1 - s / 6}) + "\n")
    assert main(["plot", str(run)]) == 0
    png = run / "reward.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert main(["plot", str(tmp_path / "nowhere")]) == 1
    assert "metrics.jsonl not found" in capsys.readouterr().err
    shutil.rmtree(run)


def test_a_step_where_every_group_failed_is_a_fault_not_a_degenerate_step(tmp_path):
    from sailrl.runtime.rollouts.rollout import RolloutBatch

    async def go():
        run = await _start(tmp_path, "training.steps=1")
        failed = [(3, "SailRolloutError: status failed"), (5, "x")]

        async def every_group_fails(policy, builders):
            return RolloutBatch(groups=[], rows=[], failed=failed)

        import sailrl.runtime.loop.sampler as run_module

        path = await run.sampler.save_checkpoint(4)
        policy = await run.sampler.policy_for(path, 4)
        original = run_module.rollout_groups
        run_module.rollout_groups = every_group_fails
        try:
            with pytest.raises(RunError, match=r"^step 4, phase 'rollout': every group failed \(2\): row 3: SailRoll"):
                await run.sampler.rollout(policy, 4)
        finally:
            run_module.rollout_groups = original

    asyncio.run(go())


def test_train_metrics_include_the_sampler_learner_kl_and_optimizer_metrics(tmp_path):
    async def go():
        run = await _start(tmp_path, "training.steps=1", "training.group_size=8", "training.groups_per_step=4")
        path = await run.sampler.save_checkpoint(1)
        policy = await run.sampler.policy_for(path, 1)
        batch = await run.sampler.rollout(policy, 1)
        # The untrained model's groups are degenerate; give them alternating advantages to get training data.
        from tinker_cookbook.rl.data_processing import assemble_training_data

        advantages = [torch.tensor([1.0, -1.0] * 4) for _ in batch.groups]
        data, _ = assemble_training_data(batch.groups, advantages)
        metrics = update_metrics(data, await _train(run, 1, data))
        # on-policy: the local sampler serves exactly the weights being trained, so the KL is ~0
        assert abs(metrics["optim/kl_sample_train_v1"]) < 1e-4 and metrics["optim/entropy"] > 0
        assert metrics["datums"] == len(data) and "loss:sum" in metrics
        assert any(k.startswith("optim/") and "kl" not in k and k != "optim/entropy" for k in metrics)

    asyncio.run(go())
