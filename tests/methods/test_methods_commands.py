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
    points = zip(acc["eval accuracy"].get_xdata(), acc["eval accuracy"].get_ydata(), strict=True)
    assert list(points) == [(0, 0.25), (2, 0.75)]
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


def test_explain_says_what_dpo_trains(tmp_path, capsys):
    _spec(tmp_path, DPO_SPEC, [{"q": f"{i}+1", "good": str(i + 1), "bad": str(i + 2)} for i in range(8)])
    code, out, err = cli(capsys, "explain", tmp_path / "spec.yaml")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:4] == [
        "Training of 'p' (method dpo, direct preference optimisation on chosen/rejected pairs):",
        "  Each row is a preference pair: the prompt (prompt.user), then the field 'good' as the chosen reply and "
        "the field 'bad' as the rejected one.",
        "  The reference is the starting weights, frozen: its logprob of each reply is computed once per pair. With "
        "r(y) = beta x (log policy(y) - log reference(y)) summed over the reply's tokens and beta 0.1, the loss is "
        "-log sigmoid(r(chosen) - r(rejected)), the mean over the pairs (DPO); nothing is sampled to train.",
        "  3 steps of 2 pairs each (the rows in a seeded order, epoch after epoch), Adam at learning rate 0.001; "
        "each step logs dpo/loss, dpo/accuracy (pairs whose chosen reply has the higher r), dpo/margin and both "
        "rewards.",
    ]
    assert "Reward" not in out  # DPO has no reward rules
    assert lines[5] == "Estimated cost of 'p' (local backend, sailrl/tiny): 3 DPO steps x 2 pairs = 6 pairs trained."


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


# ------------------------------------------------------------------------------------------------ preflight

def _spec(tmp_path, text: str, rows: list[dict]):
    from sailrl.compiler.validate import validate_file

    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "spec.yaml").write_text(text)
    return validate_file(tmp_path / "spec.yaml").spec


DPO_SPEC = """\
method: dpo
name: p
model: {name: sailrl/tiny, renderer: role_colon}
dataset: {source: data.jsonl, fields: [q, good, bad], shuffle: false}
prompt: {user: '{{ q }}='}
dpo: {chosen_field: good, rejected_field: bad, batch_size: 2}
training: {steps: 3, eval_every: 0, learning_rate: 1e-3}
sampling: {sampler: local}
"""


def test_preflight_dpo_shows_pairs_skips_what_the_run_skips_and_estimates_from_them(tmp_path):
    from sailrl.preflight_methods import report_for

    rows = [{"q": f"{i}+1", "good": str(i + 1), "bad": str(i + 2)} for i in range(8)]
    rows[6]["bad"] = rows[6]["good"]  # no preference: skipped (past the rows validate reads)
    rows[7]["bad"] = ""
    report = report_for(_spec(tmp_path, DPO_SPEC, rows), tmp_path, sample=2, show=1)
    assert report["data"]["train"] == 6 and report["data"]["skipped"]["count"] == 2
    assert [r["reason"] for r in report["data"]["skipped"]["by_reason"]] == [
        "its 'good' and 'bad' completions are the same text (no preference)", "its 'bad' completion is empty"]
    (shown,) = report["prompts"]
    # role_colon over the byte tokenizer: 1 token per byte; each datum is its sequence less one token
    prompt = "User: 0+1=\n\nAssistant:"
    assert shown["text"] == f"{prompt}\n── chosen (good) ──\n1\n── rejected (bad) ──\n2"
    one = len(f"{prompt} 1\n\nUser:") - 1
    assert shown["tokens"] == 2 * one and shown["subtitle"] == (
        f"chosen {one} + rejected {one} tokens; trained: 9 + 9")  # " 1" and the end-of-turn "\n\nUser:"
    tokens = report["tokens"]
    assert (tokens["what"], tokens["min"], tokens["max"], tokens["measured_rows"]) == (
        "pair tokens (chosen + rejected)", 2 * one, 2 * one, 6)
    cost = report["cost"]
    # 3 steps x 2 pairs, each sent twice (forward, then forward_backward); the reference reads each of the 6
    # distinct pairs once, a token more per sequence
    assert cost["tokens"]["trained"]["low"] == cost["tokens"]["trained"]["high"] == 3 * 2 * 2 * (2 * one)
    assert cost["tokens"]["reference"]["low"] == 6 * (2 * one + 2)
    assert report["reward"]["formula"] == [
        "DPO has no reward rules: it trains each pair's chosen reply over its rejected one"]
    assert report["sample"] is None and report["problems"][-1]["severity"] == "note"
    assert report["problems"][-1]["message"].startswith("--sample: a DPO run samples nothing to train on")
    assert report["blocking"] is False


