"""``sailrl run SPEC``: compile the spec (with its ``--set`` overrides) and run the training script now.

The script is rendered from the overridden spec, so it carries exactly the loop features the run uses, and is
executed in this process; the run records it as ``<run dir>/train.py`` once the run has opened (a run refused
for a missing key, an unusable model or data, or a run directory in the way writes nothing). Without
``--sampler`` the spec's sampler is used; Sail and Tinker need their API keys (one line says so otherwise).
The step lines and the summary go to stdout; the spec's warnings (those of the spec with its overrides, one
line each: ``sailrl validate`` shows them in full), progress, notes and errors to stderr
(:class:`sailrl.runtime.loop.console.RunConsole`).
Exit status: 0 done, 1 invalid spec or failed run, 2 bad override, 3 budget reached, 4 stopped where the spec says
to stop, 70 a bug in sailrl (with its traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from sailrl import launch
from sailrl.commands._common import say_warnings
from sailrl.compiler.render import render_script
from sailrl.compiler.validate import validate_file
from sailrl.compiler.words import reward_words
from sailrl.runtime.rundir.directory import run_dir_path
from sailrl.spec.errors import SpecErrors


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the spec YAML file")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue from the run directory's last saved state")
    mode.add_argument("--overwrite", action="store_true",
                      help="start over in a run directory that already holds a run (its records are cleared)")
    p.add_argument("--sampler", choices=("sail", "tinker", "local"), help="override sampling.sampler")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec value by dotted key (VALUE is YAML), e.g. training.steps=2")


def run(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    # lazy: runtime.run loads tinker and torch (seconds); an invalid spec is reported first
    from sailrl.runtime.run import RunOptions

    try:
        loaded = validate_file(args.spec)
    except SpecErrors as exc:
        print(exc.format(color=sys.stderr.isatty()), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot read {args.spec}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    overrides = list(args.overrides) + ([f"sampling.sampler={args.sampler}"] if args.sampler else [])
    spec_dir = Path(args.spec).parent
    spec, warnings = loaded.spec, loaded.warnings
    try:
        if overrides:
            checked = launch.check_overrides(loaded.spec.resolved(), overrides, spec_dir)
            spec, warnings = checked.spec, launch.override_warnings(loaded.warnings, checked.warnings)
    except ValueError as exc:
        say_warnings(loaded.warnings, args.spec)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SpecErrors as exc:
        say_warnings(launch.override_warnings(loaded.warnings, exc.warnings), args.spec)
        print(launch.override_errors(exc).format(color=sys.stderr.isatty()), file=sys.stderr)
        print(launch.overrides_message(loaded.spec.resolved(), overrides), file=sys.stderr)
        return 2
    say_warnings(warnings, args.spec)
    script_path = run_dir_path(spec, spec_dir) / "train.py"
    text = render_script(spec, spec_path=Path(args.spec).as_posix(), spec_bytes=loaded.text.encode("utf-8"),
                         output_path=script_path.as_posix(), reward_words=reward_words(spec))
    resume = ["sailrl", "run", args.spec, *sum((["--set", o] for o in args.overrides), [])]
    if args.sampler:
        resume += ["--sampler", args.sampler]
    options = RunOptions(spec_path=Path(args.spec).as_posix(), spec_dir=spec_dir, spec_sha256=loaded.sha256,
                         resume=args.resume, overwrite=args.overwrite, overrides=overrides,
                         resume_command=shlex.join([*resume, "--resume"]), script_text=text)
    return launch.run_compiled(text, spec, options)

