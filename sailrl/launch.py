"""The entry point of a generated training script (and of ``sailrl run``): flags, the spec, exit codes.

A script ends with ``raise SystemExit(launch.main(main, CONFIG, ...))``. :func:`main` reads the flags, builds the
spec from the script's ``CONFIG`` (with ``--set`` overrides checked like ``sailrl validate`` checks a file), opens
the run (:func:`sailrl.runtime.run.open_run`) and awaits the script's ``main(run)``, then:

- Ctrl-C: lets a submitted update land, saves state, prints the resume command, exit status 130.
- ``training.max_cost_usd`` reached: state saved, resume command printed, exit status 3.
- a stop the spec asked for (``training.on_all_degenerate: stop``, ``sampling.on_policy_mismatch: stop``): one
  ``stopped:`` line, state saved, resume command printed, exit status 4.
- a user error (bad override, missing key, unusable data or model, a run directory in the way) or a run fault
  (Tinker, Sail, their HTTP transport or the embedded backend failing, named by step and phase;
  :func:`sailrl.runtime.backends.faults.service_fault`): one ``error:`` line, exit status 1 (state saved first when some
  steps completed).
- anything else is a bug in sailrl: state saved when it can be, then its traceback and exit status 70 (printed
  by ``sailrl.cli`` for ``sailrl run``, by :func:`main` for a script).

Output: each step's line and the run's summary on stdout, everything else (progress, warnings, how to resume,
errors) on stderr (:class:`sailrl.runtime.loop.console.RunConsole`).

Flags: ``--resume``, ``--overwrite``, ``--set KEY=VALUE`` (repeatable; VALUE is YAML), ``--sampler
{sail,tinker,local}`` (shorthand for ``--set sampling.sampler=...``).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import shlex
import sys
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from sailrl.compiler.render import feature_changes
from sailrl.compiler.validate import validate_text
from sailrl.spec.errors import SailrlError, SpecErrors, UserError
from sailrl.spec.loader import read_spec_file
from sailrl.spec.schema import Spec

__all__ = ["EXIT_BUDGET", "apply_overrides", "build_spec", "execute", "main", "parse_args"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BUDGET, EXIT_STOPPED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_INTERNAL = 70  # sysexits.h EX_SOFTWARE: a bug in sailrl (sailrl.cli.INTERNAL_ERROR)


def parse_args(argv: list[str] | None, doc: str | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="continue from the run directory's last saved state")
    mode.add_argument("--overwrite", action="store_true",
                      help="start over in a run directory that already holds a run (its records are cleared)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec value by dotted key (VALUE is YAML), e.g. training.steps=2")
    parser.add_argument("--sampler", choices=("sail", "tinker", "local"),
                        help="shorthand for --set sampling.sampler=...")
    args = parser.parse_args(argv)
    if args.sampler:
        args.overrides.append(f"sampling.sampler={args.sampler}")
    return args


def _override_value(raw: str) -> Any:
    """VALUE of ``--set KEY=VALUE``: YAML, except that a Jinja template (``{{ ... }}``) stays text."""
    text = raw.strip()
    if not text:
        raise ValueError("has no value after '=': give one, or write null to clear the key (e.g. --set "
                         "training.warmup=null)")
    if text.startswith(("{{", "{%", "{#")):
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"VALUE {raw!r} is not valid YAML ({problem}); quote it, e.g. --set \"key='...'\"") from None


def apply_overrides(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of ``config`` with each ``dotted.key=yaml`` override applied.

    A number in the key indexes a list (``reward.rules.0.weight=1``). Changing ``model.name`` without also setting
    ``model.renderer`` clears the renderer, so the new model's default renderer is used. Raises ``ValueError``
    (plain words) on a malformed override.
    """
    out = copy.deepcopy(config)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            value = _override_value(raw)
        except ValueError as exc:
            raise ValueError(f"--set {item}: {exc}") from None
        node: Any = out
        parts = key.split(".")
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            where = ".".join(parts[: i + 1])
            if isinstance(node, list):
                if not p.isdigit() or int(p) >= len(node):
                    raise ValueError(f"--set {key}: {'.'.join(parts[:i])} is a list of {len(node)}; "
                                     f"use an index 0..{len(node) - 1}")
                if last:
                    node[int(p)] = value
                else:
                    node = node[int(p)]
            elif isinstance(node, dict):
                if last:
                    node[p] = value
                else:
                    if node.get(p) is None:
                        node[p] = {}
                    node = node[p]
            else:
                raise ValueError(f"--set {key}: {where.rsplit('.', 1)[0]} is a value, not a section")
    keys = {o.partition("=")[0] for o in overrides}
    if "model.name" in keys and "model.renderer" not in keys and isinstance(out.get("model"), dict):
        out["model"]["renderer"] = None  # the new model's default renderer, not the old model's
    return out


