"""Issue 18.15: what a run prints -- a resolved run directory, "first step" for one step, and logs without
transformers' GGUF de-quantising bar or peft's tied-embeddings warning on every run."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
from conftest import MINIMAL_SPEC

from sailrl.runtime.local.lora import attach_lora
from sailrl.runtime.local.sources import ResolvedModel, load_model
from sailrl.runtime.report import summary_lines
from sailrl.runtime.rundir import run_dir_path
from sailrl.spec.loader import load_spec
from tests.fakes.tiny_models import save_model_dir, tiny_config, write_llama_gguf


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
