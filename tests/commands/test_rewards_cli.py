"""`sailrl rewards` and `sailrl explain` end to end (no network, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sailrl.cli import main

SPEC = """\
name: cli-test
model: {name: sailrl/tiny, renderer: role_colon}
dataset: {source: data.jsonl, fields: [question, answer]}
prompt: {user: '{{ question }}'}
reward:
  rules:
    - name: correct
      kind: answer
      extract: {from: boxed}
      reference: {extract: {from: after_marker, marker: '####'}}
      compare: numeric
    - name: format
      kind: all_of
      checks:
        - kind: has_answer
        - kind: termination
      pass_score: 0
      fail_score: -0.1
"""


@pytest.fixture()
def spec(tmp_path: Path) -> Path:
    rows = [{"question": "q0", "answer": "24 + 48 = <<24+48=72>>72\n#### 72"},
            {"question": "q1", "answer": "#### -3"},
            {"question": "q2", "answer": "#### 1,234"}]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC)
    return p


def test_rewards_with_fields_prints_a_per_rule_table(spec: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main(["rewards", str(spec), "-c", "First \\boxed{5}. No: \\boxed{72}.", "-c", "no box",
               "--field", "answer=#### 72"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "completion 1" in out and "completion 2" in out
    assert "answer '72' matches reference '72'" in out
    assert "no answer found; ended cleanly" in out
    assert "reference answer: '72'" in out
    assert "2 completions, mean total 0.45, correct 1/2" in out


def test_rewards_against_a_dataset_row(spec: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main(["rewards", str(spec), "--row", "2", "--json", "-c", "\\boxed{1234}", "-c", "\\boxed{1234}",
               "--truncated"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rc == 0
    assert [(x["total"], x["correct"]) for x in lines] == [(pytest.approx(0.9), True), (pytest.approx(0.9), True)]
    assert lines[0]["contributions"] == {"correct": 1.0, "format": -0.1}


def test_rewards_jsonl_input(spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"completion": "\\boxed{-3}", "fields": {"answer": "#### -3"}}) + "\n"
                 + json.dumps({"completion": "\\boxed{3}", "fields": {"answer": "#### -3"}, "truncated": True})
                 + "\n")
    assert main(["rewards", str(spec), "--jsonl", str(f), "--json"]) == 0
    totals = [json.loads(x)["total"] for x in capsys.readouterr().out.splitlines()]
    assert totals == [1.0, pytest.approx(-0.1)]


def test_rewards_reference_problem_exits_1(spec: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["rewards", str(spec), "-c", "\\boxed{1}", "--field", "answer="]) == 1
    assert "reference problem: the reference field 'answer' is empty" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--field", "nonsense", "-c", "x"], []])
def test_rewards_usage_errors_exit_2(spec: Path, argv: list[str], capsys: pytest.CaptureFixture) -> None:
    assert main(["rewards", str(spec), *argv]) == 2
    assert "sailrl rewards: error:" in capsys.readouterr().err


def test_a_completion_that_starts_with_a_dash_says_how_to_pass_it(spec: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:  # argparse's usage error
        main(["rewards", str(spec), "-c", "-0x"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "sailrl rewards: error: argument --completion/-c: expected one argument (a value that starts with '-' is "
        "written --completion=TEXT or -c=TEXT)")
    assert main(["rewards", str(spec), "-c=-0x", "--field=answer=#### -0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["completion"] == "-0x"


def test_rewards_row_out_of_range(spec: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["rewards", str(spec), "--row", "9", "-c", "x"]) == 1
    assert "row 9 is not among the selected rows" in capsys.readouterr().err


def test_rewards_still_scores_when_only_examples_disagree(spec: Path, capsys: pytest.CaptureFixture) -> None:
    spec.write_text(SPEC + "examples:\n  - completion: 'x'\n    fields: {answer: '#### 1'}\n    expect_total: 1\n")
    assert main(["rewards", str(spec), "-c", "\\boxed{1}", "--field", "answer=#### 1", "--json"]) == 0
    captured = capsys.readouterr()
    assert "example 1 does not score as expected" in captured.err
    assert json.loads(captured.out)["total"] == 1.0


def test_rewards_invalid_spec_exits_1(spec: Path, capsys: pytest.CaptureFixture) -> None:
    spec.write_text(SPEC.replace("compare: numeric", "compare: numerical"))
    assert main(["rewards", str(spec), "-c", "x"]) == 1
    assert "spec.yaml:11" in capsys.readouterr().err


def test_explain_prints_the_formula(spec: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["explain", str(spec)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:4] == [
        "Reward of 'cli-test', per completion:",
        ("  correct: +1 if the last \\boxed{...} answer in the completion equals the reference answer (the text "
        "after the last '####' in field 'answer') as a number (a unit word after the number is ignored: '7 apples' "
        "counts as 7); otherwise 0."),
        ("  format: 0 if all of: the completion has an answer (the last \\boxed{...} answer); the "
        "completion ended cleanly (stop sequence or end of turn, not cut off at max_tokens); otherwise -0.1."),
        "  total = correct + format (from -0.1 to 1).",
    ]


def test_explain_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["explain", str(tmp_path / "nope.yaml")]) == 1
    assert "spec not found" in capsys.readouterr().err


@pytest.mark.parametrize("content, words", [
    (b'{"completion": "x"}\n\xff\n', "c.jsonl:2: not UTF-8 text (byte 0xff); save the file as UTF-8"),
    (b"[" * 100_000 + b"\n", "c.jsonl:1: the JSON is nested too deeply"),
    (None, "is larger than 1 MiB: score it in parts"),
])
def test_rewards_jsonl_that_is_not_utf8_too_deep_or_too_big_is_a_usage_line(spec: Path, tmp_path: Path, content,
                                                                           words, capsys, monkeypatch) -> None:
    """Was exit 70 (UnicodeDecodeError / RecursionError tracebacks), and a file was read whole however big it was
    (``--jsonl /dev/zero`` grew until the kernel killed it)."""
    import sailrl.commands.rewards as rewards_cmd

    monkeypatch.setattr(rewards_cmd, "MAX_JSONL_BYTES", 2**20)
    f = tmp_path / "c.jsonl"
    if content is None:
        with open(f, "wb") as out:
            out.write(b'{"completion": "x"}\n' * 60_000)  # 1.2 MB
    else:
        f.write_bytes(content)
    assert main(["rewards", str(spec), "--jsonl", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sailrl rewards: error: ") and words in err and "Traceback" not in err, err
    if Path("/dev/zero").exists():
        assert main(["rewards", str(spec), "--jsonl", "/dev/zero"]) == 2
        assert "is larger than 1 MiB" in capsys.readouterr().err
