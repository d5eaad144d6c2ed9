"""End to end on the embedded backend: compiled scripts train, resume after SIGKILL, and the Sail path runs
against a loopback Sail server with the local backend standing in for Tinker."""

from __future__ import annotations

import collections
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

SMALL = ["training.groups_per_step=4", "training.group_size=4", "sampling.max_tokens=6"]


def _run_script(script: Path, run_dir: Path, *overrides: str, resume: bool = False,
                extra_env: dict | None = None) -> subprocess.CompletedProcess:
    args = [sys.executable, str(script), "--set", f"output.run_dir={run_dir}"]
    for o in overrides:
        args += ["--set", o]
    if resume:
        args.append("--resume")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def test_quickstart_script_runs_a_few_steps_and_logs_everything(tmp_path):
    run_dir = tmp_path / "run"
    r = _run_script(ROOT / "generated/quickstart.py", run_dir, "training.steps=3", "training.save_every=2", *SMALL)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _steps(run_dir) == [1, 2, 3]
    line = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("reward/total", "reward/correct", "reward/format", "degenerate_frac", "frac_truncated",
                "tokens/sampled", "tokens/prompt", "tokens/trained", "tokens_cum/sampled", "learning_rate", "time/rollout", "time/snapshot", "datums"):
        assert key in line, key
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for m in lines:  # a step trains unless every group was degenerate, in which case it says it skipped
        assert ("time/train" in m and m["datums"] > 0) or (m["degenerate_frac"] == 1.0 and m["skipped"] == 1.0)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["spec"]["name"] == "quickstart" and len(config["spec_sha256"]) == 64
    records = [json.loads(x) for x in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert [r.get("batch") for r in records if r.get("state_path")] == [2, 3]
    assert "reward (first step -> last step)" in r.stdout and "final adapter" in r.stdout  # 3 steps


@pytest.mark.parametrize("name", ["gsm8k", "sail_guide"])
def test_committed_remote_scripts_smoke_on_the_local_backend(tmp_path, name):
    """Every committed script also runs here: the local sampler, the tiny model, a few rows of local data."""
    data = tmp_path / "rows.jsonl"
    rows = [{"question": f"What is {a} plus {b}?", "answer": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"}
            for a in range(3) for b in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _run_script(ROOT / f"generated/{name}.py", tmp_path / "run", "sampling.sampler=local",
                    "model.name=sailrl/tiny", f"dataset.source={data}", "dataset.config=null", "dataset.range=null",
                    "dataset.eval=null", "training.steps=2", "training.groups_per_step=2", "training.group_size=2",
                    "sampling.max_tokens=8", "training.eval_every=0", "training.save_every=0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert _steps(tmp_path / "run") == [1, 2]


def test_sigkill_mid_run_then_resume_gives_contiguous_unique_steps(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, str(ROOT / "generated/quickstart.py"), "--set", f"output.run_dir={run_dir}",
            "--set", "training.steps=8", "--set", "training.save_every=2"]
    for o in SMALL:
        args += ["--set", o]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(_steps(run_dir)) >= 5
    r = _run_script(ROOT / "generated/quickstart.py", run_dir, "training.steps=8", "training.save_every=2", *SMALL,
                    resume=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _steps(run_dir) == list(range(1, 9))
    assert "resuming from" in r.stderr
    # the rollout log agrees with metrics.jsonl: every step's rollouts once (16 per step at this size)
    lines = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines() if x.strip()]
    per_step = collections.Counter(r["step"] for r in lines)
    assert per_step == {s: 16 for s in range(1, 9)}
    assert len({(r["step"], r["group"], r["sample"]) for r in lines}) == len(lines)


def test_ctrl_c_saves_state_and_prints_the_resume_command(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, str(ROOT / "generated/quickstart.py"), "--set", f"output.run_dir={run_dir}",
            "--set", "training.steps=50"]
    for o in SMALL:
        args += ["--set", o]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err and "state saved" in err
    done = len(_steps(run_dir))
    records = [json.loads(x) for x in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert records[-1]["batch"] == done and "interrupted" in records[-1]["name"]


def test_sail_path_runs_against_loopback_sail_with_local_tinker_stand_in(tmp_path, monkeypatch, fake_sail_server):
    """The production path of a compiled script: Tinker trains (local stand-in), Sail samples (loopback)."""
    import tinker

    from sailrl.runtime.backends.local import LocalServiceClient
    from sailrl.runtime.backends.models import get_tokenizer
    from tests.fakes.sail_server import Sample

    tok = get_tokenizer("sailrl/tiny")
    seen: collections.Counter = collections.Counter()

    def sampler(prompt_tokens, payload):
        """The first sample of each prompt answers a+b, the second a+b+1: every group is [1.0, 0.5]."""
        a, b = map(int, re.search(r"(\d+)\+(\d+)=", tok.decode(prompt_tokens)).groups())
        seen[tuple(prompt_tokens)] += 1
        answer = a + b if seen[tuple(prompt_tokens)] % 2 == 1 else a + b + 1
        ids = tok.encode(f" {answer}\n\nUser:", add_special_tokens=False)
        return Sample(ids, [-0.5] * len(ids), "stop")

    fake_sail_server.sampler = sampler
    fake_sail_server.service_time_s = 0.0
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    monkeypatch.setattr(tinker, "ServiceClient", lambda *a, **k: LocalServiceClient("sailrl/tiny",
                                                                                    base_dir=tmp_path / "ckpt"))
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [
        "quickstart.py", "--set", f"output.run_dir={tmp_path / 'run'}", "--set", "sampling.sampler=sail",
        "--set", "training.steps=2", "--set", "training.warmup=null", "--set", "training.groups_per_step=2",
        "--set", "training.group_size=2"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "generated/quickstart.py"), run_name="__main__")
    assert exit_info.value.code == 0
    posts = fake_sail_server.payloads
    assert len(posts) == 2 * 2 * 2  # steps x groups x group_size
    meta = posts[0]["metadata"]
    assert meta["completion_window"] == "balanced" and meta["lora"].startswith("file://")
    assert json.loads(meta["tinker_adapter_config"])["r"] == 16
    run_id = json.loads((tmp_path / "run" / "config.json").read_text())["run_id"]
    assert re.fullmatch(r"[0-9a-f]{8}", run_id)  # adapters of different runs never share a name on Sail
    assert meta["tinker_lora_name"] == f"quickstart-{run_id}-step-000001"
    assert posts[-1]["metadata"]["tinker_lora_name"] == f"quickstart-{run_id}-step-000002"
    assert posts[0]["max_output_tokens"] == 12 and posts[0]["stop"] == ["\n\nUser:"]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["reward/total"] == pytest.approx(0.75) and m["correct"] == pytest.approx(0.5)
        assert m["reward/format"] == pytest.approx(0.5) and m["degenerate_frac"] == 0.0


def test_a_compiled_script_with_python_rules_loads_them_from_the_spec_folder(tmp_path):
    """The committed-script path for `kind: python`: the script's SPEC_DIR is where rewards.py is found."""
    import shutil

    src = ROOT / "docs/examples/python-reward"
    spec_dir = tmp_path / "project"
    shutil.copytree(src, spec_dir)
    script = tmp_path / "scripts" / "train.py"
    script.parent.mkdir()
    r = subprocess.run([sys.executable, "-m", "sailrl", "compile", str(spec_dir / "spec.yaml"), "-o", str(script)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, str(script), "--set", "training.steps=2", "--set", "training.group_size=2",
                        "--set", "training.groups_per_step=2"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = spec_dir / "runs/python-reward"  # a relative output.run_dir is relative to the spec's folder
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert all(m["python_rule_failures"] == 0 for m in lines)
    assert all("reward/style/polite" in m and "reward/style/calm" in m for m in lines)
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts and all(set(r["rules"]) == {"brevity", "style", "unit"} for r in rollouts)
    for r in rollouts:  # each python rule's score is what its function gives for the logged completion
        words = len(r["completion"].split())
        assert r["rules"]["brevity"]["score"] == pytest.approx(0.5 * max(0.0, min(1.0, (100 - words) / 80)))


def test_a_rule_that_cannot_be_scored_is_warned_about_every_step(tmp_path):
    (tmp_path / "boom.py").write_text('def f(completion, fields):\n    return fields["nosuchfield"]\n')
    shutil_copy = __import__("shutil").copy
    shutil_copy(ROOT / "spec/examples/data/addition.jsonl", tmp_path / "addition.jsonl")
    (tmp_path / "boom.yaml").write_text(
        "name: boom\nmodel: {name: sailrl/tiny-arith}\n"
        "dataset: {source: addition.jsonl, fields: [question, answer]}\nprompt: {user: '{{ question }}='}\n"
        "reward:\n  rules:\n    - {name: boom, kind: python, function: 'boom:f'}\n"
        "training: {steps: 2, group_size: 4, groups_per_step: 2}\nsampling: {sampler: local, max_tokens: 4}\n")
    r = subprocess.run([sys.executable, "-m", "sailrl", "run", str(tmp_path / "boom.yaml")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    warnings = [x for x in r.stderr.splitlines() if "could not be scored" in x]
    assert len(warnings) == 2 and warnings[0].startswith("warning: step 1: rule 'boom' could not be scored on 8 of 8")
    assert "KeyError: 'nosuchfield' (at boom.py:2)" in warnings[0] and "--rule boom" in warnings[0]
