"""Episodes of more than one turn: the calculator, the role_colon_tools renderer, the episode loop under a
scripted policy at the sampling-client boundary, the training mask of a two-turn episode, feedback turns, the
bounds (turns, tool calls, tokens, max_tokens) and tool errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import tinker
from tinker_cookbook.rl.data_processing import assemble_training_data
from tinker_cookbook.rl.rollouts import do_group_rollout

from sailrl.runtime.backends.models import get_renderer, get_tokenizer
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rollouts.episode import EpisodeGroupBuilder, build_tools
from sailrl.runtime.rollouts.rollout import SamplingPolicy
from sailrl.runtime.tools import calculator
from sailrl.spec.environment import EnvironmentSpec
from sailrl.spec.rewards import RewardSpec

TOK = get_tokenizer("sailrl/tiny")
RENDERER = get_renderer("role_colon_tools", TOK)
STOP = "\n\nUser:"
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call>'


# ------------------------------------------------------------------------------------------------ calculator


@pytest.mark.parametrize("expr, want", [
    ("0.1 + 0.2", "3/10 = 0.3"), ("7/3", "7/3 = 2.333333333333"), ("(12 + 30) * 2 / 7", "12"),
    ("2**100", str(2**100)), ("-7 // 2", "-4"), ("7 % 3", "1"), ("1e3 * 2", "2000"), ("1,000 + 1", "1001"),
    ("2^10", "1024"), ("-(3 - 5)", "2"), ("1/3*3", "1"),
])
def test_calculator_is_exact(expr, want):
    assert calculator.calculate(expr) == want


@pytest.mark.parametrize("expr, why", [
    ("__import__('os').system('true')", "function call"), ("x + 1", "a name"), ("1/0", "division by zero"),
    ("9**9**9", "exponent"), ("2**0.5", "whole-number exponent"), ("'a' * 3", "is not a number"),
    ("1 < 2", "comparison"), ("(" * 300 + "1" + ")" * 300, ""), ("1+" * 200 + "1", "parts"), ("", "empty"),
    ("10**900 * 10**900", "digits"), ("~1", "the operator ~ is not allowed"), ("not 1", "the operator not is"),
    ("1 << 100000", "the operator << is not allowed"), ("6 & 3", "the operator & is"), ("[1]", "a list is not"),
])
def test_calculator_refuses_with_a_reason(expr, why):
    with pytest.raises(calculator.CalculatorError) as info:
        calculator.calculate(expr)
    assert why in str(info.value)


# ------------------------------------------------------------------------------------------------ renderer


def _ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def test_role_colon_tools_parses_calls_and_keeps_the_text():
    msg, term = RENDERER.parse_response(_ids(" Let me add. " + CALL + STOP))
    assert term.is_clean
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg["tool_calls"]] == [
        ("calculator", {"expression": "3+4"})]
    assert msg["content"] == "Let me add. " + CALL
    bad, _ = RENDERER.parse_response(_ids(" <tool_call>{not json}</tool_call>" + STOP))
    assert "tool_calls" not in bad and bad["unparsed_tool_calls"][0].error.startswith("Invalid JSON")
    plain, _ = RENDERER.parse_response(_ids(" 7" + STOP))
    assert "tool_calls" not in plain and plain["content"] == "7"


def test_role_colon_tools_history_extends_the_sampled_reply():
    """A tool result renders as a User: turn, so observation 2 = observation 1 + reply 1 + the tool turn."""
    convo = [{"role": "user", "content": "3+4="}]
    ob1 = RENDERER.build_generation_prompt(convo).to_ints()
    reply = _ids(" " + CALL + STOP)
    msg, _ = RENDERER.parse_response(reply)
    convo += [msg, {"role": "tool", "content": "7", "name": "calculator"}]
    ob2 = RENDERER.build_generation_prompt(convo).to_ints()
    assert ob2[: len(ob1) + len(reply)] == ob1 + reply
    assert TOK.decode(ob2[len(ob1) + len(reply):]) == " <tool_response>\n7\n</tool_response>\n\nAssistant:"


def test_renderers_without_tool_calls_are_the_ones_the_cookbook_leaves_unimplemented():
    from tinker_cookbook.renderers.base import Renderer
    from tinker_cookbook.renderers.llama3 import Llama3Renderer
    from tinker_cookbook.renderers.qwen3 import Qwen3Renderer
    from tinker_cookbook.renderers.role_colon import RoleColonRenderer

    from sailrl.spec.renderers import NO_TOOL_CALLS

    def implements(cls):
        own = cls.create_conversation_prefix_with_tools
        return own is not Renderer.create_conversation_prefix_with_tools and own is not \
            RoleColonRenderer.create_conversation_prefix_with_tools

    assert not implements(RoleColonRenderer) and not implements(Llama3Renderer) and implements(Qwen3Renderer)
    assert {"role_colon", "llama3", "chat_template"} == set(NO_TOOL_CALLS)


# ------------------------------------------------------------------------------------------------ episodes


class ScriptedSampler:
    """A Tinker-interface sampling client that answers each call with the next scripted reply (text, stop_reason),
    logprob -0.5 per token. Records the prompts it was given."""

    def __init__(self, replies: list[tuple[str, str]]):
        self.replies = list(replies)
        self.prompts: list[list[int]] = []
        self.max_tokens: list[int] = []

    async def sample_async(self, prompt, num_samples, sampling_params):
        self.prompts.append(prompt.to_ints())
        self.max_tokens.append(sampling_params.max_tokens)
        text, stop = self.replies.pop(0)
        toks = _ids(text)
        return SimpleNamespace(sequences=[SimpleNamespace(tokens=toks, logprobs=[-0.5] * len(toks),
                                                          stop_reason=stop)])


REWARD = RewardSpec.model_validate({"rules": [
    {"name": "correct", "kind": "answer", "extract": {"from": "whole"}, "reference": {"extract": {"from": "whole"}},
     "compare": "numeric", "weight": 1.0},
]})


def _run(replies, env: dict, *, max_tokens: int = 64, max_episode_tokens=None, spec_dir=None, row=None):
    environment = EnvironmentSpec.model_validate(env)
    tools = build_tools(environment, spec_dir or ".")
    fn = RewardFunction.from_spec(REWARD, "answer")
    builder = EpisodeGroupBuilder(row=row or {"question": "3+4", "answer": "7"},
                                  messages=[{"role": "user", "content": "3+4="}], renderer=RENDERER, reward_fn=fn,
                                  environment=environment, tools=tools, group_size=1, max_tokens=max_tokens,
                                  max_episode_tokens=max_episode_tokens)
    sampler = ScriptedSampler(replies)
    policy = SamplingPolicy(sampler, max_tokens=max_tokens)
    group = asyncio.run(do_group_rollout(builder, policy))
    return group.trajectories_G[0], sampler, builder


def test_two_turn_episode_with_the_calculator_and_its_training_mask():
    traj, sampler, builder = _run([(" " + CALL + STOP, "stop"), (" 7" + STOP, "stop")],
                                  {"max_turns": 3, "tools": [{"builtin": "calculator"}]})
    assert len(traj.transitions) == 2
    last = traj.transitions[-1]
    assert last.reward == 1.0 and last.episode_done and traj.transitions[0].reward == 0.0
    m = last.metrics
    assert (m["episode/turns"], m["episode/tool_calls"], m["episode/tool_errors"], m["episode/end/answered"]) == \
        (2.0, 1.0, 0.0, 1.0)
    assert m["episode/max_turns"] == 0.0 and m["correct"] == 1.0
    turns = json.loads(last.logs["episode"])
    assert [t["role"] for t in turns] == ["assistant", "tool", "assistant"]
    assert turns[0]["tool_calls"] == [{"name": "calculator", "arguments": '{"expression": "3+4"}'}]
    assert turns[1]["text"] == "7" and turns[1]["name"] == "calculator" and not turns[1]["error"]
    assert last.logs["completion"] == "7" and last.logs["episode_end"] == "answered"

    # The prompt the model saw first declares the tool; the second is the first + reply + tool result.
    system = TOK.decode(sampler.prompts[0])
    assert system.startswith("System: Tools:\ncalculator(expression: string): Exact arithmetic.\n")
    prompt1 = sampler.prompts[0]
    reply1, reply2 = _ids(" " + CALL + STOP), _ids(" 7" + STOP)
    tool_turn = _ids(" <tool_response>\n7\n</tool_response>\n\nAssistant:")
    assert sampler.prompts[1] == prompt1 + reply1 + tool_turn

    # The mask, by hand: the episode is one sequence prompt1 + reply1 + tool_turn + reply2; the targets are that
    # sequence shifted by one; weight 1 exactly on the sampled reply tokens, 0 on the prompt and the tool result.
    datums, _ = assemble_training_data([SimpleNamespace(trajectories_G=[traj])], [[1.0]])
    assert len(datums) == 1
    full = prompt1 + reply1 + tool_turn + reply2
    want_mask = ([0.0] * len(prompt1) + [1.0] * len(reply1) + [0.0] * len(tool_turn) + [1.0] * len(reply2))[1:]
    d = datums[0]
    assert d.model_input.to_ints() == full[:-1]
    assert d.loss_fn_inputs["target_tokens"].tolist() == full[1:]
    assert d.loss_fn_inputs["mask"].tolist() == want_mask
    assert d.loss_fn_inputs["logprobs"].tolist() == [-0.5 * w for w in want_mask]
    assert d.loss_fn_inputs["advantages"].tolist() == want_mask
    assert sum(want_mask) == len(reply1) + len(reply2)


def test_feedback_turn_until_the_rule_passes():
    env = {"max_turns": 3, "feedback": [{"rule": "correct", "message": "Not quite: {{ why }}. Try again."}]}
    traj, sampler, _ = _run([(" 8" + STOP, "stop"), (" 7" + STOP, "stop")], env)
    last = traj.transitions[-1]
    assert len(traj.transitions) == 2 and last.reward == 1.0
    assert last.metrics["episode/feedback_turns"] == 1.0 and last.metrics["episode/end/answered"] == 1.0
    turns = json.loads(last.logs["episode"])
    assert [t["role"] for t in turns] == ["assistant", "user", "assistant"]
    assert turns[1]["text"].startswith("Not quite: ") and turns[1]["text"].endswith(". Try again.")
    assert TOK.decode(sampler.prompts[1]).endswith("Assistant: 8\n\nUser: " + turns[1]["text"] + "\n\nAssistant:")


def test_feedback_stops_at_max_turns():
    env = {"max_turns": 2, "feedback": [{"rule": "correct"}]}
    traj, sampler, _ = _run([(" 8" + STOP, "stop"), (" 9" + STOP, "stop")], env)
    last = traj.transitions[-1]
    assert len(traj.transitions) == 2 and last.reward == 0.0 and not sampler.replies
    assert last.metrics["episode/max_turns"] == 1.0 and last.logs["episode_end"] == "max_turns"
    assert last.metrics["episode/feedback_turns"] == 1.0


def test_all_turns_scores_every_answer_joined():
    env = {"max_turns": 2, "score": "all_turns", "feedback": [{"rule": "correct"}]}
    traj, _, _ = _run([(" 8" + STOP, "stop"), (" 7" + STOP, "stop")], env)
    # 'whole' reads "8\n\n7", not a number equal to 7: the whole episode is what is scored.
    last = traj.transitions[-1]
    assert last.logs["completion"] == "8\n\n7" and last.reward == 0.0 and last.logs["episode_end"] == "max_turns"


def test_tool_calls_past_max_turns_end_the_episode_and_are_scored():
    traj, sampler, _ = _run([(" " + CALL + STOP, "stop")] * 2, {"max_turns": 2, "tools": [{"builtin": "calculator"}]})
    last = traj.transitions[-1]
    assert len(traj.transitions) == 2 and last.logs["episode_end"] == "max_turns"
    assert last.metrics["episode/max_turns"] == 1.0 and last.metrics["episode/tool_calls"] == 2.0


def test_max_tool_calls_bounds_the_episode():
    traj, _, _ = _run([(" " + CALL + CALL + STOP, "stop")],
                      {"max_turns": 4, "max_tool_calls": 1, "tools": [{"builtin": "calculator"}]})
    last = traj.transitions[-1]
    assert len(traj.transitions) == 1 and last.logs["episode_end"] == "max_tool_calls"
    assert last.metrics["episode/tool_calls"] == 1.0


def test_reply_cut_at_max_tokens_is_scored_as_truncated():
    traj, sampler, _ = _run([(" " + CALL + STOP, "stop"), (" 7 and then some", "length")],
                            {"max_turns": 3, "tools": [{"builtin": "calculator"}]})
    last = traj.transitions[-1]
    assert last.logs["episode_end"] == "max_tokens" and last.metrics["truncated"] == 1.0
    assert last.metrics["episode/turns"] == 2.0 and last.logs["completion"] == "7 and then some"


def test_episode_token_budget_ends_the_episode():
    # Room for the first prompt and reply, not for the next turn (prompt + reply + tool result + max_tokens).
    _, probe, _ = _run([(" " + CALL + STOP, "stop"), (" 7" + STOP, "stop")],
                       {"max_turns": 3, "tools": [{"builtin": "calculator"}]})
    budget = len(probe.prompts[1]) + 64 - 1
    traj, sampler, _ = _run([(" " + CALL + STOP, "stop"), (" 7" + STOP, "stop")],
                            {"max_turns": 3, "tools": [{"builtin": "calculator"}]}, max_episode_tokens=budget)
    last = traj.transitions[-1]
    assert len(traj.transitions) == 1 and last.logs["episode_end"] == "max_episode_tokens"
    assert len(sampler.replies) == 1


def test_calculator_errors_reach_the_model_and_are_counted():
    bad = '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(1)"}}</tool_call>'
    nope = '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
    traj, sampler, _ = _run([(" " + bad + nope + STOP, "stop"), (" 7" + STOP, "stop")],
                            {"max_turns": 3, "tools": [{"builtin": "calculator"}]})
    last = traj.transitions[-1]
    assert last.metrics["episode/tool_errors"] == 2.0 and last.reward == 1.0
    turns = json.loads(last.logs["episode"])
    assert "arithmetic only" in turns[1]["text"] and turns[1]["error"]
    assert "not found" in turns[2]["text"] and turns[2]["error"]


TOOLS_PY = '''
import time

def lookup(city: str, units: str = "C") -> str:
    """The temperature in a city."""
    if city == "boom":
        raise KeyError(city)
    if city == "slow":
        time.sleep(30)
    if city == "loud":
        print("x" * 10000)
    return f"{city}: 21 {units}"
'''


@pytest.mark.slow
def test_user_tool_runs_in_a_worker_and_its_failures_are_tool_errors(tmp_path: Path):
    (tmp_path / "tools.py").write_text(TOOLS_PY)

    def call(city):
        return "<tool_call>" + json.dumps({"name": "lookup", "arguments": {"city": city}}) + "</tool_call>"

    replies = [(" " + call("Oslo") + call("boom") + STOP, "stop"), (" " + call("slow") + STOP, "stop"),
               (" " + call("loud") + STOP, "stop"), (" 7" + STOP, "stop")]
    env = {"max_turns": 4, "tools": [{"function": "tools:lookup", "timeout_s": 0.5, "max_output_chars": 1000}]}
    traj, sampler, builder = _run(replies, env, spec_dir=tmp_path)
    spec = builder.tools[0].to_spec()
    assert spec["name"] == "lookup" and spec["description"] == "The temperature in a city."
    assert spec["parameters"]["required"] == ["city"] and spec["parameters"]["properties"]["units"]["default"] == "C"
    last = traj.transitions[-1]
    turns = [t for t in json.loads(last.logs["episode"]) if t["role"] == "tool"]
    assert turns[0]["text"] == "Oslo: 21 C" and not turns[0]["error"]
    assert "raised KeyError: 'boom' (at tools.py:7)" in turns[1]["text"]
    assert "longer than 0.5 s" in turns[2]["text"]
    assert "printed more than 1000 characters" in turns[3]["text"]
    assert last.metrics["episode/tool_calls"] == 4.0 and last.metrics["episode/tool_errors"] == 3.0
    assert last.reward == 1.0 and last.logs["episode_end"] == "answered"


def test_rollout_log_show_and_metrics_carry_every_turn(tmp_path, capsys, monkeypatch):
    from sailrl.cli import main
    from sailrl.runtime.loop.report import rollout_metrics
    from sailrl.runtime.rundir.rollout_log import RolloutLog, read_rollouts

    traj, _, _ = _run([(" " + CALL + STOP, "stop"), (" 7" + STOP, "stop")],
                      {"max_turns": 3, "tools": [{"builtin": "calculator"}]})
    group = SimpleNamespace(trajectories_G=[traj], get_total_rewards=lambda: [1.0])
    m = rollout_metrics([group], 0, ["correct"])
    assert (m["episode/turns"], m["episode/tool_calls"], m["episode/end/answered"], m["reward/correct"]) == \
        (2.0, 1.0, 1.0, 1.0)
    RolloutLog(tmp_path, reference_field="answer").write_step(
        1, "train", [group], [{"_index": 0, "answer": "7"}], None, sampler_paths="local://r/sampler_weights/0",
        sampler_steps=0, tokenizer=TOK)
    rec = read_rollouts(tmp_path)[0]
    assert rec["episode"]["end"] == "answered"
    assert [t["role"] for t in rec["episode"]["turns"]] == ["assistant", "tool", "assistant"]
    assert rec["num_tokens"] == len(_ids(" " + CALL + STOP)) + len(_ids(" 7" + STOP))
    assert rec["rules"]["correct"]["passed"] is True and rec["completion"] == "7"
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "turn 1 · assistant" in out and '→ tool call calculator({"expression": "3+4"})' in out
    assert "turn 2 · tool calculator" in out and "turn 3 · assistant" in out
    assert "episode ended: answered after 2 model turns" in out and "scored text" in out  # not the tool result


def test_single_turn_records_have_no_episode_key(tmp_path):
    from sailrl.runtime.rundir.rollout_log import RolloutLog

    tr = SimpleNamespace(ob=tinker.ModelInput.from_ints(_ids("User: 1\n\nAssistant:")),
                         ac=SimpleNamespace(tokens=_ids(" 7"), stop_reason="stop"), logs={"completion": "7"},
                         metrics={})
    group = SimpleNamespace(trajectories_G=[SimpleNamespace(transitions=[tr])], get_total_rewards=lambda: [1.0])
    rec = RolloutLog(tmp_path).records(1, "train", [group], [{}], None, sampler_paths=None, sampler_steps=0,
                                       tokenizer=TOK)[0]
    assert "episode" not in rec and list(rec)[-1] == "prompt"


def test_a_python_rule_can_charge_each_turn(tmp_path):
    (tmp_path / "rewards.py").write_text("def turn_penalty(completion, fields):\n"
                                         "    return -0.1 * (fields['episode_turns'] - 1)\n")
    reward = RewardSpec.model_validate({"rules": [
        *[r.model_dump(by_alias=True, exclude_unset=True) for r in REWARD.rules],
        {"name": "turns", "kind": "python", "function": "rewards:turn_penalty"}]})
    environment = EnvironmentSpec.model_validate({"max_turns": 3, "feedback": [{"rule": "correct"}]})
    fn = RewardFunction.from_spec(reward, "answer", spec_dir=tmp_path)
    builder = EpisodeGroupBuilder(row={"question": "3+4", "answer": "7"}, messages=[{"role": "user", "content": "3+4="}],
                                  renderer=RENDERER, reward_fn=fn, environment=environment, tools=[], group_size=1,
                                  max_tokens=64)
    sampler = ScriptedSampler([(" 8" + STOP, "stop"), (" 9" + STOP, "stop"), (" 7" + STOP, "stop")])
    traj = asyncio.run(do_group_rollout(builder, SamplingPolicy(sampler, max_tokens=64))).trajectories_G[0]
    last = traj.transitions[-1]
    assert last.metrics["reward/turns"] == pytest.approx(-0.2) and last.reward == pytest.approx(0.8)


def test_a_reply_whose_tool_calls_all_fail_to_parse_ends_the_episode_scored():
    traj, sampler, _ = _run([(" 7 <tool_call>{not json}</tool_call>" + STOP, "stop")],
                            {"max_turns": 3, "tools": [{"builtin": "calculator"}]})
    last = traj.transitions[-1]
    assert len(traj.transitions) == 1 and last.logs["episode_end"] == "parse_error"
    assert last.metrics["parse_error"] == 1.0 and "correct" in last.metrics  # scored by the rules, not -0.1
    assert last.logs["completion"] == "7 " and last.reward == 1.0


@pytest.mark.parametrize("name", ["qwen3", "qwen3_instruct"])
def test_qwen3_renderers_write_and_parse_the_calls_of_an_episode(name):
    """The cookbook's qwen3 renderers (the gsm8k_calculator example's), over the byte tokenizer with Qwen's special
    tokens added (no hub): the tool is declared in the system turn, the <tool_call> block is parsed, the result
    comes back as a tool turn, and only the sampled tokens are trained."""
    from transformers import ByT5Tokenizer

    from sailrl.runtime.backends.models import get_renderer as renderer_for

    tok = ByT5Tokenizer(extra_ids=0)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]})
    renderer = renderer_for(name, tok)
    environment = EnvironmentSpec.model_validate({"max_turns": 3, "tools": [{"builtin": "calculator"}]})
    builder = EpisodeGroupBuilder(row={"question": "3+4", "answer": "7"}, messages=[{"role": "user", "content": "3+4="}],
                                  renderer=renderer, reward_fn=RewardFunction.from_spec(REWARD, "answer"),
                                  environment=environment, tools=build_tools(environment, "."), group_size=1,
                                  max_tokens=128)
    replies = ['<tool_call>\n{"name": "calculator", "arguments": {"expression": "3+4"}}\n</tool_call><|im_end|>',
               "7<|im_end|>"]
    sampled = [tok.encode(r, add_special_tokens=False) for r in replies]

    class Sampler:
        prompts: list = []

        async def sample_async(self, prompt, num_samples, sampling_params):
            self.prompts.append(tok.decode(prompt.to_ints()))
            toks = sampled[len(self.prompts) - 1]
            return SimpleNamespace(sequences=[SimpleNamespace(tokens=toks, logprobs=[-0.5] * len(toks),
                                                              stop_reason="stop")])

    sampler = Sampler()
    traj = asyncio.run(do_group_rollout(builder, SamplingPolicy(sampler, max_tokens=128))).trajectories_G[0]
    last = traj.transitions[-1]
    assert last.reward == 1.0 and last.metrics["episode/tool_calls"] == 1.0 and last.logs["episode_end"] == "answered"
    assert '"name": "calculator"' in sampler.prompts[0].split("<|im_start|>user", 1)[0]  # declared before the question
    assert "<tool_response>\n7\n</tool_response>" in sampler.prompts[1]
    datums, _ = assemble_training_data([SimpleNamespace(trajectories_G=[traj])], [[1.0]])
    trained = [t for d in datums for t, m in zip(d.loss_fn_inputs["target_tokens"].tolist(),
                                                  d.loss_fn_inputs["mask"].tolist(), strict=True) if m == 1.0]
    assert trained == sampled[0] + sampled[1]


@pytest.mark.slow
def test_a_tool_result_nested_too_deep_for_json_is_a_result_error(tmp_path: Path):
    """json.dumps of data nested past the recursion limit raises RecursionError, not TypeError / ValueError: it
    escaped the tool's own check and came back as the cookbook's 'execution_failed', a kind the episode does not
    know (ToolOutcome lists validation_failed, raised, timeout, memory, output, result, died, unloadable)."""
    from sailrl.runtime.tools.functions import ToolFunction

    (tmp_path / "deep.py").write_text('def nest(depth: int) -> dict:\n    """Nested data."""\n    d = {}\n'
                                      '    for _ in range(depth):\n        d = {"a": d}\n    return d\n')
    tool = ToolFunction(tmp_path, "deep:nest", timeout_s=5.0)
    assert tool.call({"depth": 3}).content == '{"a": {"a": {"a": {}}}}'
    out = tool.call({"depth": 100_000})
    assert out.error == "result", out
    assert "the tool returned a dict that is not text or JSON (maximum recursion depth exceeded" in out.content
    assert tool.call({"depth": 1}).content == '{"a": {}}'  # the worker still answers


def test_show_counts_the_model_turns_max_turns_counts() -> None:
    """Issue 33.14: an episode of 3 replies (max_turns: 3) with a tool result and a feedback turn between them ended
    "after 5 turns"; the number is the model's turns, what environment.max_turns bounds."""
    import io

    from sailrl.commands.show import _episode
    from sailrl.runtime.loop.console import make_console

    out = io.StringIO()
    turns = [{"role": "assistant", "text": "a", "tool_calls": [{"name": "calculator", "arguments": "{}"}]},
             {"role": "tool", "name": "calculator", "text": "7", "error": False},
             {"role": "assistant", "text": "8"}, {"role": "user", "text": "Try again"},
             {"role": "assistant", "text": "9"}]
    _episode(make_console(file=out, width=100), {"end": "max_turns", "turns": turns})
    assert out.getvalue().splitlines()[-1] == "episode ended: max_turns after 3 model turns"
    out = io.StringIO()
    _episode(make_console(file=out, width=100), {"end": "max_tokens", "turns": turns[:1]})
    assert out.getvalue().splitlines()[-1] == "episode ended: max_tokens after 1 model turn"
