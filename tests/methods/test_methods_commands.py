"""The commands on SFT, DPO and distillation specs and run directories: ``show`` and ``plot`` of hand-made run
directories (exact lines, the panels and their values), ``explain`` / ``validate`` in words, ``preflight`` (pairs,
conversations, token lengths, the estimate), and ``export`` / ``sample`` of a finished run's final checkpoint."""

from __future__ import annotations

import json
import math

import pytest

from sailrl.cli import main
from sailrl.plot import build_method_figure
from sailrl.runtime.rundir.directory import RunDirectory
from sailrl.runtime.rundir.method_logs import METHOD_PANELS, run_method
from sailrl.runtime.rundir.rollout_log import RolloutLog
from tests.commands.test_show import group, no, ok
from tests.fakes.tokenizer import CharTokenizer


def write_run(path, method: str | None, lines: list[dict]) -> None:
    d = RunDirectory(path)
    spec = {"name": path.name, **({"method": method} if method else {})}
    d.write_config(spec, "0" * 64, {"run_id": "r"})
    for m in lines:
        d.append_metrics(m)


SFT_LINES = [
    {"step": 1, "train/nll": 5.5, "eval/nll_start": 5.25, "eval/correct_start": 0.0, "tokens/trained": 100,
     "learning_rate": 0.01},
    {"step": 2, "train/nll": 2.0, "eval/nll": 1.75, "eval/correct": 0.5, "tokens/trained": 90, "learning_rate": 0.01},
    {"step": 3, "train/nll": 1.0, "tokens/trained": 80, "learning_rate": 0.005},
]

DPO_LINES = [
    {"step": 1, "dpo/loss": 0.6931, "dpo/accuracy": 0.5, "dpo/margin": 0.0, "dpo/chosen_reward": 0.0,
     "dpo/rejected_reward": 0.0, "eval/accuracy_start": 0.25, "tokens/trained": 40, "learning_rate": 0.001},
    {"step": 2, "dpo/loss": 0.5, "dpo/accuracy": 1.0, "dpo/margin": 0.75, "dpo/chosen_reward": 0.25,
     "dpo/rejected_reward": -0.5, "eval/accuracy": 0.75, "tokens/trained": 40, "learning_rate": 0.001},
]


def cli(capsys, *argv):
    code = main([*map(str, argv)])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_run_method_reads_the_config_and_defaults_to_rl(tmp_path):
    for method in ("sft", "dpo", "distill", None):
        write_run(tmp_path / str(method), method, [])
        assert run_method(tmp_path / str(method)) == (method or "rl")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(ValueError):
        run_method(tmp_path / "bad")


def test_show_sft_run_prints_its_steps_metrics(tmp_path, capsys):
    run = tmp_path / "sft_run"
    write_run(run, "sft", SFT_LINES)
    code, out, err = cli(capsys, "show", run)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"{run}: method sft (supervised fine-tuning on demonstrations), 3 steps logged (1-3); it samples no "
        "rollouts, so these are its steps' metrics",
        "  train/nll: 5.500 (step 1) -> 1.000 (step 3)",
        "  eval/nll: 5.250 (before training) -> 1.750 (step 2)",
        "  eval/correct: 0.000 (before training) -> 0.500 (step 2)",
        "the first step, the last and the 1 in between that measured the held-out rows (--step N for every "
        "metric of one step):",
        "  step  train/nll  eval/nll  eval/correct  tokens/trained  learning_rate",
        "     1        5.5         -             -             100           0.01",
        "     2          2      1.75           0.5              90           0.01",
        "     3          1         -             -              80          0.005",
    ]
    code, out, _ = cli(capsys, "show", run, "--step", 2)
    assert code == 0 and out.splitlines()[1:] == [
        "step 2:", "  eval/correct    0.5", "  eval/nll        1.75", "  learning_rate   0.01",
        "  tokens/trained  90", "  train/nll       2"]


