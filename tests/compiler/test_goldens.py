"""Goldens per feature (datamodel-code-generator style): each ``tests/goldens/<name>.yaml`` is one small spec that
turns on one option, and ``<name>.py`` next to it is its compiled script, checked byte for byte.

Adding a golden is one file: write ``tests/goldens/<name>.yaml`` with a first line ``# option: <the spec key>``,
then ``sailrl compile tests/goldens/<name>.yaml -o tests/goldens/<name>.py``. Every loop feature
(``compiler.render.FEATURES``) must have a golden, and README's option table and the goldens name the same keys.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sailrl.compiler.render import FEATURES, features, render_script
from sailrl.compiler.validate import validate_file
from sailrl.compiler.words import reward_words

ROOT = Path(__file__).resolve().parents[2]
GOLDENS = ROOT / "tests" / "goldens"
SPECS = sorted(GOLDENS.glob("*.yaml"))


def _option(spec: Path) -> str:
    first = spec.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# option: "), f"{spec.name}: the first line must be '# option: <spec key>'"
    return first.removeprefix("# option: ").strip()


@pytest.mark.parametrize("spec", SPECS, ids=[s.stem for s in SPECS])
def test_the_golden_script_is_what_compile_writes_byte_for_byte(spec: Path, monkeypatch):
    monkeypatch.chdir(ROOT)
    rel, out = spec.relative_to(ROOT).as_posix(), spec.with_suffix(".py").relative_to(ROOT).as_posix()
    loaded = validate_file(rel)
    text = render_script(loaded.spec, spec_path=rel, spec_bytes=spec.read_bytes(), output_path=out,
                         reward_words=reward_words(loaded.spec))
    golden = ROOT / out
    assert golden.is_file(), f"no golden for {rel}: run `sailrl compile {rel} -o {out}`"
    assert golden.read_text(encoding="utf-8") == text, f"{out} is stale: run `sailrl compile {rel} -o {out}`"


def test_every_loop_feature_has_a_golden_and_the_plain_golden_has_none():
    used: dict[str, list[str]] = {k: [] for k in FEATURES}
    for spec in SPECS:
        for key, on in features(validate_file(spec).spec).items():
            if on:
                used[key].append(spec.stem)
    assert all(used.values()), f"features without a golden: {[k for k, v in used.items() if not v]}"
    assert not any(features(validate_file(GOLDENS / "plain.yaml").spec).values())


def _readme_option_rows() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("| key | what it adds to the loop |"):]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(re.split(r"(?<!\\)\|", line)[1])
    return rows


def test_the_readme_option_table_and_the_goldens_name_the_same_options():
    options = {s.stem: _option(s) for s in SPECS if s.stem != "plain"}
    rows = _readme_option_rows()
    for name, option in options.items():
        assert any(f"`{option}" in row for row in rows), f"README's option table has no row for {option} ({name})"
    for row in rows:
        keys = re.findall(r"`([^`]+)`", row)
        assert any(k.startswith(o) for k in keys for o in options.values()), \
            f"README option row {row.strip()!r} has no golden: add tests/goldens/<name>.yaml"
