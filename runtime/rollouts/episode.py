"""Episodes of more than one turn (the spec's ``environment:``), on tinker_cookbook's tool-use environment.

An episode is tinker_cookbook's :class:`~tinker_cookbook.tool_use.AgentToolMessageEnv` (tool calls parsed by the
renderer, run, their results added, the episode ended on an answer without tool calls, at ``max_turns`` or at
``max_tool_calls``) wrapped in its :class:`~tinker_cookbook.rl.message_env.EnvFromMessageEnv` (messages <->
tokens, the context-window budget), with what sailrl adds:

- the reward is the spec's rules (:class:`~sailrl.runtime.rewards.rules.RewardFunction` through the step's
  :class:`~sailrl.runtime.rewards.scoring.StepScorer`) on the final assistant message, or on every assistant turn's text
  joined (``environment.score: all_turns``);
- feedback turns: after an answer without tool calls on which a ``feedback:`` rule fails, the feedback message
  (rendered with the rule's reason as ``why``) is added as a user turn and the episode goes on, up to
  ``max_turns``;
- a reply cut at ``sampling.max_tokens``, or one the renderer cannot parse, ends the episode and is scored as
  the final message (``truncated``), as a single-turn completion is -- not given the cookbook's flat penalty;
  running out of the episode's token budget ends it and scores the last answer too;
- the rules see the row's fields plus ``episode_turns``, ``episode_tool_calls`` and ``episode_tool_errors``,
  so a python rule can be a per-turn (or per-call) penalty;
- tools: the built-in calculator (in process, bounded), the built-in python tool (the model's code in a process
  forked from a worker, :mod:`sailrl.runtime.tools.python_tool`, or in a Sailbox, :mod:`sailrl.runtime.tools.sailbox`)
  and ``function:`` tools in worker processes (:mod:`sailrl.runtime.tools.functions`); a tool error is a tool message to
  the model and a counted metric;
- per-episode metrics on the final transition: ``episode/turns``, ``episode/tool_calls``, ``episode/tool_errors``,
  ``episode/feedback_turns``, ``episode/max_turns`` (1 when it ended by max_turns) and ``episode/end/<reason>``
  (``answered``, ``max_turns``, ``max_tool_calls``, ``max_tokens``, ``max_episode_tokens``, ``parse_error``);
  logs: ``episode_end`` (the reason) and ``episode`` (the turns as JSON, each at most
  :data:`MAX_TURN_LOG_CHARS` characters), plus the rules' verdicts on the scored text as single-turn rollouts
  log them.

Every turn of one episode is sampled by the one policy the step was given, i.e. from one sampler checkpoint.
Training data: tinker_cookbook's ``assemble_training_data`` trains only the sampled tokens of each turn; the
prompt, tool results and feedback turns enter as observation tokens with weight 0.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tinker
from tinker_cookbook import renderers
from tinker_cookbook.renderers.base import Message, format_content_as_string
from tinker_cookbook.rl import types
from tinker_cookbook.rl.message_env import EnvFromMessageEnv, MessageStepResult
from tinker_cookbook.rl.types import EnvGroupBuilder, StepResult
from tinker_cookbook.tool_use import (
    AgentToolMessageEnv,
    Tool,
    ToolInput,
    ToolResult,
    error_tool_result,
    handle_tool_call,
    simple_tool_result,
)

from sailrl.runtime.prompts import render_template, with_tool_declaration
from sailrl.runtime.rewards.scoring import StepScorer
from sailrl.runtime.rollouts.rollout import enter_episode, score_record
from sailrl.runtime.sandbox.bubblewrap import DEFAULT_DISK_MB, sandbox_problem
from sailrl.runtime.tools import calculator
from sailrl.runtime.tools.functions import ToolFunction
from sailrl.runtime.tools.python_tool import SPEC as PYTHON_SPEC
from sailrl.runtime.tools.python_tool import PythonTool, UnisolatedPythonTool
from sailrl.runtime.tools.sailbox import SailboxPythonTool, sail_key_problem
from sailrl.spec.errors import ConfigError
from sailrl.spec.schema import Spec

__all__ = ["END_REASONS", "CalculatorTool", "EpisodeEnv", "EpisodeGroupBuilder", "EpisodeMessageEnv",
           "ToolLoadError", "WorkerTool", "build_tools", "close_tools", "episode_group_builder", "tool_specs"]

#: Why an episode ended (``episode/end/<reason>``).
END_REASONS = ("answered", "max_turns", "max_tool_calls", "max_tokens", "max_episode_tokens", "parse_error")
#: Longest text of one turn kept in the ``episode`` log.
MAX_TURN_LOG_CHARS = 2000
_TOOL_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)


# ------------------------------------------------------------------------------------------------ tools


class CalculatorTool:
    """The built-in calculator (:mod:`sailrl.runtime.tools.calculator`) as a cookbook :class:`Tool`."""

    name = "calculator"
    description = calculator.SPEC["description"]
    parameters_schema = calculator.SPEC["parameters"]

    def to_spec(self) -> dict[str, Any]:
        return dict(calculator.SPEC)

    async def run(self, input: ToolInput) -> ToolResult:  # noqa: A002 - the cookbook's parameter name
        expr = input.arguments.get("expression")
        try:
            return simple_tool_result(calculator.calculate(expr), call_id=input.call_id or "", name=self.name)
        except calculator.CalculatorError as exc:
            return error_tool_result(str(exc), call_id=input.call_id or "", name=self.name,
                                     error_type="calculator")


class WorkerTool:
    """A ``function:`` tool (:class:`~sailrl.runtime.tools.functions.ToolFunction`) as a cookbook :class:`Tool`: its spec
    was built by the cookbook's ``FunctionTool`` in a worker; each call runs there, off the event loop."""

    def __init__(self, fn: ToolFunction, spec: dict[str, Any]) -> None:
        self.fn = fn
        self.name = spec["name"]
        self.description = spec.get("description", "")
        self.parameters_schema = spec.get("parameters", {})

    def to_spec(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters_schema}

    async def run(self, input: ToolInput) -> ToolResult:  # noqa: A002 - the cookbook's parameter name
        out = await asyncio.to_thread(self.fn.call, input.arguments, input.call_id)
        result = simple_tool_result(out.content, call_id=input.call_id or "", name=self.name)
        if out.error:
            result.metadata["error"] = out.error
        return result


