"""``sailrl preflight``: data and prompt report, token lengths vs context, static and sampled reward verdicts,
``--set``, the stand-in model for a remote spec, and the run's token and cost estimate.

Most tests sample from a scripted policy (a TokenCompleter that answers from the prompt), so rewards are exact;
the ``slow`` ones sample the real base policy on the embedded backend (``sailrl/tiny``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tinker_cookbook.completers import TokensWithLogprobs

from sailrl import preflight
from sailrl.cli import main
from sailrl.preflight import PreflightError, build_report, constant_reward, plan_sampling
from sailrl.runtime.backends.models import get_tokenizer
from sailrl.spec.schema import Spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "spec" / "examples"
QUICKSTART = EXAMPLES / "quickstart.yaml"
QUICKSTART_REWARD = {"rules": [
    {"name": "correct", "kind": "answer", "extract": {"from": "last_number"}, "compare": "numeric", "weight": 0.5},
    {"name": "format", "kind": "all_of", "weight": 0.5,
     "checks": [{"kind": "match", "pattern": r"^\s*-?\d+\s*$"}, {"kind": "termination"}]},
]}


def make_spec(*, reward=None, warmup=None, group_size=4, sampling=None, model=None, pricing=None,
              **dataset) -> Spec:
    training = {"group_size": group_size, "groups_per_step": 4}
    if warmup:
        training["warmup"] = warmup
    config = {
        "name": "pf",
        "model": model or {"name": "sailrl/tiny", "renderer": "role_colon"},
        "dataset": {"source": "data/addition.jsonl", **dataset},
        "prompt": {"user": "{{ question }}="},
        "reward": reward or QUICKSTART_REWARD,
        "training": training,
        "sampling": {"sampler": "local", "max_tokens": 8, **(sampling or {})},
    }
    if pricing:
        config["pricing"] = pricing
    return Spec.model_validate(config)


class ScriptedPolicy:
    """Answers 'a+b=' prompts: even calls correctly, odd calls off by one; or always `fixed` (cut off)."""

    def __init__(self, fixed: str | None = None, *, always_wrong: bool = False):
        self.tokenizer = get_tokenizer("sailrl/tiny")
        self.fixed = fixed
        self.always_wrong = always_wrong
        self.calls = 0

    async def __call__(self, model_input, stop, *, max_tokens=None):
        self.calls += 1
        if self.fixed is not None:
            return TokensWithLogprobs(tokens=self.tokenizer.encode(self.fixed, add_special_tokens=False),
                                      maybe_logprobs=None, stop_reason="length")
        prompt = self.tokenizer.decode(model_input.to_ints())
        a, b = prompt.split("User: ")[1].split("=")[0].split("+")
        if self.always_wrong:  # never the sum; every other completion adds words (fails the format rule)
            text = f" {int(a) + int(b) + 1}" + (" maybe" if self.calls % 2 else "")
            tokens = self.tokenizer.encode(f"{text}\n\nUser:", add_special_tokens=False)
            return TokensWithLogprobs(tokens=tokens, maybe_logprobs=None, stop_reason="stop")
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
    assert (tok["min"], tok["max"], tok["context"], tok["max_tokens"]) == (22, 22, 4096, 8)
    assert (tok["max_prompt_tokens"], tok["skipped_too_long"]) == (4088, 0)
    assert tok["context_source"] == "sailrl/tiny config max_position_embeddings"  # from sailrl.spec.models


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


def test_prompts_too_long_for_the_context_are_skipped_rows(tmp_path, monkeypatch):
    rows = [{"question": "1+1", "answer": "2"}, {"question": "100+100", "answer": "200"}, {"question": "2+2", "answer": "4"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(preflight, "context_window", lambda name, spec_dir=None: (32, "test"))
    report = build_report(make_spec(source="rows.jsonl"), tmp_path)
    assert report["data"]["train"] == 2
    (skip,) = report["data"]["skipped"]["first"]
    assert (skip["index"], skip["kind"]) == (1, "too_long")
    assert skip["reason"] == ("prompt is 26 tokens; the model's context is 32 and sampling.max_tokens is 8, so a "
                              "prompt may have at most 24")
    assert report["tokens"]["skipped_too_long"] == 1 and report["tokens"]["max"] == 22
    assert report["blocking"] is False
    assert report["verdict"] == ("ready, with 2 warnings: 1 of 3 rows skipped; only 2 training rows for 4 groups "
                                 "per step")


def test_every_prompt_too_long_blocks(monkeypatch):
    monkeypatch.setattr(preflight, "context_window", lambda name, spec_dir=None: (22, "test"))
    report = build_report(make_spec(), EXAMPLES)
    assert report["blocking"] is True
    assert report["verdict"].startswith(
        "not ready: every one of the 100 selected rows was skipped (100 x prompt too long for the model's context "
        "(e.g. row ")
    assert "prompt is 22 tokens; the model's context is 22 and sampling.max_tokens is 8" in report["verdict"]


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


def test_a_rule_that_never_passes_is_in_the_verdict():
    # The answer rule passes 0 of 32 completions while the format rule varies: no group is degenerate, and
    # before this check the verdict read "ready: no problems found".
    report = build_report(make_spec(), EXAMPLES, sample=8, policy=ScriptedPolicy(always_wrong=True))
    s = report["sample"]
    assert (s["completions"], s["rules"]["correct"]["passed"], s["rules"]["format"]["passed"]) == (32, 0, 16)
    assert s["degenerate_fraction"] == 0.0
    assert report["blocking"] is False
    assert report["verdict"] == "ready, with 1 warning: rule 'correct' never passed (0 of 32)"
    (p,) = report["problems"]
    assert p["message"] == ("rule 'correct' passed 0 of the 32 sampled completions, so it gives the base policy no "
                            "signal")
    assert p["fix"].startswith("check the rule on a few completions with `sailrl rewards`, loosen it")
    assert p["fix"].endswith("or add a supervised warm-up (training.warmup) that teaches it")


def test_a_rule_that_always_passes_is_in_the_verdict():
    report = build_report(make_spec(), EXAMPLES, sample=3, policy=ScriptedPolicy())
    assert report["verdict"] == "ready, with 1 warning: rule 'format' always passed (12 of 12)"
    assert report["problems"][0]["fix"].startswith("make it stricter if it should separate good from bad")


def test_a_never_passing_rule_with_a_warmup_says_the_warmup_runs_first():
    spec = make_spec(warmup={"steps": 10, "completion": " {{ answer }}"})
    report = build_report(spec, EXAMPLES, sample=2, policy=ScriptedPolicy(always_wrong=True))
    (p,) = report["problems"]
    assert p["message"].endswith("; the spec's supervised warm-up (10 steps) runs before RL and may change that")
    assert p["fix"].endswith("or add a longer supervised warm-up (training.warmup.steps)")


# ------------------------------------------------------------------------------------------- which model samples


def remote_spec(**sampling):
    return make_spec(model={"name": "Qwen/Qwen3-8B", "renderer": "qwen3"}, sampling={"sampler": "sail", **sampling})


def test_a_remote_model_without_a_key_is_sampled_with_the_stand_in(monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    spec = remote_spec(max_tokens=512)
    plan = plan_sampling(spec, None, EXAMPLES, "s.yaml")
    assert plan.sampler == "local" and plan.spec.model.name == "sailrl/tiny" and plan.spec.model.renderer is None
    assert plan.spec.sampling.max_tokens == 64 and plan.spec.sampling.sampler == "local"
    assert spec.model.name == "Qwen/Qwen3-8B" and spec.sampling.max_tokens == 512  # the spec itself is unchanged
    assert plan.note() == (
        "sampled with sailrl/tiny on the embedded backend instead of Qwen/Qwen3-8B (Qwen/Qwen3-8B is sampled on "
        "Tinker, which needs TINKER_API_KEY), max_tokens capped at 64: this checks that prompts render, rollouts "
        "run and the reward rules score real completions, but the rewards of a tiny model say nothing about "
        "Qwen/Qwen3-8B's, so they draw no verdict")
    local = plan_sampling(spec, "local", EXAMPLES, "s.yaml")
    assert local.stand_in["why"] == ("--sampler local runs on this machine and Qwen/Qwen3-8B is a remote model; to "
                                     "sample it here, download it and --set model.name=<its folder>")


def test_a_remote_model_with_a_key_is_sampled_on_tinker(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-abc")
    plan = plan_sampling(remote_spec(), None, EXAMPLES)
    assert (plan.sampler, plan.stand_in, plan.spec.model.name) == ("tinker", None, "Qwen/Qwen3-8B")
    monkeypatch.setenv("TINKER_API_KEY", "abc")
    with pytest.raises(PreflightError, match="^TINKER_API_KEY does not look like a Tinker API key"):
        plan_sampling(remote_spec(), None, EXAMPLES)


def test_a_local_model_samples_itself(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-abc")
    plan = plan_sampling(make_spec(), None, EXAMPLES)
    assert (plan.sampler, plan.stand_in, plan.spec.model.name) == ("local", None, "sailrl/tiny")


@pytest.mark.slow
def test_cli_samples_a_remote_spec_with_the_stand_in(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.setattr(preflight, "_hub_unreachable", lambda name: "the hub is unreachable (test)")
    text = re.sub(r"name: sailrl/tiny\S*", "name: Qwen/Qwen3-8B", QUICKSTART.read_text()).replace(
        "renderer: role_colon", "renderer: qwen3")
    text = text.replace("source: data/addition.jsonl", f"source: {EXAMPLES / 'data' / 'addition.jsonl'}")
    spec = tmp_path / "qwen.yaml"
    spec.write_text(text)
    assert main(["preflight", str(spec), "--sample", "1", "--set", "training.group_size=2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    s = report["sample"]
    assert (s["model"], s["sampler"], s["groups"], s["group_size"]) == ("sailrl/tiny", "local", 1, 2)
    assert s["stand_in"]["instead_of"] == "Qwen/Qwen3-8B" and s["note"].startswith("sampled with sailrl/tiny")
    assert report["verdict"].endswith("(base-policy rewards not judged: sampled with the sailrl/tiny stand-in)")
    assert report["overrides"] == ["training.group_size=2"]
    assert any(p["message"].startswith("cannot load the tokenizer of Qwen/Qwen3-8B: the hub is unreachable (test)")
               for p in report["problems"])
    assert report["cost"]["completions"] == "not sampled: 1 to max_tokens (12) tokens each"


def test_sampler_sail_samples_the_base_model_on_sail(fake_sail_server):
    from tests.fakes.sail_server import Sample

    tok = get_tokenizer("sailrl/tiny")

    def answer(prompt_tokens, payload):
        a, b = map(int, re.search(r"(\d+)\+(\d+)=", tok.decode(prompt_tokens)).groups())
        ids = tok.encode(f" {a + b}\n\nUser:", add_special_tokens=False)
        return Sample(ids, [-0.5] * len(ids), "stop")

    fake_sail_server.sampler = answer
    fake_sail_server.service_time_s = 0.0
    report = build_report(make_spec(sampling={"max_tokens": 12}), EXAMPLES, sample=2, sampler="sail")
    posts = fake_sail_server.payloads
    assert len(posts) == 8  # 2 groups x group_size 4
    assert posts[0]["model"] == "sailrl/tiny" and "lora" not in (posts[0].get("metadata") or {})
    assert posts[0]["max_output_tokens"] == 12 and posts[0]["stop"] == ["\n\nUser:"]
    s = report["sample"]
    assert (s["sampler"], s["groups"], s["rules"]["correct"]["passed"], s["degenerate_fraction"]) == ("sail", 2, 8, 1.0)
    assert report["verdict"].startswith("not ready: every one of the 2 sampled groups is degenerate")


# ------------------------------------------------------------------------------------------- cost estimate


def test_the_cost_estimate_without_sampling_uses_the_max_tokens_bound():
    spec = make_spec(sampling={"sampler": "tinker"}, pricing={"tinker": {"train": 1, "prefill": 1, "sample": 1}})
    report = build_report(spec, EXAMPLES)
    # 7 steps x 4 groups x 4 rollouts = 112 rollouts of 22 prompt tokens (2,464) and 1..8 sampled tokens;
    # trained: 0 (every group degenerate) to prompt + completion - 1 of every rollout (2,464 + 112 x 7 = 3,248).
    # Total 2,464 + 112 + 0 = 2,576 to 2,464 + 896 + 3,248 = 6,608 tokens, at $1 per million each.
    assert report["cost"]["summary"] == ("tokens: 2,576-6,608 (completions of 1 to max_tokens (8) tokens); cost: "
                                         "$0.002576-$0.006608 (estimate)")
    assert report["cost"]["tokens"]["prompt"] == {"low": 2464.0, "high": 2464.0, "expected": 2464.0}


def test_the_cost_estimate_uses_sampled_completion_lengths_of_the_spec_model():
    spec = make_spec(sampling={"sampler": "tinker", "max_tokens": 12},
                     pricing={"tinker": {"train": 1, "prefill": 1, "sample": 1}})
    report = build_report(spec, EXAMPLES, sample=3, policy=ScriptedPolicy())
    assert report["cost"]["completions"].startswith("12 sampled completions: 10th-90th percentile")
    assert "(completion lengths from the sampled base policy)" in report["cost"]["summary"]
    lengths = report["sample"]["completion_lengths"]
    assert len(lengths) == 12 and report["cost"]["completion_tokens"]["expected"] == sum(lengths) / 12


def test_a_local_run_costs_nothing_and_an_unpriced_one_says_what_to_add():
    assert report_cost(make_spec()).endswith("cost: $0 (the embedded backend bills nothing)")
    assert report_cost(make_spec(sampling={"sampler": "tinker"})).endswith(
        "cost: unknown: add pricing.tinker.prefill, pricing.tinker.sample, pricing.tinker.train (USD per million "
        "tokens) to the spec")


def report_cost(spec):
    return build_report(spec, EXAMPLES)["cost"]["summary"]


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


def test_cli_sail_sampler_without_key(monkeypatch, capsys):
    monkeypatch.delenv("SAIL_API_KEY", raising=False)
    assert main(["preflight", str(QUICKSTART), "--sample", "1", "--sampler", "sail"]) == 1
    assert capsys.readouterr().err.startswith("sailrl preflight: SAIL_API_KEY is not set: --sampler sail needs it")


def test_cli_set_overrides_the_spec(capsys):
    assert main(["preflight", str(QUICKSTART), "--set", "sampling.max_tokens=4", "--set", "dataset.limit=10",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"]["max_tokens"] == 4 and report["data"]["selected"] == 10
    assert report["overrides"] == ["sampling.max_tokens=4", "dataset.limit=10"]


def test_cli_set_errors(capsys):
    assert main(["preflight", str(QUICKSTART), "--set", "training.group_size"]) == 2
    assert capsys.readouterr().err.strip() == ("sailrl preflight: error: --set expects KEY=VALUE, got "
                                               "'training.group_size'")
    assert main(["preflight", str(QUICKSTART), "--set", "training.group_size=many"]) == 1
    err = capsys.readouterr().err
    assert "training.group_size" in err and "(these come from the --set overrides: training.group_size=many)" in err


# ------------------------------------------------------------------------------------------- embedded backend


def _local_backend_or_skip():
    try:
        from sailrl.runtime.backends.local import LocalServiceClient  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"sailrl.runtime.backends.local.LocalServiceClient is not available yet ({exc})")


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


def test_the_spec_warnings_are_in_the_verdict(tmp_path, capsys):
    spec = tmp_path / "w.yaml"
    spec.write_text(
        "name: w\nmodel: {name: sailrl/tiny}\n"
        f"dataset: {{source: {EXAMPLES / 'data' / 'addition.jsonl'}}}\n"
        "prompt: {user: '{{ question }}='}\n"
        "reward:\n  rules:\n    - {name: c, kind: answer, extract: {from: last_number}}\n"
        "training: {learning_rate: 1e5}\n"
        "sampling: {sampler: local, max_tokens: 8}\n")
    assert main(["preflight", str(spec), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "ready, with 1 warning: training.learning_rate looks unusual"
    assert report["problems"][0]["message"] == (f"{spec}:8:27: training.learning_rate: learning_rate 1e5 is outside "
                                                f"its usual range, 1e-07 to 0.01")