def override_notes(config: dict[str, Any], overrides: list[str]) -> list[str]:
    """What the overrides did besides setting their keys, for a message about them (e.g. the renderer reset)."""
    keys = {o.partition("=")[0] for o in overrides}
    renderer = (config.get("model") or {}).get("renderer")
    if "model.name" in keys and "model.renderer" not in keys and renderer:
        return [f"--set model.name resets model.renderer (it was {renderer!r}) to the new model's default; add "
                f"--set model.renderer={renderer} to keep it"]
    return []


def overrides_message(config: dict[str, Any], overrides: list[str], *, of: str | None = None) -> str:
    """The line printed under spec problems that came from ``--set`` overrides (``of``: which spec they were
    applied to, when a command has several)."""
    notes = "".join(f"\n({n})" for n in override_notes(config, overrides))
    where = f" of {of}" if of else ""
    return f"(these come from the --set overrides{where}: " + " ".join(overrides) + ")" + notes


def _validate_text(text: str, filename: str, path: Path | None) -> Any:
    """Every ``sailrl validate`` check on a spec's text; raises ``SpecErrors``."""
    return validate_text(text, filename=filename, path=path)


def build_spec(config: dict[str, Any], overrides: list[str], spec_dir: Path | str | None = None) -> Any:
    """The :class:`~sailrl.spec.schema.Spec` of a script's ``CONFIG`` with ``overrides`` applied.

    Overrides go through every check ``sailrl validate`` makes (located in a YAML rendering of the overridden
    spec). Raises ``ValueError`` for a malformed override and ``SpecErrors`` for a value the spec refuses.
    """
    if not overrides:
        return Spec.model_validate(config)
    return check_overrides(config, overrides, spec_dir).spec


def check_overrides(config: dict[str, Any], overrides: list[str], spec_dir: Path | str | None = None) -> Any:
    """The validated spec (a :class:`~sailrl.spec.loader.LoadedSpec`, its warnings included) of ``config`` with
    ``overrides`` applied, located in a YAML rendering of it named ``<spec with --set overrides>``. Raises as
    :func:`build_spec` does."""
    # Checked as the user would have written it: the values that differ from the defaults, plus the overrides (a
    # default written out would trip checks meant for what a spec sets, e.g. an unused reference_field).
    written = Spec.model_validate(config).model_dump(mode="json", by_alias=True, exclude_defaults=True)
    merged = apply_overrides(written, overrides)
    text = yaml.safe_dump(merged, sort_keys=False, allow_unicode=True)
    where = Path(spec_dir).resolve() / "spec-with-overrides.yaml" if spec_dir is not None else None
    return _validate_text(text, "<spec with --set overrides>", where)


def _same_problem(a: Any) -> tuple[str, str, str]:
    return a.code, a.key_path, a.message


def override_warnings(file_warnings: list[Any], checked: list[Any]) -> list[Any]:
    """The warnings of the spec with its overrides (``checked``, located in ``<spec with --set overrides>``), each
    said once: one the spec file has too is given as located in the file; one the overrides fixed is gone."""
    in_file = {_same_problem(w): w for w in file_warnings}
    return [in_file.get(_same_problem(w), w) for w in checked if w.is_warning]


def override_errors(refused: SpecErrors) -> SpecErrors:
    """The errors of ``refused`` (the ``SpecErrors`` of a spec with overrides) without its warnings, which
    :func:`override_warnings` says with the spec file's."""
    return SpecErrors([e for e in refused.errors if not e.is_warning], refused.text, omitted=refused.omitted)


