"""The python tool's sandbox in tests: skip where bubblewrap cannot run, except in CI (``CI=true``), where a
missing sandbox fails the test, so that the isolation tests can never pass by being skipped."""

from __future__ import annotations

import os

import pytest

from sailrl.runtime.sandbox.bubblewrap import sandbox_problem


def require_sandbox() -> None:
    """Skip the calling test (fail it under ``CI=true``) when the python tool's sandbox is unavailable here."""
    problem = sandbox_problem()
    if problem is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI needs the python tool's sandbox: {problem}")
    pytest.skip(f"the python tool's sandbox is unavailable here: {problem}")
