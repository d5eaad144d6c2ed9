"""Shared fixtures: a minimal valid spec text and a writer for spec files (with their local data)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

# A test run started in the background without job control (`(cmd &)` in a script) inherits SIGINT ignored, and so
# would every process a test starts: the Ctrl-C tests (exit 130, state saved) need the default disposition.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

MINIMAL_SPEC = """\
name: test-run
model:
  name: sailrl/tiny
dataset:
  source: rows.jsonl
  fields: [question, answer]
prompt:
  user: '{{ question }}'
reward:
  rules:
    - name: correct
      kind: answer
      compare: numeric
sampling:
  sampler: local
"""


@pytest.fixture
def minimal_spec() -> str:
    """A valid spec (tiny model, local sampler) reading rows.jsonl next to it."""
    return MINIMAL_SPEC


@pytest.fixture
def write_spec(tmp_path: Path):
    """write_spec(text, name="spec.yaml") -> Path: writes the spec and a two-row rows.jsonl beside it."""

    def _write(text: str, name: str = "spec.yaml") -> Path:
        (tmp_path / "rows.jsonl").write_text(
            '{"question": "1+1", "answer": "2"}\n{"question": "2+3", "answer": "5"}\n', encoding="utf-8"
        )
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return _write


# The loopback Sail server fixture (tests/fakes/sail_server.py), available to every test module.
from tests.fakes.sail_server import fake_sail_server  # noqa: E402,F401

# SkyRL's Tinker API server on loopback (tests/fakes/skyrl_server.py): one per test module, its model once a session.
from tests.fakes.skyrl_server import skyrl_model_folder, skyrl_server  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _isolated_sailrl_home(tmp_path_factory, monkeypatch):
    """Local checkpoints go to a per-test store, never the user's ~/.cache/sailrl."""
    monkeypatch.setenv("SAILRL_HOME", str(tmp_path_factory.mktemp("sailrl-home")))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` (an end-to-end run, a child process, a browser, seconds each) are collected first, the
    rest keep their order. With parallel workers (the README's ``pytest -n auto --dist worksteal``) the long tests
    start at once, a worker that runs out of tests takes half of another's queue from its end (the short tests),
    and the run does not end with a few long tests on one worker while the others sit idle. A test that takes
    seconds: mark it ``@pytest.mark.slow``."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: False (slow) first
