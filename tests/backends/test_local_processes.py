"""The embedded backend's child processes (training, sampling): the same samples and the same training as in
process, plain errors when one fails, none left behind when the run is killed, and off-policy runs that resume and
stop cleanly with them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tinker import types

from sailrl.runtime.backends.local import LocalServiceClient
from sailrl.runtime.backends.local.weights.device import use_local_processes
from sailrl.runtime.backends.local.processes.sampler_process import SamplerProcessError
from sailrl.runtime.backends.local.processes.trainer_process import TrainerProcessError
from sailrl.spec.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MODEL = "sailrl/tiny-arith"


def _prompt(tok, text: str) -> types.ModelInput:
    return types.ModelInput.from_ints(tok.encode(text, add_special_tokens=False))


def _samples(process: bool, base_dir: Path) -> list:
    """Seeded and unseeded samples of a checkpoint, and the base model's prompt logprobs."""
    svc = LocalServiceClient(MODEL, processes=process, base_dir=base_dir, seed=7)
    try:
        tc = svc.create_lora_training_client(base_model=MODEL, rank=4, seed=3)
        tok = tc.get_tokenizer()
        data = [types.Datum(model_input=_prompt(tok, "User: 2+2=\n\nAssistant: "),
                            loss_fn_inputs={"target_tokens": types.TensorData(
                                data=tok.encode("User: 2+2=\n\nAssistant: 4", add_special_tokens=False)[1:],
                                dtype="int64")})]
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()  # a checkpoint that is not the base
        sampler = tc.create_sampling_client(tc.save_weights_for_sampler("s1").result().path)
        out = []
        for seed in (None, 11):
            params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=seed)
            futures = [sampler.sample(_prompt(tok, f"User: {i}+3=\n\nAssistant:"), 4, params) for i in range(5)]
            out.append([[(s.tokens, s.logprobs, s.stop_reason) for s in f.result().sequences] for f in futures])
        base = svc.create_sampling_client(base_model=MODEL)
        out.append(base.compute_logprobs(_prompt(tok, "User: 1+2=\n\nAssistant: 3")).result())
        out.append(sampler.compute_logprobs(_prompt(tok, "User: 1+2=\n\nAssistant: 3")).result())
        return out
    finally:
        svc.close("done")


@pytest.mark.slow
def test_the_sampling_process_samples_exactly_what_in_process_sampling_does(tmp_path):
    in_process = _samples(False, tmp_path / "a")
    child = _samples(True, tmp_path / "b")
    assert child == in_process
    tokens = [seq[0] for req in in_process[0] for seq in req]
    assert len(set(map(tuple, tokens))) > 1  # real samples, not one repeated sequence
    assert in_process[2] != in_process[3]  # the trained checkpoint is not the base model


