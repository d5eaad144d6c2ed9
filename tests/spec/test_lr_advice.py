"""Learning-rate advice: the table equals tinker_cookbook's get_lr, validate warns (W120) past 10x, explain says it."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest

from sailrl.compiler.validate import validate_text
from sailrl.spec.lr_advice import RECOMMENDED_LORA_LR, lr_advice, lr_far, recommended_lora_lr

SPEC = """\
name: lr-test
model:
  name: {model}
  lora_rank: 32
dataset:
  source: openai/gsm8k
  fields: [question, answer]
prompt:
  user: '{{{{ question }}}}'
reward:
  rules:
    - name: correct
      kind: answer
      compare: numeric
training:
{training}
sampling:
  sampler: sail
"""


def _spec(model: str, lr: str | None) -> str:
    training = f"  learning_rate: {lr}" if lr is not None else "  steps: 10"
    return SPEC.format(model=model, training=training)


def test_table_is_get_lr_for_every_model_it_knows_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from tinker_cookbook import hyperparam_utils

    names = re.findall(r'"([^"]+/[^"]+)": \d', inspect.getsource(hyperparam_utils._get_hidden_size))
    known = {}
    for name in names:
        try:
            known[name] = hyperparam_utils.get_lr(name, is_lora=True)
        except Exception:  # noqa: BLE001 -- not calibrated (Kimi, DeepSeek, gpt-oss ...): no advice
            continue
    assert known == RECOMMENDED_LORA_LR
    assert RECOMMENDED_LORA_LR["Qwen/Qwen3-8B"] == pytest.approx(4.7297908e-4)


def test_advice_numbers_and_suffix():
    assert recommended_lora_lr("Qwen/Qwen3-8B:peft:131072") == RECOMMENDED_LORA_LR["Qwen/Qwen3-8B"]
    assert recommended_lora_lr("moonshotai/Kimi-K2.6") is None
    assert recommended_lora_lr("sailrl/tiny-arith") is None
    assert lr_advice("Qwen/Qwen3-8B", 4e-5) == (
        "learning_rate 4e-05 is 11.8x below the 4.7e-04 tinker_cookbook recommends for a LoRA on Qwen/Qwen3-8B "
        "(hyperparam_utils.get_lr)")
    assert lr_advice("meta-llama/Llama-3.1-8B", 0.005).endswith(
        "is 17.5x above the 2.9e-04 tinker_cookbook recommends for a LoRA on meta-llama/Llama-3.1-8B "
        "(hyperparam_utils.get_lr)")
    assert "within 10% of" in lr_advice("Qwen/Qwen3-8B", 4.8e-4)
    rec = RECOMMENDED_LORA_LR["Qwen/Qwen3-8B"]
    assert not lr_far("Qwen/Qwen3-8B", rec * 9.9) and lr_far("Qwen/Qwen3-8B", rec * 10.1)
    # below: RL recipes run 12-28x under get_lr (tinker_cookbook's rl_loop 4e-5, math_rl 1e-5), so only 100x warns
    assert not lr_far("Qwen/Qwen3-8B", rec / 99) and lr_far("Qwen/Qwen3-8B", rec / 101)
    assert not lr_far("meta-llama/Llama-3.1-8B", 1e-5) and not lr_far("Qwen/Qwen3-8B", 4e-5)


def _w120(text: str):
    return [w for w in validate_text(text, "spec.yaml").warnings if w.code == "W120"]


def test_validate_warns_far_learning_rate_located_with_the_recommendation():
    (w,) = _w120(_spec("Qwen/Qwen3-8B", "1e-7"))
    assert (w.line, w.column) == (16, 18)
    assert "4729.8x below the 4.7e-04" in w.message and "more than 100x away" in w.message
    (w,) = _w120(_spec("meta-llama/Llama-3.1-8B", "1e-2"))
    assert "35.0x above the 2.9e-04" in w.message and "more than 10x away" in w.message


def test_validate_is_quiet_near_the_recommendation_and_for_unknown_models():
    assert _w120(_spec("Qwen/Qwen3-8B", "1e-4")) == []  # 4.7x below
    assert _w120(_spec("Qwen/Qwen3-8B", "1e-5")) == []  # 47x below: where RL recipes run (the Sail guide's rate)
    assert _w120(_spec("moonshotai/Kimi-K2.6", "1e-2")) == []  # get_lr has no calibrated value
    assert _w120(_spec("sailrl/tiny", "2e-3").replace("sampler: sail", "sampler: local")) == []


def test_the_default_learning_rate_is_an_ordinary_rl_rate_and_gets_no_warning():
    assert _w120(_spec("Qwen/Qwen3-8B", None)) == []  # default 1e-5: 47x below get_lr, as RL recipes run


def test_validate_does_not_import_transformers_for_the_advice(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(_spec("Qwen/Qwen3-8B", "1e-7"))
    code = ("import sys; from sailrl.cli import main; rc = main(['validate', sys.argv[1]]); "
            "assert 'transformers' not in sys.modules and 'torch' not in sys.modules, 'heavy import'; "
            "sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "W120 learning-rate-far-from-recommended" in r.stderr


def test_explain_states_the_recommendation(tmp_path, capsys):
    from sailrl.cli import main

    path = tmp_path / "spec.yaml"
    path.write_text(_spec("Qwen/Qwen3-8B", "1e-4"))
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("Learning rate: learning_rate 0.0001 is 4.7x below the 4.7e-04 tinker_cookbook recommends for a LoRA "
            "on Qwen/Qwen3-8B (hyperparam_utils.get_lr).") in out
