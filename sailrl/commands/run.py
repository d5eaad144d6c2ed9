"""``sailrl run SPEC``: compile the spec and execute the training script now.

The script is written to ``<run dir>/train.py`` (so the run directory records exactly what ran) and executed
in this process. Without ``--sampler`` the spec's sampler is used, except that when the spec asks for Sail or
Tinker and their API keys are not set, sailrl says so in one line (use ``--sampler local``).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the spec YAML file")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's last saved state")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a run directory that already holds a run (its records are cleared)")
    p.add_argument("--sampler", choices=("sail", "tinker", "local"), help="override sampling.sampler")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec value by dotted key (VALUE is YAML), e.g. training.steps=2")


def run(args: argparse.Namespace) -> int:
    import runpy
    from pathlib import Path

    from sailrl.compiler.render import render_script
    from sailrl.runtime.script import apply_overrides
    from sailrl.spec.errors import SpecErrors
    from sailrl.spec.loader import load_spec

    try:
        loaded = load_spec(args.spec)
    except SpecErrors as exc:
        print(exc.format(color=sys.stderr.isatty()), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot read {args.spec}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    overrides = list(args.overrides)
    if args.sampler:
        overrides.append(f"sampling.sampler={args.sampler}")
    try:
        resolved = apply_overrides(loaded.spec.resolved(), overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(str((resolved.get("output") or {}).get("run_dir", "runs/{name}")).replace("{name}",
                   str(resolved.get("name"))))
    script_path = run_dir / "train.py"
    if not args.resume and not args.overwrite:
        from sailrl.runtime.rundir import RunDirectory

        if run_dir.exists() and RunDirectory(run_dir).has_metrics():
            steps = len(RunDirectory(run_dir).read_metrics())
            print(f"error: {run_dir} already holds a run ({steps} steps logged). Continue it with --resume, start "
                  "it over with --overwrite, or set output.run_dir to a new directory.", file=sys.stderr)
            return 1
    text = render_script(loaded.spec, spec_path=Path(args.spec).as_posix(), spec_bytes=loaded.text.encode("utf-8"),
                         output_path=script_path.as_posix())
    run_dir.mkdir(parents=True, exist_ok=True)
    script_path.write_text(text, encoding="utf-8")
    argv = [str(script_path)] + (["--resume"] if args.resume else []) + (["--overwrite"] if args.overwrite else [])
    for o in overrides:
        argv += ["--set", o]
    import os
    import shlex

    resume = ["sailrl", "run", args.spec, *sum((["--set", o] for o in args.overrides), [])]
    if args.sampler:
        resume += ["--sampler", args.sampler]
    os.environ["SAILRL_RESUME_COMMAND"] = shlex.join([*resume, "--resume"])
    old_argv = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(str(script_path), run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    finally:
        sys.argv = old_argv
    return 0
