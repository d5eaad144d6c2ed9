"""A spec folder for the studio's tests: the quickstart spec and its data, a python rule module, and a run folder
whose ``rollouts.jsonl`` (written by the runtime's ``RolloutLog``) and ``metrics.jsonl`` hold real verdicts of
the spec's reward rules on made-up completions."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import tinker
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rundir.rollout_log import RolloutLog
from sailrl.spec.loader import load_spec
from tests.fakes.tokenizer import CharTokenizer

ROOT = Path(__file__).resolve().parents[2]


def make_project(folder: Path) -> Path:
    """``folder/quickstart.yaml`` + ``folder/data/addition.jsonl``; returns the spec path."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "spec/examples/data/addition.jsonl", folder / "data" / "addition.jsonl")
    spec = folder / "quickstart.yaml"
    shutil.copy(ROOT / "spec/examples/quickstart.yaml", spec)
    return spec


def _group(fn: RewardFunction, row: dict, completions: list[str]) -> tuple[TrajectoryGroup, list[float]]:
    prompt = f"User: {row['question']}=\n\nAssistant:"
    trajs, totals = [], []
    for text in completions:
        truncated = len(text) > 6
        score = fn.score(text, row, truncated=truncated, num_tokens=len(text))
        logs = {"completion": text}
        for name in fn.rule_names:
            logs.update({f"score/{name}": score.contributions[name], f"passed/{name}": int(score.passed[name]),
                         f"why/{name}": score.reasons[name]})
        tr = Transition(ob=tinker.ModelInput.from_ints([ord(c) for c in prompt]),
                        ac=TokensWithLogprobs(tokens=[ord(c) for c in text], maybe_logprobs=None,
                                              stop_reason="length" if truncated else "stop"),
                        reward=score.total, episode_done=True, metrics={}, logs=logs)
        trajs.append(Trajectory(transitions=[tr], final_ob=tinker.ModelInput.empty()))
        totals.append(score.total)
    return TrajectoryGroup(trajs, [0.0] * len(trajs), [{} for _ in trajs]), totals


def write_steps(spec_path: Path, run_dir: Path, steps: range, *, seed: int = 0) -> None:
    """Log ``steps`` of 4 groups x 4 rollouts each: rollouts.jsonl through RolloutLog, a metrics.jsonl line per
    step (means of the logged verdicts), and an eval point every 5 steps. Later steps answer right more often."""
    spec = load_spec(spec_path).spec
    fn = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field, spec_path.parent)
    rows = [json.loads(line) for line in (spec_path.parent / "data/addition.jsonl").read_text().splitlines()]
    run_dir.mkdir(parents=True, exist_ok=True)
    log = RolloutLog(run_dir, reference_field="answer")
    rng = random.Random(seed + steps.start)
    with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as metrics:
        for step in steps:
            p_right = min(0.9, 0.3 + 0.05 * step)
            groups, chosen, advantages, all_totals, per_rule = [], [], [], [], {n: [] for n in fn.rule_names}
            for _ in range(4):
                i = rng.randrange(len(rows))
                row = {**rows[i], "_index": i}
                right = int(row["answer"])
                texts = [f" {right}" if rng.random() < p_right else
                         rng.choice([f" {right + 1}", f" {right} or {right + 1}", "seven", f" {right - 1}"])
                         for _ in range(4)]
                group, totals = _group(fn, row, texts)
                mean = sum(totals) / len(totals)
                groups.append(group)
                chosen.append(row)
                advantages.append([t - mean for t in totals])
                all_totals += totals
                for tr in group.trajectories_G:
                    for n in fn.rule_names:
                        per_rule[n].append(tr.transitions[0].logs[f"score/{n}"])
            log.write_step(step, "train", groups, chosen, advantages,
                           sampler_paths=f"local://studio-test/sampler_weights/{step - 1:06d}",
                           sampler_steps=step - 1, tokenizer=CharTokenizer())
            line = {"step": step, "reward/total": sum(all_totals) / len(all_totals),
                    **{f"reward/{n}": sum(v) / len(v) for n, v in per_rule.items()},
                    "correct": sum(1 for v in per_rule["correct"] if v > 0) / len(per_rule["correct"]),
                    "degenerate_frac": sum(1 for a in advantages if all(x == 0 for x in a)) / len(advantages),
                    "frac_truncated": 0.0}
            if step % 5 == 0:
                line["eval/reward/total"] = min(1.0, line["reward/total"] + 0.05)
            metrics.write(json.dumps(line) + "\n")
