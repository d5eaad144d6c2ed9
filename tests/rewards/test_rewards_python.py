"""``kind: python`` rules (issue 10.4): a function in a file next to the spec, run in worker processes.

Same contract as the other rules: a time limit per call (the worker is killed when the function will not stop),
an exception or a bad result fails the rule with the reason and is counted, never raised; validate loads the
function (missing file or function, an import that raises, a wrong signature: located at ``function:``) and
scores the examples with it; explain names it; the compiled script loads the file from the spec's folder.
"""

from __future__ import annotations

import importlib.util
import os
import textwrap
import time
from pathlib import Path

import pytest

from sailrl.compiler.validate import validate_file
from sailrl.runtime.rewards import python_rules
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.errors import SpecErrors
from sailrl.spec.rewards import RewardSpec

RULES_PY = '''\
import time

STATE = []


def score(completion, fields):
    return 0.5 if "yes" in completion else -0.5


def parts(completion, fields):
    return {"a": 1, "b": 0.25}


def flag(completion, fields):
    return completion.startswith("ok")


def uses(completion, fields):
    fields["answer"] = "changed"  # a copy: the row stays as it was
    return float(len(fields))


def slow(completion, fields):
    time.sleep(5)
    return 1


def stubborn(completion, fields):
    while True:
        try:
            time.sleep(10)
        except BaseException:
            pass


def boom(completion, fields):
    return {"x": 1} [completion]


def nan(completion, fields):
    return float("nan")


def text(completion, fields):
    return "high"


def empty(completion, fields):
    return {}


def chatty(completion, fields):
    print("hello from the rule")
    return 2


def exits(completion, fields):
    import os
    os._exit(3)


def remember(completion, fields):
    STATE.append(completion)
    return len(STATE)
'''


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    (tmp_path / "myrules.py").write_text(RULES_PY, encoding="utf-8")
    return tmp_path


def reward(spec_dir: Path | None, *rules: dict, **kw) -> RewardFunction:
    return RewardFunction.from_spec(RewardSpec.model_validate({"rules": list(rules), **kw}), "answer", spec_dir)


def py(name: str, function: str | None = None, **kw) -> dict:
    return {"name": name, "kind": "python", "function": function or f"myrules:{name}", **kw}


# ------------------------------------------------------------------------------------------- scoring


def test_weight_scales_the_value_and_a_dict_is_summed_and_kept(spec_dir: Path) -> None:
    fn = reward(spec_dir, py("score", weight=2), py("parts"), py("flag", pass_score=1, fail_score=-1))
    s = fn.score("yes", {"answer": "1"})
    assert s.contributions == {"score": 1.0, "parts": 1.25, "flag": -1.0}
    assert s.passed == {"score": True, "parts": True, "flag": False}
    assert s.subscores == {"parts": {"a": 1.0, "b": 0.25}}
    assert s.total == 1.25
    assert s.reasons == {"score": "myrules.py:score returned 0.5", "parts": "myrules.py:parts returned 1.25 = a 1 + "
                         "b 0.25", "flag": "myrules.py:flag returned 0"}
    s = fn.score("ok no", {"answer": "1"})
    assert s.contributions == {"score": -1.0, "parts": 1.25, "flag": 1.0}
    assert s.passed["score"] is False  # passes only above 0
    assert s.errors == {} and s.python_failures == 0


def test_the_function_gets_a_copy_of_the_fields_without_the_row_index(spec_dir: Path) -> None:
    row = {"_index": 7, "question": "q", "answer": "1"}
    s = reward(spec_dir, py("uses")).score("x", row)
    assert s.contributions == {"uses": 2.0}  # question and answer; no _index
    assert row == {"_index": 7, "question": "q", "answer": "1"}


@pytest.mark.parametrize(("name", "reason"), [
    ("boom", "myrules.py:boom raised KeyError: 'zz' (at myrules.py:37)"),
    ("nan", "myrules.py:nan returned nan; return a finite number"),
    ("text", "myrules.py:text returned a str; return a number or a dict of named numbers, e.g. {'style': 0.5}"),
    ("empty", "myrules.py:empty returned an empty dict; return a number or named numbers"),
])
def test_a_failing_call_fails_the_rule_with_the_reason_and_is_counted(spec_dir: Path, name: str,
                                                                      reason: str) -> None:
    s = reward(spec_dir, py(name, pass_score=1, fail_score=-0.5)).score("zz", {})
    assert (s.passed, s.contributions) == ({name: False}, {name: -0.5})
    assert s.reasons == {name: reason} and s.errors == {name: reason}
    assert s.python_failures == 1


