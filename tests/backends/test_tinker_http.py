"""The real Tinker API over HTTP: compiled scripts with ``sampler: tinker`` run through the real ``tinker`` SDK against
SkyRL's Tinker API server on loopback (``tests/fakes/skyrl_server.py``; JAX on the CPU), serving the quickstart's
base model ``sailrl/tiny-arith``. No API key: sailrl gives the SDK a placeholder for a server other than Thinking
Machines'. Skipped with the reason where SkyRL's environment is absent (``SAILRL_SKYRL_PYTHON``); a failure under
``CI=true``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tinker

from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.models import get_tokenizer
from sailrl.runtime.backends.tinker_service import service_client
from tests.fakes.skyrl_server import MODEL, SkyRLServer, unpatch_sdk

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
#: The quickstart at a smaller shape: 4 prompts x 4 rollouts a step, a saved state each step.
SMALL = {"  steps: 100": "  steps: 3", "  group_size: 8": "  group_size: 4", "  groups_per_step: 16": "  groups_per_step: 4",
         "  save_every: 20": "  save_every: 1",
         "  sampler: local": "  sampler: tinker", "  run_dir: runs/quickstart": "  run_dir: run"}
#: Seconds a whole run gets before the test gives up on it (a step takes seconds once JAX has compiled its shapes).
RUN_TIMEOUT_S = 300


def _spec(tmp_path: Path, **changes: str) -> Path:
    """The quickstart with ``SMALL``'s lines (and ``changes``'s) replaced, compiled to ``train.py`` beside it."""
    text = (ROOT / "spec/examples/quickstart.yaml").read_text(encoding="utf-8")
    for old, new in {**SMALL, **changes}.items():
        assert f"\n{old}" in text, old
        text = text.replace(f"\n{old}", f"\n{new}", 1)
    spec = tmp_path / "spec.yaml"
    spec.write_text(text, encoding="utf-8")
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "addition.jsonl").write_bytes((ROOT / "spec/examples/data/addition.jsonl").read_bytes())
    done = subprocess.run([sys.executable, "-m", "sailrl", "compile", str(spec), "-o", str(tmp_path / "train.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp_path / "train.py"


def _env(server: SkyRLServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TINKER_API_KEY", "TINKER_CREDENTIAL_CMD")}
    return {**env, "TINKER_BASE_URL": server.url, "PYTHONUNBUFFERED": "1", "no_proxy": "127.0.0.1,localhost"}


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _wait_for_saved_step(proc: subprocess.Popen, run_dir: Path, step: int) -> None:
    """Wait (bounded) until the run has logged ``step`` and saved the state after it."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if any(r.get("batch") == step for r in _lines(run_dir / "checkpoints.jsonl")):
            return
        time.sleep(0.05)
    raise AssertionError(f"the run did not save step {step} (exit {proc.poll()})")


def _first_step(service, datums, sequence):
    """A fresh rank-16 LoRA of `MODEL` (seed 0) on ``service``: the NLL and per-token logprobs of a ``forward`` with
    ``cross_entropy`` over ``datums``, and its sampler's ``compute_logprobs`` of ``sequence``."""
    client = service.create_lora_training_client(base_model=MODEL, rank=16, seed=0)
    out = client.forward(datums, "cross_entropy").result()
    logprobs = [list(map(float, o["logprobs"].tolist())) for o in out.loss_fn_outputs]
    weights = [d.loss_fn_inputs["weights"].tolist() for d in datums]
    nll = -sum(lp * w for lps, ws in zip(logprobs, weights, strict=True)
               for lp, w in zip(lps, ws, strict=True)) / sum(map(sum, weights))
    sampler = client.save_weights_and_get_sampling_client()
    scored = sampler.compute_logprobs(tinker.ModelInput.from_ints(sequence)).result()
    return nll, logprobs, [x for x in scored if x is not None]


