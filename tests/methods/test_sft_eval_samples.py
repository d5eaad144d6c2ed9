"""method: sft's evaluation samples a fixed set of training rows beside the held-out ones: ``eval/train_correct``
(what the demonstrations taught) next to ``eval/correct`` (what carried over to rows never trained on), both scored
by the spec's reward rules on one sample per row, from one sampling client per evaluation."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import tinker
import torch
from transformers import ByT5Tokenizer

from sailrl.runtime.backends.models import get_renderer
from sailrl.runtime.data import DatasetRows
from sailrl.runtime.planning.cost import estimate_supervised
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.supervised.run import SupervisedRun
from sailrl.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "spec/examples/sft_sums.yaml"

# (question, answer, the reply the fake policy writes): rows 0-5 train, 6-9 held out.
TRAIN = [("1+2", "3", "3"), ("4+4", "8", "8"), ("2+5", "7", "6"), ("0+9", "9", "9"),
         ("3+3", "6", "1"), ("5+1", "6", "2")]
HELD_OUT = [("2+2", "4", "4"), ("6+1", "7", "5"), ("8+0", "8", "0"), ("7+2", "9", "12")]


class _Policy:
    """A sampling client that writes a fixed reply per prompt, then the role_colon end-of-turn."""

    def __init__(self, tokenizer: Any, replies: dict[str, str]) -> None:
        self.tokenizer, self.replies, self.calls = tokenizer, replies, []

    async def sample_async(self, *, prompt: tinker.ModelInput, num_samples: int,
                           sampling_params: tinker.SamplingParams) -> Any:
        text = self.tokenizer.decode(prompt.to_ints())
        question = text.split("User: ", 1)[1].split("=", 1)[0]
        self.calls.append((question, sampling_params.seed, sampling_params.temperature, num_samples))
        tokens = self.tokenizer.encode(f" {self.replies[question]}\n\nUser:", add_special_tokens=False)
        return SimpleNamespace(sequences=[SimpleNamespace(tokens=tokens)])


class _Future:
    def __init__(self, value: Any) -> None:
        self.value = value

    async def result_async(self) -> Any:
        return self.value


class _TrainingClient:
    """Forward passes give every target token logprob -0.5; each save gives the same policy, and is counted."""

    def __init__(self, policy: _Policy) -> None:
        self.policy, self.saved = policy, []

    async def forward_async(self, data: list[tinker.Datum], loss_fn: str) -> _Future:
        outputs = [{"logprobs": tinker.TensorData.from_torch(torch.full((d.model_input.length,), -0.5))}
                   for d in data]
        return _Future(tinker.ForwardBackwardOutput(loss_fn_output_type=loss_fn, loss_fn_outputs=outputs,
                                                    metrics={}))

    async def save_weights_and_get_sampling_client_async(self, name: str) -> _Policy:
        self.saved.append(name)
        return self.policy


class _Records:
    def __init__(self) -> None:
        self.lines: dict[int, dict[str, Any]] = {}

    def add(self, step: int, metrics: dict[str, Any]) -> None:
        self.lines.setdefault(step, {}).update(metrics)


def _rows(items: list[tuple[str, str, str]], start: int) -> list[dict[str, Any]]:
    return [{"question": q, "answer": a, "_index": start + i} for i, (q, a, _) in enumerate(items)]


def _run() -> tuple[SupervisedRun, _TrainingClient, _Records]:
    spec = load_spec(EXAMPLE).spec
    tokenizer = ByT5Tokenizer(extra_ids=0)
    renderer = get_renderer("role_colon", tokenizer)
    policy = _Policy(tokenizer, {q: reply for q, _, reply in TRAIN + HELD_OUT})
    client, records = _TrainingClient(policy), _Records()
    rows = DatasetRows(train=_rows(TRAIN, 0), eval=_rows(HELD_OUT, len(TRAIN)), skipped=[], columns=[], source="")
    reward_fn = RewardFunction.from_spec(spec.reward, reference_field="answer", spec_dir=EXAMPLE.parent)
    run = SupervisedRun(spec=spec, backend=None, training_client=client, tokenizer=tokenizer, renderer=renderer,
                        rows=rows, prompts=PromptBuilder(spec.prompt, renderer), reward_fn=reward_fn,
                        max_length=None, run_dir=None, records=records, checkpoints=None, console=None,
                        start_step=1)
    return run, client, records


def test_the_evaluation_scores_as_many_training_rows_as_held_out_ones_with_one_sampling_client():
    run, client, records = _run()
    asyncio.run(run.evaluate(50))
    # Training sample: the first 4 training rows (as many as are held out): 3 right (1+2, 4+4, 0+9), 2+5 -> 6
    # wrong; rows 4 and 5 (both wrong) are not sampled, or the fraction would be 3/6. Held out: only 2+2 right.
    assert records.lines == {50: {"eval/nll": 0.5, "eval/reward": 0.25, "eval/correct": 0.25,
                                  "eval/train_reward": 0.75, "eval/train_correct": 0.75}}
    assert client.saved == ["sft_sums-eval-000050"]  # one set of sampler weights serves both
    temperature = run.spec.sampling.temperature
    # Row i of each list is seeded model.seed + i (the example's seed is 0), at sampling.temperature.
    assert client.policy.calls == ([(q, i, temperature, 1) for i, (q, _, _) in enumerate(HELD_OUT)]
                                   + [(q, i, temperature, 1) for i, (q, _, _) in enumerate(TRAIN[:4])])


def test_the_starting_weights_training_sample_goes_into_step_1s_line_with_start_names():
    run, _, records = _run()
    asyncio.run(run.evaluate(0))
    assert records.lines[1]["eval/train_correct_start"] == 0.75
    assert records.lines[1]["eval/correct_start"] == 0.25
    assert "eval/train_correct" not in records.lines[1]


def test_fewer_training_rows_than_held_out_ones_are_all_sampled():
    run, _, records = _run()
    run.rows = DatasetRows(train=_rows(TRAIN[:2], 0), eval=_rows(HELD_OUT, 2), skipped=[], columns=[], source="")
    assert run.train_sample() == _rows(TRAIN[:2], 0)
    asyncio.run(run.evaluate(3))
    assert records.lines[3]["eval/train_correct"] == 1.0  # 1+2 and 4+4, both right


def test_the_cost_estimate_counts_the_training_samples_beside_the_held_out_ones():
    spec = load_spec(EXAMPLE).spec.model_copy(deep=True)
    spec.training.steps = 200  # eval_every 50: before training and at steps 50..200, 5 evaluations; 20 held out
    e = estimate_supervised(spec, [10] * 80, [7] * 20)
    # Each evaluation samples 20 held-out and 20 training rows, 1 to sampling.max_tokens (12) tokens each.
    assert (e.tokens["eval_sampled"].low, e.tokens["eval_sampled"].high) == (5 * 40, 5 * 40 * 12)
    # The held-out forward pass (20 x 7 tokens) and the 20 sampled training rows' conversations (20 x 10).
    assert e.tokens["eval_prompt"].low == e.tokens["eval_prompt"].high == 5 * (140 + 200)
    small = estimate_supervised(spec, [10] * 3, [7] * 20)  # 3 training rows: only those 3 are sampled
    assert small.tokens["eval_sampled"].low == 5 * 23
    assert small.tokens["eval_prompt"].low == 5 * (140 + 30)
