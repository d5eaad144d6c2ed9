"""Dynamic sampling (``training.dynamic_sampling``) and the difficulty filter (``training.difficulty_filter``): a
constructed step whose groups are degenerate on chosen rows, counted exactly; the rows the filter rests; the cursor
a saved state records; a killed and resumed run that repeats the uninterrupted one; the keys' validation."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import tinker
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from sailrl.cli import main
from sailrl.compiler.render import features, read_keys
from sailrl.compiler.validate import validate_file
from sailrl.runtime.data.draws import RowDraws
from sailrl.runtime.data.order import rows_for_step
from sailrl.runtime.loop.sampler import Sampler
from sailrl.runtime.planning.cost import CostModel, estimate_run
from sailrl.runtime.rollouts.rollout import RolloutBatch
from sailrl.spec.errors import SpecErrors
from sailrl.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "spec/examples/quickstart.yaml"


class _Records:
    """What the sampler's draws write to: each step's metrics, and the console."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.console = SimpleNamespace(print=lambda *a, **k: None)

    def add(self, step: int, metrics: dict[str, float]) -> None:
        self.metrics.setdefault(step, {}).update(metrics)


def _sampler(sets: dict, n_rows: int = 20) -> tuple[Sampler, _Records, list[dict]]:
    """A run's sampler over ``n_rows`` rows (``_index`` i, question 'q<i>'), the quickstart spec with ``sets``."""
    spec = load_spec(QUICKSTART).spec
    training = {**spec.training.model_dump(), "groups_per_step": 4, **sets}
    spec = spec.model_copy(update={"training": type(spec.training).model_validate(training)})
    rows = [{"question": f"q{i}", "answer": str(i), "_index": i} for i in range(n_rows)]
    records = _Records()
    sampler = Sampler(spec=spec, backend=SimpleNamespace(service_client=None), training_client=None, tokenizer=None,
                      renderer=None, reward_fn=None, prompts=None, train_rows=rows, eval_rows=[], run_id="t",
                      lora_rank=1, records=records)
    return sampler, records, rows


def _group(rewards: list[float]) -> TrajectoryGroup:
    trajs = [Trajectory(transitions=[Transition(ob=tinker.ModelInput.from_ints([1]),
                                                ac=TokensWithLogprobs(tokens=[2], maybe_logprobs=[-0.5]),
                                                reward=r, episode_done=True, metrics={})],
                        final_ob=tinker.ModelInput.from_ints([])) for r in rewards]
    return TrajectoryGroup(trajs, [0.0] * len(rewards), [{} for _ in rewards])


def _scored(rows: list[dict], flat: set[int]) -> RolloutBatch:
    """The step's scored batch as a fake sampler gives it: a row in ``flat`` gives a degenerate group (every
    rollout 1.0), any other a group with signal."""
    groups = [_group([1.0, 1.0, 1.0]) if r["_index"] in flat else _group([0.0, 1.0, 1.0]) for r in rows]
    return RolloutBatch(groups=groups, rows=list(rows), failed=[], extra_metrics={"reward_scored": 3.0 * len(rows)},
                        sampler_paths=["p"] * len(rows), sampler_steps=[1] * len(rows), seconds=1.0)


def _step(sampler: Sampler, step: int, flat: set[int], max_extra: int) -> RolloutBatch:
    """What the compiled script's main() does for one step with dynamic sampling."""
    batch = _scored(sampler.rows(step), flat)
    while rows := sampler.more_rows(step, batch, max_extra):
        batch = sampler.extend(batch, _scored(rows, flat))
    return batch


def _signal(batch: RolloutBatch) -> int:
    return sum(1 for g in batch.groups if len({float(r) for r in g.get_total_rewards()}) > 1)


# ------------------------------------------------------------------------------------------ dynamic sampling
def test_a_step_draws_the_next_rows_until_it_has_groups_per_step_groups_with_signal():
    sampler, records, rows = _sampler({"dynamic_sampling": {"max_extra_groups": 8}})
    order = [r["_index"] for r in rows_for_step(rows, 0, 20, seed=0)]  # the data order (model.seed 0)
    flat = set(order[1:4]) | {order[5]}  # rows 2-4 and 6 of the order give degenerate groups
    batch = _step(sampler, 1, flat, max_extra=8)
    # 4 rows, 3 of them flat -> 3 more; of those (order 5-7) one is flat -> 1 more (order 8): 8 drawn, 4 with signal
    assert [r["_index"] for r in batch.rows] == order[:8]
    assert _signal(batch) == 4 and len(batch.groups) == 8
    assert records.metrics[1] == {"sampling/draws": 8.0, "sampling/extra_groups": 4.0, "sampling/rounds": 2.0,
                                  "sampling/rested_skipped": 0.0, "sampling/short": 0.0}
    assert batch.extra_metrics == {"reward_scored": 24.0} and batch.seconds == 3.0
    # the next step starts after the rows the extra draws took
    assert [r["_index"] for r in sampler.rows(2)] == order[8:12]


