"""The rollout log: records built from TrajectoryGroups (both log shapes), bounds, JSON safety, torn writes, resume."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import tinker
import torch
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from sailrl.runtime.rundir import rollout_log
from sailrl.runtime.rundir.rollout_log import (
    COMPLETION_CHARS,
    PROMPT_CHARS,
    ROLLOUTS_FILE,
    RolloutLog,
    cap_text,
    logged_steps,
    read_rollouts,
    rule_verdicts,
)
from tests.fakes.tokenizer import CharTokenizer

TOK = CharTokenizer()


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def transition(prompt: str, completion: str, reward: float, *, logs=None, metrics=None, stop="stop",
               tokens: list[int] | None = None) -> Transition:
    return Transition(ob=tinker.ModelInput.from_ints(ids(prompt)),
                      ac=TokensWithLogprobs(tokens=tokens if tokens is not None else ids(completion),
                                            maybe_logprobs=None, stop_reason=stop),
                      reward=reward, episode_done=True, metrics=metrics or {}, logs=logs or {})


def group(prompt: str, samples: list[tuple[str, float, dict, dict]], stops=None) -> TrajectoryGroup:
    trajs = []
    for i, (completion, reward, logs, metrics) in enumerate(samples):
        stop = stops[i] if stops else "stop"
        trajs.append(Trajectory(transitions=[transition(prompt, completion, reward, logs={"completion": completion,
                                                                                          **logs},
                                                        metrics=metrics, stop=stop)],
                                final_ob=tinker.ModelInput.empty()))
    return TrajectoryGroup(trajs, [0.0] * len(trajs), [{} for _ in trajs])


def new_shape(correct: float, fmt: float, why_c: str, why_f: str) -> dict:
    """The logs RuleEnv.step writes once rules explain themselves: score/, passed/, why/ per rule."""
    return {"score/correct": correct, "passed/correct": int(correct > 0), "why/correct": why_c,
            "score/format": fmt, "passed/format": int(fmt == 0), "why/format": why_f}


def old_shape(correct: float, fmt: float) -> dict:
    """The metrics RuleEnv.step writes today (no verdicts in logs)."""
    return {"reward/correct": correct, "reward/format": fmt, "truncated": 0.0, "regex_timeouts": 0.0}


def two_groups():
    g0 = group("User: 2+3=?\n\nAssistant:", [
        (" \\boxed{5}", 1.0, new_shape(1.0, 0.0, "answer '5' (last \\boxed{}) = reference 5", "ok"),
         old_shape(1.0, 0.0)),
        (" five", -0.1, new_shape(0.0, -0.1, "no \\boxed{} answer", "failed: no \\boxed{} answer"),
         old_shape(0.0, -0.1)),
    ])
    g1 = group("User: 1+1=?\n\nAssistant:", [
        (" \\boxed{3}", 0.0, {}, old_shape(0.0, 0.0)),
        (" \\boxed{3", 0.0, {}, old_shape(0.0, 0.0)),
    ], stops=["stop", "length"])
    rows = [{"_index": 17, "question": "2+3", "answer": "5"}, {"_index": 4, "question": "1+1", "answer": 2}]
    return [g0, g1], rows


def write_two(tmp_path, step=3, kind="train", limit="all", **kw):
    groups, rows = two_groups()
    log = RolloutLog(tmp_path, limit, reference_field="answer")
    advantages = kw.pop("advantages", [torch.tensor([0.55, -0.55]), None])
    n = log.write_step(step, kind, groups, rows, advantages,
                       sampler_paths=["tinker://run/sampler_weights/s2", "tinker://run/sampler_weights/s2"],
                       sampler_steps=[2, 2], tokenizer=TOK, **kw)
    return log, n


def test_records_carry_every_field_with_exact_values_from_both_log_shapes(tmp_path):
    log, n = write_two(tmp_path)
    assert n == 4
    recs = read_rollouts(tmp_path)
    assert [(r["group"], r["sample"]) for r in recs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    first = recs[0]
    assert list(first) == ["step", "kind", "group", "sample", "step_records", "row", "sampler_step", "staleness",
                           "sampler_path", "total", "advantage", "truncated", "num_tokens", "degenerate", "rules",
                           "completion", "reference", "prompt"]
    assert first == {
        "step": 3, "kind": "train", "group": 0, "sample": 0, "step_records": 4, "row": 17, "sampler_step": 2,
        "staleness": 1, "sampler_path": "tinker://run/sampler_weights/s2", "total": 1.0,
        "advantage": pytest.approx(0.55), "truncated": False, "num_tokens": 10, "degenerate": False,
        "rules": {"correct": {"score": 1.0, "passed": True, "why": "answer '5' (last \\boxed{}) = reference 5"},
                  "format": {"score": 0.0, "passed": True, "why": "ok"}},
        "completion": " \\boxed{5}", "reference": "5", "prompt": "User: 2+3=?\n\nAssistant:",
    }
    assert recs[1]["rules"]["format"] == {"score": -0.1, "passed": False, "why": "failed: no \\boxed{} answer"}
    assert recs[1]["advantage"] == pytest.approx(-0.55)
    # the metrics-only shape: scores from reward/<rule>, no verdicts yet
    assert recs[2]["rules"] == {"correct": {"score": 0.0, "passed": None, "why": ""},
                                "format": {"score": 0.0, "passed": None, "why": ""}}
    assert recs[2]["reference"] == 2 and recs[2]["row"] == 4
    assert recs[2]["advantage"] is None and recs[2]["degenerate"] is True  # totals 0.0 and 0.0
    assert [r["truncated"] for r in recs] == [False, False, False, True]


def test_logs_without_a_score_take_it_from_the_metrics():
    rules = rule_verdicts({"passed/correct": 0, "why/correct": "no answer"}, {"reward/correct": -0.5, "x": 1})
    assert rules == {"correct": {"score": -0.5, "passed": False, "why": "no answer"}}


def test_one_line_per_rollout_in_one_fsynced_write(tmp_path, monkeypatch):
    """A step's records reach the file in one write of whole lines, then one fsync (rundir.append_whole)."""
    from sailrl.runtime.rundir import directory as rundir

    writes, syncs = [], []
    real_write, real_fsync = rundir.os.write, rundir.os.fsync
    monkeypatch.setattr(rundir.os, "write", lambda fd, data: (writes.append(bytes(data)), real_write(fd, data))[1])
    monkeypatch.setattr(rundir.os, "fsync", lambda fd: (syncs.append(fd), real_fsync(fd)))
    groups, rows = two_groups()
    RolloutLog(tmp_path).write_step(0, "train", groups, rows, None, sampler_paths="p", sampler_steps=0,
                                    tokenizer=TOK)
    assert len(writes) == 1 and writes[0].count(b"\n") == 4 and len(syncs) == 1
    assert (tmp_path / "rollouts.jsonl").read_bytes() == writes[0]


