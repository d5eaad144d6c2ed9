"""method: distill: the compiled script, the reverse-KL advantage on a constructed case, the teacher's tokenizer
checked at validate, keys of another method refused, the cost of the teacher's prefill, and the example run."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tinker
import torch

from sailrl.compiler.render import render_script
from sailrl.compiler.validate import validate_file, validate_text
from sailrl.compiler.words import reward_words
from sailrl.runtime.distillation.reverse_kl import KL_METRIC, add_reverse_kl, sequence_inputs, teacher_logprobs
from sailrl.runtime.distillation.teacher import same_tokenizer, teacher_checkpoint
from sailrl.runtime.planning.cost import CostModel, estimate_run
from sailrl.spec.errors import ConfigError, SpecErrors

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "spec" / "examples"
GOLDEN = ROOT / "tests" / "goldens" / "method_distill.yaml"

DISTILL = """\
method: distill
name: d
model:
  name: {student}
distill:
  teacher:
    name: {teacher}
dataset:
  source: data.jsonl
  fields: [question, answer]
prompt:
  user: '{{{{ question }}}}='
{extra}"""


def _spec(tmp_path: Path, *, student: str = "sailrl/tiny-arith", teacher: str = "sailrl/tiny-arith",
          extra: str = "") -> Path:
    (tmp_path / "data.jsonl").write_text('{"question": "1+2", "answer": "3"}\n' * 4)
    path = tmp_path / "spec.yaml"
    path.write_text(DISTILL.format(student=student, teacher=teacher, extra=extra))
    return path


# ---------------------------------------------------------------------------------------------- the script
def test_the_golden_compiles_byte_for_byte_and_main_reads_the_algorithm_in_order():
    loaded = validate_file(GOLDEN)
    text = render_script(loaded.spec, spec_path="tests/goldens/method_distill.yaml", spec_bytes=GOLDEN.read_bytes(),
                         output_path="tests/goldens/method_distill.py", reward_words=reward_words(loaded.spec))
    assert text == GOLDEN.with_suffix(".py").read_text(encoding="utf-8")
    main = text[text.index("async def main(run: Run)"):text.index("async def train_step(")]
    order = ["run.sampler.save_checkpoint(step)", "run.sampler.policy_for(sampler_path, step)",
             "run.sampler.sample(policy, step)", "run.rewards.score(step, rollouts)", "compute_advantages(groups)",
             "assemble_training_data(groups, advantages)", "reverse_kl.teacher_logprobs(run.teacher, data)",
             "reverse_kl.add_reverse_kl(data, teacher_logprobs, kl_coef)", "run.checkpoints.apply_update(",
             "run.records.end_step(step)", "run.checkpoints.save_final()"]
    positions = [main.index(line) for line in order]
    assert positions == sorted(positions)
    assert "split_degenerate" not in main  # every group trains: the teacher tells equal-reward rollouts apart
    assert '"kl_coef": 0.5,  # distill.kl_coef' in text
    assert '"checkpoint": "local://teacher-run/sampler_weights/final"' in text


def test_a_spec_without_reward_rules_compiles_a_loop_that_says_the_teacher_is_the_whole_signal(tmp_path):
    path = _spec(tmp_path)
    loaded = validate_file(path)
    assert loaded.spec.reward is None
    text = render_script(loaded.spec, spec_path=str(path), spec_bytes=path.read_bytes(),
                         output_path=str(tmp_path / "d.py"), reward_words=reward_words(loaded.spec))
    assert "the spec has no reward rules, so every reward is 0" in text
    assert "The reward, in plain words" not in text
    compile(text, "d.py", "exec")  # the script is Python


# ---------------------------------------------------------------------------------------------- the advantage
def _datum(tokens: list[int], logprobs: list[float], mask: list[float], advantages: list[float]) -> tinker.Datum:
    """A datum as assemble_training_data builds one: inputs are tokens[:-1], targets tokens[1:]."""
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_torch(torch.tensor(tokens[1:])),
            "logprobs": tinker.TensorData.from_torch(torch.tensor(logprobs)),
            "mask": tinker.TensorData.from_torch(torch.tensor(mask)),
            "advantages": tinker.TensorData.from_torch(torch.tensor(advantages)),
        },
    )


def test_each_sampled_token_gains_kl_coef_times_teacher_minus_student_logprob():
    # prompt token 5, then the student sampled 6, 7 (logprobs -1.0, -2.0) with the rules' advantage 0.5 on each
    a = _datum([5, 6, 7], [0.0, -1.0, -2.0][1:], [1.0, 1.0], [0.5, 0.5])
    # a second rollout: prompt 5, 8; sampled 9 (logprob -0.25), advantage -0.5
    b = _datum([5, 8, 9], [0.0, -0.25], [0.0, 1.0], [0.0, -0.5])
    metrics = add_reverse_kl([a, b], [[-0.5, -3.0], [-4.0, -1.25]], kl_coef=2.0)
    # a: 0.5 + 2 * (-0.5 - -1.0) = 1.5; 0.5 + 2 * (-3.0 - -2.0) = -1.5
    assert a.loss_fn_inputs["advantages"].to_torch().tolist() == [1.5, -1.5]
    # b: the prompt token (mask 0) gains nothing; -0.5 + 2 * (-1.25 - -0.25) = -2.5
    assert b.loss_fn_inputs["advantages"].to_torch().tolist() == [0.0, -2.5]
    # reverse KL: mean of (student - teacher) over the 3 sampled tokens: (-0.5 + 1.0 + 1.0) / 3
    assert metrics[KL_METRIC] == pytest.approx(0.5)
    assert metrics["tokens/teacher"] == 6.0  # each whole sequence, prompt included


class _Teacher:
    """A sampling client's compute_logprobs_async: the logprob of each token given the ones before it (None at 0),
    here -token / 10, recording the sequences it was asked for."""

    def __init__(self) -> None:
        self.asked: list[list[int]] = []

    async def compute_logprobs_async(self, prompt: tinker.ModelInput) -> list[float | None]:
        tokens = prompt.to_ints()
        self.asked.append(tokens)
        return [None] + [-t / 10 for t in tokens[1:]]


def test_the_teacher_reads_each_whole_sequence_and_its_logprobs_align_with_the_targets():
    data = [_datum([5, 6, 7], [-1.0, -2.0], [1.0, 1.0], [0.0, 0.0]), _datum([3, 4], [-1.0], [1.0], [0.0])]
    assert [s.to_ints() for s in sequence_inputs(data)] == [[5, 6, 7], [3, 4]]
    teacher = _Teacher()
    got = asyncio.run(teacher_logprobs(teacher, data))
    assert teacher.asked == [[5, 6, 7], [3, 4]]
    assert got == [[-0.6, -0.7], [-0.4]]


def test_a_teacher_that_answers_the_wrong_number_of_logprobs_is_an_error_not_a_silent_shift():
    class Short(_Teacher):
        async def compute_logprobs_async(self, prompt):
            return [None]

    with pytest.raises(ValueError, match="1 logprobs for a sequence of 3 tokens"):
        asyncio.run(teacher_logprobs(Short(), [_datum([5, 6, 7], [-1.0, -2.0], [1.0, 1.0], [0.0, 0.0])]))


# ---------------------------------------------------------------------------------------------- bad input
def test_a_teacher_whose_tokenizer_differs_is_one_located_line_at_validate(tmp_path):
    path = _spec(tmp_path, teacher="Qwen/Qwen3-8B")
    with pytest.raises(SpecErrors) as info:
        validate_file(path)
    [error] = [e for e in info.value.errors if e.code == "S258"]
    line = path.read_text().splitlines().index("    name: Qwen/Qwen3-8B") + 1
    assert (error.line, error.column) == (line, 11)
    assert "the teacher Qwen/Qwen3-8B has the Qwen3 tokenizer and the student sailrl/tiny-arith the byte" in \
        error.message


def test_validate_exits_1_naming_the_teachers_line(tmp_path):
    path = _spec(tmp_path, student="meta-llama/Llama-3.1-8B", teacher="Qwen/Qwen3-32B", extra="""\
