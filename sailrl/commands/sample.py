"""``sailrl sample RUN_DIR``: sample the policy a run trained and score each completion with the spec's rules.

``--prompt TEXT`` (a user turn, as is) or ``--row N`` (row N of the spec's data, through its prompt template);
``--n K`` completions (default 4); ``--checkpoint final|STEP``; ``--field NAME=VALUE`` gives the reference answer
for a ``--prompt``; ``--temperature`` / ``--max-tokens`` override the spec's ``sampling:``. Prints each completion
as ``sailrl rewards`` does (rule | result | score | why, and the total). See :mod:`sailrl.export.sample`.
Exit 0, or 1 with one line saying what to do.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from sailrl.commands._common import print_score_tables
from sailrl.export import RunInfo
from sailrl.export.sample import sample_run


def _field(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"--field needs NAME=VALUE, got {text!r} (e.g. --field answer=7)")
    return name.strip(), value


def _whole_number(flag: str, low: int, high: int, shown_high: str | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``low`` to ``high``, else one line naming ``flag`` and the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{flag} takes a whole number from {low} to {shown_high or high}, not {text!r}")
        return value

    return parse


_positive = _whole_number("--n", 1, 256)
_max_tokens = _whole_number("--max-tokens", 1, 1_048_576)  # sampling.max_tokens' range
_seed = _whole_number("--seed", 0, 2**63 - 1, "2**63 - 1")


def _text(text: str) -> str:
    """A --prompt / --field value: text the tokenizer and the terminal can take (bytes that are not UTF-8 arrive
    from argv as lone surrogates and failed deep inside the tokenizer)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not UTF-8 text") from None
    return text


def _field_text(text: str) -> tuple[str, str]:
    return _field(_text(text))


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):  # NaN fails too
        raise argparse.ArgumentTypeError(f"--temperature takes a number 0 or above (0 = greedy), not {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (output.run_dir, e.g. runs/quickstart)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", type=_text, metavar="TEXT",
                     help="the user's message, as is (the spec's template is not applied)")
    src.add_argument("--row", type=int, metavar="N", help="row N of the spec's dataset split, through its template")
    p.add_argument("--n", type=_positive, default=4, metavar="K", help="completions to sample (default 4)")
    p.add_argument("--checkpoint", default="final", metavar="final|STEP",
                   help="which checkpoint: 'final' (default) or the step a checkpoint was saved after")
    p.add_argument("--field", "-f", type=_field_text, action="append", default=[], metavar="NAME=VALUE",
                   help="a dataset field for the rules, e.g. --field answer=7 (repeatable; overrides --row)")
    p.add_argument("--temperature", type=_temperature, help="override sampling.temperature (0 = greedy)")
    p.add_argument("--max-tokens", type=_max_tokens, help="override sampling.max_tokens")
    p.add_argument("--seed", type=_seed, help="sampling seed (same seed, same completions on the embedded backend)")


def run(args: argparse.Namespace) -> int:
    run_info = RunInfo.read(args.run_dir)
    ckpt = run_info.checkpoint(args.checkpoint)
    result = sample_run(run_info, ckpt, prompt=args.prompt, row=args.row, fields=dict(args.field), n=args.n,
                        temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    print(f"{ckpt.path} (step {ckpt.step}), {len(result.completions)} completion(s) of:")
    for m in result.messages:
        print(f"  {m['role']}: {m['content']!r}")
    print()
    spec = run_info.spec()
    if not result.scored:  # no reward rules (method dpo; sft or distill without reward:)
        _print_unscored(spec, result)
        return 0
    rows = [({"completion": c.text, "truncated": c.truncated, "num_tokens": len(c.tokens)}, result.fields,
             result.reference_problem, c.score, c.traces) for c in result.completions]
    print_score_tables(result.reward_fn, rows)
    if result.reference_problem is not None and args.row is None and not args.field:
        print(f"note: the reward needs the reference answer: pass it with --field "
              f"{spec.prompt.reference_field}=VALUE, or take a dataset row with --row N", file=sys.stderr)
    return 0


def _print_unscored(spec: Any, result: Any) -> None:
    """The completions of a spec without reward rules, as text; for a DPO row, which of its pair each one writes."""
    pair = None
    if spec.method == "dpo" and spec.dpo is not None and spec.dpo.chosen_field in result.fields:
        pair = (str(result.fields.get(spec.dpo.chosen_field)).strip(),
                str(result.fields.get(spec.dpo.rejected_field)).strip())
        print(f"chosen: {pair[0]!r}; rejected: {pair[1]!r}")
    for i, c in enumerate(result.completions, 1):
        flags = [f"{len(c.tokens)} tokens"] + (["cut off at max_tokens"] if c.truncated else [])
        if pair is not None:
            text = c.text.strip()
            flags.append("writes the chosen reply" if text == pair[0] else
                         "writes the rejected reply" if text == pair[1] else "writes neither reply")
        print(f"completion {i} ({', '.join(flags)}): {c.text!r}")
    print(f"note: the spec has no reward rules (method {spec.method}), so the completions are not scored",
          file=sys.stderr)
