"""``role_colon_tools``: tinker_cookbook's ``role_colon`` format with tool calls, for the built-in models.

``role_colon`` (``User: ...\\n\\nAssistant: ...``) has no tool-calling convention, and the cookbook's renderers
that have one (qwen3, llama3, kimi_k2, ...) need their special tokens, which the built-in models' byte tokenizer
does not have. This renderer keeps role_colon's text and stop sequence (``\\n\\nUser:``) and adds:

- tools declared in a short ``System:`` message (:meth:`create_conversation_prefix_with_tools`): ``Tools:``,
  one line per tool, ``name(param: type, optional?: type): the description's first sentence.``, then the call
  format, ``Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.`` The byte tokenizer spends a
  token a character, so each tool's whole JSON spec (as the cookbook's qwen3 renderer writes it) would make the
  declarations several times the prompt and most of what an episode trains on (``benchmarks/local_backend.md``);
- tool calls parsed out of the reply with the cookbook's ``parse_content_blocks`` (a block with bad JSON is an
  ``UnparsedToolCall``, as in the cookbook's qwen3 renderer); the reply's text keeps the block as written, so the
  history renders back to exactly the sampled tokens;
- a tool result rendered as a ``User:`` turn, ``<tool_response>...</tool_response>``: so every later
  observation extends the previous observation plus the sampled reply (its ``\\n\\nUser:`` stop included), and an
  episode trains as one sequence, tool results and feedback masked out.
"""

from __future__ import annotations

import json
import re

from tinker_cookbook.renderers.base import (
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    ToolCall,
    ToolSpec,
    UnparsedToolCall,
    ensure_text,
    parse_content_blocks,
)
from tinker_cookbook.renderers.role_colon import RoleColonRenderer

NAME = "role_colon_tools"


#: The last line of the declaration: how to write a call.
CALL_FORMAT = 'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def declare_tool(tool: ToolSpec) -> str:
    """One tool's line of the declaration: ``name(param: type, optional?: type): first sentence.`` -- e.g.
    ``calculator(expression: string): Exact arithmetic.`` (the description's first sentence only)."""
    schema = tool.get("parameters") or {}
    required = set(schema.get("required") or [])
    params = []
    for pname, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type", "any") if isinstance(prop, dict) else "any"
        if isinstance(kind, list):
            kind = "|".join(str(k) for k in kind)
        params.append(f"{pname}{'' if pname in required else '?'}: {kind}")
    line = f"{tool['name']}({', '.join(params)})"
    description = " ".join(str(tool.get("description") or "").split())
    if description:
        line += ": " + _SENTENCE_END.split(description, maxsplit=1)[0]
    return line


def format_tool_call(call: ToolCall) -> str:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` for ``call``."""
    payload = {"name": call.function.name, "arguments": json.loads(call.function.arguments or "{}")}
    return "<tool_call>" + json.dumps(payload, ensure_ascii=False) + "</tool_call>"


class RoleColonToolsRenderer(RoleColonRenderer):
    """role_colon with tool calls (see the module docstring)."""

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        if message["role"] == "tool":
            body = "<tool_response>\n" + ensure_text(message["content"]) + "\n</tool_response>"
            return super().render_message({"role": "user", "content": body}, ctx)
        if message["role"] == "assistant" and message.get("tool_calls"):
            text = ensure_text(message["content"]) if message.get("content") else ""
            if "<tool_call>" not in text:  # a message built in code, not parsed from a reply: write its calls
                text = text + "".join(format_tool_call(c) for c in message["tool_calls"])
            return super().render_message({"role": "assistant", "content": text}, ctx)
        return super().render_message(message, ctx)

    def parse_response(self, response: list[int]) -> tuple[Message, ParseTermination]:
        message, termination = super().parse_response(response)
        content = message.get("content")
        if not termination.is_clean or not isinstance(content, str):
            return message, termination
        parsed = parse_content_blocks(content)
        if parsed is not None:
            _, calls = parsed
            tool_calls = [c for c in calls if isinstance(c, ToolCall)]
            unparsed = [c for c in calls if isinstance(c, UnparsedToolCall)]
            if tool_calls:
                message["tool_calls"] = tool_calls
            if unparsed:
                message["unparsed_tool_calls"] = unparsed
        return message, termination

    def create_conversation_prefix_with_tools(self, tools: list[ToolSpec], system_prompt: str = "") -> list[Message]:
        lines = [system_prompt.strip()] if system_prompt.strip() else []
        lines.append("Tools:")
        lines += [declare_tool(t) for t in tools]
        lines.append(CALL_FORMAT)
        return [{"role": "system", "content": "\n".join(lines)}]
