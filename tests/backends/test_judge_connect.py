"""Issue 20 leftovers: a judge's per-event-loop semaphores go with their loops; a Sail judge without an API key
fails its rule at once (no call, no retries), counted, with one line per run."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sailrl.runtime.backends.judge_clients import connect_judges
from sailrl.runtime.rewards.judge import JudgeReply
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rewards.scoring import StepScorer
from sailrl.spec.rewards import RewardSpec
from tests.fakes.sail_server import FakeSailServer, point_sail_sdk_at

ROOT = Path(__file__).resolve().parents[2]


def reward(sampler: str = "sail") -> RewardFunction:
    rules = [{"name": "polite", "kind": "judge", "rubric": "The reply answers {{ question }} politely.",
              "judge": {"model": "judge-m", "sampler": sampler, "retries": 3}}]
    return RewardFunction.from_spec(RewardSpec.model_validate({"rules": rules}), "answer")


class Yes:
    label = "scripted"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, messages, **kw) -> JudgeReply:
        self.calls += 1
        return JudgeReply("<score>yes</score>", 10, 2)


def test_the_judges_semaphores_go_with_their_event_loops() -> None:
    """judge_blocking (validate, `sailrl rewards`) runs each call on a fresh event loop: one semaphore each, and
    none left once the loops are gone (it was a dict by loop id that only grew)."""
    fn = reward()
    judge = fn.judges["polite"]
    client = Yes()
    judge.connect(client)
    for i in range(40):
        v = judge.judge_blocking(f"completion {i}", {"question": "q"})
        assert v.kind == "ok" and v.score == 1.0
    gc.collect()
    assert client.calls == 40 and len(judge._semaphores) == 0

    async def inside() -> int:
        await asyncio.gather(*(judge.judge(f"again {i}", {"question": "q"}) for i in range(5)))
        return len(judge._semaphores)

    assert asyncio.run(inside()) == 1  # one per running loop, shared by its calls
    gc.collect()
    assert len(judge._semaphores) == 0


@pytest.fixture
def no_sail_key(monkeypatch, tmp_path):
    """The sail SDK pointed at a loopback server that counts requests, with no API key anywhere (no
    SAIL_API_KEY, a HOME without a `sail auth login`)."""
    import sail

    server = FakeSailServer(chat_models={"judge-m"}).start()
    point_sail_sdk_at(server.url, monkeypatch)
    monkeypatch.delenv("SAIL_API_KEY")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    sail.reset_transports()
    try:
        yield server
    finally:
        server.close()
        sail.reset_transports()


def test_a_sail_judge_without_a_key_fails_at_once_and_is_counted(no_sail_key) -> None:
    fn = reward()
    problems = connect_judges(fn)
    assert problems == {"polite": "the judge (sail: judge-m) needs a Sail API key: SAIL_API_KEY is not set (export "
                                  "it, or run `sail auth login`)"}
    assert not fn.judges["polite"].connected

    async def step() -> tuple[list[Any], dict[str, float]]:
        scorer = StepScorer(fn)
        scores = await asyncio.gather(*(scorer.score(c, {"question": "q"}) for c in ("hi", "hello", "hey")))
        return scores, scorer.metrics()

    scores, m = asyncio.run(step())
    for s in scores:
        assert s.judge["polite"].kind == "failed" and s.judge["polite"].tries == 0 and not s.passed["polite"]
        assert s.errors["polite"] == problems["polite"]
    assert m["judge/failed"] == 3.0 and m["judge/calls"] == 0.0
    assert no_sail_key.count("POST") == 0  # no request was made, so none was retried


def test_validate_with_the_judge_and_no_key_lists_the_examples_as_not_checked_saying_why(no_sail_key) -> None:
    from sailrl.compiler.validate import validate_text

    spec = RUN_SPEC.replace("training:", "examples:\n  - {completion: ' 7', fields: {question: '3+4', answer: '7'}, "
                            "expect_total: 2.0}\ntraining:")
    loaded = validate_text(spec, "spec.yaml", judges=lambda fn: connect_judges(fn))
    (w,) = [e for e in loaded.warnings if e.code == "W112"]
    assert "were NOT checked: 'polite': the judge (sail: judge-m) needs a Sail API key: SAIL_API_KEY is not set" \
        in w.message
    assert no_sail_key.count("POST") == 0


def test_with_a_key_the_sail_judge_is_connected(monkeypatch) -> None:
    with FakeSailServer(chat_models={"judge-m"}, chat_answer=lambda body: "<score>yes</score>") as server:
        point_sail_sdk_at(server.url, monkeypatch)
        fn = reward()
        assert connect_judges(fn) == {} and fn.judges["polite"].connected
        assert fn.score("hi", {"question": "q"}).passed["polite"] is True
        assert server.count("POST") == 1


RUN_SPEC = """\
name: sail-judge-no-key
model: {name: sailrl/tiny-arith, renderer: role_colon, lora_rank: 8, seed: 0}
dataset: {source: data/addition.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}=', reference_field: answer}
reward:
  rules:
    - {name: correct, kind: answer, extract: {from: whole}, reference: {extract: {from: whole}}, compare: numeric}
    - name: polite
      kind: judge
      rubric: 'The reply answers {{ question }} politely.'
      judge: {model: judge-m, sampler: sail, retries: 3, timeout_s: 30}
