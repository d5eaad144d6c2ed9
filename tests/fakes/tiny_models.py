"""Tiny Hugging Face models and tokenizers built offline, saved as folders or GGUF files, for model-source tests.

``byte_bpe_tokenizer()`` trains a byte-level BPE (``tokenizers``) on a few sentences, with ChatML special tokens
and a ChatML chat template; ``save_model_dir(arch, path)`` saves a seeded causal LM of architecture ``llama``,
``gpt2`` or ``qwen2`` (a small config) and that tokenizer with ``save_pretrained``; ``write_llama_gguf`` writes a
Llama folder's weights and tokenizer as a float32 GGUF file with the ``gguf`` package, as llama.cpp's converter
lays them out (q/k rows permuted, GGUF tensor names).
"""

from __future__ import annotations

from pathlib import Path

import torch

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "the answer is 42 and the sum of 3 and 4 is 7",
    "user assistant system hello world what is two plus two",
    "tom has 3 apples and buys 5 more so he has 8 apples",
    "boxed answer final number 0 1 2 3 4 5 6 7 8 9",
]


def byte_bpe_tokenizer(vocab_size: int = 320, chat_template: str | None = CHATML):
    """A ``PreTrainedTokenizerFast``: byte-level BPE, ids 0..2 the ChatML specials, EOS ``<|endoftext|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def tiny_config(arch: str, vocab_size: int):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    if arch == "llama":
        return LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           tie_word_embeddings=False, eos_token_id=0, pad_token_id=0, bos_token_id=None)
    if arch == "qwen2":
        return Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           tie_word_embeddings=True, eos_token_id=0, pad_token_id=0, bos_token_id=None)
    if arch == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                          eos_token_id=0, bos_token_id=0, pad_token_id=0)
    raise ValueError(arch)


def save_model_dir(arch: str, path: Path, *, seed: int = 0, chat_template: str | None = CHATML):
    """Save a seeded tiny ``arch`` causal LM and its tokenizer to ``path``; return (model, tokenizer)."""
    from transformers import AutoModelForCausalLM

    tok = byte_bpe_tokenizer(chat_template=chat_template)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config(arch, len(tok)))
    model.eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


def _permute(w, n_head: int, n_head_kv: int | None):
    """llama.cpp's ``convert_hf_to_gguf`` row permutation of q/k projections."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(model, tok, path: Path, *, chat_template: str | None = CHATML) -> Path:
    """Write a Llama ``model`` and byte-level BPE ``tok`` as a float32 GGUF file at ``path``."""
    import gguf
    import numpy as np

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("sailrl-test-llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None)
                              else cfg.rope_theta)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = set(tok.all_special_tokens)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t in tokens])
    import json

    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_eos_token_id(tok.convert_tokens_to_ids("<|im_end|>"))
    writer.add_bos_token_id(tok.convert_tokens_to_ids("<|im_start|>"))
    writer.add_pad_token_id(tok.pad_token_id)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        base, suffix = hf_name.rsplit(".", 1)
        name = names.get_name(base)
        assert name is not None, hf_name
        data = tensor.detach().to(torch.float32).numpy()
        if name.endswith("attn_q"):
            data = _permute(data, cfg.num_attention_heads, cfg.num_attention_heads)
        elif name.endswith("attn_k"):
            data = _permute(data, cfg.num_attention_heads, cfg.num_key_value_heads)
        writer.add_tensor(f"{name}.{suffix}", np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
