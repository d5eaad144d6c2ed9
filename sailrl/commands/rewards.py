"""``sailrl rewards SPEC``: score completions with a spec's reward rules and print a per-rule table.

Completions come from ``--completion TEXT`` (repeatable) and/or ``--jsonl FILE`` (one JSON object per line:
``completion`` and optional ``fields``, ``truncated``, ``num_tokens``). The dataset fields they are scored
against come from ``--row N`` (row N of the spec's dataset split, by its index in the split) and/or
``--field NAME=VALUE`` (repeatable; overrides the row). Each completion gets a table: rule | result | score |
why, and the total.

Judge rules call their judge (keys as for a run); one that cannot be called (no key, a judge that cannot be opened)
is shown as not checked, never as failed, and the total as not known.

Exit codes: 0 scored; 1 invalid spec, unloadable dataset, a reference answer the rules cannot use, or a judge rule
not checked; 2 usage error (no completions, a malformed --field or JSONL line).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sailrl.commands._common import load_spec_lenient, print_score_tables, spec_missing, use_color
from sailrl.runtime.data import dataset_row
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the spec YAML file")
    p.add_argument("--completion", "-c", action="append", default=[], metavar="TEXT",
                   help="a completion to score (repeatable); for line breaks use the shell, e.g. $'a\\nb'")
    p.add_argument("--jsonl", metavar="FILE",
                   help="completions as JSON lines: {\"completion\": ..., \"fields\": {...}, \"truncated\": false}")
    p.add_argument("--row", type=int, metavar="N", help="score against row N of the dataset split (0-based)")
    p.add_argument("--field", "-f", action="append", default=[], metavar="NAME=VALUE",
                   help="a dataset field value, e.g. --field 'answer=#### 72' (repeatable; overrides --row)")
    p.add_argument("--truncated", action="store_true",
                   help="treat the --completion texts as cut off at max_tokens")
    p.add_argument("--tokens", type=int, metavar="N", help="completion length in tokens (for length rules)")
    p.add_argument("--json", action="store_true", help="print one JSON object per completion instead of tables")


class _Usage(UserError):
    pass


#: Largest --jsonl file read (each completion is at most 200,000 characters anyway).
MAX_JSONL_BYTES = 64 * 2**20


def _parse_fields(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise _Usage(f"--field needs NAME=VALUE, got {item!r} (e.g. --field 'answer=#### 72')")
        out[name.strip()] = value
    return out


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    import json

    try:
        with open(path, "rb") as f:  # bounded: a huge file (or /dev/zero) is refused, not read into memory
            data = f.read(MAX_JSONL_BYTES + 1)
    except OSError as exc:
        raise _Usage(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_JSONL_BYTES:
        raise _Usage(f"{path} is larger than {MAX_JSONL_BYTES // 2**20} MiB: score it in parts")
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _Usage(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8") from None
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _Usage(f"{path}:{n}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise _Usage(f"{path}:{n}: the JSON is nested too deeply") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("completion"), str):
            raise _Usage(f"{path}:{n}: expected an object with a \"completion\" string")
        if "fields" in obj and not isinstance(obj["fields"], dict):
            raise _Usage(f"{path}:{n}: \"fields\" must be an object")
        items.append(obj)
    return items


def run(args: argparse.Namespace) -> int:
    import json

    color = use_color("auto", sys.stderr)
    try:
        fields = _parse_fields(args.field)
        items: list[dict[str, Any]] = [
            {"completion": c, "truncated": args.truncated, "num_tokens": args.tokens}
            for c in args.completion
        ]
        if args.jsonl:
            items += _read_jsonl(args.jsonl)
    except _Usage as exc:
        print(f"sailrl rewards: error: {exc}", file=sys.stderr)
        return 2
    if not items:
        print("sailrl rewards: error: give completions with --completion TEXT or --jsonl FILE", file=sys.stderr)
        return 2
    if spec_missing(args.spec):
        print(f"error: spec not found: {args.spec}", file=sys.stderr)
        return 1
    spec = load_spec_lenient(args.spec, color)
    if spec is None:
        return 1
    row: dict[str, Any] = {}
    if args.row is not None:
        try:
            row, note = dataset_row(spec, Path(args.spec).resolve().parent, args.row)
        except LookupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        if note:
            print(f"note: {note}", file=sys.stderr)
    base = {**row, **fields}

    spec_dir = Path(args.spec).resolve().parent
    fn = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field, spec_dir)
    unchecked: dict[str, str] = {}
    if fn.judges:  # kind: judge rules call their judge models (keys as for a run)
        # lazy: judge clients load tinker and torch (seconds); only specs with judge rules need them
        from sailrl.runtime.backends.judge_clients import connect_judges

        unchecked = connect_judges(fn, spec_dir=spec_dir)  # a judge that cannot be called: not checked, not failed
    problems = 0
    results = []
    for item in items:
        item_fields = {**base, **item.get("fields", {})}
        problem = fn.reference_problem(item_fields)
        problems += problem is not None
        score, traces = fn.trace(item["completion"], item_fields, truncated=bool(item.get("truncated", False)),
                                 num_tokens=item.get("num_tokens"))
        results.append((item, item_fields, problem, score, traces))

    if args.json:
        for item, _, problem, score, _traces in results:
            print(json.dumps({
                "completion": item["completion"], "total": None if unchecked else score.total,
                "contributions": {n: None if n in unchecked else c for n, c in score.contributions.items()},
                "passed": {n: None if n in unchecked else p for n, p in score.passed.items()},
                "reasons": {n: f"not checked: {unchecked[n]}" if n in unchecked else r
                            for n, r in score.reasons.items()},
                "not_checked": unchecked, "correct": score.correct,
                "timeouts": score.timeouts, "errors": score.errors, "subscores": score.subscores,
                "reference_problem": problem,
                **({"judge": {n: {"answer": v.answer, "score_text": v.label, "normalised": v.score, "kind": v.kind,
                                  "prompt_tokens": v.prompt_tokens, "output_tokens": v.output_tokens}
                              for n, v in score.judge.items() if n not in unchecked}} if score.judge else {}),
            }))
    else:
        print_score_tables(fn, results, unchecked)
    for name, why in unchecked.items():
        print(f"sailrl rewards: judge rule '{name}' not checked: {why}", file=sys.stderr)
    if problems and args.row is None and not fields:
        print(f"note: the reward needs the reference answer: pass it with --field "
              f"{spec.prompt.reference_field}=VALUE, or take a dataset row with --row N", file=sys.stderr)
    return 1 if problems or unchecked else 0
