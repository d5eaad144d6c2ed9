"""``sailrl validate SPEC...``: check specs and report every problem, located; ``ok: PATH`` per valid spec.

Runs the YAML loader, the schema, the semantic checks and the spec's worked reward ``examples:``.
Never imports torch or transformers. Exit 0 when every spec is valid, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec YAML files to check")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the error report (auto: when printing to a terminal and NO_COLOR is unset)")


def use_color(choice: str, stream) -> bool:
    """Whether to colour output on ``stream`` for --color ``choice`` (honours NO_COLOR)."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def run(args: argparse.Namespace) -> int:
    from sailrl.spec.errors import SpecErrors
    from sailrl.spec.loader import load_spec

    color = use_color(args.color, sys.stderr)
    failed = 0
    for path in args.specs:
        try:
            load_spec(path)
        except SpecErrors as exc:
            failed += 1
            print(exc.format(color=color), file=sys.stderr)
            print(file=sys.stderr)
            continue
        print(f"ok: {path}")
    if len(args.specs) > 1 and failed:
        print(f"{failed} of {len(args.specs)} specs have problems", file=sys.stderr)
    return 1 if failed else 0
