"""Helpers several ``sailrl`` subcommands share: colour choice, printing spec problems, lenient spec loading."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO


def use_color(choice: str, stream: TextIO) -> bool:
    """Whether to colour output on ``stream`` for --color ``choice`` (auto/always/never; honours NO_COLOR)."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def spec_missing(path: str) -> bool:
    """True when nothing exists at ``path`` (a path the file system refuses, e.g. too long, is not "missing")."""
    from pathlib import Path

    try:
        return not Path(path).exists()
    except OSError:
        return False


def print_warnings(loaded: Any, color: bool, stream: TextIO | None = None) -> None:
    """Print ``loaded.warnings`` (a validated spec's warnings) as a report, when there are any."""
    from sailrl.spec.errors import format_problems

    if loaded.warnings:
        print(format_problems(loaded.warnings, loaded.text, color=color), file=stream or sys.stderr)
        print(file=stream or sys.stderr)


def load_spec_lenient(path: str, color: bool) -> Any:
    """The validated :class:`~sailrl.spec.schema.Spec` at ``path``, or None after printing its problems.

    A spec whose only errors are its worked ``examples:`` disagreeing still loads (the problems are printed
    first): that is when scoring completions by hand helps most. Warnings are printed and do not stop it.
    """
    from sailrl.compiler.reward_checks import is_example_error
    from sailrl.compiler.validate import problems
    from sailrl.spec.errors import SpecErrors, format_problems
    from sailrl.spec.loader import read_spec_file

    try:
        text, digest = read_spec_file(path)
    except SpecErrors as exc:
        print(exc.format(color=color), file=sys.stderr)
        return None
    from pathlib import Path

    loaded, found = problems(text, path, path=Path(path), sha256=digest)
    if found:
        print(format_problems(found, loaded.text, color=color), file=sys.stderr)
    errors = [e for e in found if not e.is_warning]
    if not errors:
        return loaded.spec
    if loaded.spec is None or not all(is_example_error(e) for e in errors):
        return None
    print("(the reward examples disagree; scoring anyway)\n", file=sys.stderr)
    return loaded.spec
