"""sailrl/tiny-tools and spec/examples/calculator.yaml: a built-in model taught (by a committed seeded script) to
call the calculator about half the time, so that RL on the embedded backend raises the tool's use and `correct`.

The pretraining texts are episodes of the real path (the script plays them through EpisodeGroupBuilder); the
shipped weights carry their teacher-forced measures, recomputed here; the taught model's sampled tool-call rate is
measured through the run's own episode builder (preflight's sampling); the example's RL values are pinned and a
short run of it must raise both figures."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

from sailrl.runtime.backends.local.weights.tiny import PRETRAINED_WEIGHTS, resolve_base_model, weights_sha256
from sailrl.spec.loader import load_spec
from sailrl.spec.models import BUILTIN_MODELS, default_renderer
from tests.fakes.recipes import recipe, weights_metadata

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "spec/examples/calculator.yaml"
WEIGHTS = PRETRAINED_WEIGHTS["sailrl/tiny-tools"]


def _script():
    return recipe("sailrl/tiny-tools")


def _meta() -> dict[str, str]:
    return weights_metadata(WEIGHTS)


def _base_model():
    from sailrl.runtime.backends.local import LocalServiceClient

    svc = LocalServiceClient("sailrl/tiny-tools")
    return svc._backend.bases.get(resolve_base_model("sailrl/tiny-tools", seed=0))


def test_tiny_tools_is_a_shipped_builtin_with_the_tools_renderer():
    info = BUILTIN_MODELS["sailrl/tiny-tools"]
    assert info.pretrained and default_renderer("sailrl/tiny-tools") == "role_colon_tools"
    assert WEIGHTS.stat().st_size < 2_000_000
    spec = resolve_base_model("sailrl/tiny-tools", seed=5)
    assert spec.revision == weights_sha256(WEIGHTS) != weights_sha256(PRETRAINED_WEIGHTS["sailrl/tiny-arith"])


def test_role_colon_tools_declares_each_tool_on_one_short_line():
    """The compact declaration (the built-in models read bytes): name, parameters with their types (optional ones
    marked ?), the description's first sentence; a system prompt stays in front of it."""
    from sailrl.runtime.backends.models import get_renderer, get_tokenizer
    from sailrl.runtime.backends.role_colon_tools import CALL_FORMAT, declare_tool

    lookup = {"name": "lookup", "description": "Look up a city's weather.\n  Returns the temperature.",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                              "days": {"type": ["integer", "null"]}},
                             "required": ["city"]}}
    assert declare_tool(lookup) == "lookup(city: string, days?: integer|null): Look up a city's weather."
    assert declare_tool({"name": "now", "parameters": {"type": "object", "properties": {}}}) == "now()"
    renderer = get_renderer("role_colon_tools", get_tokenizer("sailrl/tiny"))
    (msg,) = renderer.create_conversation_prefix_with_tools([lookup], "Be brief.")
    assert msg == {"role": "system", "content": "Be brief.\nTools:\n" + declare_tool(lookup) + "\n" + CALL_FORMAT}