def tool_specs(environment: Any, spec_dir: str | Path) -> list[dict[str, Any]]:
    """The declarations (cookbook ``ToolSpec``: name, description, parameters) of ``environment.tools``, as the
    model sees them, without starting a Sailbox (``function:`` tools are loaded in their workers). Raises
    :class:`ToolLoadError` for a ``function:`` tool that cannot load."""
    specs: list[dict[str, Any]] = []
    for entry in environment.tools:
        if entry.builtin == "calculator":
            specs.append(dict(calculator.SPEC))
        elif entry.builtin == "python":
            specs.append(dict(PYTHON_SPEC))
        else:
            specs.append(_load_function_tool(entry, spec_dir).to_spec())
    return specs


def _load_function_tool(entry: Any, spec_dir: str | Path) -> WorkerTool:
    fn = ToolFunction(spec_dir, entry.function, timeout_s=entry.timeout_s, memory_mb=entry.memory_mb,
                      max_output_chars=entry.max_output_chars, env=list(getattr(entry, "env", []) or []))
    spec, problem = fn.load()
    if spec is None:
        raise ToolLoadError(f"environment.tools: tool '{entry.name}': "
                            f"{problem[1] if problem else 'cannot be loaded'}; `sailrl validate` shows where")
    return WorkerTool(fn, spec)


async def close_tools(tools: list[Any]) -> None:
    """Release what the tools hold (the Sailbox of ``sandbox: sail``); never raises."""
    for tool in tools:
        close = getattr(tool, "aclose", None)
        if close is not None:
            await close()


class ToolLoadError(ConfigError):
    """A tool of ``environment.tools`` cannot be loaded (``sailrl validate`` reports it first, as S254)."""

    code = "E135"