training: {steps: 3, group_size: 2, groups_per_step: 2, learning_rate: 1e-3}
sampling: {sampler: local, max_tokens: 8}
output: {run_dir: run}
"""


@pytest.mark.slow
def test_a_run_with_a_sail_judge_and_no_key_stops_before_its_first_step_in_one_line(no_sail_key, tmp_path) -> None:
    """A rule no step could compute is not trained on at its fail score: exit 1, one line, no run directory."""
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "spec/examples/data/addition.jsonl", tmp_path / "data" / "addition.jsonl")
    (tmp_path / "spec.yaml").write_text(RUN_SPEC)
    r = subprocess.run([sys.executable, "-m", "sailrl", "run", "spec.yaml"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"})
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.splitlines()[-1:] == [
        "error: judge rule 'polite' cannot be computed: the judge (sail: judge-m) needs a Sail API key: SAIL_API_KEY "
        "is not set (export it, or run `sail auth login`); the run stops before its first step"]
    assert "Traceback" not in r.stderr and "step 1" not in r.stdout
    assert not (tmp_path / "run").exists()
    assert no_sail_key.count("POST") == 0


def test_rewards_shows_a_judge_it_cannot_call_as_not_checked_never_as_failed(no_sail_key, tmp_path, capsys) -> None:
    from sailrl.cli import main

    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "spec/examples/data/addition.jsonl", tmp_path / "data" / "addition.jsonl")
    spec = tmp_path / "spec.yaml"
    spec.write_text(RUN_SPEC)
    why = ("the judge (sail: judge-m) needs a Sail API key: SAIL_API_KEY is not set (export it, or run `sail auth "
           "login`)")
    argv = ["rewards", str(spec), "-c", "7", "-f", "question=3+4", "-f", "answer=7"]
    assert main([*argv, "--json"]) == 1
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["total"] is None and got["not_checked"] == {"polite": why}
    assert got["passed"] == {"correct": True, "polite": None}
    assert got["contributions"] == {"correct": 1.0, "polite": None}
    assert err.splitlines()[-1] == f"sailrl rewards: judge rule 'polite' not checked: {why}"

    assert main(argv) == 1
    out, err = capsys.readouterr()
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]]
            for line in out.splitlines() if line.startswith("│") and line.split("│")[1].strip()}
    assert rows["correct"] == ["pass", "1"]
    assert rows["polite"] == ["not checked", ""]
    assert rows["total"] == ["", "not known"]
    assert "fail" not in out
    assert no_sail_key.count("POST") == 0


@pytest.mark.slow
def test_a_run_whose_sail_judge_cannot_be_reached_stops_before_its_first_step(monkeypatch, tmp_path) -> None:
    """A key is set, but the judge's service does not serve its model: one judgement before the first step says so
    in one line (exit 1), where every step's judgement would have failed and the run trained on nothing."""
    (tmp_path / "data").mkdir()
    shutil.copy(ROOT / "spec/examples/data/addition.jsonl", tmp_path / "data" / "addition.jsonl")
    (tmp_path / "spec.yaml").write_text(RUN_SPEC.replace("retries: 3", "retries: 0"))
    with FakeSailServer(chat_models={"another-model"}) as server:
        point_sail_sdk_at(server.url, monkeypatch)
        r = subprocess.run([sys.executable, "-m", "sailrl", "run", "spec.yaml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"})
        calls = server.count("POST")
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.splitlines()[-1]
    assert last.startswith("error: judge rule 'polite' cannot be computed: the judge (sail: judge-m)") and \
        last.endswith("the run stops before its first step (one judgement was tried on the first training row)")
    assert "Traceback" not in r.stderr and "step 1" not in r.stdout and calls == 1
