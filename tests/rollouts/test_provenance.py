"""Trust on the production path (Tinker trains, Sail samples), with the embedded backend standing in for Tinker
and a loopback Sail server: every rollout records the checkpoint that produced it, the sampler-vs-learner check
notices a Sail that serves another policy, the budget stops the run resumably, and a Tinker that refuses to sign
checkpoint URLs stops it at the resolve phase in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tinker

from sailrl.cli import main
from sailrl.runtime.backends.local import LocalServiceClient
from tests.fakes.sail_server import fixed_policy_sampler, local_checkpoint_clients, policy_sampler

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "spec/examples/quickstart.yaml"
pytestmark = pytest.mark.slow


def _sail_run(tmp_path: Path, monkeypatch, server, *sets: str, resume: bool = False,
              sampler_for=None) -> tuple[int, Path]:
    """``sailrl run quickstart --sampler sail`` in-process; returns (exit status, run dir)."""
    service = LocalServiceClient("sailrl/tiny", base_dir=tmp_path / "ckpt")
    server.sampler = sampler_for(service) if sampler_for else policy_sampler(local_checkpoint_clients(service))
    server.service_time_s = 0.0
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    monkeypatch.setattr(tinker, "ServiceClient", lambda *a, **k: service)
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "run"
    base = ["training.warmup=null", "training.groups_per_step=4", "training.group_size=4", "sampling.max_tokens=6",
            "training.learning_rate=0.01", f"output.run_dir={run_dir}"]
    args = ["run", str(QUICKSTART), "--sampler", "sail", *sum((["--set", s] for s in [*base, *sets]), [])]
    return main(args + (["--resume"] if resume else [])), run_dir


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "checkpoints.jsonl").read_text().splitlines()]


def test_rollouts_sampled_from_the_trained_checkpoint_pass_the_on_policy_check(tmp_path, monkeypatch,
                                                                                  fake_sail_server, capsys):
    rc, run_dir = _sail_run(tmp_path, monkeypatch, fake_sail_server, "training.steps=3")
    err = capsys.readouterr().err
    assert rc == 0, err[-2000:]
    assert "disagree with the learner" not in err
    lines = _metrics(run_dir)
    assert [m["step"] for m in lines] == [1, 2, 3]
    for m in lines:
        if m.get("datums"):
            assert m["optim/kl_sample_train_v2"] < 1e-6  # Sail served exactly the weights being trained
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    paths = {r["step"]: r["sampler_path"] for r in rollouts}
    assert paths == {s: f"{paths[1].rsplit('-', 1)[0]}-{s:06d}" for s in (1, 2, 3)}
    assert all(r["sampler_step"] == r["step"] and r["staleness"] == 0 for r in rollouts)
    # the adapter each step's requests named is that step's checkpoint
    names = [p["metadata"]["tinker_lora_name"] for p in fake_sail_server.payloads]
    assert [n.rsplit("-", 1)[1] for n in names[:: 16]] == ["000001", "000002", "000003"]


def _another_policy(service):
    """Sail serving a different model: every other request its own sample, the others the right answer -- both
    with that model's logprobs -- so no group is degenerate and every step trains (and is checked)."""
    import re
    from collections import Counter

    from tests.fakes.sail_server import Sample

    other = LocalServiceClient("sailrl/tiny", base_dir=service.base_dir, seed=12345)  # a different base model
    client = other.create_sampling_client(base_model="sailrl/tiny")
    tok = client.get_tokenizer()
    own = fixed_policy_sampler(client)
    seen: Counter = Counter()

    def sample(prompt_tokens, payload):
        seen[tuple(prompt_tokens)] += 1
        if seen[tuple(prompt_tokens)] % 2:
            return own(prompt_tokens, payload)
        a, b = map(int, re.search(r"(\d+)\+(\d+)=", tok.decode(prompt_tokens)).groups())
        ids = tok.encode(f"{a + b}", add_special_tokens=False)
        lps = client.compute_logprobs(tinker.ModelInput.from_ints(list(prompt_tokens) + ids)).result()
        return Sample(ids, [float(x) for x in lps[-len(ids):]], "stop")

    return sample


