"""A spec with tools: the warm-up, the length check and the cost estimates see the prompt an episode's first turn
sees (the tools declared), and the estimates count the turns (max_turns as the high end)."""

from __future__ import annotations

import pytest

from sailrl.runtime.data import DatasetError, load_rows
from sailrl.runtime.planning.cost import CostModel, EpisodeBound, estimate_run
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.rollouts.episode import EpisodeGroupBuilder, tool_specs
from sailrl.runtime.tools import calculator
from sailrl.spec.environment import EnvironmentSpec
from sailrl.spec.loader import load_spec
from tests.rollouts.test_episodes import RENDERER, TOK

ENV = "\nenvironment:\n  max_turns: 3\n  tools:\n    - builtin: calculator\n    - builtin: python\n"


def _spec(write_spec, minimal_spec: str, extra: str = ""):
    text = minimal_spec.replace("  sampler: local\n", "  sampler: local\n  max_tokens: 50\n") + extra
    return load_spec(write_spec(text)).spec


def test_the_warmup_trains_on_the_prompt_an_episodes_first_turn_sees(write_spec, minimal_spec):
    spec = _spec(write_spec, minimal_spec, ENV)
    specs = tool_specs(spec.environment, ".")
    assert [s["name"] for s in specs] == ["calculator", "python"]
    row = {"question": "1+1", "answer": "2"}
    prompts = PromptBuilder(spec.prompt, RENDERER, tool_specs=specs)
    episode = EpisodeGroupBuilder(row=row, messages=prompts.messages(row), renderer=RENDERER, reward_fn=None,
                                  environment=spec.environment, tools=_tools(specs), group_size=1, max_tokens=50)
    first_turn = RENDERER.build_generation_prompt(episode.initial_messages()).to_ints()
    model_input, weights = prompts.supervised_example(row, "{{ answer }}")
    tokens = model_input.to_ints()
    n_prompt = int((weights == 0).sum())
    assert tokens[:n_prompt] == first_turn and prompts.model_input(row).to_ints() == first_turn
    assert "calculator" in TOK.decode(first_turn) and "python" in TOK.decode(first_turn)
    assert TOK.decode(tokens[n_prompt:]).startswith(" 2")
    # without tools, the same builder is what it was
    plain = PromptBuilder(spec.prompt, RENDERER)
    assert plain.model_input(row).to_ints() == RENDERER.build_generation_prompt(plain.messages(row)).to_ints()
    assert len(plain.model_input(row).to_ints()) < len(first_turn)


def _tools(specs):
    class Declared:
        def __init__(self, spec):
            self.spec = spec

        def to_spec(self):
            return self.spec

    return [Declared(s) for s in specs]


def test_a_prompt_that_fits_only_without_the_tool_declaration_is_skipped(write_spec, minimal_spec):
    spec = _spec(write_spec, minimal_spec, ENV)
    specs = tool_specs(spec.environment, ".")
    row = {"question": "1+1", "answer": "2"}
    declared = PromptBuilder(spec.prompt, RENDERER, tool_specs=specs).model_input(row).length
    bare = PromptBuilder(spec.prompt, RENDERER).model_input(row).length
    window = 50 + (bare + declared) // 2  # room for the bare prompt, not for the declared one
    path = write_spec(minimal_spec + ENV)
    without = load_rows(spec, path.parent, renderer=RENDERER, context_window=window)
    assert len(without.train) == 2 and not without.skipped
    with pytest.raises(DatasetError, match=f"every one of the 2 selected rows was skipped .*prompt is "
                                           f"{declared:,} tokens; the model's context is {window}"):
        load_rows(spec, path.parent, renderer=RENDERER, context_window=window, tool_specs=specs)


def test_the_episode_bound_by_hand():
    env = EnvironmentSpec.model_validate({"max_turns": 3, "max_episode_tokens": 400,
                                          "tools": [{"builtin": "python", "max_output_chars": 100}]})
    spec = type("S", (), {"environment": env, "model": type("M", (), {"name": "sailrl/tiny"})(),
                          "sampling": type("P", (), {"max_tokens": 50})()})()
    b = EpisodeBound.of(spec)
    assert (b.turns, b.max_tokens, b.budget, b.observation) == (3, 50, 400, 132)
    # turn prompts 20, 20 + 182, 20 + 364 (capped at 400); datum 20 + 150 + 264 = 434, capped at 400
    assert b.prompt_tokens(20) == 20 + 202 + 384
    assert b.prompt_tokens(100) == 100 + 282 + 400
    assert b.datum_tokens(20) == 400 and b.sampled_tokens() == 150
    assert "max_turns (3) turns" in b.words() and "(400)" in b.words()


def test_estimates_count_the_turns_with_max_turns_as_the_high_end(write_spec, minimal_spec):
    single = _spec(write_spec, minimal_spec)
    spec = _spec(write_spec, minimal_spec, ENV + "  max_episode_tokens: 1000\n")
    lengths = [30, 40]
    one, many = estimate_run(single, lengths), estimate_run(spec, lengths)
    t = spec.training
    rollouts = t.steps * t.groups_per_step * t.group_size
    assert many.rollouts == one.rollouts == rollouts
    assert many.tokens["sampled"].high == rollouts * 3 * 50 and many.tokens["sampled"].low == one.tokens["sampled"].low
    assert many.tokens["sampled"].expected is None
    bound = EpisodeBound.of(spec)
    assert bound.observation == 4000 + 32  # the python tool's default max_output_chars
    per_row = {n: bound.prompt_tokens(n) for n in lengths}
    assert per_row[30] == 30 + 1000 + 1000  # turns 2 and 3 reach the budget
    assert many.tokens["prompt"].low == one.tokens["prompt"].low
    # the rows are drawn as for one turn: n30 + n40 draws whose single-turn prompts sum to what one estimate says
    draws = t.steps * t.groups_per_step
    n40 = one.tokens["prompt"].high / t.group_size - 30 * draws
    n40 /= 10
    n30 = draws - n40
    assert many.tokens["prompt"].high == pytest.approx(t.group_size * (n30 * per_row[30] + n40 * per_row[40]))
    assert many.tokens["trained"].high == rollouts * 1000 - rollouts
    assert any("max_turns (3) turns" in n for n in many.notes)
    # the per-step bound the budget checks against: every episode at max_turns
    step = CostModel.from_spec(spec, prompt_token_lengths=lengths).step_token_bound(1)
    g, gs = t.groups_per_step, t.group_size
    longest = sorted(lengths, reverse=True)[:g]
    assert step["sampled"] == g * gs * 150
    assert step["prompt"] == gs * sum(bound.prompt_tokens(n) for n in longest)
    assert step["trained"] == gs * sum(bound.datum_tokens(n) for n in longest) - g * gs
    assert calculator.SPEC["name"] == "calculator"
