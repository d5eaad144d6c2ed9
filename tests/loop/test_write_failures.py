"""A write that fails for want of disk (ENOSPC injected at each kind of write a run makes: metrics, rollouts, the
checkpoint index, a checkpoint's files) stops the run in one line, exit 1, at a step boundary: ``--resume`` then
gives exactly the metrics of an uninterrupted run, every step logged once."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from sailrl.runtime.backends.local.weights.checkpoints import CheckpointStore
from sailrl.runtime.loop import checkpoints
from sailrl.runtime.rundir import directory as rundir
from sailrl.runtime.rundir import rollout_log
from sailrl.runtime.rundir.writes import RunWriteError, write_error

ROOT = Path(__file__).resolve().parents[2]
SETS = ["training.groups_per_step=2", "training.group_size=4", "sampling.max_tokens=12", "training.warmup=null",
        "training.steps=5", "training.save_every=2"]
#: metrics that are timings (they differ from run to run by nature)
TIMINGS = ("time/", "reward_scoring_s")


def _run(run_dir: Path, *, resume: bool = False) -> int:
    from sailrl.cli import main

    args = ["run", "spec/examples/quickstart.yaml", "--set", f"output.run_dir={run_dir}"]
    for s in SETS:
        args += ["--set", s]
    return main(args + (["--resume"] if resume else []))


def _metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"", "metrics.jsonl ends in a half line"
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(TIMINGS)} for x in lines[:-1]]


class FullDisk:
    """Makes the run directory's disk fill up at the ``after + 1``-th whole-record append to ``name``: that write
    puts half its bytes down and fails with ENOSPC, as does every append after it, until :meth:`free`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, after: int) -> None:
        self.name, self.after, self.seen, self.full, self.writing = name, after, 0, False, False
        real_append, real_write = rundir.append_whole, os.write

        def append(path, data):
            if Path(path).name == self.name:
                self.seen += 1
                self.full = self.full or self.seen > self.after
            self.writing = self.full
            try:
                return real_append(path, data)
            finally:
                self.writing = False

        def write(fd, data):
            if not self.writing:
                return real_write(fd, data)
            if len(data) > 1:  # a short write first, as a disk that fills mid-record gives
                return real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        for module in (rundir, rollout_log, checkpoints):
            monkeypatch.setattr(module, "append_whole", append)
        monkeypatch.setattr(os, "write", write)

    def free(self) -> None:
        self.full = False
        self.after = 10**9


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert _run(run_dir) == 0
    finally:
        os.chdir(cwd)
    return _metrics(run_dir)


def _check_failed_run_resumes_exactly(run_dir: Path, capsys, uninterrupted: list[dict], free) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err[-3000:]
    free()
    assert _run(run_dir, resume=True) == 0, capsys.readouterr().err[-3000:]
    capsys.readouterr()
    got = _metrics(run_dir)
    assert [m["step"] for m in got] == [1, 2, 3, 4, 5]
    assert got == uninterrupted  # every metric value of every step, exactly
    steps = [json.loads(x)["step"] for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(set(steps)) == [1, 2, 3, 4, 5] and len(steps) == 5 * 8  # each step's 8 rollouts once
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "after", "resumes_after"), [
    ("metrics.jsonl", 2, 2),      # step 3's update landed, its metrics line did not: state after 2 is the boundary
    ("rollouts.jsonl", 3, 2),     # step 4's update landed, its rollouts did not
    ("checkpoints.jsonl", 1, 2),  # the state after step 4 was saved, its record in the index was not
])
def test_a_full_disk_in_the_run_directory_is_one_line_and_resume_repeats_the_run(
        name, after, resumes_after, tmp_path, monkeypatch, capsys, uninterrupted):
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "run"
    disk = FullDisk(monkeypatch, name, after)
    assert _run(run_dir) == 1
    line = _check_failed_run_resumes_exactly(run_dir, capsys, uninterrupted, disk.free)
    assert line.startswith(f"error: the disk is full at {run_dir / name}: free space and run again with --resume")
    assert line.endswith(f"(--resume continues from the state saved after {resumes_after} steps)")