def build_tools(environment: Any, spec_dir: str | Path) -> list[Tool]:
    """The cookbook tools of an ``environment:`` section, loaded. Raises :class:`ToolLoadError` for a tool that
    cannot load (one plain line), and for ``sandbox: sail`` without ``SAIL_API_KEY``."""
    tools: list[Tool] = []
    for entry in environment.tools:
        if entry.builtin == "calculator":
            tools.append(CalculatorTool())
            continue
        if entry.builtin == "python":
            limits = {"timeout_s": entry.timeout_s, "memory_mb": entry.memory_mb,
                      "max_output_chars": entry.max_output_chars}
            sandbox = getattr(environment, "sandbox", "worker")
            if sandbox == "sail":
                problem = sail_key_problem()
                if problem:
                    raise ToolLoadError(f"environment.sandbox: sail: {problem}")
                tools.append(SailboxPythonTool(**limits))
            elif sandbox == "unisolated_worker":
                tools.append(UnisolatedPythonTool(**limits))
            else:
                problem = sandbox_problem()
                if problem:
                    raise ToolLoadError(f"environment.tools: python: {problem}; or set environment.sandbox: sail "
                                        "(a Sailbox) or unisolated_worker (no isolation: the model's code can read "
                                        "this machine's files and keys)")
                tools.append(PythonTool(**limits, disk_mb=getattr(entry, "disk_mb", None) or DEFAULT_DISK_MB,
                                        network=bool(getattr(entry, "network", False))))
            continue
        tools.append(_load_function_tool(entry, spec_dir))
    return tools


# ------------------------------------------------------------------------------------------------ the episode


def reply_text(message: Message, mode: str = "visible") -> str:
    """The text of an assistant message the rules read: ``visible`` -- the reply's text parts (thinking removed)
    without ``<tool_call>`` blocks; ``full`` -- its whole content as text."""
    content = message.get("content", "")
    if mode == "full":
        return content if isinstance(content, str) else format_content_as_string(content)
    return _TOOL_BLOCK.sub("", renderers.get_text_content(message))


