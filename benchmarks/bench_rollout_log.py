"""Cost of the rollout log: writing one step, its size on disk, and reading a step back as `sailrl show` does.

A step of G groups x S rollouts with a P-character prompt (decoded by the `sailrl/tiny` byte tokenizer, a
pure-Python tokenizer: the slow case), C-character completions and three rules with verdicts. Prints, over R
interleaved repetitions (min and median):

- ``write_step`` time per step for log_rollouts "all" and 4 groups, and the bytes each writes;
- on a log of N such steps: `show`'s read of the last step (``logged_steps`` + ``read_rollouts(step=last)``,
  which places lines by their key prefix) against parsing every line with ``json.loads``, as a ratio;
- ``truncate`` (resume) of that log to half its steps.

    python benchmarks/bench_rollout_log.py [G S P C N R]     (defaults 64 16 1200 1500 40 5)
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tinker
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition

from sailrl.runtime.backends.models import get_tokenizer
from sailrl.runtime.rundir.rollout_log import ROLLOUTS_FILE, RolloutLog, logged_steps, read_rollouts


def make_step(tokenizer, groups: int, samples: int, prompt_chars: int, completion_chars: int):
    out, rows = [], []
    for g in range(groups):
        prompt = (f"User: question {g}: " + "lorem ipsum dolor sit amet " * (prompt_chars // 27 + 1))[:prompt_chars]
        ob = tinker.ModelInput.from_ints(tokenizer.encode(prompt + "\n\nAssistant:", add_special_tokens=False))
        trajs = []
        for s in range(samples):
            text = ("step by step reasoning " * (completion_chars // 23 + 1))[:completion_chars - 12]
            text += f"\\boxed{{{s}}}"
            logs = {"completion": text}
            for rule in ("correct", "format", "length"):
                logs.update({f"score/{rule}": float(s % 2), f"passed/{rule}": s % 2,
                             f"why/{rule}": f"answer '{s}' (last \\boxed{{}}) vs reference 1 (numeric)"})
            tr = Transition(ob=ob, ac=TokensWithLogprobs(tokens=list(range(3, 3 + 400)), maybe_logprobs=None),
                            reward=float(s % 2), episode_done=True, metrics={"reward/correct": float(s % 2)},
                            logs=logs)
            trajs.append(Trajectory(transitions=[tr], final_ob=tinker.ModelInput.empty()))
        out.append(TrajectoryGroup(trajs, [0.0] * samples, [{} for _ in range(samples)]))
        rows.append({"_index": g, "answer": "1"})
    return out, rows


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def stats(ts: list[float]) -> str:
    return f"min {min(ts) * 1000:8.1f} ms  median {statistics.median(ts) * 1000:8.1f} ms"


def main() -> None:
    g, s, p, c, n, r = (list(map(int, sys.argv[1:7])) + [64, 16, 1200, 1500, 40, 5][len(sys.argv[1:7]):])
    tok = get_tokenizer("sailrl/tiny")
    groups, rows = make_step(tok, g, s, p, c)
    advantages = [[0.5 if i % 2 else -0.5 for i in range(s)] for _ in range(g)]
    kw = dict(sampler_paths="tinker://run/sampler_weights/000001", sampler_steps=1, tokenizer=tok)
    tmp = Path(tempfile.mkdtemp())
    arms = {"all": ("all", tmp / "all"), "4 groups": (4, tmp / "four")}
    times: dict[str, list[float]] = {k: [] for k in arms}
    for rep in range(r):
        for name, (limit, d) in arms.items():
            log = RolloutLog(d, limit, reference_field="answer")
            times[name].append(timed(lambda log=log, rep=rep: log.write_step(rep, "train", groups, rows, advantages,
                                                                             **kw)))
    print(f"step: {g} groups x {s} rollouts, prompt {p} chars, completion {c} chars, 3 rules; {r} repetitions")
    for name, (_, d) in arms.items():
        size = (d / ROLLOUTS_FILE).stat().st_size / r
        print(f"write_step log_rollouts={name:9s} {stats(times[name])}   {size / 1e6:6.2f} MB/step")

    # a log of n steps; read the last one as `sailrl show` does, against json.loads of every line
    d = tmp / "long"
    log = RolloutLog(d, "all", reference_field="answer")
    for step in range(n):
        log.write_step(step, "train", groups, rows, advantages, **kw)
    path = d / ROLLOUTS_FILE
    print(f"log of {n} steps: {path.stat().st_size / 1e6:.1f} MB")

    def show_read():
        last = logged_steps(d)["train"][-1]
        assert len(read_rollouts(d, step=last, kind="train")) == g * s

    def parse_all():
        with open(path, "rb") as f:
            recs = [json.loads(line) for line in f]
        last = max(x["step"] for x in recs)
        assert len([x for x in recs if x["step"] == last]) == g * s

    reads: dict[str, list[float]] = {"show read (prefix scan)": [], "json.loads every line": []}
    for _ in range(r):
        reads["show read (prefix scan)"].append(timed(show_read))
        reads["json.loads every line"].append(timed(parse_all))
    for name, ts in reads.items():
        print(f"{name:28s} {stats(ts)}")
    a, b = reads.values()
    print(f"ratio prefix scan / parse all: min {min(a) / min(b):.2f}  median "
          f"{statistics.median(a) / statistics.median(b):.2f}")
    print(f"truncate to {n // 2} of {n} steps: {timed(lambda: log.truncate(n // 2)) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
