"""``sailrl run SPEC...``: compile each spec (with its ``--set`` overrides) and run its training script now.

The script is rendered from the overridden spec, so it carries exactly the loop features the run uses, and is
executed in this process; the run records it as ``<run dir>/train.py`` once the run has opened (a run refused
for a missing key, an unusable model or data, or a run directory in the way writes nothing). Without
``--sampler`` the spec's sampler is used; Sail and Tinker need their API keys (one line says so otherwise).
The step lines and the summary go to stdout; the spec's warnings (those of the spec with its overrides, one
line each: ``sailrl validate`` shows them in full), progress, notes and errors to stderr
(:class:`sailrl.runtime.loop.console.RunConsole`).

Several specs are stages of one pipeline, run in order, each in its own run directory, each compiled and run as
one spec is (``sailrl run sft.yaml rl.yaml``: a later stage's ``training.init_from: runs/sums-sft`` starts it
from the final weights of the stage that writes that folder, :mod:`sailrl.runtime.rundir.init_from`). Every spec
is validated first, with every problem of every spec reported together, and nothing runs while one has an error:
a run directory that ``init_from`` names is read then (S261 when it holds no finished run, S262 when its model,
LoRA rank or backend is not this spec's), except one an earlier stage writes, which is checked against that
stage's spec and read when that stage has run. A stage that does not end with status 0 stops the pipeline: its
status is the command's, and each later stage gets a ``not run`` line. ``--set KEY=VALUE`` applies to every stage,
``--set N:KEY=VALUE`` to stage N only; ``--overwrite`` to every stage; ``--resume`` skips the stages whose run
directory holds a finished run and resumes the first one that does not.

Exit status: 0 done, 1 invalid spec or failed run, 2 bad override, 3 budget reached, 4 stopped where the spec says
to stop, 70 a bug in sailrl (with its traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sailrl import launch
from sailrl.commands._common import say_warnings
from sailrl.compiler.render import render_script
from sailrl.compiler.validate import validate_file
from sailrl.compiler.words import reward_words
from sailrl.runtime.rundir.directory import RunDirectory, RunFileError, run_dir_path
from sailrl.runtime.rundir.init_from import (
    InitFromError,
    finished_state,
    init_run_dir,
    is_run_directory,
    mismatch,
    resolve_init_from,
)
from sailrl.spec.errors import SpecErrors, UserError
from sailrl.spec.loader import LoadedSpec
from sailrl.spec.schema import Spec

_STAGE_PREFIX = re.compile(r"([0-9]+):(.*)", re.S)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="+", metavar="SPEC",
                   help="the spec YAML file; several are stages run in order, each in its own run directory")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true",
                      help="continue from the run directory's last saved state (several specs: the first stage "
                           "not finished)")
    mode.add_argument("--overwrite", action="store_true",
                      help="start over in a run directory that already holds a run (its records are cleared)")
    p.add_argument("--sampler", choices=("sail", "tinker", "local"), help="override sampling.sampler")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec value by dotted key (VALUE is YAML), e.g. training.steps=2; with several "
                        "specs it applies to every stage, N:KEY=VALUE to stage N only")


@dataclass
class Stage:
    """One spec of the command, validated with its overrides and compiled."""

    number: int
    path: str
    overrides: list[str]  # the --set overrides that apply to it, prefix removed
    loaded: LoadedSpec  # the file
    checked: LoadedSpec | None  # the spec with its overrides, when there are any
    spec: Spec
    run_dir: Path
    text: str = ""

    @property
    def spec_dir(self) -> Path:
        return Path(self.path).parent

    def error(self, key: tuple[str, ...], problem: InitFromError) -> SpecErrors:
        """``problem`` located at ``key`` in the file, or in the spec with its overrides when one set the key."""
        overridden = any(o.partition("=")[0] == ".".join(key) for o in self.overrides)
        where = self.checked if overridden and self.checked is not None else self.loaded
        return SpecErrors([where.error(key, problem.message, problem.hint, code=problem.problem)], where.text)


def run(args: argparse.Namespace) -> int:
    try:
        per_stage = stage_overrides(args.overrides, len(args.specs))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sampler = [f"sampling.sampler={args.sampler}"] if args.sampler else []
    stages: list[Stage] = []
    status = 0
    first_invalid = len(args.specs) + 1
    for number, (path, overrides) in enumerate(zip(args.specs, per_stage, strict=True), 1):
        stage = prepare(number, path, overrides + sampler, name_it=len(args.specs) > 1)
        if isinstance(stage, int):
            status, first_invalid = max(status, stage), min(first_invalid, number)
        else:
            stages.append(stage)
    # A run directory init_from names is not read while an earlier stage's spec, which may write it, is invalid.
    problems = [p for p in (init_from_problem(s, stages, resume=args.resume) for s in stages
                            if s.number < first_invalid) if p is not None]
    for problem in problems:
        print(problem.format(color=sys.stderr.isatty()), file=sys.stderr)
    if status or problems:
        return status or 1
    if same_run_dir(stages):
        return 1
    # lazy: runtime.run loads tinker and torch (seconds); an invalid spec is reported first
    from sailrl.runtime.run import RunOptions

    command = ["sailrl", "run", *args.specs, *sum((["--set", o] for o in args.overrides), [])]
    if args.sampler:
        command += ["--sampler", args.sampler]

    def options(stage: Stage, resume: bool) -> Any:
        return RunOptions(spec_path=Path(stage.path).as_posix(), spec_dir=stage.spec_dir,
                          spec_sha256=stage.loaded.sha256, resume=resume, overwrite=args.overwrite,
                          overrides=stage.overrides, resume_command=shlex.join([*command, "--resume"]),
                          script_text=stage.text)

    if len(stages) == 1:
        return launch.run_compiled(stages[0].text, stages[0].spec, options(stages[0], args.resume))
    return run_stages(stages, options, resume=args.resume)


def stage_overrides(overrides: list[str], count: int) -> list[list[str]]:
    """Each stage's ``--set`` overrides: ``KEY=VALUE`` for every stage, ``N:KEY=VALUE`` for stage N only.
    ``ValueError`` for a stage number the command does not have."""
    out: list[list[str]] = [[] for _ in range(count)]
    for item in overrides:
        found = _STAGE_PREFIX.fullmatch(item)
        if found is None:
            for stage in out:
                stage.append(item)
            continue
        number = int(found[1])
        if not 1 <= number <= count:
            stages = "one spec, stage 1" if count == 1 else f"{count} specs, stages 1-{count}"
            raise ValueError(f"--set {item}: there is no stage {number} (this command has {stages})")
        out[number - 1].append(found[2])
    return out


def prepare(number: int, path: str, overrides: list[str], *, name_it: bool = False) -> Stage | int:
    """The stage of the spec at ``path``, validated with ``overrides`` and compiled; or, after printing what is
    wrong, the exit status (1 a problem in the file, 2 in the overrides). ``name_it``: say which spec a problem
    of the overrides is in (several specs)."""
    try:
        loaded = validate_file(path)
    except SpecErrors as exc:
        print(exc.format(color=sys.stderr.isatty()), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    spec_dir = Path(path).parent
    spec, warnings, checked = loaded.spec, loaded.warnings, None
    try:
        if overrides:
            checked = launch.check_overrides(loaded.spec.resolved(), overrides, spec_dir)
            spec, warnings = checked.spec, launch.override_warnings(loaded.warnings, checked.warnings)
    except ValueError as exc:
        say_warnings(loaded.warnings, path)
        print(f"error: {exc}" + (f" (in {path})" if name_it else ""), file=sys.stderr)
        return 2
    except SpecErrors as exc:
        say_warnings(launch.override_warnings(loaded.warnings, exc.warnings), path)
        print(launch.override_errors(exc).format(color=sys.stderr.isatty()), file=sys.stderr)
        print(launch.overrides_message(loaded.spec.resolved(), overrides,
                                       of=f"stage {number}, {path}" if name_it else None), file=sys.stderr)
        if name_it:
            print("(--set KEY=VALUE applies to every stage; --set N:KEY=VALUE to stage N only)", file=sys.stderr)
        return 2
    say_warnings(warnings, path)
    stage = Stage(number, path, overrides, loaded, checked, spec, run_dir_path(spec, spec_dir))
    stage.text = render_script(spec, spec_path=Path(path).as_posix(), spec_bytes=loaded.text.encode("utf-8"),
                               output_path=(stage.run_dir / "train.py").as_posix(), reward_words=reward_words(spec))
    return stage


def init_from_problem(stage: Stage, stages: list[Stage], *, resume: bool) -> SpecErrors | None:
    """The located problem of ``stage``'s ``training.init_from`` when it names a run directory: one another stage
    writes is checked against that stage's spec (an earlier one) or refused (a later one); any other is read now.
    None when there is none, or when ``--resume`` continues a saved state (init_from is not read then)."""
    value = stage.spec.training.init_from
    if not value or not is_run_directory(value):
        return None
    if resume and saved_state(stage.run_dir):
        return None
    key = ("training", "init_from")
    path = init_run_dir(value, stage.spec_dir)
    writer = next((s for s in stages if s.run_dir == path and s is not stage), None)
    m = stage.spec.model
    if writer is not None and writer.number < stage.number:
        problem = mismatch(f"stage {writer.number} ({writer.path}, writing {value})",
                           model=writer.spec.model.name, lora_rank=writer.spec.model.lora_rank,
                           source_local=writer.spec.sampling.sampler == "local", spec_model=m.name,
                           spec_rank=m.lora_rank, spec_local=stage.spec.sampling.sampler == "local")
        return None if problem is None else stage.error(key, problem)
    if writer is not None:
        return stage.error(key, InitFromError(
            "S261", f"{value} is written by stage {writer.number} ({writer.path}), which runs after this one",
            f"List {writer.path} before {stage.path} on the command line."))
    try:
        resolve_init_from(value, stage.spec_dir, model=m.name, lora_rank=m.lora_rank,
                          local=stage.spec.sampling.sampler == "local")
    except InitFromError as exc:
        return stage.error(key, exc)
    return None


def saved_state(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a saved state (what ``--resume`` continues from)."""
    try:
        return RunDirectory(run_dir).last_state() is not None
    except RunFileError:
        return False  # the run itself says what is wrong with its folder


