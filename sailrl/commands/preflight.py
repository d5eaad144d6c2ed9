"""``sailrl preflight SPEC``: check data, prompts and (optionally) base-policy rewards before training.

Reports rows loaded and skipped (and why), the train / eval split, the first prompts exactly as the model sees
them with their reference answers, prompt token lengths against the context window and ``max_tokens``, the
reward formula, and with ``--sample N`` the base policy's reward per rule, degenerate groups and truncated
completions, ending with a plain-words verdict. The report logic is ``sailrl.runtime.preflight``.

Exit codes: 0 ready (warnings allowed); 1 invalid spec, unusable data or a blocking problem (e.g. a reward that
cannot vary, every sampled group degenerate); 2 usage error.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the spec YAML file")
    p.add_argument("--sample", type=int, default=0, metavar="N",
                   help="sample N groups (training.group_size rollouts each) from the base policy and score them")
    p.add_argument("--sampler", choices=("local", "tinker", "sail"), default="local",
                   help="where --sample samples: the embedded backend (default, no keys), Tinker "
                        "(TINKER_API_KEY) or Sail (SAIL_API_KEY)")
    p.add_argument("--show", type=int, default=3, metavar="K",
                   help="how many prompts, skipped rows and sampled completions to show (default 3)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.sample < 0 or args.show < 0:
        print("sailrl preflight: error: --sample and --show must be >= 0", file=sys.stderr)
        return 2
    import json
    from pathlib import Path

    from sailrl.spec.errors import SpecErrors
    from sailrl.spec.loader import load_spec

    color = sys.stderr.isatty()
    try:
        loaded = load_spec(args.spec)
    except SpecErrors as exc:
        print(exc.format(color=color), file=sys.stderr)
        return 1

    from sailrl.runtime.preflight import PreflightError, build_report, render_report

    spec_dir = Path(args.spec).resolve().parent
    try:
        report = build_report(loaded.spec, spec_dir, sample=args.sample, show=args.show, sampler=args.sampler,
                              spec_path=args.spec, loaded=loaded)
    except PreflightError as exc:
        print(f"sailrl preflight: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        from rich.console import Console

        data = report.get("data") or {}
        if data.get("error") and data.get("key"):
            print(SpecErrors([loaded.error(data["key"], data["error"])], loaded.text).format(color=color),
                  file=sys.stderr)
        render_report(report, Console(highlight=False))
    return 1 if report["blocking"] else 0
