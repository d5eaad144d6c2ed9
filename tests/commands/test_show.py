"""``sailrl show``: exact output for a hand-made run directory, ordering, --rule, and plain one-line errors."""

from __future__ import annotations

import pytest
import tinker
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from sailrl.cli import main
from sailrl.commands.show import visible
from sailrl.runtime.rundir.rollout_log import ROLLOUTS_FILE, RolloutLog
from tests.fakes.tokenizer import CharTokenizer


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def group(prompt: str, samples: list[tuple[str, float, dict]], length_cut: tuple[int, ...] = ()) -> TrajectoryGroup:
    trajs = []
    for i, (completion, total, verdicts) in enumerate(samples):
        logs = {"completion": completion}
        for rule, (score, passed, why) in verdicts.items():
            logs.update({f"score/{rule}": score, f"passed/{rule}": passed, f"why/{rule}": why})
        tr = Transition(ob=tinker.ModelInput.from_ints(ids(prompt)),
                        ac=TokensWithLogprobs(tokens=ids(completion), maybe_logprobs=None,
                                              stop_reason="length" if i in length_cut else "stop"),
                        reward=total, episode_done=True, metrics={}, logs=logs)
        trajs.append(Trajectory(transitions=[tr], final_ob=tinker.ModelInput.empty()))
    return TrajectoryGroup(trajs, [0.0] * len(trajs), [{} for _ in trajs])


def ok(why="answer '5' = reference 5"):
    return (1.0, 1, why)


def no(why="no \\boxed{} answer", score=0.0):
    return (score, 0, why)


@pytest.fixture
def run_dir(tmp_path):
    """Steps 0-2 of train (step 2 is the last) and eval at step 1; rules 'correct' and 'format'."""
    log = RolloutLog(tmp_path, reference_field="answer")
    rows = [{"_index": 17, "answer": "5"}, {"_index": 4, "answer": "2"}]
    for step in (0, 1):
        g = group("User: 2+3?\n\nAssistant:", [("\\boxed{5}", 1.0, {"correct": ok(), "format": ok("ok")})] * 2)
        log.write_step(step, "train", [g, g], rows, None, sampler_paths="local://r/sampler_weights/000000",
                       sampler_steps=0, tokenizer=CharTokenizer())
    g0 = group("User: 2+3?\n\nAssistant:", [
        ("\\boxed{5}", 1.0, {"correct": ok(), "format": ok("ok")}),
        ("5 [bold]five[/bold]\x1b[2J", -0.1, {"correct": no(), "format": no("failed: no \\boxed{}", -0.1)}),
    ])
    g1 = group("User: 1+1?\n\nAssistant:", [
        ("\\boxed{3}", 0.0, {"correct": no("answer '3' != reference 2"), "format": ok("ok")}),
        ("\\boxed{3", 0.0, {"correct": no("answer '3' != reference 2"), "format": ok("ok")}),
    ], length_cut=(1,))
    log.write_step(2, "train", [g0, g1], rows, [[0.55, -0.55], None],
                   sampler_paths="local://r/sampler_weights/000001", sampler_steps=1, tokenizer=CharTokenizer())
    ge = group("User: 7+1?\n\nAssistant:", [("\\boxed{8}", 1.0, {"correct": ok("answer '8' = reference 8"),
                                                                  "format": ok("ok")})])
    log.write_step(1, "eval", [ge], [{"_index": 0, "answer": "8"}], None,
                   sampler_paths="local://r/sampler_weights/000001", sampler_steps=1, tokenizer=CharTokenizer())
    return tmp_path


def show(capsys, monkeypatch, *argv):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    code = main(["show", *map(str, argv)])
    cap = capsys.readouterr()
    return code, "\n".join(line.rstrip() for line in cap.out.splitlines()), cap.err


def headers(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("── ")]