@dataclass
class EpisodeMessageEnv(AgentToolMessageEnv):
    """The cookbook's tool-use message env with sailrl's scoring, feedback turns and episode records (see the
    module docstring). ``reward_fn`` is filled in here (the rules through ``scorer``); pass ``row``, ``rules``
    (a RewardFunction), ``scorer``, ``feedback`` (the spec's entries), ``score_mode``."""

    row: dict[str, Any] = field(default_factory=dict)
    rules: Any = None
    scorer: Any = None
    feedback: list[Any] = field(default_factory=list)
    score_mode: str = "final"
    last_num_tokens: int | None = None
    tool_calls_made: int = 0
    tool_errors: int = 0
    feedback_turns: int = 0
    graded: bool = False
    _score: Any = field(default=None, init=False)
    _score_logs: dict[str, Any] = field(default_factory=dict, init=False)
    _score_metrics: dict[str, float] = field(default_factory=dict, init=False)
    _truncated: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.reward_fn = self._grade_messages
        if self.scorer is None:
            self.scorer = StepScorer(self.rules)

    # -- scoring ---------------------------------------------------------------------------------------
    def scored_text(self) -> str:
        mode = getattr(self.rules, "text_mode", "visible")
        turns = [m for m in self.history[len(self.initial_messages):] if m["role"] == "assistant"]
        if not turns:
            return ""
        if self.score_mode == "all_turns":
            return "\n\n".join(reply_text(m, mode) for m in turns)
        return reply_text(turns[-1], mode)

    async def _grade_messages(self, messages: list[Message]) -> tuple[float, dict[str, float]]:
        text = self.scored_text()
        fields = {**self.row, "episode_turns": self._turn_count, "episode_tool_calls": self.tool_calls_made,
                  "episode_tool_errors": self.tool_errors}  # a python rule can penalise turns or tool calls
        score = await self.scorer.score(text, fields, truncated=self._truncated, num_tokens=self.last_num_tokens)
        self._score = score
        self._score_metrics, self._score_logs = score_record(score, text, length_stopped=self._truncated)
        self.graded = True
        return float(score.total), dict(self._score_metrics)

    # -- tools -------------------------------------------------------------------------------------------
    async def _handle_tool_calls(self, tool_calls: list[Any]) -> list[Message]:
        results = await asyncio.gather(*(handle_tool_call(self._tool_dict, tc) for tc in tool_calls))
        out: list[Message] = []
        for result in results:
            self.tool_calls_made += 1
            if result.metadata.get("error"):
                self.tool_errors += 1
            for msg in result.messages:
                self.history.append(msg)
                out.append(msg)
            if result.should_stop:
                self._should_stop = True
        return out

    # -- turns -------------------------------------------------------------------------------------------
    def _failed_feedback(self) -> Any:
        if self._score is None:
            return None
        for fb in self.feedback:
            if fb.rule in self._score.passed and not self._score.passed[fb.rule]:
                return fb
        return None

    async def step(self, message: Message) -> MessageStepResult:
        result = await super().step(message)
        if not result.episode_done:
            return result
        completed = result.metrics.get(f"{types.STOP_METRIC_PREFIX}{types.StopReason.COMPLETED}") == 1.0
        fb = self._failed_feedback() if completed else None
        if fb is not None and self._turn_count < self.max_turns:
            why = self._score.reasons.get(fb.rule, "") if self._score is not None else ""
            text = render_template(fb.message, {**self.row, "why": why, "rule": fb.rule},
                                   template="environment.feedback.message")
            self.history.append({"role": "user", "content": text})
            self.feedback_turns += 1
            self.graded = False
            return MessageStepResult(reward=0.0, episode_done=False, next_messages=self.history,
                                     metrics={}, logs=dict(result.logs))
        if completed:
            reason = "max_turns" if fb is not None else "answered"
        elif result.metrics.get("max_tool_calls"):
            reason = "max_tool_calls"
        elif result.metrics.get(f"{types.STOP_METRIC_PREFIX}{types.StopReason.PARSE_ERROR}"):
            reason = "parse_error"
        else:
            reason = "max_turns"
        reward = result.reward
        if not self.graded:  # the cookbook skips the grader on a turn whose tool calls all failed to parse
            reward, _ = await self._grade_messages(self.history)
        metrics, logs = self.episode_record(reason)
        return MessageStepResult(reward=reward, episode_done=True, next_messages=result.next_messages,
                                 metrics={**result.metrics, **metrics}, logs={**result.logs, **logs})

    async def finish(self, reason: str, *, truncated: bool) -> tuple[float, dict[str, float], dict[str, Any]]:
        """End the episode now (``reason``): score it, ``truncated`` when its last reply was cut off."""
        self._truncated = truncated
        reward, _ = await self._grade_messages(self.history)
        metrics, logs = self.episode_record(reason)
        return reward, metrics, logs

    def episode_record(self, reason: str) -> tuple[dict[str, float], dict[str, Any]]:
        metrics = {**self._score_metrics,
                   "episode/turns": float(self._turn_count), "episode/tool_calls": float(self.tool_calls_made),
                   "episode/tool_errors": float(self.tool_errors),
                   "episode/feedback_turns": float(self.feedback_turns),
                   "episode/max_turns": float(reason == "max_turns"), f"episode/end/{reason}": 1.0}
        logs = {**self._score_logs, "episode_end": reason, "episode": json.dumps(self.transcript())}
        return metrics, logs

    def transcript(self) -> list[dict[str, Any]]:
        """The episode's turns after the prompt: ``{role, text}`` plus ``tool_calls`` ([{name, arguments}]) on an
        assistant turn and ``name`` / ``error`` on a tool turn; ``role`` "user" is a feedback turn."""
        out: list[dict[str, Any]] = []
        for m in self.history[len(self.initial_messages):]:
            content = m.get("content", "")
            text = content if isinstance(content, str) else format_content_as_string(content)
            item: dict[str, Any] = {"role": m["role"], "text": text[:MAX_TURN_LOG_CHARS]}
            if m.get("tool_calls"):
                item["tool_calls"] = [{"name": c.function.name, "arguments": c.function.arguments[:500]}
                                      for c in m["tool_calls"]]
            if m["role"] == "tool":
                item["name"] = m.get("name", "")
                item["error"] = text.startswith('{"error"')
            out.append(item)
        return out