def test_show_dpo_run_and_its_plain_errors(tmp_path, capsys):
    run = tmp_path / "dpo_run"
    write_run(run, "dpo", DPO_LINES)
    code, out, err = cli(capsys, "show", run)
    assert (code, err) == (0, "")
    assert out.splitlines()[1:8] == [
        "  dpo/loss: 0.693 (step 1) -> 0.500 (step 2)",
        "  dpo/chosen_reward: 0.000 (step 1) -> 0.250 (step 2)",
        "  dpo/rejected_reward: 0.000 (step 1) -> -0.500 (step 2)",
        "  dpo/margin: 0.000 (step 1) -> 0.750 (step 2)",
        "  dpo/accuracy: 0.500 (step 1) -> 1.000 (step 2)",
        "  eval/accuracy: 0.250 (before training) -> 0.750 (step 2)",
        "the first step, the last and the 0 in between that measured the held-out rows (--step N for every "
        "metric of one step):",
    ]
    assert cli(capsys, "show", run, "--worst")[:3] == (
        1, "", "error: --worst: this dpo run samples no rollouts to sort or score; `sailrl show RUN_DIR` prints "
        "its steps' metrics (--step N: one step's)\n")
    assert cli(capsys, "show", run, "--step", 9)[2] == (
        f"error: {run}/metrics.jsonl has no step 9; steps logged: 1-2\n")
    empty = tmp_path / "sft_empty"
    write_run(empty, "sft", [])
    assert cli(capsys, "show", empty) == (
        1, "", f"error: {empty}/metrics.jsonl holds no step yet: this sft run logs each step's metrics there when "
        "the step ends\n")


def test_show_distill_run_has_the_kl_and_no_degenerate_groups(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    run = tmp_path / "distill_run"
    write_run(run, "distill", [{"step": 1, "distill/reverse_kl": 0.25, "reward/total": 0.5}])
    g = group("User: 2+3?\n\nAssistant:", [("5", 1.0, {"correct": ok()}), ("5", 1.0, {"correct": ok()})])
    RolloutLog(run, reference_field="answer").write_step(
        1, "train", [g], [{"_index": 0, "answer": "5"}], None, sampler_paths="local://r/sampler_weights/1",
        sampler_steps=1, tokenizer=CharTokenizer())
    code, out, err = cli(capsys, "show", run)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:6] == [
        "step 1 (train): 2 rollouts in 1 groups, mean reward 1.000",
        "truncated: 0 of 2",
        "sampler checkpoint local://r/sampler_weights/1 (policy step 1, staleness 0)",
        "  correct: mean 1.000, passed 2 of 2",
        "reverse KL to the teacher: 0.250 nats per sampled token (distill/reverse_kl)",
        "distillation: every group trains; the advantage shown is the rules' part",
    ]
    assert "degenerate" not in out
    # the same rollouts in an RL run: the group is degenerate
    (run / "config.json").unlink()
    write_run(run, None, [])
    assert "degenerate groups: 1 of 1; truncated: 0 of 2" in cli(capsys, "show", run)[1]
    assert no  # the shared fixtures' helpers


def labels(ax) -> dict:
    return {ln.get_label(): ln for ln in ax.get_lines()}