def test_a_slow_call_is_stopped_at_its_time_limit(spec_dir: Path) -> None:
    fn = reward(spec_dir, py("slow", timeout_s=0.3), py("score"))
    fn.score("warm", {})  # the first call also starts the worker
    t0 = time.perf_counter()
    s = fn.score("yes", {})
    seconds = time.perf_counter() - t0
    assert 0.25 < seconds < 2.0
    assert s.reasons["slow"] == "myrules.py:slow timed out after 0.3 s" and s.passed["slow"] is False
    assert s.contributions["score"] == 0.5 and s.python_failures == 1


def test_a_function_that_swallows_the_alarm_is_killed_and_its_worker_replaced(spec_dir: Path) -> None:
    fn = reward(spec_dir, py("stubborn", timeout_s=0.2), py("score"))
    t0 = time.perf_counter()
    s = fn.score("yes", {})
    assert time.perf_counter() - t0 < python_rules.GRACE_S + 3.0  # limit + grace (+ the worker's start)
    assert s.reasons["stubborn"] == "myrules.py:stubborn timed out after 0.2 s"
    assert fn.score("yes", {}).contributions["score"] == 0.5  # the pool goes on with a fresh worker


def test_a_worker_that_dies_fails_that_call_only(spec_dir: Path) -> None:
    fn = reward(spec_dir, py("exits"), py("score"))
    s = fn.score("yes", {})
    assert s.passed["exits"] is False
    assert s.reasons["exits"].startswith("the worker process exited (exit code 3)")
    assert s.contributions["score"] == 0.5


def test_print_in_the_function_does_not_disturb_scoring(spec_dir: Path, capfd: pytest.CaptureFixture) -> None:
    s = reward(spec_dir, py("chatty")).score("x", {})
    assert s.contributions == {"chatty": 2.0}
    assert s.output == {"chatty": ("hello from the rule\n", 20, 1)}  # captured per call, not written to stderr
    assert "hello from the rule" not in capfd.readouterr().err


def test_workers_keep_the_module_loaded_between_calls(spec_dir: Path) -> None:
    fn = reward(spec_dir, py("remember"))
    values = [fn.score(str(i), {}).contributions["remember"] for i in range(3)]
    assert values[-1] >= 2  # module state survives between calls of one worker (not re-imported per call)


def test_an_edited_file_is_loaded_afresh(spec_dir: Path) -> None:
    fn = reward(spec_dir, py("score"))
    assert fn.score("yes", {}).total == 0.5
    path = spec_dir / "myrules.py"
    path.write_text(RULES_PY.replace("0.5 if", "0.75 if"), encoding="utf-8")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert reward(spec_dir, py("score")).score("yes", {}).total == 0.75


def test_many_spec_folders_keep_a_bounded_number_of_worker_processes(tmp_path: Path) -> None:
    """A process that meets many spec folders (the studio, a test session) closes the least recently used pool
    past PoolCache.max_pools: its children exit, and the folder still scores when it comes back."""
    cache = python_rules._POOLS
    folders = []
    for i in range(cache.max_pools + 2):
        folder = tmp_path / f"spec{i}"
        folder.mkdir()
        (folder / "myrules.py").write_text(RULES_PY, encoding="utf-8")
        folders.append(folder)
        assert reward(folder, py("score")).score("yes", {}).total == 0.5
        if i == 0:
            (first_pool,) = [pool for key, (_, pool) in cache._pools.items() if key[0] == str(folder.resolve())]
            children = list(first_pool._idle)
            assert children and all(child.alive for child in children)
    assert len(cache) == cache.max_pools
    assert first_pool._closed and not any(child.alive for child in children)  # its processes were stopped
    assert reward(folders[0], py("score")).score("no", {}).total == -0.5  # and the folder scores again
    assert len(cache) == cache.max_pools


def test_a_dotted_module_is_a_package_folder(spec_dir: Path) -> None:
    (spec_dir / "pkg").mkdir()
    (spec_dir / "pkg" / "__init__.py").write_text("", encoding="utf-8")
    (spec_dir / "pkg" / "scoring.py").write_text(
        "from myrules import score as base\n\ndef score(c, f):\n    return base(c, f) * 4\n", encoding="utf-8")
    s = reward(spec_dir, py("deep", "pkg.scoring:score")).score("yes", {})
    assert s.contributions == {"deep": 2.0}  # and it imported its neighbour myrules.py


def test_without_the_spec_folder_the_rule_fails_saying_so() -> None:
    s = reward(None, py("score")).score("yes", {})
    assert s.passed == {"score": False}
    assert "the spec's folder is not known" in s.reasons["score"]


