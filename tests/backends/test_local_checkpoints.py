"""Checkpoints: PEFT adapters that peft loads, exact resume with optimizer state, rest calls, HF dirs."""

from __future__ import annotations

import asyncio
import json
import os
import tarfile
import urllib.parse

import pytest
import torch
from tinker import types

from sailrl.runtime.backends.local import CheckpointPathError, LocalServiceClient
from sailrl.runtime.backends.local.weights.tiny import TINY_CONFIG, build_tiny_model

SEQ = [72, 101, 108, 108, 111, 35, 50, 43, 51, 61]
DATUM = types.Datum(
    model_input=types.ModelInput.from_ints(SEQ[:-1]), loss_fn_inputs={"target_tokens": SEQ[1:]}
)
ADAM = types.AdamParams(learning_rate=0.02)


def _step(tc) -> float:
    loss = tc.forward_backward([DATUM], "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(ADAM).result()
    return loss


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    return LocalServiceClient(base_dir=tmp_path_factory.mktemp("ckpt"), seed=0)


def test_sampler_weights_are_a_peft_adapter_on_the_reproducible_base(svc):
    from peft import PeftModel

    tc = svc.create_lora_training_client("sailrl/tiny", rank=4, seed=2)
    for _ in range(3):
        _step(tc)
    path = tc.save_weights_for_sampler("step-3").result().path
    assert path == f"local://{tc.get_info().model_id}/sampler_weights/step-3"
    directory = os.path.join(svc.base_dir, tc.get_info().model_id, "sampler_weights", "step-3")
    assert {"adapter_config.json", "adapter_model.safetensors", "base_model.json"} <= set(
        os.listdir(directory)
    )
    with open(os.path.join(directory, "base_model.json")) as f:
        base_info = json.load(f)
    assert base_info == {"model_name": "sailrl/tiny", "seed": 0, "config": TINY_CONFIG, "revision": None}

    loaded = PeftModel.from_pretrained(build_tiny_model(base_info["seed"]), directory).eval()
    x = torch.tensor([SEQ])
    with torch.no_grad():
        want = tc.peft_model(input_ids=x).logits
        got = loaded(input_ids=x).logits
        sampler = svc.create_sampling_client(model_path=path)
        merged = sampler._batcher.engine.model(input_ids=x).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(merged, want, atol=1e-5)
    assert not torch.allclose(build_tiny_model(0)(input_ids=x).logits, want, atol=1e-3)  # training mattered


def test_resume_with_optimizer_continues_identically(svc):
    run = svc.create_lora_training_client("sailrl/tiny", rank=4, seed=5)
    _step(run)
    _step(run)
    state_path = run.save_state("after-2").result().path
    assert state_path.endswith("/weights/after-2")
    uninterrupted = [_step(run) for _ in range(2)]

    resumed = svc.create_training_client_from_state_with_optimizer(state_path)
    assert resumed.get_info().model_id != run.get_info().model_id
    continued = [_step(resumed) for _ in range(2)]
    assert continued == pytest.approx(uninterrupted, rel=1e-6, abs=1e-6)
    for (name, a), b in zip(run.peft_model.named_parameters(), resumed.peft_model.parameters(), strict=True):
        if a.requires_grad:
            assert torch.allclose(a, b, atol=1e-6), name

    # weights only: same first loss, but a fresh optimizer takes a different step
    fresh = svc.create_training_client_from_state(state_path)
    first = _step(fresh)
    assert first == pytest.approx(uninterrupted[0], rel=1e-6)
    assert _step(fresh) != pytest.approx(uninterrupted[1], rel=1e-6)


def test_load_state_with_optimizer_on_an_existing_client(svc):
    run = svc.create_lora_training_client("sailrl/tiny", rank=4, seed=6)
    _step(run)
    path = run.save_state("one").result().path
    expected = _step(run)
    other = svc.create_lora_training_client("sailrl/tiny", rank=4, seed=99)
    other.load_state_with_optimizer(path).result()
    assert _step(other) == pytest.approx(expected, rel=1e-6)
    sampler_path = run.save_weights_for_sampler("s").result().path
    fresh = svc.create_lora_training_client("sailrl/tiny", rank=4, seed=98)
    with pytest.raises(CheckpointPathError, match=r"load_state needs a training-state checkpoint \(weights/"):
        fresh.load_state_with_optimizer(sampler_path).result()


def test_names_and_paths_are_checked(svc):
    tc = svc.create_lora_training_client("sailrl/tiny", rank=2, seed=1)
    with pytest.raises(ValueError, match="is not allowed"):
        tc.save_state("../escape")
    tc.save_state("dup").result()
    with pytest.raises(ValueError, match="already exists"):
        tc.save_state("dup").result()
    tc.save_state("dup", overwrite=True).result()
    with pytest.raises(CheckpointPathError, match="belongs to the Tinker service"):
        svc.create_sampling_client(model_path="tinker://abc/sampler_weights/x")
    with pytest.raises(CheckpointPathError, match="No checkpoint at"):
        svc.create_sampling_client(model_path="local://nope/sampler_weights/x")


def test_rest_client_ttl_archive_list_delete(svc):
    import sail.tinker

    tc = svc.create_lora_training_client("sailrl/tiny", rank=2, seed=1)
    path = tc.save_weights_for_sampler("s0").result().path
    url = asyncio.run(sail.tinker.get_tinker_checkpoint_signed_url_async(svc, path, ttl_seconds=7200))
    assert url.startswith("file://")
    archive = urllib.parse.urlparse(url).path
    with tarfile.open(archive) as tar:
        assert {"adapter_config.json", "adapter_model.safetensors", "base_model.json"} <= set(tar.getnames())
    rest = svc.create_rest_client()
    listed = rest.list_checkpoints(tc.get_info().model_id).result().checkpoints
    assert [c.tinker_path for c in listed] == [path]
    assert listed[0].checkpoint_type == "sampler" and listed[0].expires_at is not None
    rest.delete_checkpoint_from_tinker_path(path).result()
    assert rest.list_checkpoints(tc.get_info().model_id).result().checkpoints == []


def test_local_hugging_face_directory_as_base_model(tmp_path):
    from transformers import ByT5Tokenizer

    model_dir = tmp_path / "my-model"
    build_tiny_model(3).save_pretrained(model_dir)
    ByT5Tokenizer(extra_ids=0).save_pretrained(model_dir)
    svc = LocalServiceClient(str(model_dir), base_dir=tmp_path / "ckpt", seed=0)
    tc = svc.create_lora_training_client(str(model_dir), rank=4, seed=1)
    assert tc.get_tokenizer().encode("a", add_special_tokens=False) == [100]
    losses = [_step(tc) for _ in range(3)]
    assert losses[2] < losses[0]
    path = tc.save_weights_for_sampler("s").result().path
    sampler = svc.create_sampling_client(model_path=path)
    out = sampler.sample(
        types.ModelInput.from_ints(SEQ), 2, types.SamplingParams(max_tokens=4, stop=[])
    ).result()
    assert [len(s.tokens) for s in out.sequences] == [4, 4]
    caps = svc.get_server_capabilities()
    assert caps.supported_models[0].model_name == str(model_dir)