def test_limit_keeps_the_first_groups_of_each_step_and_zero_writes_nothing(tmp_path):
    _, n = write_two(tmp_path / "a", limit=1)
    assert n == 2
    assert {r["group"] for r in read_rollouts(tmp_path / "a")} == {0}
    assert all(r["step_records"] == 2 for r in read_rollouts(tmp_path / "a"))
    _, n = write_two(tmp_path / "b", limit=0)
    assert n == 0 and not (tmp_path / "b" / ROLLOUTS_FILE).exists()
    with pytest.raises(ValueError, match="log_rollouts is 'all', 0"):
        RolloutLog(tmp_path, -1)
    with pytest.raises(ValueError, match="log_rollouts is 'all', 0"):
        RolloutLog(tmp_path, True)


def test_eval_goes_to_the_same_file_and_filters_by_step_and_kind(tmp_path):
    write_two(tmp_path, step=0)
    write_two(tmp_path, step=0, kind="eval", advantages=None)
    write_two(tmp_path, step=1)
    assert len(read_rollouts(tmp_path)) == 12
    ev = read_rollouts(tmp_path, kind="eval")
    assert len(ev) == 4 and {r["kind"] for r in ev} == {"eval"} and all(r["advantage"] is None for r in ev)
    assert all(r["degenerate"] is None for r in ev)
    assert {r["step"] for r in read_rollouts(tmp_path, step=1)} == {1}
    assert read_rollouts(tmp_path, step=1, kind="eval") == []
    assert logged_steps(tmp_path) == {"train": [0, 1], "eval": [0]}
    with pytest.raises(ValueError, match="kind is 'train' or 'eval'"):
        write_two(tmp_path, kind="test")


def test_per_group_lists_of_the_wrong_length_are_refused(tmp_path):
    groups, rows = two_groups()
    with pytest.raises(ValueError, match="sampler_steps has 1 entries for 2 groups"):
        RolloutLog(tmp_path).write_step(0, "train", groups, rows, None, sampler_paths="p", sampler_steps=[1],
                                        tokenizer=TOK)


