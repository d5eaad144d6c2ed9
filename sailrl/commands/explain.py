"""``sailrl explain SPEC``: print a spec's reward formula in plain words (for ``method: sft``, ``dpo`` or
``distill``, first what it trains on: the conversations, the pairs and their reference, or the teacher; the loss,
the steps).

One line per rule ("correct: +1 if the last \\boxed{...} answer in the completion equals the reference answer
... as a number; otherwise 0."), then the total with its range and what the logged 'correct' means, then the
run's estimated tokens and cost by kind (``sailrl.runtime.planning.cost.estimate_run`` without data: completions of 1 to
``max_tokens`` tokens, prompt tokens not counted; ``sailrl preflight`` measures them). For a model tinker_cookbook
has a LoRA learning rate for (``sailrl.spec.lr_advice``), a line says where the spec's stands against it.
With an ``environment:`` section, the episode (turns, tools, feedback, how it ends, what is scored) in words.
Never imports torch. Exit 0, or 1 when the spec is invalid.
"""

from __future__ import annotations

import argparse
import sys

from sailrl.commands._common import load_spec_lenient, spec_missing, use_color
from sailrl.compiler.words import method_words
from sailrl.runtime.planning.cost import estimate_run
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.lr_advice import lr_advice
from sailrl.spec.methods import METHOD_WORDS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the spec YAML file")


def run(args: argparse.Namespace) -> int:
    if spec_missing(args.spec):
        print(f"error: spec not found: {args.spec}", file=sys.stderr)
        return 1
    spec = load_spec_lenient(args.spec, use_color("auto", sys.stderr))
    if spec is None:
        return 1

    if spec.method != "rl":
        print(f"Training of '{spec.name}' (method {spec.method}, {METHOD_WORDS[spec.method]}):")
        for line in method_words(spec):
            print(f"  {line}")
    if spec.reward is None or spec.prompt is None:
        print()
        print("\n".join(estimate_run(spec, None).render()))
        return 0
    fn = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field)
    print({"sft": f"Reward rules of '{spec.name}', scoring one sample per held-out row:",
           "distill": f"Reward rules of '{spec.name}', scoring each of the student's completions:"}.get(
        spec.method, f"Reward of '{spec.name}', per completion:"))
    for line in fn.explain(held_out=spec.method == "sft"):
        print(f"  {line}")
    if spec.environment is not None:
        print("Episodes:")
        for line in spec.environment.describe():
            print(f"  {line}")
        print(f"  The cost estimate below counts each episode at one turn (its low end) to max_turns "
              f"({spec.environment.max_turns}) turns (its high end), later turns re-sending the conversation as "
              "prompt tokens (the note under it says the bound).")
    if spec.examples:
        remote = {n for n, j in fn.judges.items() if j.config.sampler != "local"}
        judged = [ex for ex in spec.examples if remote and (ex.expect_total is not None or remote & set(ex.expect))]
        if judged:  # they read a judge rule whose judge only `validate --judge` calls
            print(f"{len(spec.examples)} worked example(s) in the spec are checked by `sailrl validate`; "
                  f"{len(judged)} of them read a judge rule and are checked only by `sailrl validate --judge`.")
        else:
            print(f"{len(spec.examples)} worked example(s) in the spec are checked by `sailrl validate`.")

    advice = lr_advice(spec.model.name, spec.training.learning_rate)
    if advice is not None:
        print(f"Learning rate: {advice}.")

    print()  # the cost before paying: completions from 1 to max_tokens tokens, prompts not measured here
    print("\n".join(estimate_run(spec, None).render()))
    return 0
