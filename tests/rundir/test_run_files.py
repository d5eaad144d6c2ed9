"""Every command that reads a run directory reads regular files only, each within a bound.

A run directory's ``checkpoints.jsonl`` or ``metrics.jsonl`` that is a FIFO hung ``sailrl export``, one that is
``/dev/zero`` hung it too (a line that never ends), and ``sailrl show`` exited 70 (MemoryError) on a
``rollouts.jsonl`` that is ``/dev/zero`` and hung on a FIFO. Each is now one line naming the file, exit 1, from
``sailrl.runtime.rundir.directory.open_run_file``. The commands run in a child process with a timeout and a memory limit, so
a reader that regresses fails the test instead of hanging it or eating the machine's memory.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from sailrl.runtime.rundir import directory as rundir
from sailrl.runtime.rundir import rollout_log
from sailrl.runtime.rundir.directory import MAX_LINE_BYTES, RunDirectory, RunFileError, open_run_file, read_run_bytes
from sailrl.runtime.rundir.rollout_log import ROLLOUTS_FILE, RolloutLog, logged_steps, read_rollouts

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # a command that reads a FIFO blocks forever; one that reads /dev/zero never ends
MEMORY_LIMIT = 8 * 2**30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _sailrl(*argv: str, cwd: Path | None = None, home: Path) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "SAILRL_HOME": str(home), "NO_COLOR": "1", "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-m", "sailrl", *argv], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=TIMEOUT_S, preexec_fn=_limit_memory)


def _special(path: Path, kind: str) -> str:
    """Make ``path`` a FIFO, a link to /dev/zero or a link to a FIFO; the words the error gives it."""
    if kind == "fifo":
        os.mkfifo(path)
        return "is a FIFO (named pipe), not a regular file"
    if kind == "zero":
        path.symlink_to("/dev/zero")
        return "is a character device (through a symbolic link), not a regular file"
    os.mkfifo(path.with_name(path.name + ".pipe"))
    path.symlink_to(path.with_name(path.name + ".pipe"))
    return "is a FIFO (named pipe) (through a symbolic link), not a regular file"


def _refusal(path: Path, words: str) -> str:
    return (f"error: {path} {words}: a run directory holds only the regular files a run wrote; remove it, or put "
            "back the file the run wrote")


def _one_line(result: subprocess.CompletedProcess) -> str:
    err = result.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _record(step: int, group: int, sample: int, n: int, text: str = "5") -> dict:
    return {"step": step, "kind": "train", "group": group, "sample": sample, "step_records": n, "row": 0,
            "sampler_step": step - 1, "staleness": 1, "sampler_path": "local://r/sampler_weights/000000",
            "total": 1.0, "advantage": 0.0, "truncated": False, "num_tokens": 1, "degenerate": True,
            "rules": {"correct": {"score": 1.0, "passed": True, "why": "ok"}}, "completion": text,
            "reference": "5", "prompt": "User: 2+3=\n\nAssistant:"}


def _write_steps(run: Path, steps: dict[int, int], text: str = "5") -> None:
    """``rollouts.jsonl`` with ``n`` records for each ``step: n``, one write per step as the writer does."""
    with open(run / ROLLOUTS_FILE, "a", encoding="utf-8") as f:
        for step, n in steps.items():
            f.write("".join(json.dumps(_record(step, 0, i, n, text)) + "\n" for i in range(n)))


@pytest.fixture
def run(tmp_path) -> Path:
    """A run directory with a config.json (an empty spec: enough for the readers before the spec is used)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"spec": {}, "spec_sha256": "0" * 64}))
    return run


# ------------------------------------------------------------------------------------------------ the commands


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "zero", "link_to_fifo"])
@pytest.mark.parametrize("name", ["checkpoints.jsonl", "metrics.jsonl", "config.json"])
def test_export_and_sample_refuse_a_run_file_that_is_not_regular(run, tmp_path, name, kind):
    (run / name).unlink(missing_ok=True)
    words = _special(run / name, kind)
    for argv in (["export", str(run), "-o", str(tmp_path / "out")], ["sample", str(run), "--prompt", "1+1="]):
        result = _sailrl(*argv, home=tmp_path / "home")
        assert result.returncode == 1 and _one_line(result) == _refusal(run / name, words), result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "zero", "link_to_fifo"])
