"""Which text of a rollout the reward rules read (``reward.text``), for thinking and plain renderers."""

from __future__ import annotations

from dataclasses import dataclass

from sailrl.runtime.backends.models import get_renderer, get_tokenizer
from sailrl.runtime.rollouts.rollout import completion_text


@dataclass
class _Termination:
    is_clean: bool


class ThinkingRenderer:
    """Parses like tinker_cookbook's thinking renderers: a clean reply is split into thinking and text parts;
    a cut-off reply comes back as raw text (the renderers do not split an unterminated message)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def parse_response(self, tokens):
        raw = self.tokenizer.decode(tokens)
        if raw.endswith("<|end|>"):
            body = raw[: -len("<|end|>")]
            thinking, _, text = body.partition("</think>")
            parts = [{"type": "thinking", "thinking": thinking.removeprefix("<think>")}, {"type": "text", "text": text}]
            return {"role": "assistant", "content": parts}, _Termination(True)
        return {"role": "assistant", "content": raw}, _Termination(False)


TOK = get_tokenizer("sailrl/tiny")


def _ids(s: str) -> list[int]:
    return TOK.encode(s, add_special_tokens=False)


def test_visible_text_drops_thinking_for_clean_and_cut_off_replies():
    r = ThinkingRenderer(TOK)
    clean = _ids("<think>try \\boxed{5}</think>So \\boxed{7}<|end|>")
    assert completion_text(r, clean, ["<|end|>"]) == ("So \\boxed{7}", True)
    cut_inside_thinking = _ids("<think>maybe \\boxed{7} but")
    assert completion_text(r, cut_inside_thinking, ["<|end|>"]) == ("", False)
    cut_after_thinking = _ids("<think>hmm</think>The answer is \\boxed{7")
    assert completion_text(r, cut_after_thinking, ["<|end|>"]) == ("The answer is \\boxed{7", False)


def test_full_text_keeps_thinking_and_drops_the_stop_sequence():
    r = ThinkingRenderer(TOK)
    clean = _ids("<think>\nl1\nl2\n</think>\n<answer>9</answer><|end|>")
    assert completion_text(r, clean, ["<|end|>"], mode="full") == ("<think>\nl1\nl2\n</think>\n<answer>9</answer>", True)


def test_plain_renderer_text_is_the_reply():
    r = get_renderer("role_colon", TOK)
    assert completion_text(r, _ids(" 7\n\nUser:"), ["\n\nUser:"]) == ("7", True)
    assert completion_text(r, _ids(" 7\n\nUser:"), ["\n\nUser:"], mode="full") == (" 7", True)
    text, clean = completion_text(r, _ids(" 7 and mo"), ["\n\nUser:"])
    assert not clean and text.strip() == "7 and mo"
