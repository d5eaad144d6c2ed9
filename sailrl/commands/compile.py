"""``sailrl compile SPEC [-o PATH] [--check]``: render the training script, or check a committed one is current."""

from __future__ import annotations

import argparse
import sys

from sailrl.commands._common import say_warnings
from sailrl.compiler.render import default_output_path, render_script
from sailrl.compiler.validate import validate_file
from sailrl.spec.errors import SpecErrors


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the spec YAML file")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="where to write the script (default: generated/<spec name>.py); '-' for stdout")
    p.add_argument("--check", action="store_true",
                   help="do not write; exit 1 with a diff when PATH is missing or differs from a fresh compile")


def compile_spec(spec_path: str, output: str | None, *, warn: bool = True) -> tuple[str, str]:
    """(output path, script text). Raises SpecErrors when the spec is invalid (every check of `sailrl validate`).

    ``warn``: print the spec's warnings to stderr, one line each (``sailrl validate`` shows them in full).
    """
    loaded = validate_file(spec_path)
    if warn:
        say_warnings(loaded.warnings, spec_path)
    out = output or default_output_path(spec_path, loaded.spec)
    text = render_script(loaded.spec, spec_path=spec_path, spec_bytes=loaded.text.encode("utf-8"),
                         output_path=out if out != "-" else default_output_path(spec_path, loaded.spec))
    return out, text


def stale_diff(path: str, fresh: str, spec_path: str) -> str | None:
    """None when ``path`` holds exactly ``fresh``; else a unified diff and the regenerate command."""
    import difflib
    from pathlib import Path

    p = Path(path)
    try:
        old = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return f"{path} is missing. Generate it with:\n    sailrl compile {spec_path} -o {path}\n"
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path} cannot be read ({getattr(exc, 'strerror', None) or exc}); regenerate it with:\n" \
               f"    sailrl compile {spec_path} -o {path}\n"
    if old == fresh:
        return None
    diff = "".join(difflib.unified_diff(old.splitlines(keepends=True), fresh.splitlines(keepends=True),
                                        fromfile=f"{path} (committed)", tofile=f"{path} (fresh compile)"))
    return f"{diff}\n{path} is stale. Regenerate it with:\n    sailrl compile {spec_path} -o {path}\n"


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    try:
        out, text = compile_spec(args.spec, args.output, warn=not args.check)
    except SpecErrors as exc:
        print(exc.format(color=sys.stderr.isatty()), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot read {args.spec}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if args.check:
        if out == "-":
            print("error: --check needs a file path, not '-'", file=sys.stderr)
            return 2
        diff = stale_diff(out, text, args.spec)
        if diff:
            print(diff, file=sys.stderr)
            return 1
        print(f"up to date: {out}")
        return 0
    if out == "-":
        sys.stdout.write(text)
        return 0
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