def test_text_fields_are_capped_and_values_are_json_safe(tmp_path):
    long_prompt = "S" * 10_000 + "QUESTION?"
    long_completion = "a" * 50_000 + "\\boxed{7}"
    g = group(long_prompt, [(long_completion, float("nan"),
                             {"score/r": float("inf"), "why/r": "w" * 5000, "passed/r": "yes"}, {}),
                            ("\ud800 \u2028 \r line", 1.0, {"score/r": 1.0}, {})])
    rows = [{"_index": 0, "answer": {"nested": [1, 2, float("nan")], "big": 10**5000}}]
    log = RolloutLog(tmp_path, reference_field="answer")
    log.write_step(5, "train", [g], rows, [[float("nan"), 2.0]], sampler_paths="x" * 5000, sampler_steps=5,
                   tokenizer=TOK)
    raw = (tmp_path / ROLLOUTS_FILE).read_bytes()
    assert b"NaN" not in raw and b"Infinity" not in raw
    a, b = read_rollouts(tmp_path)
    assert a["total"] is None and a["advantage"] is None and a["rules"]["r"]["score"] is None
    assert a["rules"]["r"]["passed"] is True and len(a["rules"]["r"]["why"]) <= 500 + 40
    assert len(a["prompt"]) <= PROMPT_CHARS + 40 and a["prompt"].endswith("QUESTION?")
    assert "[6,009 characters cut]" in a["prompt"]
    assert len(a["completion"]) <= COMPLETION_CHARS + 40 and a["completion"].endswith("\\boxed{7}")
    assert len(a["sampler_path"]) <= 1000 + 40 and a["staleness"] == 0
    assert isinstance(a["reference"], str) and len(a["reference"]) <= 2000 + 40
    # a lone surrogate becomes U+FFFD; a line separator and CR stay inside their one JSON line
    assert b["completion"] == "\ufffd \u2028 \r line" and raw.count(b"\n") == 2


def test_cap_text_keeps_head_and_tail():
    assert cap_text("0123456789", 4) == "01…[6 characters cut]…89"
    assert cap_text("short", 10) == "short"


def test_prompt_decoding_is_bounded_for_huge_prompts_and_never_raises():
    class Counting(CharTokenizer):
        decoded = 0

        def decode(self, tokens):
            Counting.decoded += len(tokens)
            return super().decode(tokens)

    mi = tinker.ModelInput.from_ints(ids("x") * 1_000_000)
    text = rollout_log.decode_prompt(mi, Counting())
    assert Counting.decoded == 2 * rollout_log._PROMPT_TOKENS_PER_END and len(text) <= PROMPT_CHARS + 40

    class Broken:
        def decode(self, tokens):
            raise KeyError(99)

    assert rollout_log.decode_prompt(mi, Broken()) == "[prompt not decodable: KeyError: 99]"


def test_a_torn_last_step_is_dropped_on_read_and_cut_before_the_next_write(tmp_path):
    write_two(tmp_path, step=0)
    path = tmp_path / ROLLOUTS_FILE
    full = path.read_bytes()
    write_two(tmp_path, step=1)
    step1 = path.read_bytes()[len(full):]
    lines = step1.splitlines(keepends=True)
    # killed mid-write: two whole lines of step 1 and half of the third
    path.write_bytes(full + lines[0] + lines[1] + lines[2][:30])
    assert [r["step"] for r in read_rollouts(tmp_path)] == [0, 0, 0, 0]
    assert logged_steps(tmp_path)["train"] == [0]
    # the resumed process re-runs step 1: its records never merge with the torn half line
    write_two(tmp_path, step=1)
    recs = read_rollouts(tmp_path)
    assert [(r["step"], r["group"], r["sample"]) for r in recs] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    # a torn line cut on a newline boundary (whole lines, too few) is dropped as well
    path.write_bytes(full + lines[0] + lines[1])
    assert len(read_rollouts(tmp_path)) == 4