def test_plot_sft_draws_nll_and_eval_points_from_before_training(tmp_path, capsys):
    fig = build_method_figure(SFT_LINES, "sft", title="s")
    nll, frac = fig.axes
    lines = labels(nll)
    assert list(lines) == ["train NLL", "eval NLL (held-out)"]
    assert list(lines["train NLL"].get_xdata()) == [1, 2, 3]
    assert list(lines["train NLL"].get_ydata()) == [5.5, 2.0, 1.0]
    assert list(lines["eval NLL (held-out)"].get_xdata()) == [0, 2]  # 0: before training
    assert list(lines["eval NLL (held-out)"].get_ydata()) == [5.25, 1.75]
    assert list(labels(frac)) == ["eval correct (one sample per held-out row)"]
    assert nll.get_ylabel() == "NLL (nats per assistant token)"
    assert fig._suptitle.get_text() == "s: supervised fine-tuning on demonstrations"
    run = tmp_path / "sft_run"
    write_run(run, "sft", SFT_LINES)
    assert cli(capsys, "plot", run)[:2] == (0, f"wrote {run / 'reward.png'}\n")
    assert (run / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_dpo_and_distill_panels(tmp_path):
    fig = build_method_figure(DPO_LINES, "dpo")
    assert [ax.get_ylabel() for ax in fig.axes] == [p.ylabel for p in METHOD_PANELS["dpo"]]
    assert list(labels(fig.axes[0])) == ["train loss"]  # no eval/loss logged: left out
    assert list(labels(fig.axes[1])["margin"].get_ydata()) == [0.0, 0.75]
    acc = labels(fig.axes[2])
    assert list(acc) == ["accuracy (chosen above rejected)", "eval accuracy"]
    assert list(zip(acc["eval accuracy"].get_xdata(), acc["eval accuracy"].get_ydata())) == [(0, 0.25), (2, 0.75)]
    distill = [{"step": s, "distill/reverse_kl": kl, "reward/total": r, "correct": c, "frac_truncated": 0.0}
               for s, kl, r, c in ((1, 0.5, 0.25, 0.25), (2, 0.125, None, 0.5))]
    fig = build_method_figure(distill, "distill")
    kl, reward, frac = fig.axes
    assert list(labels(kl)["KL(student || teacher)"].get_ydata()) == [0.5, 0.125]
    ys = labels(reward)["reward total"].get_ydata()
    assert ys[0] == 0.25 and math.isnan(ys[1])  # a null is a gap, not a zero
    assert list(labels(frac)) == ["correct (pass rate)", "truncated"]
    with pytest.raises(ValueError, match="no steps"):
        build_method_figure([{"dpo/loss": 1.0}], "dpo")


def test_plot_refuses_an_unreadable_config_in_one_line(tmp_path, capsys):
    run = tmp_path / "r"
    write_run(run, "sft", SFT_LINES)
    (run / "config.json").write_text("{")
    code, out, err = cli(capsys, "plot", run)
    assert code == 1 and out == "" and err.startswith(f"error: {run / 'config.json'} cannot be read: ")
    assert len(err.splitlines()) == 1
    json.dumps(err)


EXAMPLES = "spec/examples"


def test_explain_says_what_dpo_trains(capsys):
    code, out, err = cli(capsys, "explain", f"{EXAMPLES}/dpo_sums.yaml")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == ("Training of 'dpo_sums' (method dpo, direct preference optimisation on chosen/rejected "
                        "pairs):")
    assert lines[1] == ("  Each row is a preference pair: the prompt (prompt.user), then the field 'chosen' as the "
                        "chosen reply and the field 'rejected' as the rejected one.")
    assert "the loss is -log sigmoid(r(chosen) - r(rejected))" in lines[2] and "beta 0.1" in lines[2]
    assert lines[3].startswith("  100 steps of 16 pairs each")
    assert "Reward" not in out  # DPO has no reward rules


def test_explain_and_validate_say_what_distill_trains(capsys):
    code, out, err = cli(capsys, "explain", f"{EXAMPLES}/distill_sums.yaml")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "Training of 'distill_sums' (method distill, on-policy distillation from a teacher model):"
    assert lines[1] == ("  The student (sailrl/tiny-arith, the LoRA trained) samples 16 prompts x 8 completions per "
                        "step; the teacher sailrl/tiny-arith (checkpoint runs/quickstart) reads every token the "
                        "student sampled and gives its logprob (a prefill: the teacher samples nothing).")
    assert lines[2] == ("  Each sampled token's advantage is the reward rules' group-centred advantage plus kl_coef x "
                        "(teacher logprob - student logprob), kl_coef 1: the loss (importance_sampling) lowers the "
                        "reverse KL(student || teacher) on the student's own samples; every group trains, so none "
                        "is degenerate.")
    assert lines[4] == "Reward rules of 'distill_sums', scoring each of the student's completions:"
    code, out, _ = cli(capsys, "validate", f"{EXAMPLES}/distill_sums.yaml")
    assert code == 0 and out.splitlines()[1:3] == lines[1:3]
    code, out, _ = cli(capsys, "validate", f"{EXAMPLES}/dpo_sums.yaml")
    assert code == 0 and out.splitlines()[1].startswith("  Each row is a preference pair")
