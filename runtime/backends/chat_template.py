"""``chat_template``: a tinker_cookbook ``Renderer`` over the tokenizer's own chat template.

For models tinker_cookbook has no renderer for (a local folder, a GGUF file, a hub model), prompts are built
with ``tokenizer.apply_chat_template`` -- exactly what the model was tuned on -- and implement what sailrl's
loop uses from a renderer:

- ``build_generation_prompt(messages)``: the template with ``add_generation_prompt=True``, tokenized as is
  (``add_special_tokens=False``: the template already writes any BOS);
- ``get_stop_sequences()``: the template's end-of-turn token and the tokenizer's EOS, as token ids. The
  end-of-turn token is found by rendering a one-turn conversation and taking the first special token after
  the assistant's text (``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama 3). A template that ends a turn
  with plain text instead stops on that text (and EOS);
- ``parse_response(tokens)``: the text before the stop token; ``STOP_SEQUENCE`` when the end-of-turn token
  ended it, ``EOS`` for EOS, ``MALFORMED`` when neither did (cut at max_tokens);
- ``build_supervised_example(messages)``: the generation prompt of ``messages[:-1]`` (weight 0) followed by the
  last assistant message as the template renders it, up to and including its end-of-turn token (weight 1).

Tools (episodes with ``environment.tools``), where the template declares them itself -- it reads the ``tools``
variable of ``apply_chat_template(..., tools=...)`` and writes calls as ``<tool_call>`` JSON blocks (the
Hermes / Qwen convention; :func:`template_tool_support` says whether a template does):

- ``create_conversation_prefix_with_tools(tools, system)``: the system message alone; the tools (each as
  ``{"type": "function", "function": spec}``) are remembered and passed as ``tools=`` on every later render, so
  the template writes the declaration in its own words;
- ``parse_response``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks become the message's
  ``tool_calls`` (the cookbook's ``parse_content_blocks``; a block with bad JSON an ``unparsed_tool_calls``
  entry); the text keeps the blocks as sampled;
- history: an assistant message is rendered with its text as sampled (its ``tool_calls`` also passed, for
  templates that write them from there), a tool result as ``{"role": "tool", "content", "name"}``.
"""

from __future__ import annotations

import json
from typing import Any

import tinker
import torch
from tinker_cookbook.renderers.base import (
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Renderer,
    ToolCall,
    ToolSpec,
    TrainOnWhat,
    UnparsedToolCall,
    ensure_text,
    parse_content_blocks,
)

from sailrl.spec.errors import ModelError
from sailrl.spec.renderers import template_tool_support

_MARK = "sailrl-turn-marker-7f3a"


class ChatTemplateError(ModelError):
    """The tokenizer has no chat template, or its template cannot render a plain conversation."""

    code = "E122"


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return ids