def test_scoring_never_raises_for_any_of_them(spec_dir: Path) -> None:
    names = ["score", "parts", "flag", "boom", "nan", "text", "empty", "chatty"]
    fn = reward(spec_dir, *(py(n, timeout_s=0.5) for n in names), py("missing", "nowhere:score"))
    s = fn.score("ok yes", {"answer": "1"})
    assert set(s.errors) == {"boom", "nan", "text", "empty", "missing"}
    assert s.python_failures == 5


# ------------------------------------------------------------------------------------------- validate


SPEC = """\
name: t
model: {{name: sailrl/tiny, renderer: role_colon}}
dataset: {{source: data.jsonl, fields: [question, answer]}}
prompt: {{user: '{{{{ question }}}}'}}
reward:
  rules:
    - name: mine
      kind: python
      function: {function}
examples:
  - {{completion: 'yes', fields: {{answer: '1'}}, expect: {{mine: {expect}}}}}
"""


def write_spec(folder: Path, function: str, expect: float = 0.5) -> Path:
    (folder / "data.jsonl").write_text('{"question": "q", "answer": "1"}\n', encoding="utf-8")
    path = folder / "spec.yaml"
    path.write_text(SPEC.format(function=function, expect=expect), encoding="utf-8")
    return path


def problems_of(path: Path) -> list:
    with pytest.raises(SpecErrors) as info:
        validate_file(path)
    return info.value.errors


def test_validate_loads_the_function_and_scores_the_examples(spec_dir: Path) -> None:
    loaded = validate_file(write_spec(spec_dir, "myrules:score"))
    assert loaded.warnings == []
    (err,) = problems_of(write_spec(spec_dir, "myrules:score", expect=1))
    assert (err.code, err.key_path) == ("S301", "examples.0.expect.mine")
    assert "fail: myrules.py:score returned 0.5" not in err.message and "pass: myrules.py:score returned 0.5" in \
        err.message


@pytest.mark.parametrize(("function", "message", "code_hint"), [
    ("nowhere:score", "rule 'mine': there is no file nowhere.py next to the spec", "Put the file next to the spec"),
    ("myrules:scroe", "rule 'mine': myrules.py has no function 'scroe' -- did you mean 'score'?",
     "Define the function"),
    ("myrules:STATE", "rule 'mine': myrules.py:STATE is a list, not a function", "function: must name a function"),
])
def test_validate_reports_an_unusable_function_at_its_key(spec_dir: Path, function: str, message: str,
                                                          code_hint: str) -> None:
    (err,) = problems_of(write_spec(spec_dir, function))
    assert (err.code, err.key_path, err.line, err.column) == ("S230", "reward.rules.0.function", 9, 17)
    assert err.message.startswith(message)
    assert err.hint.startswith(code_hint)


def test_validate_reports_a_file_that_raises_on_import_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import math\n\nvalue = 1 / 0\n\ndef score(c, f):\n    return 1\n",
                                        encoding="utf-8")
    (err,) = problems_of(write_spec(tmp_path, "broken:score"))
    assert err.code == "S230"
    assert err.message == "rule 'mine': importing broken.py raised ZeroDivisionError: division by zero (at broken.py:3)"


@pytest.mark.parametrize(("source", "words"), [
    ("def score(completion):\n    return 1\n",
     "rule 'mine': signature.py:score(completion) cannot be called as score(completion, fields) (too many "
     "positional arguments); write def score(completion, fields):"),
    ("def score(completion, fields, extra):\n    return 1\n",
     "rule 'mine': signature.py:score(completion, fields, extra) cannot be called as score(completion, fields) "
     "(missing a required argument: 'extra'); write def score(completion, fields):"),
    ("async def score(completion, fields):\n    return 1\n",
     "rule 'mine': signature.py:score is an async def; write a plain def score(completion, fields)"),
])
def test_validate_reports_a_wrong_signature(tmp_path: Path, source: str, words: str) -> None:
    (tmp_path / "signature.py").write_text(source, encoding="utf-8")
    (err,) = problems_of(write_spec(tmp_path, "signature:score"))
    assert (err.code, err.message) == ("S230", words)


def test_a_file_named_like_an_already_loaded_module_is_reported(tmp_path: Path) -> None:
    (tmp_path / "time.py").write_text("def score(c, f):\n    return 0.5\n", encoding="utf-8")
    (err,) = problems_of(write_spec(tmp_path, "time:score"))
    assert err.code == "S230"
    assert "the name 'time' is taken by the installed module" in err.message and "rename time.py" in err.message