class EpisodeEnv(EnvFromMessageEnv):
    """The token-level episode: the cookbook's bridge, except that a reply cut at max_tokens or unparseable ends
    the episode scored by the rules (``truncated``), and an exhausted token budget scores the last answer."""

    message_env: EpisodeMessageEnv
    #: (place in its group, group size): seeds the episode's sampling calls by its place, not by the order in which
    #: concurrent episodes reach the sampler (set by :meth:`EpisodeGroupBuilder.make_envs`)
    seat: tuple[int, int] | None = None

    async def initial_observation(self):
        if self.seat is not None:
            enter_episode(*self.seat)  # this rollout's task: its calls are seeded as this episode's turns
        return await super().initial_observation()

    async def step(self, action: types.Action, *, extra: types.ActionExtra | None = None) -> StepResult:
        env = self.message_env
        env.last_num_tokens = len(action)
        stop_reason = (extra or {}).get("stop_reason", "stop")
        message, termination = self.renderer.parse_response(action)
        if stop_reason == "length" or not termination.is_clean:
            env._turn_count += 1
            env.history.append(message)
            reason = "max_tokens" if stop_reason == "length" else "parse_error"
            reward, metrics, logs = await env.finish(reason, truncated=True)
            return StepResult(reward=reward, episode_done=True, next_observation=tinker.ModelInput.empty(),
                              next_stop_condition=self._base_stop_condition,
                              metrics={**metrics, "parse_error": float(reason == "parse_error")}, logs=logs)
        result = await super().step(action, extra=extra)
        if result.episode_done and not env.graded:  # the context window ran out before the model answered
            reward, metrics, logs = await env.finish("max_episode_tokens", truncated=False)
            return StepResult(reward=reward, episode_done=True, next_observation=tinker.ModelInput.empty(),
                              next_stop_condition=self._base_stop_condition,
                              metrics={**result.metrics, **metrics}, logs={**result.logs, **logs})
        return result


@dataclass(frozen=True)
class EpisodeGroupBuilder(EnvGroupBuilder):
    """``group_size`` episodes of one row. ``messages``: the row's prompt conversation (system + user, from
    :class:`~sailrl.runtime.prompts.PromptBuilder`); the tools' declaration is put in front of it by the
    renderer (``create_conversation_prefix_with_tools``). ``max_tokens``: ``sampling.max_tokens`` per turn;
    ``max_episode_tokens``: the episode's token budget (default: the caller passes the context window)."""

    row: dict[str, Any]
    messages: list[Message]
    renderer: Any
    reward_fn: Any
    environment: Any
    tools: list[Any]
    group_size: int
    max_tokens: int
    max_episode_tokens: int | None = None
    scorer: Any = None
    tags: tuple[str, ...] = ("sailrl", "episode")

    def initial_messages(self) -> list[Message]:
        return with_tool_declaration(self.renderer, self.messages, [t.to_spec() for t in self.tools])

    async def make_envs(self):
        scorer = self.scorer if self.scorer is not None else StepScorer(self.reward_fn)
        env = self.environment
        messages = self.initial_messages()  # the tools' declaration rendered once per group, not per episode
        envs = []
        for i in range(self.group_size):
            msg_env = EpisodeMessageEnv(
                tools=list(self.tools), initial_messages=[dict(m) for m in messages], max_turns=env.max_turns,
                reward_fn=None,  # type: ignore[arg-type] - set in __post_init__
                max_tool_calls=env.max_tool_calls, terminate_on_parse_error=True,
                row=self.row, rules=self.reward_fn, scorer=scorer, feedback=list(env.feedback),
                score_mode=env.score)
            episode = EpisodeEnv(self.renderer, msg_env, max_trajectory_tokens=self.max_episode_tokens,
                                 max_generation_tokens=self.max_tokens)
            episode.seat = (i, self.group_size)
            envs.append(episode)
        return envs

    # compute_group_rewards and cleanup: EnvGroupBuilder's (no group-level bonus, nothing to release).

    def logging_tags(self):
        return list(self.tags)


def episode_group_builder(spec: Spec, row: dict[str, Any], *, prompts: Any, renderer: Any, reward_fn: Any,
                          tools: list[Any], group_size: int, scorer: Any = None,
                          context_window: int | None = None) -> EpisodeGroupBuilder:
    """The :class:`EpisodeGroupBuilder` of ``row`` for a spec with ``environment:``. ``prompts``: the run's
    :class:`~sailrl.runtime.prompts.PromptBuilder`; ``tools``: :func:`build_tools` of the spec (built once per
    run); the episode's token budget is ``environment.max_episode_tokens``, else ``context_window``."""
    env = spec.environment
    return EpisodeGroupBuilder(row=row, messages=prompts.messages(row), renderer=renderer, reward_fn=reward_fn,
                               environment=env, tools=tools, group_size=group_size,
                               max_tokens=spec.sampling.max_tokens,
                               max_episode_tokens=env.max_episode_tokens or context_window, scorer=scorer)
