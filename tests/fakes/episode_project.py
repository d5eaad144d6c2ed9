"""A spec folder with ``environment:`` (the calculator, a user tool, a feedback turn) and a run folder whose
``rollouts.jsonl`` was written by the runtime's ``RolloutLog`` from real episodes: the runtime's
``EpisodeGroupBuilder`` (its tools, the user tool in its worker process, its feedback turns and rules) driven by a
scripted policy at the sampling-client boundary, as tests/rollouts/test_episodes.py drives it. Nothing of the log's format is
written by hand.

The episodes (one step, three groups of two):

- group 0: a calculator call with text before it, the tool's result, then the right answer; and a wrong answer,
  a feedback turn, then the right answer;
- group 1: the user tool ``lookup``, whose result carries ``<script>`` markup (the page must show it as text),
  then a wrong answer and a feedback turn, still wrong at ``max_turns``; and a calculator call the calculator
  refuses (a tool error), then the right answer;
- group 2: one reply cut at ``max_tokens``; and a plain right answer in one turn.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

from tinker_cookbook.rl.rollouts import do_group_rollout
from tinker_cookbook.rl.types import TrajectoryGroup

from sailrl.runtime.backends.models import get_renderer, get_tokenizer
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rollouts.episode import build_tools, episode_group_builder
from sailrl.runtime.rollouts.rollout import SamplingPolicy
from sailrl.runtime.rundir.rollout_log import RolloutLog
from sailrl.spec.loader import load_spec

SPEC = """\
name: episodes-studio
model: {name: sailrl/tiny, renderer: role_colon_tools, lora_rank: 8}
dataset: {source: rows.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}=', reference_field: answer}
reward:
  rules:
    - name: correct
      kind: answer
      extract: {from: whole}
      reference: {extract: {from: whole}}
      compare: numeric
      weight: 1.0
environment:
  max_turns: 3
  tools:
    - builtin: calculator
    - function: tools:lookup
  feedback:
    - rule: correct
      message: 'Not quite. Try again: {{ question }}='
training: {steps: 1, group_size: 2, groups_per_step: 3, learning_rate: 1e-3}
sampling: {sampler: local, max_tokens: 64}
output: {run_dir: runs/episodes}
"""

TOOLS_PY = '''\
def lookup(city: str) -> str:
    """A note about a city."""
    return f"<script>window.__pwned = 1</script><b>{city}</b> & co"
'''

#: What the user tool answers for "Oslo": markup the page must show as text.
LOOKUP_RESULT = "<script>window.__pwned = 1</script><b>Oslo</b> & co"
STOP = "\n\nUser:"


def call(name: str, **arguments: str) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


#: Per group (row), per sample: the scripted replies, (text, stop_reason) each.
EPISODES = [
    ({"question": "3+4", "answer": "7"}, [
        [(" Let me <i>check</i>: " + call("calculator", expression="3+4") + STOP, "stop"), (" 7" + STOP, "stop")],
        [(" 8" + STOP, "stop"), (" 7" + STOP, "stop")],
    ]),
    ({"question": "2+2", "answer": "4"}, [
        [(" " + call("lookup", city="Oslo") + STOP, "stop"), (" 5" + STOP, "stop"), (" 3" + STOP, "stop")],
        [(" " + call("calculator", expression="__import__('os')") + STOP, "stop"), (" 4" + STOP, "stop")],
    ]),
    ({"question": "1+5", "answer": "6"}, [
        [(" 6 and on and on and on", "length")],
        [(" 6" + STOP, "stop")],
    ]),
]


class ScriptedSampler:
    """A Tinker-interface sampling client answering each call with the next scripted reply."""

    def __init__(self, tokenizer, replies):
        self.tokenizer = tokenizer
        self.replies = list(replies)

    async def sample_async(self, prompt, num_samples, sampling_params):
        text, stop = self.replies.pop(0)
        toks = self.tokenizer.encode(text, add_special_tokens=False)
        return SimpleNamespace(sequences=[SimpleNamespace(tokens=toks, logprobs=[-0.5] * len(toks),
                                                          stop_reason=stop)])


def make_episode_project(folder: Path) -> tuple[Path, Path]:
    """``folder/episodes.yaml`` (+ its data and tools.py) and ``folder/runs/episodes`` with step 1 logged;
    returns (spec path, run folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tools.py").write_text(TOOLS_PY)
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row, _ in EPISODES))
    spec_path = folder / "episodes.yaml"
    spec_path.write_text(SPEC)
    spec = load_spec(spec_path).spec
    tok = get_tokenizer(spec.model.name)
    renderer = get_renderer(spec.model.renderer, tok)
    fn = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field, folder)
    tools = build_tools(spec.environment, folder)
    prompts = PromptBuilder(spec.prompt, renderer)

    async def episode(row, replies):
        builder = episode_group_builder(spec, row, prompts=prompts, renderer=renderer, reward_fn=fn, tools=tools,
                                        group_size=1, context_window=4096)
        policy = SamplingPolicy(ScriptedSampler(tok, replies), max_tokens=spec.sampling.max_tokens)
        group = await do_group_rollout(builder, policy)
        return group.trajectories_G[0]

    groups, rows, advantages = [], [], []
    for i, (row, samples) in enumerate(EPISODES):
        row = {**row, "_index": i}
        trajectories = [asyncio.run(episode(row, replies)) for replies in samples]
        group = TrajectoryGroup(trajectories, [0.0] * len(trajectories), [{} for _ in trajectories])
        totals = group.get_total_rewards()
        mean = sum(totals) / len(totals)
        groups.append(group)
        rows.append(row)
        advantages.append([t - mean for t in totals])
    run = folder / "runs" / "episodes"
    run.mkdir(parents=True, exist_ok=True)
    RolloutLog(run, reference_field="answer").write_step(
        1, "train", groups, rows, advantages, sampler_paths="local://episodes-studio/sampler_weights/000000",
        sampler_steps=0, tokenizer=tok)
    return spec_path, run