def test_the_extra_draws_stop_at_max_extra_groups_and_the_shortfall_is_counted():
    sampler, records, rows = _sampler({"dynamic_sampling": {"max_extra_groups": 3}})
    order = [r["_index"] for r in rows_for_step(rows, 0, 20, seed=0)]
    batch = _step(sampler, 1, set(order[:10]), max_extra=3)  # every row it can reach is flat
    assert [r["_index"] for r in batch.rows] == order[:7]  # 4 + 3 extra, then the bound
    assert records.metrics[1]["sampling/draws"] == 7.0 and records.metrics[1]["sampling/extra_groups"] == 3.0
    assert records.metrics[1]["sampling/short"] == 4.0 and records.metrics[1]["sampling/rounds"] == 1.0


def test_without_degenerate_groups_the_steps_draw_exactly_the_rows_of_a_run_without_the_option():
    sampler, records, rows = _sampler({"dynamic_sampling": {"max_extra_groups": 8}})
    for step in (1, 2, 3, 4, 5, 6):  # past the first epoch (20 rows): the reshuffled order too
        _step(sampler, step, set(), max_extra=8)
        assert sampler.rows(step) == rows_for_step(rows, step - 1, 4, seed=0)
        assert records.metrics[step]["sampling/extra_groups"] == 0.0


# ------------------------------------------------------------------------------------------ difficulty filter
def test_a_row_degenerate_its_last_two_draws_rests_for_rest_steps_then_comes_back():
    cursor = RowDraws(6, 2, seed=0, reshuffle=False)  # order 0..5, 0..5, ...
    observe = {"degenerate_draws": 2, "rest_steps": 3}
    assert cursor.take(1, 2) == ([0, 1], 0)
    assert cursor.observe(1, [0, 1], [True, False], **observe) == []  # row 0: one degenerate draw
    assert cursor.take(2, 2) == ([2, 3], 0) and cursor.observe(2, [2, 3], [True, True], **observe) == []
    assert cursor.take(3, 2) == ([4, 5], 0) and cursor.observe(3, [4, 5], [False, False], **observe) == []
    assert cursor.take(4, 2) == ([0, 1], 0)
    assert cursor.observe(4, [0, 1], [True, True], **observe) == [0]  # row 0: its second in a row; row 1: its first
    assert cursor.resting == {0: 7} and cursor.streaks == {1: 1, 2: 1, 3: 1}
    assert cursor.take(5, 2) == ([2, 3], 0)
    assert cursor.observe(5, [2, 3], [False, True], **observe) == [3]  # row 2's count starts again
    assert cursor.take(6, 2) == ([4, 5], 0)
    assert cursor.take(7, 2) == ([1, 2], 1)  # row 0 rests through step 7 (4 + 3): skipped
    assert cursor.take(8, 2) == ([4, 5], 1)  # row 3 (rested at 5, until 8) skipped
    assert cursor.take(9, 2) == ([0, 1], 0)  # row 0 is back
    assert cursor.resting_at(9) == 0


def test_rows_rest_for_the_rest_of_the_run_but_never_below_groups_per_step_rows():
    cursor = RowDraws(5, 2, seed=0, reshuffle=False)
    forever = {"degenerate_draws": 1, "rest_steps": None}
    rows, _ = cursor.take(1, 5)
    # 5 rows, 2 a step: at most 3 may rest; rows 3 and 4 find no room and keep their count
    assert cursor.observe(1, rows, [True] * 5, **forever) == [0, 1, 2]
    assert cursor.streaks == {3: 1, 4: 1}
    assert cursor.take(2, 4) == ([3, 4, 3, 4], 6)
    assert cursor.take(1_000, 2) == ([3, 4], 3)  # still resting, a thousand steps on


