"""Tool calls in the renderer's own format: the ``chat_template`` renderer where the tokenizer's chat template
declares tools (``apply_chat_template(..., tools=...)``, ``<tool_call>`` JSON), over an offline tokenizer with a
tools-capable template written here; validate's S252 reads a local model folder's template; and the cookbook
renderers of the other models the spec accepts with tools (kimi, deepseek, gpt_oss) parse the calls they write."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tinker_cookbook.renderers.base import Message, ToolCall
from tinker_cookbook.rl.data_processing import assemble_training_data
from tinker_cookbook.rl.rollouts import do_group_rollout
from transformers import ByT5Tokenizer

from sailrl.compiler.validate import problems
from sailrl.runtime.backends.chat_template import ChatTemplateError, ChatTemplateRenderer
from sailrl.runtime.backends.models import get_renderer
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rollouts.episode import EpisodeGroupBuilder, build_tools
from sailrl.runtime.rollouts.rollout import SamplingPolicy
from sailrl.spec.environment import EnvironmentSpec
from sailrl.spec.renderers import template_tool_support
from tests.compiler.test_episode_spec import BASE
from tests.rollouts.test_episodes import REWARD

#: A small Hermes-style template that declares tools itself and writes calls as <tool_call> JSON blocks.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>\n'
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PLAIN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tokenizer(template: str) -> ByT5Tokenizer:
    tok = ByT5Tokenizer(extra_ids=0)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = template
    return tok


def test_which_templates_can_declare_tools():
    assert template_tool_support(TOOLS_TEMPLATE) is None
    assert "never reads the `tools` variable" in template_tool_support(PLAIN_TEMPLATE)
    assert "<tool_call> JSON" in template_tool_support(PLAIN_TEMPLATE.replace("m.content", "tools"))
    assert template_tool_support(None) == "the tokenizer has no chat template"
    with pytest.raises(ChatTemplateError, match="cannot give this model tools: its chat template does not"):
        ChatTemplateRenderer(_tokenizer(PLAIN_TEMPLATE)).create_conversation_prefix_with_tools([{"name": "x"}])


def test_an_episode_through_the_tokenizers_own_tools_template():
    tok = _tokenizer(TOOLS_TEMPLATE)
    renderer = ChatTemplateRenderer(tok)
    environment = EnvironmentSpec.model_validate({"max_turns": 3, "tools": [{"builtin": "calculator"}]})
    builder = EpisodeGroupBuilder(row={"question": "3+4", "answer": "7"},
                                  messages=[{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "3+4="}],
                                  renderer=renderer, reward_fn=RewardFunction.from_spec(REWARD, "answer"),
                                  environment=environment, tools=build_tools(environment, "."), group_size=1,
                                  max_tokens=128)
    replies = ['<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call><|im_end|>',
               "7<|im_end|>"]
    sampled = [tok.encode(r, add_special_tokens=False) for r in replies]

    class Sampler:
        prompts: list = []

        async def sample_async(self, prompt, num_samples, sampling_params):
            self.prompts.append(prompt.to_ints())
            toks = sampled[len(self.prompts) - 1]
            return SimpleNamespace(sequences=[SimpleNamespace(tokens=toks, logprobs=[-0.5] * len(toks),
                                                              stop_reason="stop")])

    sampler = Sampler()
    traj = asyncio.run(do_group_rollout(builder, SamplingPolicy(sampler, max_tokens=128))).trajectories_G[0]
    last = traj.transitions[-1]
    assert last.reward == 1.0 and last.metrics["episode/tool_calls"] == 1.0 and last.logs["episode_end"] == "answered"
    first = tok.decode(sampler.prompts[0])
    assert first.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n")  # the template's own words
    assert '{"type": "function", "function": {"name": "calculator"' in first
    assert first.endswith("<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n")
    second = tok.decode(sampler.prompts[1])
    assert second.startswith(first + tok.decode(sampled[0]))  # the reply as sampled, then the tool's result
    assert second.endswith("<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>"
                           "<|im_start|>assistant\n")
    # one datum: only the two sampled replies trained
    datums, _ = assemble_training_data([SimpleNamespace(trajectories_G=[traj])], [[1.0]])
    assert len(datums) == 1
    trained = [t for t, m in zip(datums[0].loss_fn_inputs["target_tokens"].tolist(),
                                 datums[0].loss_fn_inputs["mask"].tolist(), strict=True) if m == 1.0]
    assert trained == sampled[0] + sampled[1]


def test_a_bad_tool_call_is_unparsed_and_plain_text_has_no_calls():
    renderer = ChatTemplateRenderer(_tokenizer(TOOLS_TEMPLATE))
    renderer.create_conversation_prefix_with_tools([{"name": "calculator", "description": "", "parameters": {}}])
    tok = renderer.tokenizer
    msg, term = renderer.parse_response(tok.encode("<tool_call>{nope}</tool_call><|im_end|>",
                                                   add_special_tokens=False))
    assert term.is_clean and "tool_calls" not in msg and len(msg["unparsed_tool_calls"]) == 1
    msg, _ = renderer.parse_response(tok.encode("just 7<|im_end|>", add_special_tokens=False))
    assert msg["content"] == "just 7" and "tool_calls" not in msg


def test_validate_reads_a_local_model_folders_template(tmp_path: Path):
    (tmp_path / "addition.jsonl").write_text('{"question": "1+2", "answer": "3"}\n')
    for template, refused in ((TOOLS_TEMPLATE, False), (PLAIN_TEMPLATE, True)):
        folder = tmp_path / ("plain" if refused else "tools")
        _tokenizer(template).save_pretrained(folder)
        text = BASE.replace("renderer: role_colon      #", "renderer: chat_template  #")
        text = re.sub(r"(?m)^(  name: ).*$", rf"\g<1>{folder.name}", text, count=1)
        text += "\nenvironment:\n  tools:\n    - builtin: calculator\n"
        path = tmp_path / "spec.yaml"
        path.write_text(text)
        s252 = [e for e in problems(text, str(path), path=path)[1] if e.code == "S252"]
        assert bool(s252) == refused, (folder.name, s252)
        if refused:
            assert "cannot give this model tools: its chat template does not declare tools" in s252[0].message
            assert s252[0].key_path == "model.renderer"


# ------------------------------------------------------------------------------------------------ cookbook renderers


def _special_tokens(module: str) -> list[str]:
    """The special tokens the renderer's module names (DeepSeek's also in their full-width form)."""
    source = Path(sys.modules[module].__file__).read_text(encoding="utf-8")
    found = {t for t in re.findall(r"<[|｜][^<>\s\"'*]{1,60}?[|｜]>", source)}
    found |= {t.replace("|", "｜").replace("_", "▁") for t in found if "deepseek" in module}
    return sorted(found | {"<think>", "</think>"})


class _BytesNoEos(ByT5Tokenizer):
    """The byte tokenizer without the EOS it appends on encode (the cookbook renderers encode single tokens)."""

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        return list(token_ids_0) + list(token_ids_1 or [])


@pytest.mark.parametrize("name, module", [("kimi_k2", "tinker_cookbook.renderers.kimi_k2"),
                                          ("kimi_k26", "tinker_cookbook.renderers.kimi_k2 kimi_k25 kimi_k26"),
                                          ("deepseekv3", "tinker_cookbook.renderers.deepseek_v3"),
                                          ("gpt_oss_medium_reasoning", "tinker_cookbook.renderers.gpt_oss")])
def test_the_cookbook_renderers_accepted_with_tools_parse_the_calls_they_write(name, module):
    """Each renderer writes an assistant turn with a tool call (its own format, over the byte tokenizer with its
    special tokens added) and reads the call back out of those tokens, as an episode's reply is read."""
    import importlib

    first, *more = module.split()
    modules = [first, *(first.rsplit(".", 1)[0] + "." + m for m in more)]  # kimi_k26 builds on k25 and k2
    tokens: set[str] = set()
    for m in modules:
        importlib.import_module(m)
        tokens |= set(_special_tokens(m))
    tok = _BytesNoEos(extra_ids=0)
    tok.add_special_tokens({"additional_special_tokens": sorted(tokens)})
    renderer = get_renderer(name, tok)
    call = ToolCall(function=ToolCall.FunctionBody(name="calculator", arguments='{"expression": "3+4"}'), id="functions.calculator:0")
    convo = [*renderer.create_conversation_prefix_with_tools([{"name": "calculator", "description": "Arithmetic.",
                                                                "parameters": {"type": "object"}}], ""),
             {"role": "user", "content": "3+4="},
             Message(role="assistant", content="", tool_calls=[call])]
    model_input, weights = renderer.build_supervised_example(convo)
    tokens = model_input.to_ints()
    reply = [t for t, w in zip(tokens, weights.tolist(), strict=True) if w > 0]
    stops = [s for s in renderer.get_stop_sequences() if isinstance(s, int)]
    if stops and reply[-1] not in stops:  # a sampled reply ends at the stop token (DeepSeek writes none here)
        reply.append(stops[0])
    message, termination = renderer.parse_response(reply)
    assert termination.is_clean, (name, tok.decode(reply))
    calls = message.get("tool_calls") or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("calculator", {"expression": "3+4"})], (name, tok.decode(reply), message)