def test_the_dpo_estimate_counts_held_out_pairs_and_samples(tmp_path):
    from sailrl.runtime.planning.cost import DPO_EVAL_SAMPLES, estimate_preference
    from sailrl.runtime.preference.run import EVAL_SAMPLES

    assert DPO_EVAL_SAMPLES == EVAL_SAMPLES
    spec = _spec(tmp_path, DPO_SPEC.replace("eval_every: 0", "eval_every: 2").replace(
        "shuffle: false}", "shuffle: false, eval: {count: 2}}"), [{"q": f"{i}+1", "good": "a", "bad": "b"}
                                                                   for i in range(8)])
    e = estimate_preference(spec, [10] * 6, [20, 30])
    assert e.eval_steps == 3  # before training, step 2, and after the last (step 3)
    assert e.tokens["eval_prompt"].low == 3 * 50
    assert (e.tokens["eval_sampled"].low, e.tokens["eval_sampled"].high) == (3 * 2 * 8, 3 * 2 * 8 * spec.sampling.max_tokens)
    assert e.tokens["reference"].low == 6 * 12 + (22 + 32)
    assert e.render()[0] == ("Estimated cost of 'p' (local backend, sailrl/tiny): 3 DPO steps x 2 pairs = 6 pairs "
                             "trained, 3 evaluations x 2 rows.")


SFT_MESSAGES = """\
method: sft
name: m
model: {name: sailrl/tiny, renderer: role_colon}
dataset: {source: data.jsonl, fields: [chat]}
sft: {messages_field: chat, batch_size: 2}
training: {steps: 2}
sampling: {sampler: local}
"""


def test_preflight_sft_without_a_prompt_shows_the_conversation(tmp_path, capsys):
    chat = [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+2"},
            {"role": "assistant", "content": "4"}]
    rows = [{"chat": chat}] * 6 + [{"chat": chat[:2]}]  # the last has no assistant turn: skipped
    _spec(tmp_path, SFT_MESSAGES, rows)
    code, out, err = cli(capsys, "preflight", tmp_path / "spec.yaml", "--show", "1", "--sample", "1")
    assert code == 0, err
    assert "conversation: row " in out and "│ System: Add." in out and "│ Assistant: 4" in out
    whole = "System: Add.\n\nUser: 2+2\n\nAssistant: 4\n\nUser:"  # 1 token per byte; the datum is 1 shorter
    assert f"conversation: row 4, {len(whole) - 1} tokens" in out
    assert f"  trained: {len(' 4' + chr(10) * 2 + 'User:')} assistant tokens (weight 0 on the rest)" in out
    assert f"conversation tokens: min {len(whole) - 1}, median {len(whole) - 1}, max {len(whole) - 1} over 6 " \
           "rows; context 4096" in out
    assert f"trained  {2 * 2 * (len(whole) - 1)}" in out  # 2 steps x 2 conversations
    assert "no reward rules: the run trains on the conversations" in out
    assert "note: --sample: an SFT run samples nothing to train on" in out
    assert ("warning: 1 of 7 rows are skipped (most often: chat has no assistant message, so nothing would be "
            "trained, 1 rows, e.g. row 6)") in " ".join(out.split())
    assert out.rstrip().splitlines()[-1].startswith("ready, with 1 warning: 1 of 7 rows skipped")


# ------------------------------------------------------------------------------------------------ real runs