class ChatTemplateRenderer(Renderer):
    """Renders conversations with ``tokenizer.apply_chat_template`` (see the module docstring).

    Raises :class:`ChatTemplateError` when the tokenizer has no ``chat_template`` or the template fails on a
    user + assistant conversation.
    """

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        self.tools: list[dict[str, Any]] | None = None  # set by create_conversation_prefix_with_tools
        if not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ChatTemplateError(
                f"the tokenizer of '{name}' has no chat template, so the chat_template renderer cannot build "
                "prompts: set model.renderer (role_colon works with any tokenizer)")
        try:
            text = self._text([{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARK}])
        except Exception as exc:  # noqa: BLE001 -- jinja errors, templates that need extra variables
            raise ChatTemplateError(f"the tokenizer's chat template cannot render a user + assistant "
                                    f"conversation ({type(exc).__name__}: {exc}); set model.renderer") from None
        if _MARK not in text:
            raise ChatTemplateError("the tokenizer's chat template drops the assistant's text; set model.renderer")
        suffix = text.split(_MARK, 1)[1]
        eos = tokenizer.eos_token_id
        special = _special_ids(tokenizer)
        turn_end = next((t for t in tokenizer.encode(suffix, add_special_tokens=False) if t in special), None)
        self.end_of_turn_id: int | None = turn_end
        self.stop_text: str | None = None
        if turn_end is not None:
            self._stops: list[int] | list[str] = sorted({turn_end} | ({int(eos)} if eos is not None else set()))
        elif suffix.strip():
            self.stop_text = suffix.strip()
            self._stops = [self.stop_text]  # strings: the sampler also stops on EOS
        else:
            self._stops = [int(eos)] if eos is not None else []

    # ------------------------------------------------------------------ text
    @staticmethod
    def _plain(message: Message) -> dict[str, Any]:
        out: dict[str, Any] = {"role": message["role"], "content": ensure_text(message.get("content") or "")}
        if message.get("tool_calls") and "<tool_call>" not in out["content"]:  # sampled text keeps its blocks
            out["tool_calls"] = [{"type": "function", "function": {
                "name": c.function.name, "arguments": json.loads(c.function.arguments or "{}")}}
                for c in message["tool_calls"]]
        if message["role"] == "tool" and message.get("name"):
            out["name"] = message["name"]
        return out

    def _text(self, messages: list[Message], *, generation: bool = False) -> str:
        plain = [self._plain(m) for m in messages]
        extra = {"tools": self.tools} if self.tools else {}
        return str(self.tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=generation,
                                                      **extra))

    def create_conversation_prefix_with_tools(self, tools: list[ToolSpec], system_prompt: str = "") -> list[Message]:
        """The system message (if any); ``tools`` go to the template as ``tools=`` on every render from now on.
        Raises :class:`ChatTemplateError` when the template cannot declare them (:func:`template_tool_support`)."""
        why = template_tool_support(getattr(self.tokenizer, "chat_template", None))
        if why is not None:
            raise ChatTemplateError(f"the chat_template renderer cannot give this model tools: {why}; set "
                                    "model.renderer to one that writes tool calls for it (e.g. qwen3)")
        self.tools = [{"type": "function", "function": dict(t)} for t in tools]
        return [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # ------------------------------------------------------------------ Renderer interface
    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        raise NotImplementedError("the chat_template renderer renders whole conversations through the template")

    def get_stop_sequences(self) -> list[str] | list[int]:
        """The end-of-turn token id and EOS id (or the template's end-of-turn text)."""
        return list(self._stops)

    def build_generation_prompt(self, messages: list[Message], role: str = "assistant",
                                prefill: str | None = None) -> tinker.ModelInput:
        """The template with ``add_generation_prompt=True`` (only ``role="assistant"``), plus ``prefill``."""
        if role != "assistant":
            raise ValueError("the chat_template renderer builds prompts for the assistant only")
        tokens = self._encode(self._text(messages, generation=True))
        if prefill:
            tokens += self._encode(prefill)
        return tinker.ModelInput.from_ints(tokens)

    def parse_response(self, response: list[int]) -> tuple[Message, ParseTermination]:
        """(assistant message, how it ended): see the module docstring."""
        tokens = list(response)
        termination = ParseTermination.MALFORMED
        if tokens and self.end_of_turn_id is not None and tokens[-1] == self.end_of_turn_id:
            tokens, termination = tokens[:-1], ParseTermination.STOP_SEQUENCE
        elif tokens and self.tokenizer.eos_token_id is not None and tokens[-1] == self.tokenizer.eos_token_id:
            tokens, termination = tokens[:-1], ParseTermination.EOS
        text = str(self.tokenizer.decode(tokens, skip_special_tokens=True))
        if self.stop_text is not None and termination == ParseTermination.MALFORMED and text.endswith(self.stop_text):
            text, termination = text[: -len(self.stop_text)], ParseTermination.STOP_SEQUENCE
        message = Message(role="assistant", content=text.strip())
        if self.tools and termination.is_clean:
            parsed = parse_content_blocks(message["content"])
            if parsed is not None:
                calls = parsed[1]
                if any(isinstance(c, ToolCall) for c in calls):
                    message["tool_calls"] = [c for c in calls if isinstance(c, ToolCall)]
                if any(isinstance(c, UnparsedToolCall) for c in calls):
                    message["unparsed_tool_calls"] = [c for c in calls if isinstance(c, UnparsedToolCall)]
        return message, termination

    def build_supervised_example(self, messages: list[Message],
                                 train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE
                                 ) -> tuple[tinker.ModelInput, torch.Tensor]:
        """``(ModelInput, weights)``: the prompt (weight 0) then the last assistant message up to its end-of-turn
        token (weight 1). Only ``LAST_ASSISTANT_MESSAGE`` / ``LAST_ASSISTANT_TURN`` of a conversation ending
        in an assistant message are supported (``ValueError`` otherwise)."""
        if train_on_what not in (TrainOnWhat.LAST_ASSISTANT_MESSAGE, TrainOnWhat.LAST_ASSISTANT_TURN):
            raise ValueError(f"the chat_template renderer supports only LAST_ASSISTANT_MESSAGE, not {train_on_what}")
        if not messages or messages[-1]["role"] != "assistant":
            raise ValueError("a supervised example must end with an assistant message")
        prompt_text = self._text(messages[:-1], generation=True)
        full_text = self._text(messages)
        if not full_text.startswith(prompt_text):
            raise ValueError("the chat template renders the conversation differently from its generation prompt")
        prompt = self._encode(prompt_text)
        completion = self._encode(full_text[len(prompt_text):])
        if self.end_of_turn_id is not None and self.end_of_turn_id in completion:
            completion = completion[: completion.index(self.end_of_turn_id) + 1]
        tokens = prompt + completion
        weights = torch.tensor([0.0] * len(prompt) + [1.0] * len(completion))
        return tinker.ModelInput.from_ints(tokens), weights