def test_show_and_plot_refuse_a_run_file_that_is_not_regular(run, tmp_path, kind):
    words = _special(run / ROLLOUTS_FILE, kind)
    result = _sailrl("show", str(run), home=tmp_path / "home")
    assert result.returncode == 1 and _one_line(result) == _refusal(run / ROLLOUTS_FILE, words)
    words = _special(run / "metrics.jsonl", kind)
    result = _sailrl("plot", str(run), "-o", str(tmp_path / "p.png"), home=tmp_path / "home")
    assert result.returncode == 1 and _one_line(result) == _refusal(run / "metrics.jsonl", words)
    assert not (tmp_path / "p.png").exists()


@pytest.mark.slow
def test_resume_and_clean_refuse_a_run_file_that_is_not_regular(tmp_path):
    """``--resume`` reads metrics.jsonl and checkpoints.jsonl before it connects; ``sailrl clean`` reads every
    run directory's checkpoints.jsonl to keep what its --resume needs."""
    text = (ROOT / "spec/examples/quickstart.yaml").read_text()
    text = text.replace("source: data/addition.jsonl", f"source: {ROOT / 'spec/examples/data/addition.jsonl'}")
    text = text.replace("run_dir: runs/quickstart", "run_dir: runs/q")
    (tmp_path / "spec.yaml").write_text(text)
    run = tmp_path / "runs" / "q"
    run.mkdir(parents=True)
    words = _special(run / "metrics.jsonl", "fifo")
    result = _sailrl("run", str(tmp_path / "spec.yaml"), "--resume", cwd=tmp_path, home=tmp_path / "home")
    assert result.returncode == 1 and _refusal(run / "metrics.jsonl", words) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]

    (tmp_path / "home" / "checkpoints" / "tiny-0123abcd" / "weights" / "s-000001").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"spec": {}}))
    words = _special(run / "checkpoints.jsonl", "zero")
    result = _sailrl("clean", "--all", "--dry-run", cwd=tmp_path, home=tmp_path / "home")
    assert result.returncode == 1 and _one_line(result) == _refusal(run / "checkpoints.jsonl", words)


# ------------------------------------------------------------------------------------------------ the readers


def test_a_missing_file_reads_as_absent_and_a_regular_one_whole(run):
    rd = RunDirectory(run)
    assert rd.read_metrics() == [] and rd.last_state() is None and open_run_file(run / "nothing") is None
    (run / "dangling.jsonl").symlink_to(run / "gone")
    assert open_run_file(run / "dangling.jsonl") is None
    rd.append_metrics({"step": 1, "reward/total": 0.5})
    (run / "linked.jsonl").symlink_to(run / "metrics.jsonl")  # a link to a regular file reads as that file
    assert rd.read_metrics() == [{"reward/total": 0.5, "step": 1}]
    assert read_run_bytes(run / "linked.jsonl") == (run / "metrics.jsonl").read_bytes()


def test_an_oversized_file_is_one_line_and_is_not_read(run, monkeypatch):
    """A sparse 200 MiB metrics.jsonl: over its 128 MiB limit, refused from its size before a byte is read."""
    with open(run / "metrics.jsonl", "wb") as f:
        f.truncate(200 * 2**20)
    with pytest.raises(RunFileError) as exc:
        RunDirectory(run).read_metrics()
    assert str(exc.value) == (f"{run / 'metrics.jsonl'} is 200.0 MiB, more than the 128.0 MiB sailrl reads of a "
                              "metrics.jsonl: it was not written by a run; remove it, or put back the file the run "
                              "wrote")
    with open(run / "config.json", "ab") as f:
        f.truncate(17 * 2**20)
    with pytest.raises(RunFileError, match=r"config.json is 17.0 MiB, more than the 16.0 MiB"):
        RunDirectory(run).read_config()