def _train(tmp_path, example: str, *overrides: str):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / example
    args = [sys.executable, "-m", "sailrl", "run", f"spec/examples/{example}.yaml", "--set", f"output.run_dir={run_dir}"]
    for o in overrides:
        args += ["--set", o]
    r = subprocess.run(args, cwd=root, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    sets = [x for o in overrides for x in ("--set", o)]
    return run_dir, [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()], sets


@pytest.mark.slow
def test_a_finished_sft_run_shows_plots_exports_samples_and_matches_its_estimate(tmp_path, capsys):
    run_dir, lines, sets = _train(tmp_path, "sft_sums", "training.steps=3", "training.lr_warmup_steps=0",
                                  "sft.batch_size=4", "training.eval_every=0", "training.save_every=0",
                                  "dataset.eval=null")
    # preflight's estimate of the same spec counts the tokens the run sent, exactly
    code, out, err = cli(capsys, "preflight", "spec/examples/sft_sums.yaml", *sets, "--json")
    assert code == 0, err
    trained = json.loads(out)["cost"]["tokens"]["trained"]
    assert trained["low"] == trained["high"] == lines[-1]["tokens_cum/trained"]
    code, out, _ = cli(capsys, "show", run_dir)
    assert code == 0 and out.splitlines()[1].startswith("  train/nll: ")
    assert cli(capsys, "plot", run_dir)[0] == 0
    code, out, err = cli(capsys, "export", run_dir, "-o", tmp_path / "out")
    assert code == 0, err
    card = (tmp_path / "out" / "README.md").read_text()
    assert "trained with supervised fine-tuning (`method: sft`)" in card and "\n- sft\n" in card
    assert "4 conversations per step" in card and "| train/nll |" in card
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()
    code, out, err = cli(capsys, "sample", run_dir, "--row", "0", "--n", "2", "--seed", "1")
    assert code == 0, err
    assert out.startswith("local://") and "(step 3), 2 completion(s) of:" in out
    assert "completion 1" in out and "correct" in out  # the spec's rules score the samples


@pytest.mark.slow
def test_a_finished_dpo_run_exports_samples_against_its_pair_and_matches_its_estimate(tmp_path, capsys):
    run_dir, lines, sets = _train(tmp_path, "dpo_sums", "training.steps=2", "dpo.batch_size=4",
                                  "training.eval_every=0", "training.save_every=0", "dataset.eval={count: 4}")
    code, out, err = cli(capsys, "preflight", "spec/examples/dpo_sums.yaml", *sets, "--json")
    assert code == 0, err
    tokens = json.loads(out)["cost"]["tokens"]
    last = lines[-1]
    for kind in ("trained", "reference", "eval_prompt"):  # what the run logged, exactly
        assert tokens[kind]["low"] == tokens[kind]["high"] == last[f"tokens_cum/{kind}"], kind
    code, out, err = cli(capsys, "export", run_dir, "-o", tmp_path / "out")
    assert code == 0, err
    card = (tmp_path / "out" / "README.md").read_text()
    assert "trained with direct preference optimisation (`method: dpo`)" in card and "\n- dpo\n" in card
    assert "4 pairs per step" in card and "| dpo/loss |" in card and "Reward" not in card
    code, out, err = cli(capsys, "sample", run_dir, "--row", "0", "--n", "3", "--seed", "1")
    assert code == 0, err
    assert err.endswith("note: the spec has no reward rules (method dpo), so the completions are not scored\n")
    body = out.splitlines()
    pair = next(line for line in body if line.startswith("chosen: "))
    assert len([line for line in body if line.startswith("completion ")]) == 3
    assert all(("writes the chosen reply" in line) or ("writes the rejected reply" in line) or
               ("writes neither reply" in line) for line in body if line.startswith("completion "))
    assert "; rejected: " in pair


def test_the_readme_methods_table_names_each_example_and_the_figures_docs_methods_measured():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text(encoding="utf-8")
    table = readme.split("### Methods", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [re.match(r"\| `(\w+)`", r).group(1) for r in rows] == ["rl", "sft", "dpo", "distill"]
    methods_doc = (root / "docs/methods.md").read_text(encoding="utf-8")
    for row in rows[1:]:  # rl's figures are the quickstart table's, above it in the README
        example = re.search(r"`(spec/examples/\w+\.yaml)`", row).group(1)
        assert (root / example).is_file() and f"sailrl run {example}" in row
        figures = re.findall(r"\d\.\d{3}", row.split(" | ")[3])
        assert len(figures) >= 2 and all(f in methods_doc for f in figures), (row, figures)
