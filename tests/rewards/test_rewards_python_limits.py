"""``kind: python`` rules bounded in output and memory: what a call prints is captured in its worker (the first
4 KiB kept, the rest counted), shown as whole lines prefixed with the rule's name (at most 10 a step) and
summarised per step; a worker may allocate ``memory_mb`` beyond its import, past which the call fails the rule."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from sailrl.runtime.rewards import scoring
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rewards.scoring import StepScorer
from sailrl.runtime.sandbox import workers
from sailrl.spec.rewards import RewardSpec

RULES_PY = '''\
import os
import sys


def flood(completion, fields):
    chunk = "x" * 99 + "\\n"
    for _ in range(100_000):  # 10 MB, 100,000 lines
        sys.stdout.write(chunk)
    os.write(2, b"from C-level stderr\\n")
    return 1


def chatty(completion, fields):
    for i in range(5):
        print(f"call {completion} line {i} " + "y" * 200)
    return 1


def hungry(completion, fields):
    block = bytearray(8 * 2**30)  # 8 GiB
    return len(block)


def fine(completion, fields):
    return 0.5
'''


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    (tmp_path / "limits_rules.py").write_text(RULES_PY, encoding="utf-8")
    return tmp_path


def reward(spec_dir: Path, *names: str, **kw) -> RewardFunction:
    rules = [{"name": n, "kind": "python", "function": f"limits_rules:{n}", "timeout_s": 20, **kw} for n in names]
    return RewardFunction.from_spec(RewardSpec.model_validate({"rules": rules}), "answer", spec_dir)


def test_a_call_that_prints_10_mb_keeps_4_kib_and_counts_the_rest(spec_dir, capfd):
    s = reward(spec_dir, "flood").score("x", {})
    assert s.contributions == {"flood": 1.0}
    text, printed, lines = s.output["flood"]
    assert printed == 100_000 * 100 + len("from C-level stderr\n") and lines == 100_001
    assert len(text.encode()) == workers.MAX_OUTPUT_BYTES and text.startswith("x" * 99 + "\n")
    err = capfd.readouterr().err
    assert "xxxx" not in err and "from C-level" not in err  # nothing reached the run's terminal


def test_parallel_calls_show_whole_prefixed_lines_and_a_step_summary(spec_dir, capfd):
    fn = reward(spec_dir, "chatty")
    scorer = StepScorer(fn)
    threads = [threading.Thread(target=scorer.score_sync, args=(str(i), {})) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = capfd.readouterr().err.splitlines()
    assert len(lines) == scoring.SHOWN_LINES
    for line in lines:  # each line whole, never two calls' output mixed in one line
        assert line.startswith("  [chatty] call ") and line.endswith(" " + "y" * 200) and line.count("call") == 1
    assert scorer.warnings() == [
        f"python rule 'chatty' printed 40 lines ({8 * 5 * (len('call 0 line 0 ') + 201):,} bytes) in 8 of 8 calls "
        f"(the first {scoring.SHOWN_LINES} lines are shown above); print less, or return the details as named "
        f"sub-scores"]


def test_a_rule_that_prints_nothing_adds_no_summary(spec_dir):
    scorer = StepScorer(reward(spec_dir, "fine"))
    scorer.score_sync("x", {})
    assert scorer.warnings() == []


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="the memory limit needs Linux's /proc")
def test_an_allocation_past_memory_mb_fails_the_call_fast_and_the_worker_stays(spec_dir):
    fn = reward(spec_dir, "hungry", "fine", memory_mb=256)
    started = time.perf_counter()
    s = fn.score("x", {})
    assert time.perf_counter() - started < 10  # refused at once, not swapped towards 8 GiB
    assert s.passed == {"hungry": False, "fine": True} and s.python_failures == 1
    assert s.errors["hungry"] == ("limits_rules.py:hungry ran out of memory (at limits_rules.py:20): it may use "
                                  "256 MiB beyond what loading its file took (the rule's memory_mb)")
    again = fn.score("y", {})  # the same worker answers the next call
    assert again.contributions["fine"] == 0.5 and again.errors["hungry"].startswith("limits_rules.py:hungry ran out")


def test_memory_mb_is_validated():
    base = {"name": "r", "kind": "python", "function": "limits_rules:fine"}
    assert RewardSpec.model_validate({"rules": [base]}).rules[0].memory_mb == 1024
    for bad in (10, 0, -1, "lots", 2**40):
        with pytest.raises(ValidationError):
            RewardSpec.model_validate({"rules": [{**base, "memory_mb": bad}]})
