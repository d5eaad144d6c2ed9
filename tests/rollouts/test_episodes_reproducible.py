"""Seeded episode runs repeat exactly: the episode examples that run on the embedded backend
(``spec/examples/calculator.yaml``, ``feedback.yaml``), run twice, and killed after a saved state then resumed, log
the same metrics, value for value, and the same rollouts. An episode's replies are seeded by its place in the batch
and its turn, and sampled in lockstep turn by turn (``runtime/rollouts/rollout.py``), however the tool calls, scoring threads
and the sampler's batching interleave."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sailrl.runtime.rollouts.rollout import EpisodeSeat, Lockstep

ROOT = Path(__file__).resolve().parents[2]
#: metrics that are timings (they differ from run to run by nature)
TIMINGS = ("time/", "reward_scoring_s")
EXAMPLES = {"calculator": ["training.steps=3", "training.groups_per_step=6"],
            "feedback": ["training.steps=3", "training.groups_per_step=6"]}


def _run(name: str, run_dir: Path, *sets: str, resume: bool = False) -> int:
    from sailrl.cli import main

    args = ["run", f"spec/examples/{name}.yaml", "--set", f"output.run_dir={run_dir}"]
    for s in [*EXAMPLES[name], *sets]:
        args += ["--set", s]
    return main(args + (["--resume"] if resume else []))


def _metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(TIMINGS)}
            for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _rollouts(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k != "sampler_path"}  # the path names the run's id
            for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_episode_example_repeats_exactly_and_so_does_a_killed_and_resumed_run(name, tmp_path, monkeypatch,
                                                                                 capsys):
    monkeypatch.chdir(ROOT)
    first, second, resumed = tmp_path / "first", tmp_path / "second", tmp_path / "resumed"
    assert _run(name, first) == 0
    assert _run(name, second) == 0
    assert _run(name, resumed, "training.save_every=1") == 0
    capsys.readouterr()
    expected = _metrics(first)
    assert [m["step"] for m in expected] == [1, 2, 3]
    assert "episode/tool_calls" in expected[0] or "episode/feedback_turns" in expected[0]
    assert _metrics(second) == expected
    assert _rollouts(second) == _rollouts(first)
    # what a kill after the state of step 1 was saved leaves (steps 2 and 3 logged, their states not): resume
    records = (resumed / "checkpoints.jsonl").read_text().splitlines()
    assert [json.loads(r).get("batch") for r in records] == [1, 2, 3, 3]
    (resumed / "checkpoints.jsonl").write_text(records[0] + "\n")
    assert _run(name, resumed, "training.save_every=1", resume=True) == 0, capsys.readouterr().err[-3000:]
    assert "at step 2" in capsys.readouterr().err
    assert _metrics(resumed) == expected
    assert _rollouts(resumed) == _rollouts(first)


def test_lockstep_releases_a_turn_in_episode_order_once_every_episode_asked_or_ended():
    async def go():
        announced, order = [], []
        lock = Lockstep(3, announced.append)

        async def episode(ordinal: int, turns: int, yields: list[int]) -> None:
            seat = EpisodeSeat(ordinal, lockstep=lock)
            for turn in range(turns):
                for _ in range(yields[turn]):  # arrive after the others have had this many turns of the loop
                    await asyncio.sleep(0)
                await lock.turn(seat)
                order.append((turn, ordinal))
                seat.turn += 1
            lock.end([ordinal])

        # episode 2 asks first at each turn, episode 1 ends after one turn, episode 0 takes three
        await asyncio.gather(episode(0, 3, [4, 4, 0]), episode(1, 1, [2]), episode(2, 2, [0, 0]))
        return announced, order

    announced, order = asyncio.run(go())
    assert order == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 2), (2, 0)]
    assert announced == [2, 1]  # turn 0 is announced by the caller with the batch
