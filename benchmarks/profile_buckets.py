"""Where a local run's time goes: a py-spy profile of ``sailrl run`` summed into the phases of an RL step.

Record a running ``sailrl run`` (embedded backend, in-process: ``training.max_steps_off_policy: 0``) for a few
steps, then summarise::

    pip install py-spy
    py-spy record -p PID -d 330 -r 10 -f raw -o profile.txt     # PID: the `sailrl run` python process
    python benchmarks/profile_buckets.py profile.txt

py-spy samples every thread that is not idle (a thread waiting for a free core counts as busy), so the shares
are of wall time, summed over threads. Each sample goes to the first bucket, in the order below, whose
condition its stack meets: the learner's forward inside the model, its backward, its loss and log-probabilities,
the optimizer; the sampler's decode steps and prefill inside the model, its own bookkeeping (sampling, stop
checks, KV-cache growth and compaction); saving the adapter and merging it into the sampler's copy of the model;
everything else. A stack whose innermost frame only waits (a lock, a queue, the event loop's select) is
"waiting", whatever called it.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

MODEL = "transformers/models/"  # a frame of the model's own forward (modeling_<arch>.py)

#: (bucket, substrings that must each be in some frame of the stack, whether a frame of the model must be too)
BUCKETS: list[tuple[str, tuple[str, ...], bool]] = [
    ("learner: backward", ("LoraTrainer.forward", "Tensor.backward ("), False),
    ("learner: forward (model)", ("LoraTrainer.forward",), True),
    ("learner: loss and log-probs", ("LoraTrainer.forward",), False),
    ("learner: optimizer", ("LoraTrainer.optim",), False),
    ("sampler: decode steps (model)", ("_decode (",), True),
    ("sampler: prefill (model)", ("generate (",), True),
    ("sampler: bookkeeping", ("generate (",), False),
    ("adapter save, merge, sampler snapshot", ("merge_adapter",), False),
    ("adapter save, merge, sampler snapshot", ("sampling_client_from_path",), False),
    ("adapter save, merge, sampler snapshot", ("LoraTrainer.save",), False),
]
#: the innermost frame of a thread that is only waiting (for a lock, a queue, the event loop's select)
WAITING = ("Condition.wait (", "select (", "_worker (concurrent/futures/thread.py")


def bucket(frames: list[str]) -> str:
    """The bucket of one stack (outermost frame first)."""
    if any(w in frames[-1] for w in WAITING):
        return "waiting (locks, queues, event loop)"
    in_model = any(MODEL in f for f in frames)
    for name, needles, needs_model in BUCKETS:
        if all(any(n in f for f in frames) for n in needles) and (not needs_model or in_model):
            return name
    return "other"


def summarise(path: Path) -> list[tuple[str, int]]:
    """(bucket, samples) for every bucket, largest first, from a py-spy ``-f raw`` file."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[bucket(stack.split(";"))] += int(n)
    return counts.most_common()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="a py-spy record -f raw file")
    args = parser.parse_args(argv)
    if not args.profile.is_file():
        print(f"no profile at {args.profile}; record one with: py-spy record -p PID -d 330 -r 10 -f raw -o "
              f"{args.profile}  (pip install py-spy)", file=sys.stderr)
        return 2
    rows = summarise(args.profile)
    total = sum(n for _, n in rows) or 1
    for name, n in rows:
        print(f"{name:36s} {n:6d} samples  {100 * n / total:5.1f}%")
    print(f"{'total':36s} {total:6d} samples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
