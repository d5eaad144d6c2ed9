"""tinker-cookbook's own recipes, unchanged, on the embedded backend: ``recipes/rl_loop.py``, ``recipes/sl_loop.py`` and
``rl/train.py`` train a few steps, are stopped, and a second run resumes from their checkpoints through
``tinker_cookbook.checkpoint_utils`` (``tests/fakes/cookbook.py`` supplies the service, tokenizer, renderer and
data)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tinker_cookbook import checkpoint_utils
from tinker_cookbook.recipes import rl_loop, sl_loop
from tinker_cookbook.rl import train as rl_train

from sailrl.runtime.backends.local import LocalServiceClient
from tests.fakes import cookbook

pytestmark = pytest.mark.slow


@pytest.fixture
def shim(monkeypatch, tmp_path):
    services: list = []
    created: list = []

    def install(stop_at=None):
        cookbook.install(monkeypatch, str(tmp_path / "checkpoints"), services, created, stop_at)
        return created

    yield install
    cookbook.uninstall()
    for service in services:
        service.close("success")


def _metrics(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def _steps(log_path: Path, key: str) -> list[int]:
    return [m[key] for m in _metrics(log_path) if key in m]


def test_rl_loop_trains_is_stopped_and_resumes_from_its_checkpoint(shim, tmp_path):
    log_path = tmp_path / "rl-loop"
    config = rl_loop.Config(log_path=str(log_path), model_name=cookbook.MODEL, batch_size=2, group_size=4,
                            lora_rank=4, max_tokens=8, save_every=2, learning_rate=1e-3)
    shim(stop_at=("save_weights_and_get_sampling_client", 3))  # a kill as batch 2 starts sampling
    with pytest.raises(cookbook.Stopped):
        rl_loop.main(config)
    records = checkpoint_utils.load_checkpoints_file(str(log_path))
    assert [(r.name, r.batch) for r in records] == [("000002", 2)]
    assert _steps(log_path, "progress/batch") == [0, 1]

    created = shim()
    rl_loop.main(config)
    assert created[-1] == ("create_training_client_from_state_with_optimizer", records[0].state_path)
    assert _steps(log_path, "progress/batch") == [0, 1, 2, 3]  # batches 2 and 3 only: it resumed at 2
    records = checkpoint_utils.load_checkpoints_file(str(log_path))
    # the resumed run saves batch 2's checkpoint again (the recipe saves at the top of a due batch), in its own run
    assert [(r.name, r.batch) for r in records] == [("000002", 2), ("000002", 2), ("final", 4)]
    assert records[0].state_path != records[1].state_path
    assert records[-1].state_path.startswith("local://") and "/sampler_weights/final" in records[-1].sampler_path


def test_sl_loop_trains_is_stopped_and_resumes_from_its_checkpoint(shim, tmp_path):
    log_path = tmp_path / "sl-loop"
    config = sl_loop.Config(log_path=str(log_path), model_name=cookbook.MODEL, batch_size=2, lora_rank=4,
                            save_every=2, learning_rate=1e-2)
    shim(stop_at=("forward_backward", 3))  # a kill after batch 2's checkpoint, before it trains
    with pytest.raises(cookbook.Stopped):
        sl_loop.main(config)
    assert [(r.name, r.batch) for r in checkpoint_utils.load_checkpoints_file(str(log_path))] == [("000002", 2)]
    first = _metrics(log_path)
    assert [m["step"] for m in first] == [0, 1]

    saved = checkpoint_utils.load_checkpoints_file(str(log_path))[0].state_path
    created = shim()
    sl_loop.main(config)
    assert created[-1] == ("create_training_client_from_state_with_optimizer", saved)
    metrics = _metrics(log_path)
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert all(m["train_mean_nll"] > 0 for m in metrics)
    assert metrics[-1]["train_mean_nll"] < metrics[0]["train_mean_nll"]
    print("sl_loop train_mean_nll:", [round(m["train_mean_nll"], 4) for m in metrics])


def test_rl_train_trains_stops_and_resumes_through_checkpoint_utils(shim, tmp_path):
    log_path = tmp_path / "rl-train"

    def config(max_steps: int) -> rl_train.Config:
        return rl_train.Config(learning_rate=1e-3, dataset_builder=cookbook.DigitsDatasetBuilder(),
                               model_name=cookbook.MODEL, recipe_name="sailrl_test", max_tokens=8,
                               log_path=str(log_path), renderer_name=cookbook.RENDERER, eval_every=0, save_every=1,
                               lora_rank=4, max_steps=max_steps, num_groups_to_log=0)

    assert shim() == []
    asyncio.run(rl_train.main(config(2)))
    records = checkpoint_utils.load_checkpoints_file(str(log_path))
    assert [(r.name, r.batch) for r in records] == [("000001", 1), ("000002", 2), ("final", 2)]
    first = _metrics(log_path)
    assert [m["progress/batch"] for m in first] == [0, 1]

    # what the resume's checkpoint_utils.check_renderer_name_for_checkpoint_async reads: the run's user_metadata
    with LocalServiceClient(cookbook.MODEL, base_dir=str(tmp_path / "checkpoints")) as service:
        run = service.create_rest_client().get_training_run_by_tinker_path(records[-1].state_path).result()
    assert run.user_metadata == {"renderer_name": cookbook.RENDERER}
    created = shim()
    asyncio.run(rl_train.main(config(4)))
    assert created[-1] == ("create_training_client_from_state_with_optimizer_async", records[-1].state_path)
    metrics = _metrics(log_path)
    assert [m["progress/batch"] for m in metrics] == [0, 1, 2, 3]
    records = checkpoint_utils.load_checkpoints_file(str(log_path))
    assert [(r.name, r.batch) for r in records] == [("000001", 1), ("000002", 2), ("final", 2), ("000003", 3),
                                                    ("000004", 4), ("final", 4)]
    assert all("optim/lr" in m or "env/all/reward/total" in m for m in metrics)
    print("rl/train.py reward:", [round(m["env/all/reward/total"], 4) for m in metrics])
