"""runtime.models: tokenizer + renderer for a model name; sailrl/tiny is reproducible from its seed."""

from __future__ import annotations

import pytest
import torch

from sailrl.runtime.local.tiny import BaseModelError, build_tiny_model, resolve_base_model
from sailrl.runtime.models import default_renderer_name, get_renderer, get_tokenizer


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


def test_unknown_model_is_explained():
    with pytest.raises(BaseModelError, match="local Hugging Face model directory"):
        resolve_base_model("Qwen/Qwen3-8B", 0)