def same_run_dir(stages: list[Stage]) -> bool:
    """Print one line per pair of stages that would write the same run directory; whether there was one."""
    seen: dict[Path, Stage] = {}
    found = False
    for stage in stages:
        first = seen.setdefault(stage.run_dir, stage)
        if first is not stage:
            found = True
            print(f"error: stages {first.number} ({first.path}) and {stage.number} ({stage.path}) both write "
                  f"{stage.run_dir}: give each stage its own output.run_dir (the default, runs/{{name}}, differs "
                  "when their names do)", file=sys.stderr)
    return found


def finished(stage: Stage) -> bool:
    """Whether the stage's run directory holds its finished run: the final state, after every step."""
    try:
        _, final = finished_state(RunDirectory(stage.run_dir))
    except (RunFileError, ValueError):
        return False  # the run itself says what is wrong with its folder
    return final is not None and int(final.get("batch") or 0) >= stage.spec.training.steps


def run_stages(stages: list[Stage], options: Any, *, resume: bool) -> int:
    """Run the stages in order; the first that does not end with status 0 stops the rest (each named, not run)."""
    total = len(stages)
    resuming = resume
    for stage in stages:
        label = f"stage {stage.number}/{total} ({stage.path})"
        if resuming and finished(stage):
            print(f"{label}: finished in {stage.run_dir}; skipped", file=sys.stderr)
            continue
        this_resume, resuming = resuming and (stage.run_dir / "config.json").exists(), False
        print(f"{label}: method {stage.spec.method}, run directory {stage.run_dir}"
              + (" (resumed)" if this_resume else ""), file=sys.stderr)
        problem = init_from_problem(stage, [], resume=this_resume)  # the earlier stage's folder, as it is now
        if problem is not None:
            print(problem.format(color=sys.stderr.isatty()), file=sys.stderr)
            code = 1
        else:
            code = run_stage(stage, options(stage, this_resume))
        if code:
            for later in stages[stage.number:]:
                print(f"stage {later.number}/{total} ({later.path}): not run (stage {stage.number} ended with exit "
                      f"status {code})", file=sys.stderr)
            return code
    print(f"all {total} stages done; the last one's run directory: {stages[-1].run_dir}", file=sys.stderr)
    return 0


def run_stage(stage: Stage, options: Any) -> int:
    """One stage's script run as ``sailrl run`` runs one spec; a bug in sailrl is its traceback and status 70."""
    try:
        return launch.run_compiled(stage.text, stage.spec, options)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return launch.EXIT_INTERRUPTED
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return launch.EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 -- as sailrl.cli does: a bug exits 70 with its traceback, never 1
        return launch.internal_error("sailrl run", exc)