EXPECTED_LAST_STEP = """\
step 2 (train): 4 rollouts in 2 groups, mean reward 0.225
degenerate groups: 1 of 2; truncated: 1 of 4
sampler checkpoint local://r/sampler_weights/000001 (policy step 1, staleness 1)
  correct: mean 0.250, passed 1 of 4
  format: mean 0.725, passed 3 of 4
showing 4 of 4 rollouts, in logged order

── group 0 · sample 0 · row 17 · total 1.000 · advantage +0.550 · 9 tokens
┌─ prompt ─────────────────────────────────────────────────────────────────────────────────────────┐
│ User: 2+3?                                                                                       │
│                                                                                                  │
│ Assistant:                                                                                       │
└──────────────────────────────────────────────────────────────────────────────────────────────────┘
reference: 5
┌─ completion ─────────────────────────────────────────────────────────────────────────────────────┐
│ \\boxed{5}                                                                                        │
└──────────────────────────────────────────────────────────────────────────────────────────────────┘
rule       score   passed   why
────────────────────────────────────────────────────
correct    1.000   yes      answer '5' = reference 5
format     1.000   yes      ok

── group 0 · sample 1 · row 17 · total -0.100 · advantage -0.550 · 23 tokens
┌─ prompt ─────────────────────────────────────────────────────────────────────────────────────────┐
│ User: 2+3?                                                                                       │
│                                                                                                  │
│ Assistant:                                                                                       │
└──────────────────────────────────────────────────────────────────────────────────────────────────┘
reference: 5
┌─ completion ─────────────────────────────────────────────────────────────────────────────────────┐
│ 5 [bold]five[/bold]\\x1b[2J                                                                       │
└──────────────────────────────────────────────────────────────────────────────────────────────────┘
rule       score   passed   why
───────────────────────────────────────────────
correct    0.000   NO       no \\boxed{} answer
format    -0.100   NO       failed: no \\boxed{}

── group 1 · sample 0 · row 4 · total 0.000 · advantage - · 9 tokens · degenerate group
┌─ prompt ─────────────────────────────────────────────────────────────────────────────────────────┐
│ User: 1+1?                                                                                       │
│                                                                                                  │
│ Assistant:                                                                                       │
└──────────────────────────────────────────────────────────────────────────────────────────────────┘
reference: 2
┌─ completion ─────────────────────────────────────────────────────────────────────────────────────┐
│ \\boxed{3}                                                                                        │
└──────────────────────────────────────────────────────────────────────────────────────────────────┘
rule       score   passed   why
─────────────────────────────────────────────────────
correct    0.000   NO       answer '3' != reference 2
format     1.000   yes      ok

── group 1 · sample 1 · row 4 · total 0.000 · advantage - · 8 tokens · truncated · degenerate group
┌─ prompt ─────────────────────────────────────────────────────────────────────────────────────────┐
│ User: 1+1?                                                                                       │
│                                                                                                  │
│ Assistant:                                                                                       │
└──────────────────────────────────────────────────────────────────────────────────────────────────┘
reference: 2
┌─ completion ─────────────────────────────────────────────────────────────────────────────────────┐
│ \\boxed{3                                                                                         │
└──────────────────────────────────────────────────────────────────────────────────────────────────┘
rule       score   passed   why
─────────────────────────────────────────────────────
correct    0.000   NO       answer '3' != reference 2
format     1.000   yes      ok"""


def test_default_is_the_last_train_step_in_plain_text(run_dir, capsys, monkeypatch):
    code, out, err = show(capsys, monkeypatch, run_dir)
    assert (code, err) == (0, "")
    assert out == EXPECTED_LAST_STEP
    assert "\x1b" not in out  # piped: no colour codes, and the completion's ESC is shown as \x1b


def test_best_and_worst_sort_by_total_ties_in_logged_order(run_dir, capsys, monkeypatch):
    _, out, _ = show(capsys, monkeypatch, run_dir, "--best", "--limit", "3")
    assert [h.split(" · total")[0] for h in headers(out)] == [
        "── group 0 · sample 0 · row 17", "── group 1 · sample 0 · row 4", "── group 1 · sample 1 · row 4"]
    assert "showing 3 of 4 rollouts, best first by total (--limit K or --limit all for more)" in out
    _, out, _ = show(capsys, monkeypatch, run_dir, "--worst", "--limit", "1")
    assert [h.split(" · total")[0] for h in headers(out)] == ["── group 0 · sample 1 · row 17"]


def test_rule_shows_only_its_verdicts_and_sorts_by_its_score(run_dir, capsys, monkeypatch):
    _, out, _ = show(capsys, monkeypatch, run_dir, "--rule", "format", "--worst", "--limit", "2")
    assert "  format: mean 0.725, passed 3 of 4" in out and "correct:" not in out
    assert "showing 2 of 4 rollouts, worst first by rule 'format'" in out
    assert [h.split(" · total")[0] for h in headers(out)] == [
        "── group 0 · sample 1 · row 17", "── group 0 · sample 0 · row 17"]
    rows = [line for line in out.splitlines() if line.startswith(("format ", "correct "))]
    assert rows == ["format   -0.100   NO       failed: no \\boxed{}", "format    1.000   yes      ok"]


def test_unknown_rule_gets_did_you_mean(run_dir, capsys, monkeypatch):
    code, out, err = show(capsys, monkeypatch, run_dir, "--rule", "corect")
    assert (code, out) == (1, "")
    assert err == ("error: no rule 'corect' in the train rollouts of step 2 -- did you mean 'correct'? "
                   "(rules logged: correct, format)\n")


def test_step_and_kind(run_dir, capsys, monkeypatch):
    code, out, _ = show(capsys, monkeypatch, run_dir, "--step", 0)
    assert code == 0 and out.splitlines()[0] == "step 0 (train): 4 rollouts in 2 groups, mean reward 1.000"
    assert "sampler checkpoint local://r/sampler_weights/000000 (policy step 0, staleness 0)" in out
    code, out, _ = show(capsys, monkeypatch, run_dir, "--kind", "eval")
    assert code == 0 and out.splitlines()[:3] == [
        "step 1 (eval): 1 rollouts in 1 groups, mean reward 1.000",
        "truncated: 0 of 1",  # eval rollouts train nothing: no degenerate count
        "sampler checkpoint local://r/sampler_weights/000001 (policy step 1, staleness 0)"]
    code, out, err = show(capsys, monkeypatch, run_dir, "--step", 7)
    assert (code, out) == (1, "")
    assert err == f"error: {run_dir / ROLLOUTS_FILE} has no train rollouts for step 7; train steps logged: 0-2\n"
    code, _, err = show(capsys, monkeypatch, run_dir, "--kind", "eval", "--step", 2)
    assert err == f"error: {run_dir / ROLLOUTS_FILE} has no eval rollouts for step 2; eval steps logged: 1\n"