def test_the_pretraining_texts_are_the_examples_episodes():
    """The script's first prompt is the one the example's run sends (its prompt template, environment and
    renderer); its tool-call reply parses back to the calculator call of the question; the calculator's result
    comes back in the next turn; the episode scores 1 with one tool call, the mask is the model's two replies."""
    from sailrl.runtime.backends.models import get_renderer, get_tokenizer
    from sailrl.runtime.prompts import PromptBuilder
    from sailrl.runtime.rewards.rules import RewardFunction
    from sailrl.runtime.rollouts.episode import build_tools, episode_group_builder

    m = _script()
    spec = load_spec(EXAMPLE).spec
    assert spec.environment.model_dump(exclude_defaults=True) == m.ENVIRONMENT | {"tools": [{"builtin": "calculator"}]}
    assert spec.sampling.max_tokens == m.MAX_TOKENS and spec.prompt.user == "{{ question }}="
    tok = get_tokenizer(spec.model.name)
    renderer = get_renderer(spec.model.renderer, tok)
    row = {"question": "3+4", "answer": "7"}
    builder = episode_group_builder(spec, row, prompts=PromptBuilder(spec.prompt, renderer), renderer=renderer,
                                    reward_fn=RewardFunction.from_spec(spec.reward, spec.prompt.reference_field),
                                    tools=build_tools(spec.environment, EXAMPLE.parent), group_size=1)
    first_prompt = renderer.build_generation_prompt(builder.initial_messages()).to_ints()

    ep = m.render_episode("3+4", "7", [m.tool_call_text("3+4") + m.STOP, " 7" + m.STOP])
    assert ep["tokens"][:len(first_prompt)] == first_prompt
    assert tok.decode(first_prompt) == (
        'System: Tools:\ncalculator(expression: string): Exact arithmetic.\n'
        'Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.\n\nUser: 3+4=\n\nAssistant:')
    (s1, e1), (s2, e2) = m._spans(ep["weights"])
    assert s1 == len(first_prompt)
    reply, _ = renderer.parse_response(ep["tokens"][s1:e1])
    assert [(c.function.name, json.loads(c.function.arguments)) for c in reply["tool_calls"]] == [
        ("calculator", {"expression": "3+4"})]
    assert tok.decode(ep["tokens"][e1:s2]) == " <tool_response>\n7\n</tool_response>\n\nAssistant:"
    assert tok.decode(ep["tokens"][s2:e2]) == " 7\n\nUser:" and e2 == len(ep["tokens"])
    assert ep["reward"] == 1.0 and ep["metrics"]["episode/tool_calls"] == 1.0
    direct = m.render_episode("3+4", "7", [" 8" + m.STOP])
    assert direct["tokens"][:len(first_prompt)] == first_prompt and direct["reward"] == 0.0
    assert direct["metrics"]["episode/tool_calls"] == 0.0


def test_the_shipped_weights_carry_their_measures():
    """The teacher-forced measures make_tiny_tools.py wrote into the file, recomputed on the loaded base."""
    m = _script()
    meta = _meta()
    got = m.measure(_base_model(), *m.measured_episodes())
    for key in ("p_call", "p_copy", "p_direct_ok", "expected_correct"):
        assert round(got[key], 4) == float(meta[key]), (key, got[key], meta[key])


def _sampled_episodes(spec_path: Path, rows: int, seed: int = 0):
    """Episodes of the example's base model through preflight's sampling: the run's own episode builder, tools
    loaded as the run loads them, a fresh LoRA (zero: the base) on the embedded backend."""
    from sailrl import preflight
    from sailrl.runtime.backends.models import get_renderer, get_tokenizer
    from sailrl.runtime.prompts import PromptBuilder
    from sailrl.runtime.rewards.rules import RewardFunction

    spec = load_spec(spec_path).spec
    renderer = get_renderer(spec.model.renderer, get_tokenizer(spec.model.name))
    lines = (spec_path.parent / spec.dataset.source).read_text().splitlines()[:rows]
    data = [json.loads(line) for line in lines]

    async def go():
        with tempfile.TemporaryDirectory() as tmp:
            policy, _ = await preflight._base_policy(spec, "local", Path(tmp), str(spec_path))
            policy.seed = seed
            return await preflight._sample(spec, data, policy, PromptBuilder(spec.prompt, renderer), renderer,
                                           RewardFunction.from_spec(spec.reward, spec.prompt.reference_field),
                                           spec_path.parent)

    batch = asyncio.run(go())
    return [t.transitions[-1] for g in batch.groups for t in g.trajectories_G]