def test_the_first_steps_nll_and_logprobs_agree_with_the_embedded_backend(skyrl_server, tmp_path, monkeypatch):
    """Same weights (a fresh LoRA adds nothing), same seed: the server's NLL and logprobs over HTTP are the
    embedded backend's within 1e-4 (measured: NLL differences of about 1e-6)."""
    monkeypatch.setenv("TINKER_BASE_URL", skyrl_server.url)
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    unpatch_sdk(monkeypatch)  # service_client() wraps SDK functions in this process: put them back afterwards
    tokenizer = get_tokenizer(MODEL)
    rows = [json.loads(x) for x in (ROOT / "spec/examples/data/addition.jsonl").read_text().splitlines()[:8]]
    datums = []
    for row in rows:
        prompt = tokenizer.encode(f"User: {row['question']}=\n\nAssistant:", add_special_tokens=False)
        answer = tokenizer.encode(f" {row['answer']}\n\nUser:", add_special_tokens=False)
        tokens = prompt + answer
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
        datums.append(tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                                   loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights}))
    sequence = datums[0].model_input.to_ints() + [datums[0].loss_fn_inputs["target_tokens"].tolist()[-1]]
    http = _first_step(service_client(), datums, sequence)
    local = _first_step(LocalServiceClient(MODEL, base_dir=tmp_path / "local", seed=0, device="cpu"), datums,
                        sequence)
    forward = max(abs(a - b) for ours, theirs in zip(http[1], local[1], strict=True)
                  for a, b in zip(ours, theirs, strict=True))
    # compute_logprobs: one per token after the first (the embedded backend's first is None)
    assert len(http[2]) == len(local[2]) == len(sequence) - 1
    scored = max(abs(a - b) for a, b in zip(http[2], local[2], strict=True))
    print(f"first-step NLL {http[0]:.6f} (HTTP) vs {local[0]:.6f} (embedded); largest logprob difference "
          f"{forward:.2e} (forward), {scored:.2e} (compute_logprobs)")
    assert abs(http[0] - local[0]) < 1e-4 and forward < 1e-4 and scored < 1e-4, (http[0], local[0], forward, scored)


def test_a_loss_the_server_does_not_offer_is_one_line_at_the_first_update(skyrl_server, tmp_path):
    script = _spec(tmp_path, **{"  loss_fn: importance_sampling": "  loss_fn: dro", "  steps: 100": "  steps: 1"})
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(skyrl_server), capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
    assert "Traceback" not in done.stderr
    assert (f"error: the Tinker service at {skyrl_server.url} does not offer loss_fn 'dro' (HTTP 422); it offers "
            "'cross_entropy', 'importance_sampling', 'ppo', ") in done.stderr, done.stderr[-2000:]


def _last_lines(text: str, n: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _start(script: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script), *args], cwd=script.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _after_step(proc: subprocess.Popen, run_dir: Path, step: int, interrupt) -> str:
    """Wait until the run has saved ``step``, call ``interrupt()``, and return the run's output once it exits."""
    try:
        _wait_for_saved_step(proc, run_dir, step)
        interrupt()
        return proc.communicate(timeout=RUN_TIMEOUT_S)[0]
    finally:
        proc.kill()


def test_a_compiled_script_trains_over_http_through_a_kill_a_server_gone_and_one_restarted(skyrl_server, tmp_path):
    """The quickstart with ``sampler: tinker`` (4 steps of 4 x 4, state saved each step) over HTTP: SIGKILLed after
    step 1; the server gone after step 2 (one line once it has not answered for 5 s); the server restarted after
    step 3 (its checkpoints and database kept; one line); and each time ``--resume`` continues, to the end."""
    script = _spec(tmp_path, **{"  steps: 100": "  steps: 4"})
    run_dir = tmp_path / "run"
    env = {**_env(skyrl_server), "SAILRL_TINKER_UNREACHABLE_S": "5"}

    proc = _start(script, env)
    out = _after_step(proc, run_dir, 1, lambda: proc.send_signal(signal.SIGKILL))
    assert proc.returncode == -signal.SIGKILL, out[-3000:]
    assert f"connecting to Tinker ({skyrl_server.url})" in out

    proc = _start(script, env, "--resume")
    try:
        out = _after_step(proc, run_dir, 2, skyrl_server.stop)
    finally:
        skyrl_server.start()
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    state = next(r for r in _lines(run_dir / "checkpoints.jsonl") if r.get("batch") == 1)["state_path"]
    assert f"resuming from {state} at step 2 (1 of 4 steps done)" in out
    assert f"the Tinker service at {skyrl_server.url} has not answered for" in out, _last_lines(out)

    env["SAILRL_TINKER_UNREACHABLE_S"] = "300"  # longer than a restart takes
    proc = _start(script, env, "--resume")
    out = _after_step(proc, run_dir, 3, skyrl_server.restart)
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    assert f"the Tinker service at {skyrl_server.url} refused a request (HTTP 400)" in out, _last_lines(out)
    assert "it was restarted or dropped this run's model; continue with --resume" in out, _last_lines(out)

    done = subprocess.run([sys.executable, str(script), "--resume"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "at step 4 (3 of 4 steps done)" in done.stderr
    metrics = _lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all(m["groups_failed"] == 0 and m["groups"] == 4 for m in metrics)
    # the server's sampler and its trainer agree on the sampled tokens' logprobs (one set of weights); a step whose
    # groups all scored alike trains nothing and has no such figure
    kls = [m["optim/kl_sample_train_v1"] for m in metrics if "optim/kl_sample_train_v1" in m]
    assert kls and all(abs(kl) < 1e-4 for kl in kls), metrics
    final = _lines(run_dir / "checkpoints.jsonl")[-1]
    assert final.get("final") and final["state_path"].startswith("tinker://")
    assert "final adapter: tinker://" in done.stdout
