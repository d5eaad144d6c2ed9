"""``sailrl validate SPEC...``: check specs and report every problem, located; ``ok: PATH`` per valid spec.

Runs the validation stage (``sailrl.compiler.validate.validate_file``): the YAML loader, the schema, the semantic
checks and the spec's worked reward ``examples:``. ``kind: judge`` rules: a local judge is always called;
``--judge`` calls every judge (keys needed), checking the examples that read them and scoring injection probes
(W111); otherwise those examples are listed as not checked (W112). Warnings (a value outside its usual range,
...) are printed and do not fail. Imports torch and transformers only to load a local judge. Exit 0 when every
spec is valid (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sailrl.commands._common import print_warnings, use_color
from sailrl.compiler.validate import validate_file
from sailrl.compiler.words import method_words
from sailrl.spec.errors import SpecErrors

__all__ = ["add_arguments", "run", "use_color"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec YAML files to check")
    p.add_argument("--judge", action="store_true",
                   help="call the judge models of kind: judge rules (keys needed) to check their worked examples and "
                        "score injection probes; without it only local judges are called and the other judge rules' "
                        "examples are listed as not checked")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the error report (auto: when printing to a terminal and NO_COLOR is unset)")


def judge_connector(spec_path: str, *, every: bool) -> Any:
    """What connects a spec's judge rules at validate: local judges always, the others with ``--judge``."""
    from pathlib import Path

    def connect(reward_fn: Any) -> dict[str, str]:
        # lazy: only specs with judge rules
        from sailrl.runtime.backends.judge_clients import judge_connector as connector

        return connector(Path(spec_path).resolve().parent, every=every)(reward_fn)

    return connect


def run(args: argparse.Namespace) -> int:
    color = use_color(args.color, sys.stderr)
    failed = 0
    for path in args.specs:
        try:
            loaded = validate_file(path, judges=judge_connector(path, every=args.judge))
        except SpecErrors as exc:
            failed += 1
            print(exc.format(color=color), file=sys.stderr)
            print(file=sys.stderr)
            continue
        print_warnings(loaded, color)
        n = len(loaded.warnings)
        print(f"ok: {path}" + (f" ({n} warning{'s' if n != 1 else ''})" if n else ""))
        if loaded.spec.method != "rl":  # what the run will train, in words (sailrl explain says more)
            print("\n".join(f"  {line}" for line in method_words(loaded.spec)))
    if len(args.specs) > 1 and failed:
        print(f"{failed} of {len(args.specs)} specs have problems", file=sys.stderr)
    return 1 if failed else 0
