"""The tests' stand-in tokenizer: token id = code point, so decode is exact and needs no vocabulary (what a
rollout log, a collapse warning or ``sailrl show`` read of a tokenizer). Tests that need the built-in models'
real byte tokenizer use ``get_tokenizer("sailrl/tiny")``."""

from __future__ import annotations


class CharTokenizer:
    """Token id = code point."""

    def decode(self, tokens):
        return "".join(chr(t) for t in tokens)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]
