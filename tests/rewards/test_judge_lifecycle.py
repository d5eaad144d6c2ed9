"""What a validation opens for a judge does not outlive it: validating a spec with a local judge again and again in
one process (the studio, a test session) leaves no thread, backend or model behind, and a run's own service,
which connect_judges borrows, is never closed by the judges."""

from __future__ import annotations

import gc
import threading
import weakref
from pathlib import Path

import pytest

from sailrl.commands.validate import judge_connector
from sailrl.compiler.validate import validate_file
from sailrl.runtime.backends import judge_clients
from sailrl.runtime.backends.judge_clients import connect_judges
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.rewards import RewardSpec

ROOT = Path(__file__).resolve().parents[2]
JUDGE_LOCAL = ROOT / "spec" / "examples" / "judge_local.yaml"


def _local_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("sailrl-local"))


@pytest.mark.slow
def test_validating_a_local_judge_spec_again_and_again_leaves_nothing_open(monkeypatch):
    opened: list[weakref.ref] = []
    real = judge_clients._local_service

    def recording(model, spec_dir):
        service = real(model, spec_dir)
        opened.append(weakref.ref(service))
        return service

    monkeypatch.setattr(judge_clients, "_local_service", recording)
    before = {t.ident for t in threading.enumerate()}  # earlier tests in this worker process may have left some
    for _ in range(3):
        loaded = validate_file(JUDGE_LOCAL, judges=judge_connector(str(JUDGE_LOCAL), every=False))
        # the judge was called: its examples were checked, not listed as not checked
        assert [e.code for e in loaded.warnings if e.code == "W112"] == []
        assert [t.name for t in threading.enumerate() if t.ident not in before] == []  # none of this one's left
    gc.collect()
    assert len(opened) == 3
    assert [ref() for ref in opened] == [None, None, None]  # nothing holds a backend or its model


class _Service:
    """Stands in for a run's service client: counts closes."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self, status: str) -> None:
        self.closed += 1

    async def create_sampling_client_async(self, base_model: str):
        raise AssertionError("not sampled here")


def _local_judges(n: int) -> RewardFunction:
    rules = [{"name": f"j{i}", "kind": "judge", "rubric": "The reply is {{ answer }}.",
              "judge": {"model": "sailrl/tiny-judge", "sampler": "local", "renderer": "role_colon"}}
             for i in range(n)]
    return RewardFunction.from_spec(RewardSpec.model_validate({"rules": rules}), "answer")


def test_close_judges_closes_the_judges_own_backend_once_and_never_a_borrowed_one(monkeypatch):
    own = _Service()
    monkeypatch.setattr(judge_clients, "_local_service", lambda model, spec_dir: own)
    fn = _local_judges(2)
    assert connect_judges(fn) == {}
    assert all(j.connected for j in fn.judges.values())
    fn.close_judges()
    assert own.closed == 1  # two judges share the backend they opened; it is closed once
    assert not any(j.connected for j in fn.judges.values())

    runs = _Service()
    fn = _local_judges(2)
    assert connect_judges(fn, local_service=runs) == {}
    fn.close_judges()
    assert runs.closed == 0  # the run's service belongs to the run
