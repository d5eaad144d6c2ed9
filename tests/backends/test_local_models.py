"""Built-in models, the model catalogue (spec/models.py) and the embedded backend's device / dtype / thread policy."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch

from sailrl.runtime.backends.local import BaseModelError, LocalServiceClient
from sailrl.runtime.backends.local.weights import device as device_mod
from sailrl.runtime.backends.local.weights.tiny import PRETRAINED_WEIGHTS, build_tiny_model, resolve_base_model, weights_sha256
from sailrl.runtime.backends.models import default_renderer_name, get_renderer, get_tokenizer
from sailrl.spec import models as catalogue
from sailrl.spec.errors import ConfigError
from sailrl.spec.models import classify, context_window, default_renderer, lora_family


def test_tiny_tokenizer_is_bytes_and_renderer_is_role_colon():
    tok = get_tokenizer("sailrl/tiny")
    assert len(tok) == 259 and tok.eos_token_id == 1
    assert tok.encode("a+b", add_special_tokens=False) == [ord("a") + 3, ord("+") + 3, ord("b") + 3]
    renderer = get_renderer(default_renderer_name("sailrl/tiny"), tok)
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "1+2=?"}])
    assert tok.decode(prompt.to_ints()) == "User: 1+2=?\n\nAssistant:"
    assert renderer.get_stop_sequences() == ["\n\nUser:"]
    message, _ = renderer.parse_response(tok.encode(" 3\n\nUser:", add_special_tokens=False))
    assert message["content"] == "3"


def test_local_directory_tokenizer(tmp_path):
    from transformers import ByT5Tokenizer

    ByT5Tokenizer(extra_ids=0).save_pretrained(tmp_path)
    assert get_tokenizer(str(tmp_path)).encode("a", add_special_tokens=False) == [100]


def test_tiny_base_is_reproducible_from_its_seed():
    a, b, c = build_tiny_model(0), build_tiny_model(0), build_tiny_model(1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert a.lm_head.weight.data_ptr() != a.model.embed_tokens.weight.data_ptr()  # untied
    assert a.config.vocab_size == len(get_tokenizer("sailrl/tiny"))


def test_a_hub_name_offline_is_one_plain_line(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(BaseModelError, match="cannot load the model 'Qwen/Qwen3-8B' from the Hugging Face hub"):
        resolve_base_model("Qwen/Qwen3-8B", 0)


# ------------------------------------------------------------------------------------------------ tiny-arith


def _arith_probability(model) -> float:
    import importlib.util

    path = PRETRAINED_WEIGHTS["sailrl/tiny-arith"].with_name("make_tiny_arith.py")
    spec = importlib.util.spec_from_file_location("make_tiny_arith", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.answer_probability(model, [module.render(q, a) for q, a in module.sums()])


def test_tiny_arith_ships_weights_that_half_know_the_sums():
    """The shipped base answers in the format but gets only part of the table: the p(answer) recorded in the
    file's metadata by make_tiny_arith.py, recomputed here."""
    from safetensors import safe_open

    path = PRETRAINED_WEIGHTS["sailrl/tiny-arith"]
    assert path.stat().st_size < 2_000_000
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    spec = resolve_base_model("sailrl/tiny-arith", seed=123)
    assert (spec.seed, spec.revision) == (None, weights_sha256(path))  # model.seed does not change its weights
    svc = LocalServiceClient("sailrl/tiny-arith")
    model = svc._backend.bases.get(spec)
    _, p = _arith_probability(model)
    assert round(p, 4) == float(meta["p_answer"])
    assert 0.2 <= p <= 0.5, p  # "half-knows": RL has room to climb
    random_base = build_tiny_model(0)
    assert _arith_probability(random_base)[1] < 0.001


def test_a_tiny_arith_checkpoint_rebuilds_its_base_and_refuses_other_weights(tmp_path):
    svc = LocalServiceClient("sailrl/tiny-arith", base_dir=tmp_path)
    tc = svc.create_lora_training_client("sailrl/tiny-arith", rank=4, seed=0)
    path = tc.save_state("s0").result().path
    directory = svc._backend.store.existing(path)
    base = json.loads(open(os.path.join(directory, "base_model.json")).read())
    assert base["model_name"] == "sailrl/tiny-arith" and base["revision"] == weights_sha256(
        PRETRAINED_WEIGHTS["sailrl/tiny-arith"])
    fresh = LocalServiceClient("sailrl/tiny-arith", base_dir=tmp_path)
    restored = fresh.create_training_client_from_state_with_optimizer(path)
    ids = torch.tensor([[3, 50, 60, 70]])
    with torch.no_grad():
        torch.testing.assert_close(restored.peft_model(ids).logits, tc.peft_model(ids).logits)
    base["revision"] = "0" * 64
    with open(os.path.join(directory, "base_model.json"), "w") as f:
        json.dump(base, f)
    other = LocalServiceClient("sailrl/tiny-arith", base_dir=tmp_path)
    with pytest.raises(BaseModelError, match="trained on other weights of sailrl/tiny-arith"):
        other.create_training_client_from_state_with_optimizer(path)