@pytest.mark.slow
def test_a_child_process_that_fails_fails_its_call_in_one_plain_line_and_the_rest_goes_on(tmp_path):
    """One service with both child processes (each costs seconds of imports, so the cases share it): a checkpoint
    the sampling process cannot read fails that sampler only; the child's ValueError is raised here; a killed
    sampling process fails the next sample in one plain line while training goes on; a killed training process
    fails the next update likewise, and what is checked before the child is still checked."""
    svc = LocalServiceClient(MODEL, processes=True, base_dir=tmp_path)
    try:
        tc = svc.create_lora_training_client(base_model=MODEL, rank=4, seed=0)
        tok = tc.get_tokenizer()
        bad = tc.save_weights_for_sampler("bad").result().path
        good = tc.save_weights_for_sampler("good").result().path
        directory = svc._backend.store.existing(bad)
        os.remove(os.path.join(directory, "adapter_model.safetensors"))
        with pytest.raises(FileNotFoundError, match="adapter_model.safetensors"):
            tc.create_sampling_client(bad)
        sampler = tc.create_sampling_client(good)
        response = sampler.sample(_prompt(tok, "User: 1+1=\n\nAssistant:"), 2,
                                  types.SamplingParams(max_tokens=4, seed=1)).result()
        assert len(response.sequences) == 2 and all(1 <= len(s.tokens) <= 4 for s in response.sequences)
        with pytest.raises(ValueError, match="context"):  # the child's ValueError, raised here
            sampler.sample(types.ModelInput.from_ints([5] * 5000), 1, types.SamplingParams(max_tokens=2)).result()

        # the sampling process killed
        process = svc._backend.sampler_process
        os.kill(process.pid, signal.SIGKILL)
        process._proc.wait(10)
        with pytest.raises(SamplerProcessError) as err:
            sampler.sample(_prompt(tok, "User: 1+1=\n\nAssistant:"), 1, types.SamplingParams(max_tokens=2)).result()
        message = str(err.value)
        assert "sampling process stopped during sampling (killed by signal 9)" in message
        assert "out-of-memory" in message and "SAILRL_LOCAL_PROCESSES=0" in message and "\n" not in message
        assert tc.save_weights_for_sampler("after").result().path  # training goes on: state can be saved

        # the training process killed
        with pytest.raises(AttributeError, match="training process"):
            tc.peft_model  # noqa: B018 -- the model is not in this process
        process = svc._backend.trainer_process
        os.kill(process.pid, signal.SIGKILL)
        process._proc.wait(10)
        ids = tok.encode("User: 1+1=\n\nAssistant: 2", add_special_tokens=False)
        datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                            loss_fn_inputs={"target_tokens": types.TensorData(data=ids[1:], dtype="int64")})
        with pytest.raises(TrainerProcessError) as err:
            tc.forward_backward([datum], "cross_entropy").result()
        assert "training process stopped during forward_backward (killed by signal 9)" in str(err.value)
        with pytest.raises(ValueError, match="loss_fn_inputs for 'importance_sampling' are wrong"):
            tc.forward_backward([datum], "importance_sampling").result()  # checked here, before the child
    finally:
        svc.close("done")


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # exited; its parent (init, once ours is killed) has not reaped it yet
            return True
        time.sleep(0.05)
    return False


def test_the_child_processes_are_used_for_off_policy_runs_on_the_cpu(monkeypatch):
    monkeypatch.delenv("SAILRL_LOCAL_PROCESSES", raising=False)
    assert use_local_processes("cpu", 1) and use_local_processes("cpu", 3)
    assert not use_local_processes("cpu", 0) and not use_local_processes("cuda", 1)
    monkeypatch.setenv("SAILRL_LOCAL_PROCESSES", "0")
    assert not use_local_processes("cpu", 1)
    monkeypatch.setenv("SAILRL_LOCAL_PROCESSES", "1")
    assert use_local_processes("cpu", 0) and use_local_processes("cuda", 0)
    monkeypatch.setenv("SAILRL_LOCAL_PROCESSES", "yes")
    with pytest.raises(ConfigError, match=r"SAILRL_LOCAL_PROCESSES=yes must be 1 .* or 0"):
        use_local_processes("cpu", 1)


# ----------------------------------------------------------------------------------------------------------------
# A compiled off-policy script (K=1: the sampling process) killed, interrupted and resumed
# ----------------------------------------------------------------------------------------------------------------
SMALL = ["training.groups_per_step=4", "training.group_size=4", "sampling.max_tokens=6"]


@pytest.fixture(scope="module")
def off_policy_script(tmp_path_factory) -> Path:
    """The quickstart compiled with ``max_steps_off_policy: 1``, once per module (per xdist worker): the tests run
    it into their own run directories and never write beside it."""
    from sailrl.cli import main

    tmp_path = tmp_path_factory.mktemp("off-policy-script")

    text = (ROOT / "spec/examples/quickstart.yaml").read_text()
    text = text.replace("data/addition.jsonl", str(ROOT / "spec/examples/data/addition.jsonl"))
    text = text.replace("  save_every: 20\n", "  save_every: 2\n  max_steps_off_policy: 1\n")
    spec = tmp_path / "off_policy.yaml"
    spec.write_text(text)
    script = tmp_path / "off_policy.py"
    assert main(["compile", str(spec), "-o", str(script)]) == 0
    assert "asyncio.create_task(run.sampler.policy_for(sampler_path, step))" in script.read_text()
    return script


def _popen(script: Path, run_dir: Path, *overrides: str, **kw) -> subprocess.Popen:
    args = [sys.executable, str(script), "--set", f"output.run_dir={run_dir}"]
    for o in (*SMALL, *overrides):
        args += ["--set", o]
    env = {k: v for k, v in os.environ.items() if k != "SAILRL_LOCAL_PROCESSES"}
    return subprocess.Popen(args, cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, **kw)