@pytest.mark.slow
def test_the_taught_model_calls_the_calculator_about_half_the_time():
    """Sampled through the real episode path: about half the episodes call the calculator, and those are right
    far more often than the direct answers."""
    finals = _sampled_episodes(EXAMPLE, rows=25)
    assert len(finals) == 200
    calls = [f.metrics["episode/tool_calls"] for f in finals]
    rate = sum(c > 0 for c in calls) / len(calls)
    assert 0.3 <= rate <= 0.7, rate
    with_tool = [f.metrics["correct"] for f, c in zip(finals, calls, strict=True) if c > 0]
    direct = [f.metrics["correct"] for f, c in zip(finals, calls, strict=True) if c == 0]
    assert sum(with_tool) / len(with_tool) >= sum(direct) / len(direct) + 0.2


@pytest.mark.slow
def test_the_pretraining_script_is_deterministic():
    """Two runs of make_tiny_tools.py with one seed give bit-identical weights and the same sampled pool (a short
    run: the whole recipe is the opt-in test below; the measures, a teacher-forced function of the weights, are
    recomputed from the shipped weights above)."""
    m = _script()
    (a, got_a), (b, got_b) = (m.train(6, 3e-3, 4, 0, 0.5, 0.0, log_every=10**9, measures=False) for _ in range(2))
    assert set(got_a) == {"direct_pool_correct"} and 0.2 < got_a["direct_pool_correct"] < 0.6
    assert got_a == got_b
    weights_b = b.state_dict()
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, weights_b[name]), name


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SAILRL_REPRODUCE"),
                    reason="1700 steps, about 8 CPU-minutes: SAILRL_REPRODUCE=1 runs it (README, Tests)")
def test_the_pretraining_script_reproduces_the_shipped_base():
    """make_tiny_tools.py with the settings recorded in the file gives the same model: each measure within 0.1
    (the tolerance of tiny-arith's test; bit-identical weights are not promised across CPUs). Opt-in, so the
    README's test command stays within its time; run it with SAILRL_REPRODUCE=1 after changing the recipe."""
    m = _script()
    meta = _meta()
    _, got = m.train(int(meta["steps"]), float(meta["lr"]), int(meta["batch_size"]), int(meta["seed"]),
                     float(meta["tool_fraction"]), float(meta["practice_fraction"]), log_every=10**9)
    for key in ("p_call", "p_copy", "p_direct_ok", "expected_correct"):
        assert abs(got[key] - float(meta[key])) < 0.1, (key, got[key], meta[key])


def test_the_example_values_are_the_measured_ones_and_it_validates():
    """The values the header's figures were measured with (20 steps of 8 x 8 episodes, lr 2e-3, LoRA rank 16)."""
    from sailrl.cli import main

    s = load_spec(EXAMPLE).spec
    t = s.training
    assert (s.model.name, s.model.renderer, s.model.lora_rank, s.model.seed) == (
        "sailrl/tiny-tools", "role_colon_tools", 16, 0)
    assert (t.steps, t.group_size, t.groups_per_step, t.learning_rate, t.loss_fn) == (
        20, 8, 8, 2e-3, "importance_sampling")
    assert (s.sampling.sampler, s.sampling.max_tokens, s.sampling.temperature) == ("local", 96, 1.0)
    assert [r.name for r in s.reward.rules] == ["correct"]
    assert main(["validate", str(EXAMPLE)]) == 0


@pytest.mark.slow
def test_rl_raises_the_tool_use_and_correct(tmp_path):
    """The example as committed (about 26 s on one idle core): measured 0.53 -> 1.00 episode/tool_calls and
    0.641 -> 0.978 correct (means of steps 1-5 -> 16-20); the bars leave room for CPU differences."""
    from sailrl.cli import main

    run_dir = tmp_path / "run"
    assert main(["run", str(EXAMPLE), "--set", f"output.run_dir={run_dir}"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 20
    calls = [r["episode/tool_calls"] for r in rows]
    correct = [r["correct"] for r in rows]
    first_calls, last_calls = sum(calls[:5]) / 5, sum(calls[-5:]) / 5
    first, last = sum(correct[:5]) / 5, sum(correct[-5:]) / 5
    assert 0.35 <= first_calls <= 0.7 and last_calls >= first_calls + 0.25, (first_calls, last_calls)
    assert 0.5 <= first <= 0.8 and last >= first + 0.15, (first, last)
