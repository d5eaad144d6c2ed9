"""The sampler's prefill of a batch whose prompts share a long start: that start once (``_prefill_shared``) against
every prompt whole (``_prefill``), interleaved, on the judge's prompts.

Work: ``--prompts`` (40) distinct ``sailrl/tiny-judge`` judge prompts as the local judge path builds them (the
instructions, the scale, the rubric with its question, the completion), which share their first ~300 tokens; one
thread, no grad. Each repetition times both arms once, in alternating order, after ``--warmup`` untimed rounds.
Printed: min and median seconds per arm, their ratio, the shared start's length and the largest difference in the
last position's logits (float rounding).

    .venv/bin/python benchmarks/bench_shared_prompt.py --reps 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from tinker_cookbook.renderers import get_renderer

from sailrl.runtime.backends.local.engine import generation
from sailrl.runtime.backends.local.weights.tiny import load_base_model, resolve_base_model
from sailrl.runtime.backends.models import get_tokenizer
from sailrl.runtime.rewards.judge import Judge
from sailrl.spec.loader import load_spec

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "spec", "examples", "judge_local.yaml")


def judge_prompts(n: int) -> list[tuple[int, ...]]:
    """``n`` distinct judge prompts of the judge_local example, tokenized as the local judge path sends them."""
    spec = load_spec(EXAMPLE).spec
    rule = next(r for r in spec.reward.rules if getattr(r, "kind", None) == "judge")
    judge = Judge("judged", rule)
    tok = get_tokenizer("sailrl/tiny-judge")
    renderer = get_renderer("role_colon", tok)
    prompts = []
    for i in range(n):
        a, b = i % 10, (i * 7 + 3) % 10
        messages = judge.messages(f"{a + b + i // 10}", {"question": f"{a}+{b}", "answer": str(a + b)})
        model_input = renderer.build_generation_prompt(messages)
        prompts.append(tuple(model_input.to_ints()))
    return prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = load_base_model(resolve_base_model("sailrl/tiny-judge", 0)).eval()
    prompts = list(dict.fromkeys(judge_prompts(args.prompts)))
    shared = generation.shared_prompt_length(prompts)
    times: dict[str, list[float]] = {"whole": [], "shared": []}
    with torch.no_grad():
        whole_out, _ = generation._prefill(model, prompts, "cpu", False)
        shared_out, _ = generation._prefill_shared(model, prompts, shared, "cpu")
        diff = float((whole_out.logits[:, -1] - shared_out.logits[:, -1]).abs().max())
        for rep in range(args.warmup + args.reps):
            for arm in (("whole", "shared") if rep % 2 == 0 else ("shared", "whole")):
                t0 = time.perf_counter()
                if arm == "whole":
                    generation._prefill(model, prompts, "cpu", False)
                else:
                    generation._prefill_shared(model, prompts, shared, "cpu")
                if rep >= args.warmup:
                    times[arm].append(time.perf_counter() - t0)
    lens = [len(p) for p in prompts]
    print(f"load average {os.getloadavg()[0]:.2f}; {len(prompts)} judge prompts of {min(lens)}-{max(lens)} tokens, "
          f"{shared} shared; {args.reps} repetitions, interleaved")
    for arm, ts in times.items():
        print(f"{arm:<7} min {min(ts):.3f} s  median {statistics.median(ts):.3f} s")
    print(f"whole / shared: {min(times['whole']) / min(times['shared']):.2f}x (min), "
          f"{statistics.median(times['whole']) / statistics.median(times['shared']):.2f}x (median); "
          f"largest logit difference {diff:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
