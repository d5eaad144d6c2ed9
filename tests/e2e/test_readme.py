"""The README's spec walkthrough is a valid spec, its two set-up commands are the ones CI runs, and CI checks the
quickstart's figures of the CPU it runs on."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sailrl.compiler.validate import validate_text

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _block_after(marker: str) -> str:
    rest = README.split(marker, 1)[1]
    return re.search(r"```(?:bash|yaml)\n(.*?)```", rest, re.S).group(1)


def test_the_walkthrough_spec_validates():
    spec = validate_text(_block_after("## A spec, walked through"), filename="README.md").spec
    assert spec.dataset.source == "openai/gsm8k" and spec.training.learning_rate == 4e-5
    assert [r.name for r in spec.reward.rules] == ["correct", "format"]


def test_the_ci_blocks_install_then_run_the_quickstart_and_the_tests():
    install = _block_after("<!-- ci: install-and-run -->").strip()
    tests = _block_after("<!-- ci: test -->").strip()
    assert install.endswith("sailrl run spec/examples/quickstart.yaml") and "pip install" in install
    assert tests.endswith("python -m pytest -q -n auto --dist worksteal") and '".[dev]"' in tests  # pytest-xdist


def _ci_figure_check(tmp_path: Path, last: float) -> subprocess.CompletedProcess:
    """.ci/run's figure check (its `python3 - <<'PY'` block) on a quickstart whose `correct` goes 0.378 -> ``last``,
    in a folder holding this README."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    check = re.search(r"^python3 - <<'PY'\n(.*?)^PY$", ci, re.S | re.M).group(1)
    runs = tmp_path / "spec/examples/runs/quickstart"
    runs.mkdir(parents=True)
    values = [0.378] * 5 + [0.5] * 90 + [last] * 5
    runs.joinpath("metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "correct": v}) + "\n"
                                                      for i, v in enumerate(values)))
    (tmp_path / "README.md").write_text(README, encoding="utf-8")
    return subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=60)


def _this_cpu() -> tuple[str, str]:
    info = Path("/proc/cpuinfo").read_text()
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", info, re.M)
    flags = re.search(r"^flags\s*:(.*)$", info, re.M)
    return (vendor[1] if vendor else "unknown", "avx512f" if flags and "avx512f" in flags[1].split() else "no avx512f")


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="the check reads /proc/cpuinfo (Linux)")
def test_ci_checks_the_quickstart_figure_of_this_cpu(tmp_path: Path) -> None:
    """Issue 33.11: each CPU prints its own quickstart figures; README has a row per CPU measured and .ci/run
    checks the run against the row of the CPU it runs on (vendor and avx512f), within 0.05."""
    table = README.split("<!-- ci: quickstart-figures -->", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\|[^|\n]*\| `(\w+ (?:no )?avx512f)` \| `0\.378 -> ([0-9.]+)` \|", table, re.M))
    assert rows == {"AuthenticAMD avx512f": "0.680", "AuthenticAMD no avx512f": "0.714",
                    "GenuineIntel avx512f": "0.727"}
    mine = rows.get(" ".join(_this_cpu()))
    if mine is None:
        pytest.skip(f"README has no figures row for this CPU ({' '.join(_this_cpu())})")
    assert _ci_figure_check(tmp_path / "near", float(mine) + 0.04).returncode == 0
    far = _ci_figure_check(tmp_path / "far", float(mine) - 0.06)
    assert far.returncode == 1 and f"README.md says correct 0.378 -> {float(mine)} (the row for" in far.stderr