def test_a_run_without_rollouts_is_one_plain_line(tmp_path, capsys, monkeypatch):
    code, out, err = show(capsys, monkeypatch, tmp_path)  # no config.json either: not a run directory
    assert (code, out) == (1, "")
    assert err == (f"error: {tmp_path} is not a run directory (it has no config.json): give the folder a run "
                   "wrote, e.g. runs/quickstart next to the spec (output.run_dir)\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\n", encoding="utf-8")  # the spec given instead of its run directory
    code, _, err = show(capsys, monkeypatch, spec)
    assert (code, err) == (1, f"error: {spec} is a file, not a run directory: give the folder a run wrote, "
                              "e.g. runs/quickstart next to the spec (output.run_dir)\n")
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")  # a run that logged no rollouts
    code, out, err = show(capsys, monkeypatch, tmp_path)
    assert (code, out) == (1, "")
    assert err == (f"error: {tmp_path} has no rollouts.jsonl: this run logged no rollouts "
                   "(output.log_rollouts is 0, or no step has finished yet)\n")
    code, _, err = show(capsys, monkeypatch, tmp_path / "missing")
    assert (code, err) == (1, f"error: {tmp_path / 'missing'}: no such run directory\n")
    (tmp_path / ROLLOUTS_FILE).write_text('{"step": 0, "kind": "train", "gro', encoding="utf-8")  # torn
    code, _, err = show(capsys, monkeypatch, tmp_path)
    assert (code, err) == (1, f"error: {tmp_path / ROLLOUTS_FILE} holds no complete step yet\n")


def test_limit_all_and_bad_limit(run_dir, capsys, monkeypatch):
    _, out, _ = show(capsys, monkeypatch, run_dir, "--limit", "all", "--step", 0)
    assert len(headers(out)) == 4 and "showing 4 of 4 rollouts, in logged order" in out
    with pytest.raises(SystemExit) as exc:
        main(["show", str(run_dir), "--limit", "0"])
    assert exc.value.code == 2
    assert "expected a number >= 1 or 'all', got '0'" in capsys.readouterr().err


def test_prompt_flag_prints_the_prompt(run_dir, capsys, monkeypatch):
    _, out, _ = show(capsys, monkeypatch, run_dir, "--prompt", "--limit", "1")
    assert "┌─ prompt ─" in out and "│ User: 2+3?" in out and "│ Assistant:" in out


def test_the_prompt_is_shown_by_default_and_shortened_when_long(tmp_path, capsys, monkeypatch):
    """Issue 18.15: show left the prompt out unless --prompt was given."""
    from sailrl.commands.show import PROMPT_HEAD, PROMPT_TAIL, shorten_prompt

    _, out, _ = show(capsys, monkeypatch, run_dir_with_prompt(tmp_path / "short", "User: 2+3?\n\nAssistant:"),
                     "--limit", "1")
    assert "┌─ prompt ─" in out and "│ User: 2+3?" in out
    _, out, _ = show(capsys, monkeypatch, run_dir_with_prompt(tmp_path / "none", "User: 2+3?"), "--no-prompt")
    assert "prompt ─" not in out
    long_prompt = "System: " + "rules " * 200 + "\n\nUser: what is 2+3?\n\nAssistant:"
    assert shorten_prompt("x" * 600) == "x" * 600
    short = shorten_prompt(long_prompt)
    cut = len(long_prompt) - PROMPT_HEAD - PROMPT_TAIL
    assert short == (long_prompt[:PROMPT_HEAD] + f"\n[... {cut:,} characters left out; --prompt shows the whole "
                     "prompt ...]\n" + long_prompt[-PROMPT_TAIL:])
    long_dir = run_dir_with_prompt(tmp_path / "long", long_prompt)
    _, out, _ = show(capsys, monkeypatch, long_dir, "--limit", "1")
    assert "characters left out" in out and "User: what is 2+3?" in out
    _, out, _ = show(capsys, monkeypatch, long_dir, "--limit", "1", "--prompt")
    assert "characters left out" not in out


def run_dir_with_prompt(path, prompt: str):
    log = RolloutLog(path, reference_field="answer")
    g = group(prompt, [("\\boxed{5}", 1.0, {"correct": ok(), "format": ok("ok")})] * 2)
    log.write_step(0, "train", [g], [{"_index": 0, "answer": "5"}], None, sampler_paths="local://r/s/0",
                   sampler_steps=0, tokenizer=CharTokenizer())
    return path


def test_visible_escapes_terminal_control_and_hidden_characters():
    assert visible("a\x1b[31mb\rc\u202ed\u200be\n\tf") == "a\\x1b[31mb\\x0dc\\u202ed\\u200be\n\tf"