@pytest.mark.slow
def test_a_full_disk_under_a_checkpoint_is_one_line_and_resume_repeats_the_run(
        tmp_path, monkeypatch, capsys, uninterrupted):
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "run"
    real_meta, calls = CheckpointStore.write_meta, []

    def write_meta(self, path, *args, **kwargs):  # the 5th checkpoint: step 4's snapshot (after the state at 2)
        calls.append(str(path))
        if len(calls) == 5 and not free:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_meta(self, path, *args, **kwargs)

    free: list[bool] = []
    monkeypatch.setattr(CheckpointStore, "write_meta", write_meta)
    assert _run(run_dir) == 1
    line = _check_failed_run_resumes_exactly(run_dir, capsys, uninterrupted, lambda: free.append(True))
    assert line.startswith("error: the disk is full at ") and "sampler_weights" in line, line
    assert line.endswith("(--resume continues from the state saved after 2 steps)"), line
    assert not Path(line.split(" at ", 1)[1].split(":", 1)[0]).exists()  # the half-written checkpoint is gone


def test_append_whole_takes_back_a_short_write_that_then_fails(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n')
    real_write = os.write
    calls = []

    def write(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)
    with pytest.raises(RunWriteError, match=rf"^the disk is full at {path}: free space and run again with --resume$"):
        rundir.append_whole(path, b'{"step": 2}\n')
    monkeypatch.undo()
    assert path.read_bytes() == b'{"step": 1}\n'
    path.write_bytes(b'{"step": 1}\n{"st')  # a torn line a kill left: the next record does not join it
    rundir.append_whole(path, b'{"step": 2}\n')
    assert path.read_bytes() == b'{"step": 1}\n{"st\n{"step": 2}\n'


@pytest.mark.parametrize(("code", "words"), [
    (errno.ENOSPC, "the disk is full at /r/m.jsonl: free space"),
    (errno.EDQUOT, "the disk quota is used up at /r/m.jsonl"),
    (errno.EROFS, "the file system at /r/m.jsonl is read-only"),
    (errno.EIO, "the disk failed (I/O error) writing /r/m.jsonl"),
])
def test_disk_failures_are_named_and_other_errors_are_not(code, words):
    err = write_error(OSError(code, os.strerror(code), "/r/m.jsonl"))
    assert isinstance(err, RunWriteError) and str(err).startswith(words) and "--resume" in str(err)
    wrapped = RuntimeError("write failed")
    wrapped.__cause__ = OSError(code, os.strerror(code))
    assert str(write_error(wrapped, "/r/m.jsonl")).startswith(words)
    safetensors_like = Exception(f"Error while serializing: I/O error: x (os error {code})")
    assert str(write_error(safetensors_like, "/r/m.jsonl")).startswith(words)
    assert write_error(OSError(errno.ENOENT, "no such file", "/r/m.jsonl")) is None
    assert write_error(ValueError("bad")) is None


@pytest.mark.slow
def test_a_fault_after_an_update_landed_saves_no_state_behind_the_weights(tmp_path, monkeypatch, capsys,
                                                                         uninterrupted):
    """Any fault between an update landing and its step's record (here a bug in the metrics write of step 3): the
    backend's weights are after step 3, the records end at step 2, so no state "after 2 steps" holds step 3's
    update; --resume continues from the last state saved and trains step 3 once."""
    monkeypatch.chdir(ROOT)
    run_dir = tmp_path / "run"
    real, calls = rundir.RunDirectory.append_metrics, []

    def append_metrics(self, metrics):
        calls.append(metrics["step"])
        if metrics["step"] == 3 and len(calls) == 3:
            raise RuntimeError("a bug in the metrics write")
        return real(self, metrics)

    monkeypatch.setattr(rundir.RunDirectory, "append_metrics", append_metrics)
    assert _run(run_dir) == 70
    err = capsys.readouterr().err
    assert ("state not saved: the update of step 3 landed but its record could not be written; --resume continues "
            "from the state saved after 2 steps") in err, err[-3000:]
    assert [json.loads(x)["batch"] for x in (run_dir / "checkpoints.jsonl").read_text().splitlines()] == [2]
    assert _run(run_dir, resume=True) == 0, capsys.readouterr().err[-3000:]
    assert _metrics(run_dir) == uninterrupted
