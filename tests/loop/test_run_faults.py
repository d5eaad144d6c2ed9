"""A bug is a bug: what ends a run decides its exit status and its words.

A fault of Tinker, Sail, their HTTP transport or the embedded backend is one ``error:`` line naming the step and
phase, exit 1, with the completed steps' state saved; anything else raised in a step is a bug in sailrl, which
exits 70 with its traceback (never dressed as a service fault); a stop the spec asked for
(``training.on_all_degenerate: stop``) is one ``stopped:`` line, exit 4, state saved.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
import tinker

from sailrl import launch
from sailrl.cli import main
from sailrl.runtime.backends.faults import is_bug, service_fault
from sailrl.runtime.backends.local.sampling import LocalSamplingClient
from sailrl.runtime.backends.local.training import LocalTrainingClient
from sailrl.runtime.loop.errors import AllDegenerateError, OnPolicyMismatch, RunError, RunStopped, phase
from sailrl.spec.errors import ServiceError
from sailrl.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "spec/examples/quickstart.yaml"
SMALL = ["training.steps=3", "training.groups_per_step=4", "training.group_size=4", "training.warmup=null"]
REQUEST = httpx.Request("POST", "https://tinker.example/api/v1/forward_backward")


def _run(tmp_path: Path, *overrides: str) -> int:
    args = ["run", str(QUICKSTART), "--set", f"output.run_dir={tmp_path / 'run'}"]
    for o in [*SMALL, *overrides]:
        args += ["--set", o]
    return main(args)


def _fail_on_call(monkeypatch, cls: type, name: str, n: int, exc: BaseException) -> None:
    """Make ``cls.name`` raise ``exc`` on its ``n``-th call (the calls before it go through)."""
    real = getattr(cls, name)
    calls = {"n": 0}

    async def patched(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise exc
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, patched)


def _saved_after(tmp_path: Path) -> list[int]:
    import json

    path = tmp_path / "run" / "checkpoints.jsonl"
    return [json.loads(x)["batch"] for x in path.read_text().splitlines()] if path.exists() else []


# -- the classifier -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [
    tinker.APIConnectionError(request=REQUEST),
    tinker.APITimeoutError(request=REQUEST),
    tinker.InternalServerError("Internal server error", response=httpx.Response(503, request=REQUEST), body=None),
    tinker.RateLimitError("slow down", response=httpx.Response(429, request=REQUEST), body=None),
    httpx.ConnectError("connection refused", request=REQUEST),
    httpx.ReadTimeout("timed out", request=REQUEST),
    ConnectionResetError(104, "Connection reset by peer"),
    TimeoutError(),
    ServiceError("the service failed"),
], ids=lambda e: type(e).__name__)
def test_service_faults_are_told_from_bugs(exc):
    assert service_fault(exc) and not is_bug(exc)


@pytest.mark.parametrize("exc", [TypeError("x"), AttributeError("x"), KeyError("x"), ValueError("x"),
                                 AssertionError("x"), ZeroDivisionError()], ids=lambda e: type(e).__name__)
def test_anything_else_is_a_bug(exc):
    assert not service_fault(exc) and is_bug(exc)


def test_sail_sdk_errors_are_service_faults():
    errors = pytest.importorskip("sail.errors")
    assert service_fault(errors.TransportError("unreachable")) and service_fault(errors.InternalError("boom"))


def test_phase_wraps_a_service_fault_and_lets_a_bug_through():
    timings: dict[str, float] = {}
    with pytest.raises(RunError, match=r"^step 3, phase 'train': APIConnectionError: Connection error\.$"):
        with phase(3, "train", timings):
            raise tinker.APIConnectionError(request=REQUEST)
    with pytest.raises(TypeError, match="^unsupported operand$"):
        with phase(3, "rollout", timings):
            raise TypeError("unsupported operand")
    assert set(timings) == {"time/train", "time/rollout"}


def test_a_spec_chosen_stop_is_not_a_service_fault():
    assert issubclass(AllDegenerateError, RunStopped) and issubclass(OnPolicyMismatch, RunStopped)
    assert not issubclass(AllDegenerateError, (RunError, ServiceError))
    assert not issubclass(OnPolicyMismatch, (RunError, ServiceError))


# -- whole runs ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_bug_in_the_trainer_exits_70_with_its_traceback(tmp_path, monkeypatch, capsys):
    _fail_on_call(monkeypatch, LocalTrainingClient, "forward_backward_async", 2, TypeError("injected trainer bug"))
    rc = _run(tmp_path)
    err = capsys.readouterr().err
    assert rc == 70, err[-3000:]
    assert "Traceback (most recent call last):" in err and "\nTypeError: injected trainer bug\n" in err
    assert err.rstrip().endswith("sailrl run: internal error (a bug in sailrl, not a problem in your files): "
                                 "TypeError: injected trainer bug. Please report it with the traceback above.")
    assert "RunError" not in err and "phase 'train'" not in err


@pytest.mark.slow
def test_a_bug_in_the_sampler_exits_70_not_as_every_group_failing(tmp_path, monkeypatch, capsys):
    _fail_on_call(monkeypatch, LocalSamplingClient, "sample_async", 1, TypeError("injected sampler bug"))
    rc = _run(tmp_path)
    err = capsys.readouterr().err
    assert rc == 70, err[-3000:]
    assert "\nTypeError: injected sampler bug\n" in err and "every group failed" not in err


@pytest.mark.slow
@pytest.mark.parametrize("fault, words", [
    (tinker.APIConnectionError(request=REQUEST), "APIConnectionError: Connection error."),
    (tinker.InternalServerError("Error code: 503 - service unavailable",
                                response=httpx.Response(503, request=REQUEST), body=None),
     "InternalServerError: Error code: 503 - service unavailable"),
], ids=["connection", "status"])
def test_a_tinker_fault_is_one_line_exit_1_with_state_saved(tmp_path, monkeypatch, capsys, fault, words):
    # the second sampler checkpoint: step 2's snapshot, taken after step 1's update landed
    _fail_on_call(monkeypatch, LocalTrainingClient, "save_weights_for_sampler_async", 2, fault)
    rc = _run(tmp_path)
    err = capsys.readouterr().err
    assert rc == 1, err[-3000:]
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: step 2, phase 'snapshot': {words}"]
    assert "Traceback" not in err and "internal error" not in err
    assert "state after 1 steps saved; fix the cause, then resume with:" in err
    assert _saved_after(tmp_path)[-1] == 1


@pytest.mark.slow
def test_the_spec_s_stop_on_a_degenerate_step_is_its_own_line_and_exit_status(tmp_path, capsys):
    rc = _run(tmp_path, "sampling.max_tokens=1", "training.on_all_degenerate=stop")
    err = capsys.readouterr().err
    assert rc == launch.EXIT_STOPPED == 4, err[-3000:]
    (stopped,) = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert re.fullmatch(r"stopped: step 1: every group scored the same reward \(0\.0\); nothing to learn from\. "
                        r"training\.on_all_degenerate is 'stop'\. .*", stopped), stopped
    assert "error:" not in err and "service" not in err and "Traceback" not in err
    assert "stopped after 1 steps; state saved. Resume with:" in err
    assert _saved_after(tmp_path)[-1] == 1


@pytest.mark.slow
def test_a_compiled_script_exits_70_on_a_bug_too(tmp_path, capsys):
    loaded = load_spec(QUICKSTART)
    config = launch.apply_overrides(loaded.spec.resolved(), [f"output.run_dir={tmp_path / 'run'}", *SMALL])

    async def script_main(run):
        await asyncio.sleep(0)
        raise TypeError("injected script bug")

    rc = launch.main(script_main, config, spec_path=str(QUICKSTART), spec_dir=QUICKSTART.parent,
                     spec_sha256=loaded.sha256, argv=[])
    err = capsys.readouterr().err
    assert rc == 70, err[-3000:]
    assert "Traceback (most recent call last):" in err and "\nTypeError: injected script bug\n" in err
    assert err.rstrip().endswith("train.py: internal error (a bug in sailrl, not a problem in your files): "
                                 "TypeError: injected script bug. Please report it with the traceback above.")
