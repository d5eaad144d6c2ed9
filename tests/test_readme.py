"""The README's spec walkthrough is a valid spec, and its two set-up commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

from sailrl.compiler.validate import validate_text

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


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