def test_the_sampler_rests_the_rows_whose_groups_stay_degenerate_and_counts_them():
    sampler, records, rows = _sampler({"dynamic_sampling": {"max_extra_groups": 4},
                                       "difficulty_filter": {"degenerate_draws": 1, "rest_steps": None}})
    order = [r["_index"] for r in rows_for_step(rows, 0, 20, seed=0)]
    flat = {order[0], order[2]}
    batch = _step(sampler, 1, flat, max_extra=4)
    assert sampler.rest_rows(1, batch, {"degenerate_draws": 1, "rest_steps": None}) == [order[0], order[2]]
    assert records.metrics[1]["sampling/rested_now"] == 2.0 and records.metrics[1]["sampling/resting"] == 2.0
    # step 1 drew order 0-5; steps 2-4 draw 6-17 and step 5 wraps into epoch 1 (reshuffled), skipping the resting
    for step in (2, 3, 4):
        _step(sampler, step, set(), max_extra=4)
        sampler.rest_rows(step, _scored(sampler.rows(step), set()), {"degenerate_draws": 1, "rest_steps": None})
    ahead = order[18:] + [r["_index"] for r in rows_for_step(rows, 1, 20, seed=0)]
    drawn, skipped = [], 0
    for i in ahead:  # the order from step 5's first position: resting rows skipped until 4 are drawn
        if len(drawn) == 4:
            break
        if i in flat:
            skipped += 1
        else:
            drawn.append(i)
    assert [r["_index"] for r in sampler.rows(5)] == drawn
    assert records.metrics[5]["sampling/rested_skipped"] == skipped


# ------------------------------------------------------------------------------------------ resume
def test_a_save_in_the_middle_of_a_step_records_the_cursor_after_the_completed_steps():
    cursor = RowDraws(10, 2, seed=3)
    cursor.take(1, 2)
    cursor.observe(1, [0], [True], degenerate_draws=5, rest_steps=None)
    after_one = cursor.state()
    cursor.take(2, 3)  # step 2 draws, then the run stops before it completes
    assert cursor.saved(1) == after_one and cursor.saved(2) == cursor.state()
    again = RowDraws(10, 2, seed=3)
    again.restore(json.loads(json.dumps(after_one)), 1)
    assert again.take(2, 3) == (RowDraws(10, 2, seed=3).take(1, 5)[0][2:], 0)
    assert again.state()["position"] == 5 and again.streaks == cursor.streaks


@pytest.mark.slow
def test_a_killed_run_resumes_drawing_exactly_what_the_uninterrupted_run_drew(tmp_path, monkeypatch):
    """The quickstart for 6 steps with dynamic sampling and a difficulty filter, a state saved every 3 steps; the
    run is cut back to its save after step 3 and resumed: steps 4-6 repeat, rows, rollouts and updates."""
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "run"
    sets = ["training.groups_per_step=8", "training.group_size=4", "sampling.max_tokens=6", "training.steps=6",
            "training.save_every=3", "training.dynamic_sampling={max_extra_groups: 8}",
            "training.difficulty_filter={degenerate_draws: 1, rest_steps: 2}", f"output.run_dir={run_dir}"]
    args = ["run", str(QUICKSTART), *sum((["--set", s] for s in sets), [])]
    assert main(args) == 0
    whole = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    records = (run_dir / "checkpoints.jsonl").read_text().splitlines()
    saved = json.loads(records[0])
    assert saved["batch"] == 3 and saved["row_draws"]["position"] == sum(m["sampling/draws"] + m[
        "sampling/rested_skipped"] for m in whole[:3])
    assert sum(m["sampling/extra_groups"] for m in whole) > 0 and sum(m["sampling/rested_now"] for m in whole) > 0
    (run_dir / "checkpoints.jsonl").write_text(records[0] + "\n")  # a kill right after the save of step 3
    assert main([*args, "--resume"]) == 0
    resumed = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    again = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]

    def same(m: dict) -> dict:  # what the run computed (not how long it took)
        return {k: v for k, v in m.items() if not k.startswith(("time/", "wall")) and "_s" not in k
                and k not in ("timestamp", "steps_per_min")}

    assert [m["step"] for m in resumed] == [1, 2, 3, 4, 5, 6]
    assert [same(m) for m in resumed[3:]] == [same(m) for m in whole[3:]]

    def logged(rs: list[dict], step: int) -> list[tuple]:
        return [(r["prompt"], r["completion"], r["total"]) for r in rs if r["step"] == step]

    assert all(logged(again, s) == logged(rollouts, s) for s in (4, 5, 6))


