"""``sailrl clean``: list the embedded backend's checkpoint store, remove by id / age / all, keep what a run
directory needs for --resume (unless --force), dry runs remove nothing."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
from pathlib import Path

import pytest

from sailrl.cli import main
from sailrl.runtime.rundir import checkpoint_store as cs


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SAILRL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home" / "checkpoints"


def fake_checkpoint(store: Path, run_id: str, kind: str, name: str, *, days_old: float, size: int = 1000) -> str:
    """A checkpoint folder as the local backend lays it out (only what the store listing reads)."""
    d = store / run_id / kind / name
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(b"\0" * size)
    when = dt.datetime.now(dt.UTC) - dt.timedelta(days=days_old)
    (d / "checkpoint.json").write_text(json.dumps({"time": when.isoformat()}).ljust(100))  # 100 bytes
    return f"local://{run_id}/{kind}/{name}"


def run_dir_with_state(path: Path, state_path: str, batch: int = 2) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"spec": {"training": {}}}))
    (path / "checkpoints.jsonl").write_text(
        json.dumps({"name": "000001", "batch": 1, "state_path": state_path.replace("final", "000001")}) + "\n"
        + json.dumps({"name": "final", "batch": batch, "state_path": state_path, "final": True}) + "\n")
    return path


def make_store(store: Path):
    old = fake_checkpoint(store, "tiny-aaaa0001", "sampler_weights", "s0", days_old=10, size=3000)
    fake_checkpoint(store, "tiny-aaaa0001", "weights", "final", days_old=9, size=2000)
    fake_checkpoint(store, "tiny-bbbb0002", "sampler_weights", "s0", days_old=2, size=5000)
    state = fake_checkpoint(store, "tiny-bbbb0002", "weights", "final", days_old=1, size=4000)
    (store / "tiny-bbbb0002" / "sampler_weights" / "s0.tar").write_bytes(b"\0" * 500)
    return old, state


def test_listing_shows_size_age_and_what_is_needed(home, capsys):
    _, state = make_store(home)
    run_dir_with_state(Path("runs/quick"), state)
    assert main(["clean"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "tiny-" in line]
    # 3,000 + 2,000 bytes of weights + 2 x 100 of metadata; 5,000 + 4,000 + 200 + a 500-byte archive
    assert "tiny-aaaa0001" in lines[0] and "5.2 KB" in lines[0] and "9 days" in lines[0] and " - " in lines[0]
    assert "tiny-bbbb0002" in lines[1] and "9.7 KB" in lines[1] and "1 day " in lines[1]
    assert "runs/quick" in lines[1]
    assert "2 store runs, 14.9 KB in all." in out
    assert (home / "tiny-aaaa0001").is_dir()  # listing removes nothing


def test_older_than_removes_old_runs_only(home, capsys):
    make_store(home)
    assert main(["clean", "--older-than", "5", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove tiny-aaaa0001 (5.2 KB, 9 days old)" in out and "would free 5.2 KB" in out
    assert (home / "tiny-aaaa0001").is_dir()
    assert main(["clean", "--older-than", "5"]) == 0
    assert "removed tiny-aaaa0001 (5.2 KB, 9 days old)" in capsys.readouterr().out
    assert not (home / "tiny-aaaa0001").exists() and (home / "tiny-bbbb0002").is_dir()


def test_a_checkpoint_needed_for_resume_is_kept_unless_forced(home, capsys, tmp_path):
    _, state = make_store(home)
    elsewhere = run_dir_with_state(tmp_path / "elsewhere" / "myrun", state)
    cs.note_run_directory(elsewhere)  # a run directory outside ./runs, recorded when it ran
    assert main(["clean", "tiny-bbbb0002"]) == 0
    out = capsys.readouterr().out
    assert (f"removed 2 checkpoints and archives of tiny-bbbb0002 (5.6 KB); kept {state} (elsewhere/myrun can --resume "
            f"from it). --force removes it too") in out
    assert (home / "tiny-bbbb0002" / "weights" / "final" / "adapter_model.safetensors").is_file()
    assert not (home / "tiny-bbbb0002" / "sampler_weights" / "s0").exists()
    assert main(["clean", "tiny-bbbb0002", "--force"]) == 0
    assert not (home / "tiny-bbbb0002").exists()


def test_a_run_without_saved_state_keeps_its_init_from(home, tmp_path):
    make_store(home)
    d = tmp_path / "runs" / "fresh"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"spec": {"training": {
        "init_from": "local://tiny-aaaa0001/weights/final", "resume_from": "tinker://x/weights/y"}}}))
    needed = cs.needed_checkpoints(cs.find_run_directories())
    assert needed == {"local://tiny-aaaa0001/weights/final": [d.absolute()]}


def test_all_and_unknown_ids(home, capsys):
    make_store(home)
    assert main(["clean", "tiny-bbbb0003"]) == 1
    assert capsys.readouterr().err.strip() == (f"sailrl clean: no store run 'tiny-bbbb0003' in {home} -- did you "
                                               f"mean 'tiny-bbbb0002'? (`sailrl clean` lists them)")
    assert main(["clean", "--all", "tiny-bbbb0002"]) == 2
    capsys.readouterr()
    assert main(["clean", "--all"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "freed 14.9 KB"
    assert sorted(os.listdir(home)) == []
    assert main(["clean"]) == 0
    assert capsys.readouterr().out.strip() == f"the checkpoint store {home} is empty: nothing to clean"


def test_negative_days_is_a_usage_error(home, capsys):
    with pytest.raises(SystemExit) as e:
        main(["clean", "--older-than", "-1"])
    assert e.value.code == 2
    assert "expected a number of days of 0 or more, got '-1'" in capsys.readouterr().err


def test_links_and_stray_files_are_never_touched(home, tmp_path):
    make_store(home)
    outside = tmp_path / "precious"
    (outside / "weights").mkdir(parents=True)
    (home / "linked-run").symlink_to(outside, target_is_directory=True)
    (home / "notes.txt").write_text("keep me")
    runs = cs.list_store(home)
    assert [r.run_id for r in runs] == ["tiny-aaaa0001", "tiny-bbbb0002"]
    for removal in cs.plan_removals(runs):
        cs.remove(removal)
    assert (outside / "weights").is_dir() and (home / "notes.txt").read_text() == "keep me"


def test_a_real_local_checkpoint_still_resumes_after_cleaning(home, tmp_path):
    from sailrl.runtime.backends.local import LocalServiceClient

    async def save():
        service = LocalServiceClient("sailrl/tiny", base_dir=home, seed=0)
        client = await service.create_lora_training_client_async(base_model="sailrl/tiny", rank=4)
        state = (await (await client.save_state_async("final")).result_async()).path
        sampler = (await (await client.save_weights_for_sampler_async("step-000001")).result_async()).path
        return service, state, sampler

    service, state, sampler = asyncio.run(save())
    run_id = state.split("/")[2]
    run_dir_with_state(tmp_path / "runs" / "r", state)
    (run,) = cs.list_store(home, cs.find_run_directories())
    assert run.run_id == run_id and sorted(run.checkpoints) == sorted([state, sampler])
    assert run.size_bytes > 0 and run.age_days() < 0.01
    (removal,) = cs.plan_removals([run])
    cs.remove(removal)
    assert not (home / run_id / "sampler_weights" / "step-000001").exists()

    async def resume():
        return await service.create_training_client_from_state_with_optimizer_async(state)

    assert asyncio.run(resume()) is not None


def test_the_final_adapter_a_run_printed_is_kept_and_a_unique_id_prefix_selects(home, capsys):
    fake_checkpoint(home, "tiny-cccc0003", "sampler_weights", "step-000001", days_old=3)
    adapter = fake_checkpoint(home, "tiny-cccc0003", "sampler_weights", "final", days_old=3)
    state = fake_checkpoint(home, "tiny-cccc0003", "weights", "final", days_old=3)
    run = Path("runs/done")
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"spec": {"training": {}}}))
    (run / "checkpoints.jsonl").write_text(json.dumps(
        {"name": "final", "batch": 2, "state_path": state, "sampler_path": adapter, "final": True}) + "\n")
    assert main(["clean", "tiny-cccc", "--dry-run"]) == 0  # a prefix of one run id selects it
    out = capsys.readouterr().out
    assert "tiny-cccc0003" in out
    assert main(["clean", "tiny-cccc"]) == 0
    assert (home / "tiny-cccc0003/sampler_weights/final").is_dir()  # what the run printed as its final adapter
    assert (home / "tiny-cccc0003/weights/final").is_dir()  # what --resume loads
    assert not (home / "tiny-cccc0003/sampler_weights/step-000001").exists()