def test_truncate_for_resume_keeps_earlier_steps_once(tmp_path):
    for s in range(4):
        write_two(tmp_path, step=s)
        write_two(tmp_path, step=s, kind="eval", advantages=None)
    path = tmp_path / ROLLOUTS_FILE
    path.write_bytes(path.read_bytes() + b'{"step": 4, "kind": "train", "gro')  # killed during step 4
    log = RolloutLog(tmp_path, reference_field="answer")
    log.truncate(2)
    assert logged_steps(tmp_path) == {"train": [0, 1], "eval": [0, 1]}
    assert path.read_bytes().endswith(b"}\n") and not (tmp_path / (ROLLOUTS_FILE + ".tmp")).exists()
    write_two(tmp_path, step=2)
    assert logged_steps(tmp_path) == {"train": [0, 1, 2], "eval": [0, 1]}
    steps = [(r["step"], r["kind"]) for r in read_rollouts(tmp_path)]
    assert len(steps) == 20 and steps.count((2, "train")) == 4
    RolloutLog(tmp_path / "none").truncate(3)  # no file: nothing to do
    assert not (tmp_path / "none" / ROLLOUTS_FILE).exists()


def test_a_step_written_twice_is_read_once_the_later_copy(tmp_path):
    write_two(tmp_path, step=0)
    write_two(tmp_path, step=0, advantages=[[1.0, 2.0], None])
    recs = read_rollouts(tmp_path)
    assert len(recs) == 4 and recs[0]["advantage"] == 1.0


def test_hand_written_records_in_another_key_order_are_read(tmp_path):
    rec = {"kind": "eval", "step": 2, "sample": 0, "group": 0, "step_records": 1, "total": 0.5}
    (tmp_path / ROLLOUTS_FILE).write_text(json.dumps(rec) + "\n" + "not json\n" + "[1]\n", encoding="utf-8")
    assert read_rollouts(tmp_path) == [rec]
    assert read_rollouts(tmp_path / "missing") == []


def test_records_from_the_real_rule_environment(tmp_path):
    """RuleGroupBuilder + RewardFunction + do_group_rollout give the right records, whatever RuleEnv logs."""
    from tinker_cookbook.completers import TokenCompleter
    from tinker_cookbook.rl.rollouts import do_group_rollout

    from sailrl.runtime.backends.models import get_renderer, get_tokenizer
    from sailrl.runtime.rewards.rules import RewardFunction
    from sailrl.runtime.rollouts.rollout import RuleGroupBuilder
    from sailrl.spec.rewards import RewardSpec

    tokenizer = get_tokenizer("sailrl/tiny")
    renderer = get_renderer("role_colon", tokenizer)
    reward_fn = RewardFunction.from_spec(RewardSpec.model_validate({"rules": [
        {"name": "correct", "kind": "answer", "extract": {"from": "boxed"}, "compare": "numeric"}]}), "answer")
    model_input = renderer.build_generation_prompt([{"role": "user", "content": "2+3?"}])
    stop = renderer.get_stop_sequences()
    replies = iter([" \\boxed{5}\n\nUser:", " \\boxed{6}\n\nUser:"])

    class Fixed(TokenCompleter):
        async def __call__(self, mi, stop, *, max_tokens=None):
            return TokensWithLogprobs(tokens=tokenizer.encode(next(replies), add_special_tokens=False),
                                      maybe_logprobs=None, stop_reason="stop")

    row = {"_index": 9, "question": "2+3?", "answer": "5"}
    builder = RuleGroupBuilder(row=row, model_input=model_input, stop=stop, renderer=renderer,
                               reward_fn=reward_fn, group_size=2)
    result = asyncio.run(do_group_rollout(builder, Fixed()))
    RolloutLog(tmp_path, reference_field="answer").write_step(
        7, "train", [result], [row], [[0.5, -0.5]], sampler_paths=["local://r/sampler_weights/6"],
        sampler_steps=[6], tokenizer=tokenizer)
    a, b = read_rollouts(tmp_path)
    assert a["prompt"] == "User: 2+3?\n\nAssistant:"
    assert (a["completion"], b["completion"]) == ("\\boxed{5}", "\\boxed{6}")  # the parsed reply's text
    assert (a["total"], b["total"]) == (1.0, 0.0)
    assert a["rules"]["correct"]["score"] == 1.0 and b["rules"]["correct"]["score"] == 0.0
    assert a["rules"]["correct"]["passed"] in (True, None) and b["rules"]["correct"]["passed"] in (False, None)
    assert (a["row"], a["reference"], a["staleness"], a["degenerate"]) == (9, "5", 1, False)
    assert not math.isnan(a["advantage"]) and a["num_tokens"] == len(" \\boxed{5}\n\nUser:")