# ------------------------------------------------------------------------------------------ spec and script
SPEC = """\
name: ds
model:
  name: sailrl/tiny
dataset:
  source: rows.jsonl
  fields: [question, answer]
prompt:
  user: '{{ question }}'
reward:
  rules:
    - name: correct
      kind: answer
      compare: numeric
training:
  groups_per_step: 4
%s
sampling:
  sampler: local
"""


def _problems(write_spec, training: str, head: str = "") -> list:
    path = write_spec(head + SPEC % training)
    with pytest.raises(SpecErrors) as info:
        validate_file(path)
    return [(e.code, e.key_path, e.line) for e in info.value.errors if e.severity == "error"]


@pytest.mark.parametrize("training,keys", [
    ("  dynamic_sampling: {max_extra_groups: 0}", ["training.dynamic_sampling.max_extra_groups"]),
    ("  dynamic_sampling: {}", ["training.dynamic_sampling.max_extra_groups"]),
    ("  dynamic_sampling: {max_extra: 4}", ["training.dynamic_sampling.max_extra_groups",
                                            "training.dynamic_sampling.max_extra"]),
    ("  difficulty_filter: {degenerate_draws: 0}", ["training.difficulty_filter.degenerate_draws"]),
    ("  difficulty_filter: {rest_steps: -1}", ["training.difficulty_filter.rest_steps"]),
])
def test_bad_values_are_located_at_their_key(write_spec, training, keys):
    found = _problems(write_spec, training)
    assert sorted(k for _, k, _ in found) == sorted(keys)
    assert all(line == 16 and code.startswith("S1") for code, _, line in found)


def test_the_options_need_a_synchronous_run(write_spec):
    found = _problems(write_spec, "  max_steps_off_policy: 1\n  dynamic_sampling: {max_extra_groups: 4}\n"
                                  "  difficulty_filter: {degenerate_draws: 2}")
    assert found == [("S234", "training.dynamic_sampling", 17), ("S234", "training.difficulty_filter", 18)]


def test_the_options_with_method_sft_are_keys_of_another_method(write_spec):
    found = _problems(write_spec, "  dynamic_sampling: {max_extra_groups: 4}", head="method: sft\n")
    assert ("S257", "training.dynamic_sampling", 17) in found


def test_the_script_shows_each_option_only_when_the_spec_uses_it(write_spec):
    plain = validate_file(write_spec(SPEC % "")).spec
    both = validate_file(write_spec(SPEC % "  dynamic_sampling: {max_extra_groups: 4}\n  difficulty_filter: {}",
                                    name="both.yaml")).spec
    assert not features(plain)["dynamic_sampling"] and not features(plain)["difficulty_filter"]
    assert "dynamic_sampling" not in plain.resolved()["training"]  # a spec without them compiles as before
    assert features(both)["dynamic_sampling"] and features(both)["difficulty_filter"]
    assert {"dynamic_sampling", "difficulty_filter"} <= set(read_keys(both))
    assert both.training.difficulty_filter.degenerate_draws == 2 and both.training.difficulty_filter.rest_steps is None


def test_the_cost_estimate_counts_every_extra_group_as_its_upper_bound(write_spec):
    plain = validate_file(write_spec(SPEC % "")).spec
    ds = validate_file(write_spec(SPEC % "  dynamic_sampling: {max_extra_groups: 12}", name="ds.yaml")).spec
    lengths = [10, 20, 30, 40, 50, 60, 70, 80]
    a, b = CostModel.from_spec(plain, prompt_token_lengths=lengths), CostModel.from_spec(
        ds, prompt_token_lengths=lengths)
    # group_size 4 (default), max_tokens 1024: plain 4 groups, dynamic 4 + 12 = 16 groups sampled, 4 trained
    assert a.step_token_bound(1)["sampled"] == 4 * 4 * 1024 and b.step_token_bound(1)["sampled"] == 16 * 4 * 1024
    # 16 draws over 8 rows: the bound takes every row, then the longest again for the 8 more draws
    assert b.step_token_bound(1)["prompt"] == 4 * (sum(lengths) + 8 * 80)
    assert b.step_token_bound(1)["trained"] == a.step_token_bound(1)["trained"]
    ea, eb = estimate_run(plain, lengths), estimate_run(ds, lengths)
    assert eb.tokens["sampled"].high == 4 * ea.tokens["sampled"].high
    assert eb.tokens["sampled"].low == ea.tokens["sampled"].low
    assert any("upper bound" in n for n in eb.notes)
