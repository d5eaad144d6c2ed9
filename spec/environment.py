"""The ``environment:`` section: episodes of more than one turn (tools the model may call, feedback turns).

Absent, a rollout is one prompt and one completion (the single-turn loop, and the compiled script, unchanged).
Present, a rollout is an *episode*: the model answers; when its answer calls a tool, the tool's result is added
to the conversation and the model answers again; when a ``feedback:`` rule fails on an answer without tool calls,
a user turn rendered from the feedback message is added and the model tries again -- until an answer calls no
tool and no feedback rule fails, or ``max_turns`` assistant turns, ``max_tool_calls`` tool calls or the model's
context window are used up. The reward rules score the final assistant message (``score: final``) or every
assistant turn's text joined (``score: all_turns``).

Only shapes and per-field rules live here; checks that need other sections or the files next to the spec
(feedback rules that exist, tool files and functions, a renderer that can write tool calls) are in the
validation stage (``sailrl.compiler.episode_checks``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sailrl.spec.base import SpecModel, Text
from sailrl.spec.errors import SpecValueError
from sailrl.spec.rewards import env_names, function_ref

#: Built-in tools this version runs.
BUILTIN_TOOLS: tuple[str, ...] = ("calculator", "python")
#: Built-in tools named in the design that are not available in this version, with why (none now; a value here
#: is refused with S253).
PLANNED_TOOLS: dict[str, str] = {}
#: Built-in tools that run code, so ``environment.sandbox`` decides where.
SANDBOXED_TOOLS: frozenset[str] = frozenset({"python"})
#: Where the python tool's code runs: worker (isolated in Linux namespaces, the default), unisolated_worker (a
#: forked process with the machine's files and network: opt-in, warned about), sail (a Sailbox).
SANDBOXES: tuple[str, ...] = ("worker", "unisolated_worker", "sail")


class ToolEntry(SpecModel):
    """One tool the model may call: a built-in one (``builtin: calculator``) or a Python function in a file next
    to the spec (``function: tools:lookup``)."""

    builtin: Text | None = Field(
        None,
        description=(
            "A built-in tool: calculator (exact arithmetic on + - * / // % ** and parentheses, read by a safe "
            "parser, never eval) or python (runs the model's code and returns what it printed, in a fresh process "
            "isolated in its own Linux namespaces -- no keys, files, network or lasting processes -- or, with "
            "environment.sandbox: sail, in a Sailbox)."
        ),
    )
    function: Text | None = Field(
        None,
        description=(
            "module:function -- e.g. tools:lookup is the function lookup in tools.py next to the spec. The tool's "
            "name is the function's name, its description the docstring, its arguments the parameters' type hints "
            "(as tinker_cookbook's @tool reads them). It returns text, a number or JSON-able data."
        ),
    )
    timeout_s: float = Field(
        5.0, gt=0, le=120,
        description="Seconds one call may take; a slower call is stopped and the model gets a tool error.",
    )
    memory_mb: int = Field(
        512, ge=16, le=65_536,
        description="Memory (MiB) one call may allocate in its worker process; more is a tool error.",
    )
    max_output_chars: int = Field(
        4000, ge=1, le=1_000_000,
        description=(
            "Longest result (and longest printed output) a call may give; more is a tool error, not a longer "
            "conversation."
        ),
    )
    disk_mb: int | None = Field(
        None, ge=1, le=4096,
        description=(
            "The python tool only: MiB of files one call may write in its sandbox's folder (all files together); "
            "default 64. More is an error the model reads."
        ),
    )
    network: bool = Field(
        False,
        description=(
            "The python tool only: let the model's code reach the network from this machine. Off by default, and a "
            "risk when on (the code can send what it finds and fetch what it likes); sailrl validate warns (W134)."
        ),
    )
    env: list[Text] = Field(
        default_factory=list, max_length=64,
        description=(
            "A function: tool only: names of environment variables its worker process may read (e.g. [LOOKUP_URL]). "
            "Workers get no other variable of the run's environment, so no key reaches a tool that does not name it."
        ),
    )

    @field_validator("builtin")
    @classmethod
    def _builtin_known(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if v in PLANNED_TOOLS:
            raise SpecValueError("S253", f"{PLANNED_TOOLS[v]}; the built-in tools are: {', '.join(BUILTIN_TOOLS)}")
        if v not in BUILTIN_TOOLS:
            raise SpecValueError("S104", f"'{v}' is not a built-in tool; the built-in tools are: "
                                 f"{', '.join(BUILTIN_TOOLS)} (or write your own with function: file:name)")
        return v

    @field_validator("function")
    @classmethod
    def _function_ref(cls, v: str | None) -> str | None:
        return None if v is None else function_ref(v, module="tools", function="lookup")

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: list[str]) -> list[str]:
        return env_names(v)

    @model_validator(mode="after")
    def _one_source(self) -> ToolEntry:
        if (self.builtin is None) == (self.function is None):
            raise SpecValueError("S109", "a tool is either `builtin: calculator` or `function: file:name`, "
                                 "exactly one of them")
        if self.builtin != "python" and (self.network or self.disk_mb is not None):
            key = "network" if self.network else "disk_mb"
            raise SpecValueError("S256", f"{key} is a setting of the built-in python tool's sandbox; tool "
                                 f"'{self.name}' does not run in it: remove {key}")
        if self.builtin is not None and self.env:
            raise SpecValueError("S256", f"env names variables for a function: tool's worker; the built-in tool "
                                 f"'{self.builtin}' reads none: remove env")
        return self

    @property
    def name(self) -> str:
        """The name the model calls the tool by: the built-in's name or the function's name."""
        if self.builtin is not None:
            return self.builtin
        assert self.function is not None
        return self.function.partition(":")[2]


class FeedbackEntry(SpecModel):
    """A user turn added after an assistant answer (one without tool calls) on which the rule ``rule`` fails."""

    rule: Text = Field(description="The name of a reward rule; when it fails on an answer, this feedback is given.")
    message: Text = Field(
        "Not quite. Try again.",
        description=(
            "The user turn, a Jinja2 template over the dataset fields plus `why` (the rule's reason) and `rule` "
            "(its name). An answer rule's reason names the reference answer, so `why` of one tells the model the "
            "answer (validate warns, W130)."
        ),
    )


class EnvironmentSpec(SpecModel):
    """Episodes of more than one turn: tools and feedback turns, bounded in turns, tool calls and tokens."""

    max_turns: int = Field(
        4, ge=1, le=64,
        description="Most assistant turns in one episode (the first answer included).",
    )
    max_tool_calls: int | None = Field(
        None, ge=0, le=1024,
        description="Most tool calls in one episode (default: no limit beyond max_turns).",
    )
    max_episode_tokens: int | None = Field(
        None, gt=0,
        description=(
            "Most tokens of one episode's conversation (prompt, every turn, tool results, feedback) before it ends; "
            "default: the model's context window."
        ),
    )
    score: Literal["final", "all_turns"] = Field(
        "final",
        description=(
            "What the reward rules read: final, the last assistant message; all_turns, every assistant turn's "
            "text joined by blank lines."
        ),
    )
    tools: list[ToolEntry] = Field(default_factory=list, description="The tools the model may call.")
    sandbox: Literal["worker", "unisolated_worker", "sail"] = Field(
        "worker",
        description=(
            "Where the python tool's code runs: worker, a fresh process on this machine per call, isolated in its "
            "own Linux namespaces by bubblewrap (no environment variables, none of your files, no network, no "
            "process that outlives the call; bounded in time, memory, output, disk and processes); sail, a Sailbox "
            "(an isolated machine on Sail, through sail.tinker.TinkerSandbox; needs SAIL_API_KEY); "
            "unisolated_worker, a process forked from a worker that can read this machine's files and keys and "
            "reach its network -- only for code you would run yourself (validate warns, W133)."
        ),
    )
    feedback: list[FeedbackEntry] = Field(default_factory=list,
                                          description="User turns given when a named rule fails on an answer.")

    @model_validator(mode="after")
    def _unique_tools(self) -> EnvironmentSpec:
        seen: set[str] = set()
        for i, t in enumerate(self.tools):
            if t.name in seen:
                raise SpecValueError("S250", f"two tools are named '{t.name}' (tool {i + 1} repeats it): the model "
                                     "calls a tool by its name, so each needs its own")
            seen.add(t.name)
        return self

    def describe(self) -> list[str]:
        """The episode in plain words, one line each (``sailrl explain``)."""
        lines = [f"Each rollout is an episode of at most {self.max_turns} assistant turn"
                 f"{'s' if self.max_turns != 1 else ''}"
                 + (f" and {self.max_tool_calls} tool call{'s' if self.max_tool_calls != 1 else ''}"
                    if self.max_tool_calls is not None else "")
                 + (f" and {self.max_episode_tokens} tokens" if self.max_episode_tokens is not None
                    else ", within the model's context window") + "."]
        for t in self.tools:
            if t.builtin == "calculator":
                lines.append("Tool calculator (built-in): exact arithmetic on + - * / // % ** and parentheses.")
            elif t.builtin == "python":
                isolated = ("in a fresh process isolated from this machine (its own Linux namespaces: no keys, files, "
                            + ("or lasting processes; with network access)" if t.network else
                               "network or lasting processes)"))
                where = {"sail": "in a Sailbox on Sail (one per run, each call a fresh python3 process)",
                         "unisolated_worker": "in a process forked from a worker on this machine, NOT isolated "
                                              "(it can read this machine's files and keys)"}.get(self.sandbox, isolated)
                lines.append(f"Tool python (built-in): runs the model's code {where}, at most {t.timeout_s:g} s, "
                             f"{t.memory_mb} MiB and {t.max_output_chars} characters of output; what it prints (and "
                             "a last expression's value) is the result; an error is a tool error the model reads.")
            else:
                module, _, func = (t.function or "").partition(":")
                lines.append(f"Tool {func} ({module.replace('.', '/')}.py next to the spec): runs in a worker "
                             f"process, at most {t.timeout_s:g} s, {t.memory_mb} MiB and {t.max_output_chars} "
                             "characters of output; a failure is a tool error the model reads.")
        if self.tools:
            lines.append("When an answer calls a tool, its result is added and the model answers again.")
        for f in self.feedback:
            lines.append(f"When rule '{f.rule}' fails on an answer without tool calls, the user says: "
                         f"{f.message!r}, and the model tries again.")
        ends = ["an answer that calls no tool" + (" and passes the feedback rules" if self.feedback else "")]
        ends.append(f"{self.max_turns} turns")
        if self.max_tool_calls is not None:
            ends.append(f"{self.max_tool_calls} tool calls")
        ends.append("a turn cut at sampling.max_tokens")
        ends.append("the episode's token budget")
        lines.append("The episode ends at " + ", ".join(ends[:-1]) + " or " + ends[-1] + ".")
        lines.append("The reward rules score " + ("the final assistant message" if self.score == "final" else
                                                  "every assistant turn's text, joined") + "; only the model's own "
                     "tokens are trained (tool results and feedback are masked).")
        return lines

    def summary(self) -> dict[str, Any]:
        """Plain facts for explain/show: turns, tools by name, feedback rules."""
        return {"max_turns": self.max_turns, "tools": [t.name for t in self.tools],
                "feedback": [f.rule for f in self.feedback], "score": self.score}
