"""``sailrl preflight`` of an SFT or DPO spec warns when the held-out rows' replies, with the end-of-turn that closes
them, do not fit ``sampling.max_tokens``: the evaluation samples those rows, and a sample cut off before the
end-of-turn never ends as the reply does (SFT's ``eval/correct``, DPO's ``eval/chosen_rate``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sailrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "spec" / "examples"


def _report(tmp_path: Path, monkeypatch, capsys, example: str, *overrides: str) -> dict:
    shutil.copy(EXAMPLES / example, tmp_path)
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    sets = [a for o in overrides for a in ("--set", o)]
    assert main(["preflight", example, "--json", *sets]) == 0  # a warning: ready, as the run would start
    return json.loads(capsys.readouterr().out)


def _warnings(report: dict) -> list[dict]:
    return [p for p in report["problems"] if p["severity"] == "warning"]


def test_sft_replies_cut_by_max_tokens_are_a_warning_with_the_length_that_fits(tmp_path, monkeypatch, capsys):
    # " 13" and role_colon's "\n\nUser:" are 10 byte tokens; " 7" and it 9: the 20 held-out sums need 9 or 10
    report = _report(tmp_path, monkeypatch, capsys, "sft_sums.yaml", "sampling.max_tokens=8")
    assert _warnings(report) == [{
        "severity": "warning",
        "message": "20 of 20 held-out replies, with the end-of-turn that closes them, are longer than "
                   "sampling.max_tokens (8; the longest is 10 tokens): the evaluation's samples of those rows are "
                   "cut off before they can end as the reply does",
        "fix": "set sampling.max_tokens: 10 or more",
        "short": "held-out replies longer than max_tokens"}]
    assert report["verdict"] == "ready, with 1 warning: held-out replies longer than max_tokens"


@pytest.mark.parametrize("max_tokens", [10, 12])
def test_sft_replies_that_fit_say_nothing(tmp_path, monkeypatch, capsys, max_tokens):
    report = _report(tmp_path, monkeypatch, capsys, "sft_sums.yaml", f"sampling.max_tokens={max_tokens}")
    assert _warnings(report) == []
    assert report["verdict"] == "ready: no problems found"


def test_dpo_counts_the_chosen_replies_that_do_not_fit(tmp_path, monkeypatch, capsys):
    report = _report(tmp_path, monkeypatch, capsys, "dpo_sums.yaml", "sampling.max_tokens=9")
    (warning,) = _warnings(report)
    # the held-out pairs whose chosen sum is 10 or more: " 10\n\nUser:" is 10 tokens
    held_out = [json.loads(line) for line in (tmp_path / "data" / "addition_pairs.jsonl").read_text().splitlines()]
    assert warning["message"].startswith("27 of 64 held-out chosen replies, with the end-of-turn that closes them, "
                                         "are longer than sampling.max_tokens (9; the longest is 10 tokens)")
    assert sum(len(r["chosen"]) == 2 for r in held_out) > 27  # only the held-out ones are counted
    assert warning["fix"] == "set sampling.max_tokens: 10 or more"
    assert warning["short"] == "held-out chosen replies longer than max_tokens"


def test_an_sft_spec_without_rules_samples_nothing_and_is_not_warned(tmp_path, monkeypatch, capsys):
    text = (EXAMPLES / "sft_sums.yaml").read_text()
    start = text.index("\nreward:\n") + 1
    text = text[:start] + text[text.index("\ntraining:\n", start) + 1:]
    (tmp_path / "sft_sums.yaml").write_text(text)
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    assert main(["preflight", "sft_sums.yaml", "--json", "--set", "sampling.max_tokens=8"]) == 0
    assert _warnings(json.loads(capsys.readouterr().out)) == []
