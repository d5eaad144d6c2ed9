"""One error root: every exception class sailrl defines derives from SailrlError, each public one has its own
stable code, and sailrl.spec.codes.ERROR_CODES (listed in docs/error-codes.md) matches the classes."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from sailrl.spec.codes import CODES, ERROR_CODES
from sailrl.spec.errors import SailrlError
from tests.test_architecture import FOLDERS, ROOT, module_name

#: Exceptions that must stay outside ``Exception`` (so user code's ``except Exception`` cannot swallow them).
BASE_EXCEPTIONS = {"sailrl.runtime.rewards.answers.MathTimeout", "sailrl.runtime.sandbox.workers._Alarm"}


def _modules() -> list[str]:
    out = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "pretrained" in path.parts or path.name == "__main__.py":
                continue
            name = module_name(path, ROOT)
            if name is not None:
                out.append(name)
    return out


def _exception_classes() -> dict[str, type]:
    """Every class defined in a sailrl module (by AST, then imported) that is an exception."""
    found: dict[str, type] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == name:
                found[f"{name}.{obj.__qualname__}"] = obj
    return found


def test_every_sailrl_exception_derives_from_sailrl_error():
    outside = sorted(path for path, cls in _exception_classes().items()
                     if not issubclass(cls, SailrlError) and path not in BASE_EXCEPTIONS)
    assert not outside, f"exception classes outside SailrlError: {outside}"


def test_each_public_error_has_its_own_code_and_the_table_lists_exactly_them():
    public = {path: cls for path, cls in _exception_classes().items()
              if issubclass(cls, SailrlError) and not cls.__name__.startswith("_")}
    by_code: dict[str, str] = {}
    for path, cls in sorted(public.items()):
        assert "code" in vars(cls), f"{path} has no code of its own (add `code = \"E...\"` and a row in ERROR_CODES)"
        code = vars(cls)["code"]
        assert code not in by_code, f"{path} and {by_code.get(code)} share the code {code}"
        by_code[code] = path
    spec_carriers = {c: p for c, p in by_code.items() if c in CODES}  # SpecValueError: its problem's own code
    assert set(spec_carriers.values()) == {"sailrl.spec.errors.SpecValueError"}
    table = {e.code: e.cls for e in ERROR_CODES.values()}
    assert table == {c: p for c, p in by_code.items() if c not in CODES}


def test_fatal_is_an_attribute_of_the_class():
    from sailrl.runtime.backends.local.processes.child import LocalProcessError
    from sailrl.runtime.backends.sail import CheckpointURLRefused, SailRequestRejected, SailRolloutError
    from sailrl.runtime.rollouts.rollout import _is_fatal

    assert _is_fatal(SailRequestRejected("refused", status_code=400)) and _is_fatal(LocalProcessError("stopped"))
    assert _is_fatal(CheckpointURLRefused("no", status_code=403)) and not _is_fatal(SailRolloutError("expired", reasons=[],
                                                                                     attempts=1, response_ids=[]))
    assert not _is_fatal(ValueError("x")) and SailrlError.fatal is False
    source = (ROOT / "runtime" / "rollouts" / "rollout.py").read_text(encoding="utf-8")
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
             "isinstance" and any(w in ast.unparse(n.args[1]) for w in ("Sail", "Local", "Checkpoint"))]
    assert not calls, "rollout.py decides fatality by an isinstance list again"


def test_the_error_docs_list_every_error_code():
    text = (Path(ROOT) / "docs" / "error-codes.md").read_text(encoding="utf-8")
    for e in ERROR_CODES.values():
        assert f"| `{e.code}` | `{e.cls}` |" in text


def test_the_code_tables_and_the_error_docs_are_in_code_order():
    assert list(CODES) == sorted(CODES), "spec/codes.py: put the problem codes in code order"
    assert list(ERROR_CODES) == sorted(ERROR_CODES), "spec/codes.py: put the error codes in code order"
    text = (Path(ROOT) / "docs" / "error-codes.md").read_text(encoding="utf-8")
    problems = [line.split("`")[1] for line in text.splitlines() if line.startswith("| `") and "` | `sailrl." not in
                line]
    errors = [line.split("`")[1] for line in text.splitlines() if line.startswith("| `E")
              and "` | `sailrl." in line]
    assert problems == sorted(CODES) and errors == sorted(ERROR_CODES)