@pytest.mark.slow
def test_the_pretraining_script_reproduces_the_shipped_base():
    """make_tiny_arith.py with the settings recorded in the file gives the same model: p(answer) within 0.1.

    Bit-identical weights are not promised across CPUs, and 200 steps of training stopped early amplify the last
    bits of the kernels' arithmetic (the figures on two CPUs: benchmarks/quickstart.md). The band still tells this
    script's model from a random base (< 0.001) and from one trained to the end (~0.98)."""
    from safetensors import safe_open

    with safe_open(str(PRETRAINED_WEIGHTS["sailrl/tiny-arith"]), "pt") as f:
        meta = f.metadata()
    module, _ = _arith_probability(build_tiny_model(0))
    _, p = module.train(int(meta["steps"]), float(meta["lr"]), int(meta["batch_size"]), int(meta["seed"]),
                        log_every=10**9)
    assert abs(p - float(meta["p_answer"])) < 0.1, p


# ------------------------------------------------------------------------------------------------ catalogue


def test_names_are_classified(tmp_path):
    (tmp_path / "folder").mkdir()
    assert classify("sailrl/tiny").kind == classify("sailrl/tiny-arith").kind == "builtin"
    assert classify("folder", tmp_path).kind == "local_dir"
    assert classify("folder", tmp_path).path == tmp_path / "folder"
    assert classify("m.gguf", tmp_path).kind == "gguf"  # a GGUF name, found or not
    assert classify("Qwen/Qwen3-8B").kind == "remote" and not classify("Qwen/Qwen3-8B").is_local


def test_one_default_renderer_rule_for_spec_and_runtime(tmp_path):
    from sailrl.spec.models import default_renderer as spec_default

    assert spec_default is default_renderer
    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "chat_template.jinja").write_text("{{ messages }}")
    for name in ("sailrl/tiny", "sailrl/tiny-arith", "Qwen/Qwen3-8B", "moonshotai/Kimi-K2.6",
                 str(tmp_path / "chat"), str(tmp_path / "x.gguf")):
        assert default_renderer_name(name) == default_renderer(name)
    assert default_renderer("sailrl/tiny-arith") == "role_colon"
    assert default_renderer(str(tmp_path / "x.gguf")) == "chat_template"
    assert default_renderer_name("someorg/some-model") is None


def test_context_windows_come_from_the_catalogue():
    assert context_window("sailrl/tiny-arith") == (4096, "sailrl/tiny-arith config max_position_embeddings")
    assert context_window("Qwen/Qwen3-8B") == (32768, "model card (sailrl's table)")


def test_lora_families():
    assert lora_family("sailrl/tiny-arith") == "standard"
    assert lora_family("moonshotai/Kimi-K2.6") == "mla"
    assert lora_family("Qwen/Qwen3.5-35B-A3B") is None
    assert catalogue.BUILTIN_MODELS["sailrl/tiny-arith"].pretrained


def test_the_spec_catalogue_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, sailrl.spec.models, sailrl.spec.renderers; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------------ device


def test_device_dtype_and_threads_policy(monkeypatch):
    for var in ("SAILRL_DEVICE", "SAILRL_DTYPE", "SAILRL_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert device_mod.local_device("sailrl/tiny") == "cpu"  # the built-in models stay on the CPU
    assert device_mod.local_device("/models/qwen") == "cuda"
    assert device_mod.local_dtype("cuda") is torch.bfloat16
    assert device_mod.local_dtype("cpu") is torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert device_mod.local_dtype("cuda") is torch.float32
    assert (device_mod.thread_count("sailrl/tiny-arith"), device_mod.thread_count("/models/qwen")) == (1, None)
    monkeypatch.setenv("SAILRL_DEVICE", "cpu")
    monkeypatch.setenv("SAILRL_DTYPE", "bfloat16")
    monkeypatch.setenv("SAILRL_THREADS", "2")
    assert (device_mod.local_device("/models/qwen"), device_mod.local_dtype("cpu")) == ("cpu", torch.bfloat16)
    assert device_mod.thread_count("sailrl/tiny") == 2


def test_device_settings_that_cannot_work_are_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SAILRL_DEVICE", "cuda")
    with pytest.raises(ConfigError, match="SAILRL_DEVICE=cuda but torch sees no CUDA device"):
        device_mod.local_device("sailrl/tiny")
    monkeypatch.setenv("SAILRL_DTYPE", "double")
    with pytest.raises(ConfigError, match="SAILRL_DTYPE=double is not a dtype sailrl knows"):
        device_mod.local_dtype("cpu")
    monkeypatch.setenv("SAILRL_THREADS", "zero")
    with pytest.raises(ConfigError, match="SAILRL_THREADS=zero must be a positive whole number"):
        device_mod.thread_count("sailrl/tiny")