def test_a_malformed_function_key_is_a_schema_error(tmp_path: Path) -> None:
    errs = problems_of(write_spec(tmp_path, "'myrules.score'"))
    assert any(e.key_path.startswith("reward.rules.0") and "must be written module:function" in e.message
               for e in errs)


def test_explain_names_the_function(spec_dir: Path) -> None:
    fn = reward(spec_dir, py("score", weight=0.5), py("flag", timeout_s=0.25, pass_score=0, fail_score=-1))
    assert fn.explain() == [
        "score: 0.5 x the number returned by python: myrules.py:score(completion, fields) (a dict of named numbers "
        "counts as their sum); 0 if it raises or runs past 1 s.",
        "flag: 0 if python: myrules.py:flag(completion, fields) returns a number above 0 (True counts as 1); "
        "otherwise -1 (also if it raises or runs past 0.25 s).",
        "total = score + flag (unbounded: the python rule(s) score can return any number).",
    ]
    assert reward(spec_dir, py("score"), clip=[-1, 1]).bounds() == (-1, 1)


# ------------------------------------------------------------------------------------------- compiled script


def test_the_compiled_script_loads_the_file_from_the_spec_folder(spec_dir: Path, tmp_path_factory) -> None:
    from sailrl.cli import main

    path = write_spec(spec_dir, "myrules:score")
    out = tmp_path_factory.mktemp("elsewhere") / "train.py"
    assert main(["compile", str(path), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert '"function": "myrules:score"' in text and '"kind": "python"' in text
    spec = importlib.util.spec_from_file_location("compiled_train", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the config; runs nothing
    assert Path(module.SPEC_DIR).resolve() == spec_dir.resolve()
    from sailrl import launch

    built = launch.build_spec(module.CONFIG, [], module.SPEC_DIR)
    fn = RewardFunction.from_spec(built.reward, built.prompt.reference_field, module.SPEC_DIR)
    assert fn.score("yes", {"answer": "1"}).contributions == {"mine": 0.5}


def test_rule_errors_never_reach_the_loop_through_rule_env(spec_dir: Path) -> None:
    """RuleEnv.step with a raising python rule: a StepResult with the failure counted, no exception."""
    import asyncio

    from sailrl.runtime.backends.models import get_renderer, get_tokenizer
    from sailrl.runtime.rollouts.rollout import RuleEnv

    tok = get_tokenizer("sailrl/tiny")
    renderer = get_renderer("role_colon", tok)
    fn = reward(spec_dir, py("boom"), py("parts"))
    env = RuleEnv({"answer": "1"}, renderer.build_generation_prompt([{"role": "user", "content": "q"}]),
                  renderer.get_stop_sequences(), renderer, fn)
    result = asyncio.run(env.step(tok.encode(" zz\n\nUser:", add_special_tokens=False)))
    assert result.reward == 1.25
    assert result.metrics["python_rule_failures"] == 1.0 and result.metrics["rule_errors"] == 1.0
    assert result.metrics["reward/parts/a"] == 1.0 and result.metrics["reward/parts/b"] == 0.25
    assert result.logs["why/boom"] == "myrules.py:boom raised KeyError: 'zz' (at myrules.py:37)"
    assert (result.logs["passed/boom"], result.logs["score/boom"]) == (0, 0.0)
    assert textwrap.dedent(result.logs["completion"]) == "zz"


def test_fields_that_cannot_be_sent_fail_that_call_and_keep_the_worker(spec_dir: Path) -> None:
    fn = reward(spec_dir, py("score"))
    assert fn.score("yes", {}).total == 0.5
    s = fn.score("yes", {"answer": lambda: 1})  # a lambda cannot be pickled to the worker
    assert s.passed == {"score": False}
    assert s.reasons["score"].startswith("myrules.py:score could not be called: ")
    assert fn.score("yes", {}).total == 0.5


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "python-reward"


def test_the_documented_example_is_the_guides_and_validates() -> None:
    import re

    guide = (EXAMPLE.parents[1] / "reward-rules.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(# file: rewards.py\n.*?)```", guide, re.DOTALL)
    assert block and block.group(1) == (EXAMPLE / "rewards.py").read_text(encoding="utf-8")
    loaded = validate_file(EXAMPLE / "spec.yaml")
    assert loaded.warnings == []
    fn = RewardFunction.from_spec(loaded.spec.reward, loaded.spec.prompt.reference_field, EXAMPLE)
    s = fn.score("Please note: it is 7 km.", {"unit": "km"})
    assert s.contributions == {"brevity": 0.5, "style": 0.2, "unit": 0.0}
    assert s.subscores == {"style": {"polite": 0.1, "calm": 0.1}}