def test_the_rollout_log_is_read_a_line_at_a_time_and_holds_one_step(run, monkeypatch):
    """rollouts.jsonl may be legitimately large: the steps are listed without holding any record, one step's
    records are held within MAX_HELD_BYTES, and a line past MAX_LINE_BYTES (a /dev/zero copied in, say) is
    skipped unread."""
    _write_steps(run, {1: 4, 2: 4})
    with open(run / ROLLOUTS_FILE, "ab") as f:  # 20 MiB of zeros without a newline, then a newline
        f.write(b"\0" * (MAX_LINE_BYTES + 4 * 2**20) + b"\n")
    _write_steps(run, {3: 4}, text="x" * 2000)
    one_step = sum(len(line) for line in (run / ROLLOUTS_FILE).read_bytes().splitlines(keepends=True)[-4:])
    monkeypatch.setattr(rollout_log, "MAX_HELD_BYTES", one_step)
    assert logged_steps(run) == {"train": [1, 2, 3], "eval": []}
    assert [r["sample"] for r in read_rollouts(run, step=3)] == [0, 1, 2, 3]
    monkeypatch.setattr(rollout_log, "MAX_HELD_BYTES", one_step - 1)
    assert logged_steps(run) == {"train": [1, 2, 3], "eval": []}  # nothing held
    assert len(read_rollouts(run, step=1)) == 4
    with pytest.raises(RunFileError, match=r"rollouts.jsonl is .* more than the .* sailrl reads"):
        read_rollouts(run, step=3)
    monkeypatch.setattr(rollout_log, "MAX_HELD_BYTES", one_step + 100)
    with pytest.raises(RunFileError):  # every step at once is more than one step's bound
        read_rollouts(run)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_resume_truncation_of_a_log_that_is_not_regular_is_one_line_and_leaves_nothing(run, kind):
    words = _special(run / ROLLOUTS_FILE, kind)
    with pytest.raises(RunFileError) as exc:
        RolloutLog(run).truncate(1)
    assert f"error: {exc.value}" == _refusal(run / ROLLOUTS_FILE, words)
    assert not (run / (ROLLOUTS_FILE + ".tmp")).exists()


def test_the_limits_cover_every_file_read_whole():
    assert set(rundir.FILE_LIMITS) == {rundir.CONFIG_FILE, rundir.METRICS_FILE, rundir.CHECKPOINTS_FILE,
                                       rundir.WARMUP_FILE}


# ------------------------------------------------------------------------------------------------ schema versions


def test_every_record_carries_its_schema_and_readers_take_this_version_and_the_one_before(tmp_path):
    run = RunDirectory(tmp_path)
    run.append_metrics({"step": 1, "reward": 0.5})
    run.write_config({"name": "x"}, "abc", {})
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"schema": "metrics/2", "step": 1, "reward": 0.5}
    assert json.loads((tmp_path / "config.json").read_text())["schema"] == "config/2"
    with open(tmp_path / "metrics.jsonl", "a") as f:  # a line an earlier sailrl wrote: no schema, version 1
        f.write(json.dumps({"step": 2, "reward": 0.75}) + "\n")
    assert run.read_metrics() == [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.75}]
    assert run.read_config() == {"spec_sha256": "abc", "spec": {"name": "x"}}
    with open(tmp_path / "metrics.jsonl", "a") as f:  # a newer sailrl's
        f.write(json.dumps({"schema": f"metrics/{rundir.SCHEMA_VERSIONS['metrics.jsonl'] + 1}", "step": 3}) + "\n")
    with pytest.raises(RunFileError, match=r"schema 'metrics/3'.*reads metrics/1 and metrics/2"):
        run.read_metrics()
    (tmp_path / "rollouts.jsonl").write_text(json.dumps({"step": 1, "kind": "train", "group": 0, "sample": 0,
                                                        "step_records": 1, "schema": "rollouts/9"}) + "\n")
    with pytest.raises(RunFileError, match="rollouts/9"):
        read_rollouts(tmp_path)
