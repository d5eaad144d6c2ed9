"""Issue 18.12: the Sail example's "try it locally" command needed the hub (its dataset is orca-math); the
command in the spec's header must run as written on a machine without the hub."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAIL_GUIDE = ROOT / "spec" / "examples" / "sail_guide.yaml"


def header_command(spec: Path, marker: str) -> list[str]:
    """The command in ``spec``'s header comment after the line holding ``marker`` (backslash continuations)."""
    lines = spec.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    parts: list[str] = []
    for line in lines[start + 1:]:
        text = line.lstrip("#").strip()
        if not parts and not text.startswith("sailrl "):
            continue
        parts.append(text.rstrip("\\").strip())
        if not text.endswith("\\"):
            break
    return shlex.split(" ".join(parts))


@pytest.mark.slow
def test_the_sail_guide_runs_locally_without_the_hub(tmp_path: Path) -> None:
    argv = header_command(SAIL_GUIDE, "Try it locally")
    assert argv[:3] == ["sailrl", "run", "spec/examples/sail_guide.yaml"], argv
    # As written, but one short step (the command's own overrides stay) and the run directory in tmp_path.
    argv += ["--set", "training.steps=1", "--set", "training.groups_per_step=2", "--set", "sampling.max_tokens=8",
             "--set", f"output.run_dir={tmp_path / 'run'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    done = subprocess.run([sys.executable, "-m", "sailrl", *argv[1:]], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert re.search(r"step +1/1 \| reward ", out), out[-3000:]
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