def write_into_config(config: dict[str, Any], spec: Spec, reads: dict[str, Any] | None = None) -> None:
    """Write ``spec``'s values (overrides applied) into the script's ``CONFIG`` sections in place, and into
    ``reads`` (the script's ``TRAINING``: the training values its loop reads, above it), so the names the script's
    ``main()`` reads (``TRAINING[...]``) hold the values this run uses. A reward rule keeps the keys the script
    shows when the overrides left it as it was."""
    resolved = spec.resolved()
    for key in reads or {}:
        reads[key] = resolved["training"][key]
    same_reward = Spec.model_validate(config).reward == spec.reward
    for name, section in config.items():
        if isinstance(section, dict) and isinstance(resolved.get(name), dict) and not (name == "reward" and
                                                                                    same_reward):
            section.clear()
            section.update(resolved[name])


async def execute(script_main: Callable[[Any], Awaitable[None]], spec: Spec, options: Any) -> int:
    """Open the run, await ``script_main(run)`` and turn its end into an exit status (see the module docstring)."""
    # lazy: `sailrl preflight` imports this module for build_spec; the run's modules load torch
    from sailrl.runtime.backends.faults import service_fault  # lazy: see above
    # lazy: see above
    from sailrl.runtime.loop.errors import BudgetReached, RunStopped
    from sailrl.runtime.run import open_run  # lazy: see above
    from sailrl.runtime.preference.run import open_preference_run  # lazy: see above
    from sailrl.runtime.supervised.run import open_supervised_run  # lazy: see above
    # lazy: see above
    from sailrl.runtime.rundir.writes import RunWriteError, write_error

    run = None
    _stop_state["saved"] = False
    _quiet_task_errors()
    try:
        # each method's run, its own parts
        opener = {"sft": open_supervised_run, "dpo": open_preference_run}.get(spec.method, open_run)
        run = await opener(spec, options)
        await script_main(run)
        return EXIT_OK
    except (KeyboardInterrupt, asyncio.CancelledError):
        if run is not None:
            await asyncio.shield(run.checkpoints.save_after_stop("interrupted"))
            _stop_state["saved"] = True
        else:
            print("interrupted while the run was opening; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BudgetReached as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        if run is not None:
            await run.checkpoints.save_after_stop("budget")
        return EXIT_BUDGET
    except RunStopped as exc:  # the spec's own stop: not a fault of a service, nor of sailrl
        print(f"stopped: {exc}", file=sys.stderr)
        if run is not None:
            await run.checkpoints.save_after_stop("stopped")
        return EXIT_STOPPED
    except SailrlError as exc:
        if run is not None and not isinstance(exc, UserError):
            await run.checkpoints.save_after_failure(exc)
        if isinstance(exc, SpecErrors):
            print(exc.format(color=sys.stderr.isatty()), file=sys.stderr)
        elif isinstance(exc, RunWriteError) and run is not None:  # nothing saved on the failing disk: say from where
            print(f"error: {run.checkpoints.after_write_failure(exc)}", file=sys.stderr)
        else:
            print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        disk = write_error(exc)  # a library's own write (a checkpoint file) on a full or failing disk
        if disk is not None:
            print(f"error: {run.checkpoints.after_write_failure(disk) if run is not None else disk}", file=sys.stderr)
            return EXIT_FAILED
        if run is not None:
            await run.checkpoints.save_after_failure(exc)
        if service_fault(exc):  # a service failing outside a step's phases: one line, as inside them
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_FAILED
        raise  # a bug in sailrl: its traceback, exit 70
    finally:
        _cancel_other_tasks()
        if run is not None:
            await run.close()


_stop_state = {"saved": False}  # whether the first Ctrl-C's save finished (what a second Ctrl-C reports)


def _quiet_task_errors() -> None:
    """Mark the error of every task of this event loop as seen when the task ends. The script's background tasks
    (rollouts started early for later steps, their policy) are awaited by the step that needs them, which reports
    their error; once a run has stopped on an error the ones left over hold that same fault, and asyncio would print
    each again, with a traceback, as "Task exception was never retrieved"."""

    def seen(task: asyncio.Task) -> None:
        if not task.cancelled():
            task.exception()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        task.add_done_callback(seen)
        return task

    asyncio.get_running_loop().set_task_factory(factory)


def _cancel_other_tasks() -> None:
    """Cancel the tasks the loop left running (rollouts of later steps, after a stop)."""
    current = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is not current:
            task.cancel()


def _run_async(coro: Awaitable[int]) -> int:
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:  # a second Ctrl-C while the first one's state was being saved, or after
        if _stop_state["saved"]:
            print("second Ctrl-C: stopped while shutting down; the state was saved (see above)", file=sys.stderr)
        else:
            print("second Ctrl-C: stopped without finishing the save; --resume continues from the last state saved "
                  "before it", file=sys.stderr)
        return EXIT_INTERRUPTED


def main(script_main: Callable[[Any], Awaitable[None]], config: dict[str, Any], *, spec_path: str,
         spec_dir: Path, spec_sha256: str, doc: str | None = None, argv: list[str] | None = None,
         reads: dict[str, Any] | None = None) -> int:
    """A generated script's ``__main__``: parse flags, build the spec, run. Returns the exit status. ``reads``: the
    script's ``TRAINING`` (the training values its loop reads; ``CONFIG``'s training holds them too)."""
    # lazy: the run's modules load torch; `sailrl preflight` imports this module for build_spec
    from sailrl.runtime.run import RunOptions

    args = parse_args(argv, doc)
    script = Path(sys.argv[0]) if argv is None else None
    changed = spec_changed(spec_path, Path(spec_dir), spec_sha256, script)
    if changed:
        print(changed, file=sys.stderr)
    try:
        spec = build_spec(config, args.overrides, spec_dir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SpecErrors as exc:
        print(exc.format(color=sys.stderr.isatty()), file=sys.stderr)
        print(overrides_message(config, args.overrides), file=sys.stderr)
        return EXIT_USAGE
    changes = feature_changes(Spec.model_validate(config), spec)
    if changes:
        print(f"error: the --set overrides turn on {'; '.join(changes)}, which this script was compiled without: "
              f"put it in the spec and recompile (sailrl compile {spec_path}), or run `sailrl run {spec_path} --set "
              "...`, which recompiles", file=sys.stderr)
        return EXIT_USAGE
    write_into_config(config, spec, reads)
    options = RunOptions(spec_path=spec_path, spec_dir=Path(spec_dir), spec_sha256=spec_sha256, resume=args.resume,
                         overwrite=args.overwrite, overrides=list(args.overrides),
                         script_text=script.read_text(encoding="utf-8") if script and script.is_file() else None)
    try:
        return _run_async(execute(script_main, spec, options))
    except Exception as exc:  # noqa: BLE001 -- as sailrl.cli does: a bug exits 70 with its traceback, never 1
        return internal_error(Path(sys.argv[0]).name if argv is None else "train.py", exc)


def internal_error(prog: str, exc: BaseException) -> int:
    """Report ``exc``, a bug in sailrl, with its traceback and one line saying so; the exit status (70)."""
    traceback.print_exception(exc)
    print(f"{prog}: internal error (a bug in sailrl, not a problem in your files): {type(exc).__name__}: {exc}. "
          "Please report it with the traceback above.", file=sys.stderr)
    return EXIT_INTERNAL


def spec_changed(spec_path: str, spec_dir: Path, spec_sha256: str, script: Path | None) -> str | None:
    """One line when the spec beside the script (``spec_dir`` / the name in ``spec_path``) is no longer the one
    it was compiled from (its sha256 differs from the script's ``SPEC_SHA256``), with the recompile command;
    None when it is the same, or cannot be read (moved, unreadable: the script runs what it was compiled with)."""
    beside = spec_dir / Path(spec_path).name
    try:
        text, _ = read_spec_file(beside)
    except (SpecErrors, OSError):
        return None
    if hashlib.sha256(text.encode("utf-8")).hexdigest() == spec_sha256:
        return None
    target = f" -o {shlex.quote(script.as_posix())}" if script is not None else ""
    return (f"warning: {spec_path} has changed since this script was compiled; it runs the settings it was "
            f"compiled with. To run the new spec: sailrl compile {shlex.quote(spec_path)}{target} (or sailrl run "
            f"{shlex.quote(spec_path)})")


def run_compiled(script_text: str, spec: Spec, options: Any) -> int:
    """Run a compiled script's text in this process (``sailrl run``): its ``main`` with ``spec`` and ``options``."""
    namespace: dict[str, Any] = {"__name__": "sailrl_compiled_script", "__file__": str(options.spec_dir / "train.py")}
    exec(compile(script_text, "train.py", "exec"), namespace)  # the script sailrl just rendered from the spec
    write_into_config(namespace["CONFIG"], spec, namespace.get("TRAINING"))
    return _run_async(execute(namespace["main"], spec, options))
