"""The `sailrl.runtime.backends.sail` package: its public names, its error classes, the spec keys it takes, and the tables
it must agree with (the sail SDK's completion-window check, the model catalogue's LoRA families)."""

from __future__ import annotations

import inspect
import pkgutil
from pathlib import Path

import pytest

import sailrl.runtime.backends.sail as sail_pkg
from sailrl.runtime.backends.sail import (
    CheckpointURLRefused,
    SailCheckpointError,
    SailRequestRejected,
    SailRolloutError,
    completion_window_problem,
)
from sailrl.runtime.backends.sail.adapter_config import _MODULES
from sailrl.spec import models
from sailrl.spec.constants import COMPLETION_WINDOWS, RETIRED_WINDOWS
from sailrl.spec.errors import ServiceError, SpecErrors
from sailrl.spec.loader import load_spec_text
from tests.conftest import MINIMAL_SPEC

PACKAGE_DIR = Path(sail_pkg.__file__).parent


def test_the_package_has_the_three_modules() -> None:
    assert {m.name for m in pkgutil.iter_modules([str(PACKAGE_DIR)])} == {"adapter_config", "completer",
                                                                        "checkpoint_url"}


@pytest.mark.parametrize("cls", [SailRolloutError, SailRequestRejected, SailCheckpointError, CheckpointURLRefused])
def test_errors_derive_from_the_service_error_category(cls: type) -> None:
    assert issubclass(cls, ServiceError) and issubclass(cls, RuntimeError)


def test_docstrings_cite_nothing_outside_the_repository() -> None:
    for path in PACKAGE_DIR.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for needle in ("seeds/", "shared/", "NOTES.md", "cannot drift"):
            assert needle not in text, f"{path.name} mentions {needle!r}"


def test_public_functions_and_classes_have_docstrings() -> None:
    for name in sail_pkg.__all__:
        obj = getattr(sail_pkg, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{name} has no docstring"


def test_the_spec_completion_windows_agree_with_the_sail_sdk() -> None:
    for window in COMPLETION_WINDOWS:
        assert completion_window_problem(window) is None, window
    for window, why in RETIRED_WINDOWS.items():
        problem = completion_window_problem(window)
        assert problem is not None and "use 'balanced' or 'flex'" in problem, window
        assert ("retired" in problem) == (why == "retired"), (window, problem)


def test_every_lora_family_of_the_model_catalogue_has_module_names() -> None:
    families = {family for _, family in models._FAMILY_PATTERNS}
    families |= {m.lora_family for m in models.BUILTIN_MODELS.values()}
    assert families <= set(_MODULES)


# ------------------------------------------------------------------------------------------------------
# sampling.poll_deadline_s
# ------------------------------------------------------------------------------------------------------


def test_poll_deadline_defaults_to_the_sdk_twenty_minutes() -> None:
    import sail.tinker

    spec = load_spec_text(MINIMAL_SPEC).spec
    assert spec.sampling.poll_deadline_s == 1200.0 == sail.tinker._DEFAULT_POLL_TIMEOUT_SECONDS
    assert sail_pkg.DEFAULT_POLL_DEADLINE_S == 1200.0
    assert load_spec_text(MINIMAL_SPEC + "  poll_deadline_s: 90\n").spec.sampling.poll_deadline_s == 90.0


@pytest.mark.parametrize("value", ["0", "-5", "100000", "soon"])
def test_a_bad_poll_deadline_is_a_located_error(value: str) -> None:
    text = MINIMAL_SPEC + f"  poll_deadline_s: {value}\n"
    with pytest.raises(SpecErrors) as info:
        load_spec_text(text, "spec.yaml")
    errors = [e for e in info.value.errors if e.key_path == "sampling.poll_deadline_s"]
    assert len(errors) == 1
    line = text.splitlines().index(f"  poll_deadline_s: {value}") + 1
    assert (errors[0].line, errors[0].column) == (line, 20)