sampling:
  sampler: tinker
""")
    r = subprocess.run([sys.executable, "-m", "sailrl", "validate", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1
    line = path.read_text().splitlines().index("    name: Qwen/Qwen3-32B") + 1
    assert f"spec.yaml:{line}:11: distill.teacher.name: the teacher Qwen/Qwen3-32B has the Qwen3 tokenizer" in \
        r.stdout + r.stderr
    assert "S258 teacher-tokenizer-differs" in r.stdout + r.stderr


def test_teachers_of_one_family_or_of_no_family_the_name_tells_pass_validate(tmp_path):
    validate_file(_spec(tmp_path, student="sailrl/tiny", teacher="sailrl/tiny-arith"))
    validate_file(_spec(tmp_path, student="Qwen/Qwen3-8B", teacher="Qwen/Qwen3-32B",
                        extra="sampling:\n  sampler: tinker\n"))


def test_the_run_compares_the_loaded_tokenizers():
    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    assert same_tokenizer(Tok({"a": 0}), Tok({"a": 0}))
    assert not same_tokenizer(Tok({"a": 0}), Tok({"a": 1}))


@pytest.mark.parametrize(("extra", "key"), [
    ("training:\n  kl_penalty_coef: 0.1\n", "training.kl_penalty_coef"),
    ("training:\n  max_steps_off_policy: 1\n", "training.max_steps_off_policy"),
    ("training:\n  warmup: {steps: 2}\n", "training.warmup"),
    ("training:\n  dynamic_sampling: {max_extra_groups: 4}\n", "training.dynamic_sampling"),
    ("sft:\n  batch_size: 4\n", "sft"),
    ("dpo:\n  beta: 0.1\n", "dpo"),
])
def test_a_key_of_another_method_is_refused_under_distill(tmp_path, extra, key):
    path = _spec(tmp_path, extra=extra)
    with pytest.raises(SpecErrors) as info:
        validate_file(path)
    [error] = [e for e in info.value.errors if e.code == "S257"]
    assert error.message.startswith(f"{key} is read only by method ")
    assert "this spec's method is distill" in error.message
    first = key.split(".")[-1] + ":"
    assert error.line == next(i for i, t in enumerate(path.read_text().splitlines(), 1) if t.strip().startswith(first))


def test_a_distill_spec_needs_its_teacher():
    text = "method: distill\nname: d\ndataset: {source: d.jsonl, fields: [q]}\nprompt: {user: '{{ q }}'}\n"
    with pytest.raises(SpecErrors) as info:
        validate_text(text, "spec.yaml")
    assert any("missing required section 'distill'" in e.message for e in info.value.errors)


def test_a_teacher_run_directory_without_an_adapter_is_one_line(tmp_path):
    (tmp_path / "runs" / "teacher").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"distill.teacher.checkpoint: .*runs/teacher holds no run with a saved "
                                          r"adapter"):
        teacher_checkpoint("runs/teacher", tmp_path)
    assert teacher_checkpoint("local://r/sampler_weights/x", tmp_path) == "local://r/sampler_weights/x"
    run = tmp_path / "runs" / "done"
    run.mkdir()
    (run / "checkpoints.jsonl").write_text(json.dumps({"name": "final", "batch": 3, "final": True,
                                                      "state_path": "local://r/weights/final",
                                                      "sampler_path": "local://r/sampler_weights/final"}) + "\n")
    assert teacher_checkpoint("runs/done", tmp_path) == "local://r/sampler_weights/final"


# ---------------------------------------------------------------------------------------------- cost
def test_the_cost_counts_the_teachers_prefill_at_the_teachers_price(tmp_path):
    path = _spec(tmp_path, student="Qwen/Qwen3-32B", teacher="Qwen/Qwen3-8B", extra="""\