def _wait_for_steps(run_dir: Path, n: int) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= n):
        time.sleep(0.05)


def _lines(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (run_dir / name).read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_an_off_policy_run_trains_identically_with_and_without_the_child_processes(tmp_path, monkeypatch):
    from sailrl.cli import main

    monkeypatch.chdir(ROOT)
    lines = {}
    for processes in ("0", "1"):
        monkeypatch.setenv("SAILRL_LOCAL_PROCESSES", processes)
        run_dir = tmp_path / processes
        sets = [*SMALL, "training.steps=4", "training.max_steps_off_policy=1", "training.kl_penalty_coef=0.05",
                "training.save_every=2", f"output.run_dir={run_dir}"]
        assert main(["run", str(ROOT / "spec/examples/quickstart.yaml"), *sum((["--set", x] for x in sets), [])]) == 0
        lines[processes] = [{k: v for k, v in m.items() if not k.startswith(("time/", "reward_scoring_s"))}
                            for m in _lines(run_dir, "metrics.jsonl")]
    assert [m["step"] for m in lines["1"]] == [1, 2, 3, 4]
    assert lines["1"] == lines["0"]  # rewards, losses, KL, grad norms: the same numbers
    assert len({m["reward/total"] for m in lines["1"]}) > 1 and all(m.get("kl_policy_base") is not None
                                                                   for m in lines["1"] if m.get("datums"))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_an_off_policy_run_killed_mid_run_resumes_every_step_once_and_leaves_no_sampler(tmp_path, off_policy_script):
    script = off_policy_script
    run_dir = tmp_path / "run"
    proc = _popen(script, run_dir, "training.steps=8", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_steps(run_dir, 5)
    children = _children(proc.pid)
    assert sorted(map(_role, children)) == ["sailrl-sampler", "sailrl-trainer"]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert all(_gone(c, 15) for c in children), "a child process outlived its killed parent"
    r = subprocess.run([sys.executable, str(script), "--set", f"output.run_dir={run_dir}", "--resume",
                        *sum((["--set", o] for o in (*SMALL, "training.steps=8")), [])],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = _lines(run_dir, "metrics.jsonl")
    assert [m["step"] for m in lines] == list(range(1, 9))
    assert all(m["off_policy_k"] == 1.0 for m in lines)
    # every step after the first samples one step behind, the first steps after the resume too (from the snapshot
    # the saved state recorded), as the run would have without the kill
    assert [m["sampler_step"] for m in lines] == [1.0, *(float(s - 1) for s in range(2, 9))]
    assert all(m["staleness/max"] == 1.0 for m in lines if m["step"] != 1)
    per_step: dict[int, int] = {}
    for r_ in _lines(run_dir, "rollouts.jsonl"):
        per_step[r_["step"]] = per_step.get(r_["step"], 0) + 1
    assert per_step == {s: 16 for s in range(1, 9)}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_ctrl_c_in_an_off_policy_run_saves_state_and_stops_the_sampling_process(tmp_path, off_policy_script):
    script = off_policy_script
    run_dir = tmp_path / "run"
    proc = _popen(script, run_dir, "training.steps=50", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_steps(run_dir, 3)
    children = _children(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "state saved" in err and "--resume" in err and "Traceback" not in err
    assert children and all(_gone(c, 15) for c in children)
    done = len(_lines(run_dir, "metrics.jsonl"))
    assert _lines(run_dir, "checkpoints.jsonl")[-1]["batch"] == done


def _role(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[4].decode()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_a_sampling_process_killed_mid_run_stops_the_run_in_one_line_with_state_saved(tmp_path, off_policy_script):
    script = off_policy_script
    run_dir = tmp_path / "run"
    proc = _popen(script, run_dir, "training.steps=50", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_steps(run_dir, 3)
    children = {_role(c): c for c in _children(proc.pid)}
    assert set(children) == {"sailrl-sampler", "sailrl-trainer"}
    os.kill(children["sailrl-sampler"], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-2000:]
    assert err.count("sampling process stopped during") == 1, err[-2000:]
    assert "(killed by signal 9)" in err and "state after" in err and "--resume" in err
    assert "Traceback" not in err and "never retrieved" not in err
    assert all(_gone(c, 15) for c in children.values())
