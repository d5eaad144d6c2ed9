"""``sailrl preflight``: data and prompt report, token lengths vs context, static and sampled reward verdicts.

Most tests sample from a scripted policy (a TokenCompleter that answers from the prompt), so rewards are exact;
the ``slow`` ones sample the real base policy on the embedded backend (``sailrl/tiny``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tinker_cookbook.completers import TokensWithLogprobs

from sailrl.cli import main
from sailrl.runtime import preflight
from sailrl.runtime.models import get_tokenizer
from sailrl.runtime.preflight import build_report, constant_reward, context_window
from sailrl.spec.schema import Spec

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "spec" / "examples"
QUICKSTART = EXAMPLES / "quickstart.yaml"
QUICKSTART_REWARD = {"rules": [
    {"name": "correct", "kind": "answer", "extract": {"from": "last_number"}, "compare": "numeric", "weight": 0.5},
    {"name": "format", "kind": "all_of", "weight": 0.5,
     "checks": [{"kind": "match", "pattern": r"^\s*-?\d+\s*$"}, {"kind": "termination"}]},
]}


def make_spec(*, reward=None, warmup=None, group_size=4, **dataset) -> Spec:
    training = {"group_size": group_size, "groups_per_step": 4}
    if warmup:
        training["warmup"] = warmup
    return Spec.model_validate({
        "name": "pf",
        "model": {"name": "sailrl/tiny", "renderer": "role_colon"},
        "dataset": {"source": "data/addition.jsonl", **dataset},
        "prompt": {"user": "{{ question }}="},
        "reward": reward or QUICKSTART_REWARD,
        "training": training,
        "sampling": {"sampler": "local", "max_tokens": 8},
    })


class ScriptedPolicy:
    """Answers 'a+b=' prompts: even calls correctly, odd calls off by one; or always `fixed` (cut off)."""

    def __init__(self, fixed: str | None = None):
        self.tokenizer = get_tokenizer("sailrl/tiny")
        self.fixed = fixed
        self.calls = 0

    async def __call__(self, model_input, stop, *, max_tokens=None):
        self.calls += 1
        if self.fixed is not None:
            return TokensWithLogprobs(tokens=self.tokenizer.encode(self.fixed, add_special_tokens=False),
                                      maybe_logprobs=None, stop_reason="length")
        prompt = self.tokenizer.decode(model_input.to_ints())
        a, b = prompt.split("User: ")[1].split("=")[0].split("+")
        value = int(a) + int(b) + (self.calls % 2)
        tokens = self.tokenizer.encode(f" {value}\n\nUser:", add_special_tokens=False)
        return TokensWithLogprobs(tokens=tokens, maybe_logprobs=None, stop_reason="stop")


# ------------------------------------------------------------------------------------------- static checks


def test_constant_reward_detection():
    assert constant_reward(make_spec()) is None
    zero = {"rules": [{"name": "a", "kind": "match", "pattern": "x", "weight": 0},
                      {"name": "b", "kind": "termination", "pass_score": 0.25, "fail_score": 0.25}]}
    assert constant_reward(make_spec(reward=zero)) == 0.25
    clipped = {"rules": QUICKSTART_REWARD["rules"], "clip": [0.0, 0.0]}
    assert constant_reward(make_spec(reward=clipped)) == 0.0
    # Two rules that can cancel but not always: 1 - 1 = 0 = 0 + 0, yet 1 + 0 differs -> not constant.
    cancel = {"rules": [{"name": "a", "kind": "match", "pattern": "x", "weight": 1},
                        {"name": "b", "kind": "match", "pattern": "y", "weight": -1}]}
    assert constant_reward(make_spec(reward=cancel)) is None


def test_reward_that_can_never_vary_blocks_without_sampling():
    zero = {"rules": [{"name": "correct", "kind": "answer", "extract": {"from": "last_number"}, "weight": 0}]}
    report = build_report(make_spec(reward=zero), EXAMPLES)
    assert report["blocking"] is True
    assert report["reward"]["constant"] == 0.0
    assert report["verdict"].startswith("not ready: the reward is 0 for every completion whatever the model writes")
    assert "non-zero weight" in report["verdict"]


def test_data_and_prompt_sections():
    report = build_report(make_spec(), EXAMPLES, show=2)
    assert report["blocking"] is False and report["verdict"] == "ready: no problems found"
    data = report["data"]
    assert (data["loaded"], data["selected"], data["train"], data["eval"]) == (100, 100, 100, 0)
    assert data["skipped"]["count"] == 0 and data["columns"] == ["question", "answer"]
    first = report["prompts"][0]
    q = first["text"].split("User: ")[1].split("=")[0]
    assert first["text"] == f"User: {q}=\n\nAssistant:"
    assert first["tokens"] == len(first["text"].encode())  # byte tokenizer: one token per byte
    assert first["reference"] == str(sum(map(int, q.split("+"))))
    assert report["stop"] == [repr("\n\nUser:")]
    tok = report["tokens"]
    assert (tok["min"], tok["max"], tok["context"], tok["max_tokens"], tok["rows_over"]) == (22, 22, 4096, 8, 0)


def test_skipped_rows_are_counted_by_reason(tmp_path):
    rows = [{"question": "1+1", "answer": "2"}, {"question": "2+2", "answer": None},
            {"question": "3+3", "answer": "six"}, {"question": "4+4", "answer": "8"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build_report(make_spec(source="rows.jsonl"), tmp_path)
    skipped = report["data"]["skipped"]
    assert skipped["count"] == 2
    assert {(s["index"], s["split"]) for s in skipped["first"]} == {(1, "train"), (2, "train")}
    reasons = {item["reason"]: item["rows"] for item in skipped["by_reason"]}
    assert reasons["field 'answer' is empty (null) (used by reward.rules.0 (correct) reference)"] == [1]
    assert any(r.startswith("reference rejected by the reward rules:") and v == [2] for r, v in reasons.items())
    assert report["blocking"] is False
    assert any(p["message"].startswith("2 of 4 rows are skipped") for p in report["problems"])


@pytest.mark.parametrize(("context", "severity", "start"), [
    (30, None, None),
    (25, "warning", "100 of 100 prompts plus sampling.max_tokens (8) do not fit"),
    (22, "error", "even the shortest prompt (22 tokens) fills the model's context window (22 tokens)"),
])
def test_prompt_length_against_context(monkeypatch, context, severity, start):
    monkeypatch.setattr(preflight, "context_window", lambda name, spec_dir=None: (context, "test"))
    report = build_report(make_spec(), EXAMPLES)
    problems = [p for p in report["problems"] if "context window" in p["message"]]
    if severity is None:
        assert problems == [] and report["tokens"]["rows_over"] == 0
    else:
        assert problems[0]["severity"] == severity and problems[0]["message"].startswith(start)
        assert report["blocking"] is (severity == "error")
    if severity == "warning":
        assert problems[0]["fix"].startswith("lower sampling.max_tokens to 3")


def test_context_window_sources(tmp_path):
    assert context_window("sailrl/tiny") == (4096, "sailrl/tiny config max_position_embeddings")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"max_position_embeddings": 2048}')
    assert context_window("m", tmp_path)[0] == 2048
    assert context_window("someone/unknown-model") == (None, "unknown for someone/unknown-model (not in sailrl's table)")


def test_dataset_error_is_reported_not_raised(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"q": "1+1", "answer": "2"}\n')
    report = build_report(make_spec(source="rows.jsonl"), tmp_path)
    assert report["blocking"] is True
    assert report["data"]["key"] == "dataset.fields"
    assert report["data"]["error"].startswith("prompt.user uses field 'question', but the dataset has no column")


# ------------------------------------------------------------------------------------------- sampled verdicts


def test_sampled_rewards_with_a_scripted_policy():
    policy = ScriptedPolicy()
    report = build_report(make_spec(group_size=4), EXAMPLES, sample=3, policy=policy)
    s = report["sample"]
    assert policy.calls == 12
    assert (s["groups"], s["group_size"], s["failed_groups"]) == (3, 4, [])
    assert s["rules"]["correct"]["pass_rate"] == 0.5 and s["rules"]["correct"]["mean"] == 0.25
    assert s["rules"]["format"]["pass_rate"] == 1.0 and s["rules"]["format"]["mean"] == 0.5
    assert s["total"]["mean"] == 0.75 and s["distinct_totals"] == [0.5, 1.0]
    assert s["degenerate_fraction"] == 0.0 and s["truncated_fraction"] == 0.0
    assert report["blocking"] is False


def test_every_group_degenerate_blocks_and_says_what_to_change():
    report = build_report(make_spec(), EXAMPLES, sample=2, policy=ScriptedPolicy(fixed="zzzzzzzz"))
    s = report["sample"]
    assert s["degenerate_fraction"] == 1.0 and s["truncated_fraction"] == 1.0 and s["distinct_totals"] == [0.0]
    assert report["blocking"] is True
    err = next(p for p in report["problems"] if p["severity"] == "error")
    assert err["message"] == ("every one of the 2 sampled groups is degenerate (all 4 rollouts of a group got the "
                              "same reward), so the base policy gives no gradient: RL from this model would learn "
                              "nothing")
    assert "100% of completions hit sampling.max_tokens (8); raise it" in err["fix"]
    assert "no completion passed 'correct', 'format'" in err["fix"]
    assert "training.warmup" in err["fix"]


def test_degenerate_base_policy_with_warmup_is_a_warning():
    spec = make_spec(warmup={"steps": 10, "completion": " {{ answer }}"})
    report = build_report(spec, EXAMPLES, sample=1, policy=ScriptedPolicy(fixed="zzzzzzzz"))
    assert report["blocking"] is False
    assert any(p["severity"] == "warning" and "warm-up (10 steps) runs before RL" in p["message"]
               for p in report["problems"])


# ------------------------------------------------------------------------------------------- command line


def test_cli_json_and_exit_code_on_a_static_blocker(tmp_path, capsys):
    spec = tmp_path / "zero.yaml"
    spec.write_text(
        "name: zero\nmodel: {name: sailrl/tiny}\n"
        f"dataset: {{source: {EXAMPLES / 'data' / 'addition.jsonl'}}}\n"
        "prompt: {user: '{{ question }}='}\n"
        "reward:\n  rules:\n    - {name: fmt, kind: match, pattern: 'x', weight: 0}\n"
        "sampling: {sampler: local, max_tokens: 8}\n")
    assert main(["preflight", str(spec), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["blocking"] is True and report["reward"]["constant"] == 0.0


def test_cli_locates_a_dataset_problem(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1", "solution": "2"}\n')
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\nmodel: {name: sailrl/tiny}\ndataset:\n  source: rows.jsonl\n"
                    "  fields: {question: question, answer: answr}\n"
                    "prompt: {user: '{{ question }}='}\n"
                    "reward:\n  rules:\n    - {name: c, kind: answer, extract: {from: last_number}}\n"
                    "sampling: {sampler: local}\n")
    assert main(["preflight", str(spec)]) == 1
    err = capsys.readouterr().err
    assert f"{spec}:5:40: dataset.fields.answer:" in err
    assert "field 'answer' maps to column 'answr', but the dataset has no such column" in err


def test_cli_remote_sampler_without_key_is_one_line(monkeypatch, capsys):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert main(["preflight", str(QUICKSTART), "--sample", "1", "--sampler", "tinker"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("sailrl preflight: TINKER_API_KEY is not set")


def test_cli_local_sampler_refuses_a_hub_model_before_loading_anything(tmp_path, capsys):
    text = QUICKSTART.read_text().replace("name: sailrl/tiny", "name: Qwen/Qwen3-8B").replace(
        "renderer: role_colon", "renderer: qwen3")
    text = text.replace("source: data/addition.jsonl", f"source: {EXAMPLES / 'data' / 'addition.jsonl'}")
    spec = tmp_path / "qwen.yaml"
    spec.write_text(text)
    assert main(["preflight", str(spec), "--sample", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"sailrl preflight: the embedded backend runs sailrl/tiny or a local model folder, not "
                   f"Qwen/Qwen3-8B. Sample the base model remotely: sailrl preflight {spec} --sample N --sampler "
                   f"tinker (TINKER_API_KEY) or --sampler sail (SAIL_API_KEY)")


def test_cli_sail_sampler_without_key(monkeypatch, capsys):
    monkeypatch.delenv("SAIL_API_KEY", raising=False)
    assert main(["preflight", str(QUICKSTART), "--sample", "1", "--sampler", "sail"]) == 1
    assert capsys.readouterr().err.startswith("sailrl preflight: SAIL_API_KEY is not set: --sampler sail needs it")


# ------------------------------------------------------------------------------------------- embedded backend


def _local_backend_or_skip():
    try:
        from sailrl.runtime.local import LocalServiceClient  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"sailrl.runtime.local.LocalServiceClient is not available yet ({exc})")


@pytest.mark.slow
def test_quickstart_preflight_samples_the_embedded_base_policy(capsys):
    _local_backend_or_skip()
    assert main(["preflight", str(QUICKSTART), "--sample", "2", "--show", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    s = report["sample"]
    assert s["sampler"] == "local" and s["groups"] == 2 and s["group_size"] == 8 and s["failed_groups"] == []
    assert set(s["rules"]) == {"correct", "format"}
    assert 0.0 <= s["degenerate_fraction"] <= 1.0
    assert s["completion_tokens"]["max"] <= 12  # sampling.max_tokens
    assert len(s["examples"]) == 2 and all(isinstance(e["completion"], str) for e in s["examples"])
    assert report["blocking"] is False  # the quickstart's warm-up runs before RL


@pytest.mark.slow
def test_pattern_the_tiny_model_never_produces_blocks(tmp_path, capsys):
    _local_backend_or_skip()
    spec = tmp_path / "never.yaml"
    spec.write_text(
        "name: never\nmodel: {name: sailrl/tiny, renderer: role_colon}\n"
        f"dataset: {{source: {EXAMPLES / 'data' / 'addition.jsonl'}}}\n"
        "prompt: {user: '{{ question }}='}\n"
        "reward:\n  rules:\n    - {name: magic, kind: match, pattern: 'QQQQQQQQ', weight: 1}\n"
        "training: {group_size: 4, groups_per_step: 2}\n"
        "sampling: {sampler: local, max_tokens: 8}\n")
    assert main(["preflight", str(spec), "--sample", "2"]) == 1
    out = capsys.readouterr().out
    assert "every one of the 2 sampled groups is degenerate" in out
    assert "no completion passed 'magic'" in out
    assert "not ready" in out