training:
  steps: 10
  group_size: 4
  groups_per_step: 2
sampling:
  sampler: tinker
  max_tokens: 16
""")
    spec = validate_file(path).spec
    model = CostModel.from_spec(spec, prompt_token_lengths=[5, 5, 5, 5])
    assert "teacher" in model.used_kinds()
    assert model.step_token_bound()["teacher"] == 4 * (5 + 5) + 8 * 16  # every rollout's prompt + completion
    assert model.prices["teacher"].key == ("tinker", "prefill")
    # the teacher's prefill at the teacher's price (Qwen3-8B's is listed); the student's (Qwen3-32B) is unknown
    teacher_price, student_price = model.prices["teacher"].usd_per_mtok, model.prices["prompt"].usd_per_mtok
    assert teacher_price is not None and teacher_price > 0 and student_price is None
    assert model.step_cost({"tokens/teacher": 1e6})["cost/teacher"] == pytest.approx(teacher_price)
    estimate = estimate_run(spec, [5, 5, 5, 5], None)
    teacher = estimate.tokens["teacher"]
    assert (teacher.low, teacher.high) == (10 * 8 * (5 + 1), 10 * 8 * (5 + 16))


def test_preflight_of_a_distillation_counts_the_teacher_and_does_not_call_equal_rewards_a_problem(tmp_path):
    """Without reward rules (every total 0) and with a measure-only rule of weight 0, preflight is ready: the
    teacher's signal does not depend on the rewards varying. Its estimate has the teacher's row."""
    for extra in ("", "reward:\n  rules:\n    - {name: correct, kind: answer, extract: {from: whole}, weight: 0}\n"):
        path = _spec(tmp_path, extra=extra + "training:\n  steps: 3\nsampling:\n  sampler: local\n")
        r = _sailrl("preflight", path.name, cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        verdict = r.stdout.strip().splitlines()[-1]
        assert verdict.startswith("ready") and "degenerate" not in r.stdout and "error:" not in r.stdout, verdict
        assert "3 distillation steps x " in " ".join(r.stdout.split())  # rich wraps at the terminal's width
        assert any(line.split()[:1] == ["teacher"] for line in r.stdout.splitlines())


# ---------------------------------------------------------------------------------------------- the example
def _sailrl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "sailrl", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


@pytest.mark.slow
def test_the_example_distills_a_short_quickstart_teacher_and_the_kl_falls(tmp_path):
    """The example as shipped, with its teacher (the quickstart's adapter) made by 12 quickstart steps here and 6
    distillation steps: exit 0, the run directory written, and the reverse KL falling."""
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    quick = (EXAMPLES / "quickstart.yaml").read_text().replace("  steps: 100\n", "  steps: 12\n")
    (tmp_path / "quickstart.yaml").write_text(quick)
    example = (EXAMPLES / "distill_sums.yaml").read_text()
    assert "checkpoint: runs/quickstart" in example
    (tmp_path / "distill_sums.yaml").write_text(example.replace("  steps: 40\n", "  steps: 6\n"))
    r = _sailrl("run", "quickstart.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _sailrl("run", "distill_sums.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "runs" / "distill_sums"
    for name in ("config.json", "metrics.jsonl", "rollouts.jsonl", "checkpoints.jsonl", "train.py"):
        assert (run_dir / name).is_file(), name
    teacher_path = json.loads((tmp_path / "runs/quickstart/checkpoints.jsonl").read_text().splitlines()[-1])
    assert f"teacher: sailrl/tiny-arith ({teacher_path['sampler_path']})" in r.stderr + r.stdout
    lines = _metrics(run_dir)
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5, 6]
    kl = [m[KL_METRIC] for m in lines]
    assert kl[0] > 0.02 and max(kl[-3:]) < kl[0], kl
    assert all(m["tokens/teacher"] == m["tokens/prompt"] + m["tokens/sampled"] for m in lines)
    assert lines[-1]["tokens_cum/teacher"] == sum(m["tokens/teacher"] for m in lines)
    assert all(m["reward/total"] == 0.0 and 0.0 <= m["correct"] <= 1.0 for m in lines)  # correct: weight 0
    assert "correct (mean of first" in r.stdout and "final adapter" in r.stdout
    assert f"KL to teacher {kl[0]:.3f}" in r.stdout  # each step's line
    assert re.search(r"reverse KL to the teacher \(mean of first 3 steps -> last 3\): \d\.\d{3} -> \d\.\d{3}",
                     r.stdout)  # the summary


@pytest.mark.slow
def test_a_distillation_without_reward_rules_trains_on_the_teacher_alone(tmp_path):
    path = _spec(tmp_path, extra="""\
training:
  steps: 2
  group_size: 2
  groups_per_step: 2
sampling:
  sampler: local
  max_tokens: 4
""")
    r = _sailrl("run", str(path.name), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = _metrics(tmp_path / "runs" / "d")
    assert [m["step"] for m in lines] == [1, 2]
    # the student and the teacher start as the same weights (tiny-arith, a fresh LoRA): the KL starts at 0
    assert abs(lines[0][KL_METRIC]) < 1e-4
    assert all(m["datums"] == 4.0 and math.isfinite(m["loss:sum"]) for m in lines)
    assert "teacher: sailrl/tiny-arith (its base weights)" in r.stderr + r.stdout