def test_a_sail_serving_another_policy_is_warned_about(tmp_path, monkeypatch, fake_sail_server, capsys):
    rc, run_dir = _sail_run(tmp_path, monkeypatch, fake_sail_server, "training.steps=2",
                            sampler_for=_another_policy)
    err = capsys.readouterr().err
    assert rc == 0, err[-2000:]
    assert "the sampler's logprobs disagree with the learner's" in err
    assert "Sail served the base model" in err
    assert any(m.get("optim/kl_sample_train_v2", 0) > 0.01 for m in _metrics(run_dir))


def test_on_policy_mismatch_stop_stops_with_state_saved(tmp_path, monkeypatch, fake_sail_server, capsys):
    rc, run_dir = _sail_run(tmp_path, monkeypatch, fake_sail_server, "training.steps=4",
                            "sampling.on_policy_mismatch=stop", sampler_for=_another_policy)
    err = capsys.readouterr().err
    assert rc == 4 and "on_policy_mismatch is 'stop'" in err, err[-2000:]  # the spec's stop, not a fault
    assert [line for line in err.splitlines() if line.startswith(("stopped:", "error:"))][0].startswith("stopped: ")
    done = len(_metrics(run_dir))
    assert done >= 1 and _records(run_dir)[-1]["batch"] == done and "state_path" in _records(run_dir)[-1]
    assert "state saved. Resume with" in err


def test_the_budget_stops_before_a_step_would_exceed_it_and_resumes(tmp_path, monkeypatch, fake_sail_server,
                                                                     capsys):
    prices = ["pricing.tinker.train=20", "pricing.sail.balanced.input=10", "pricing.sail.balanced.output=40"]
    rc, run_dir = _sail_run(tmp_path, monkeypatch, fake_sail_server, "training.steps=6",
                            "training.max_cost_usd=0.035", *prices)
    err = capsys.readouterr().err
    assert rc == 3, err[-2000:]
    lines = _metrics(run_dir)
    assert 1 <= len(lines) < 6
    spent = lines[-1]["cost/total"]
    step_costs = [m["cost/step"] for m in lines]
    assert spent == pytest.approx(sum(step_costs))
    # The stop rule (training.max_cost_usd is checked against an estimate): each step ran only if the spend before
    # it plus the estimate -- at least the costliest of the last RECENT_STEPS steps; the step's upper bound for the
    # first -- fitted the budget. Sail samples concurrently, so a step can sample longer than the ones before it.
    from sailrl.runtime.planning.cost import RECENT_STEPS

    for k in range(1, len(lines)):
        assert sum(step_costs[:k]) + max(step_costs[max(0, k - RECENT_STEPS):k]) <= 0.035 + 1e-12, (k, step_costs)
    assert 0 < step_costs[0] <= 0.035
    assert f"budget reached before step {len(lines) + 1}" in err and "Resume with:" in err
    assert _records(run_dir)[-1]["batch"] == len(lines) and "budget" in _records(run_dir)[-1]["name"]
    rc, _ = _sail_run(tmp_path, monkeypatch, fake_sail_server, "training.steps=6", "training.max_cost_usd=1",
                      *prices, resume=True)
    assert rc == 0, capsys.readouterr().err[-2000:]
    assert [m["step"] for m in _metrics(run_dir)] == [1, 2, 3, 4, 5, 6]


def test_tinker_refusing_the_archive_url_stops_at_resolve_with_state_saved(tmp_path, monkeypatch,
                                                                           fake_sail_server, capsys):
    import httpx

    from sailrl.runtime.backends.local.rest import LocalRestClient

    calls = {"n": 0}
    original = LocalRestClient.get_checkpoint_archive_url_from_tinker_path_async

    async def refuse_after_the_first(self, tinker_path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            return await original(self, tinker_path, *args, **kwargs)
        request = httpx.Request("GET", "https://tinker.example/archive")
        raise tinker.APIStatusError("archive URLs are no longer served; use external weights",
                                    response=httpx.Response(410, request=request), body=None)

    monkeypatch.setattr(LocalRestClient, "get_checkpoint_archive_url_from_tinker_path_async", refuse_after_the_first)
    rc, run_dir = _sail_run(tmp_path, monkeypatch, fake_sail_server, "training.steps=3")
    err = capsys.readouterr().err
    assert rc == 1
    line = next(x for x in err.splitlines() if x.startswith("error: "))
    assert "HTTP 410" in line and "sampler" in line  # the cause and the option, on one line
    assert "Traceback" not in err
    assert [m["step"] for m in _metrics(run_dir)] == [1]
    assert _records(run_dir)[-1]["batch"] == 1
