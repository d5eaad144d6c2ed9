"""``sailrl clean``: list and remove the embedded backend's checkpoints under ``$SAILRL_HOME/checkpoints``.

Without a selection it lists the store runs (one per training run of the embedded backend) with their size,
age and the run directories that still need them. ``sailrl clean RUN_ID...``, ``--older-than DAYS`` or ``--all``
removes store runs; ``--dry-run`` says what would go without removing anything.

A checkpoint a run directory's ``--resume`` would load (its last saved state, see
``sailrl.runtime.rundir.checkpoint_store``) is kept, with the rest of its store run removed, unless ``--force``. Run
directories are the ones sailrl recorded when they ran, those under ``./runs``, and those under ``--runs DIR``.

Exit codes: 0 done (or nothing to do); 1 an unknown run id; 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from typing import Any

from rich.markup import escape
from rich.table import Table

from sailrl.runtime.loop.console import make_console
from sailrl.runtime.rundir.checkpoint_store import find_run_directories, list_store, plan_removals, remove, store_dir
from sailrl.spec.messages import did_you_mean_text


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of days, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of days of 0 or more, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="store runs to remove (as listed)")
    p.add_argument("--older-than", type=_days, metavar="DAYS",
                   help="remove store runs whose newest checkpoint is older than DAYS days")
    p.add_argument("--all", action="store_true", help="remove every store run")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    p.add_argument("--force", action="store_true",
                   help="also remove checkpoints a run directory needs for --resume")
    p.add_argument("--runs", action="append", default=[], metavar="DIR",
                   help="a run directory, or a folder of run directories, whose checkpoints to keep (repeatable; "
                        "./runs and the run directories sailrl recorded are always looked at)")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _age(days: float) -> str:
    seconds = max(days * 86400, 0)
    for unit, span in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= span:
            n = int(seconds // span)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return "just now"


def _shown(path: Any) -> str:
    """``path`` relative to the current folder when it is under it, else as it is."""
    import os
    from pathlib import Path

    p = Path(path)
    try:
        return os.path.relpath(p) if p.is_relative_to(Path.cwd()) else str(p)
    except ValueError:
        return str(p)


def _needed_text(run: Any) -> str:
    dirs = sorted({_shown(d) for ds in run.needed.values() for d in ds})
    return ", ".join(dirs) if dirs else "-"


def _list(runs: list[Any], store: Any, console: Any) -> None:
    t = Table(title=f"checkpoint store {escape(str(store))}", title_justify="left")
    for col, justify in (("run id", "left"), ("size", "right"), ("age", "right"), ("checkpoints", "right"),
                         ("needed by (--resume, final adapter)", "left")):
        t.add_column(col, justify=justify, no_wrap=col == "run id")  # type: ignore[arg-type]
    for r in runs:
        t.add_row(escape(r.run_id), _size(r.size_bytes), _age(r.age_days()), str(len(r.checkpoints)),
                  escape(_needed_text(r)))
    console.print(t)
    console.print(f"{len(runs)} store runs, {_size(sum(r.size_bytes for r in runs))} in all. Remove with "
                  "`sailrl clean RUN_ID...`, `--older-than DAYS` or `--all` (add --dry-run to see first).")


def run(args: argparse.Namespace) -> int:
    console = make_console(highlight=False, soft_wrap=True)
    store = store_dir()
    selecting = bool(args.run_ids) or args.older_than is not None or args.all
    if args.all and (args.run_ids or args.older_than is not None):
        print("sailrl clean: error: --all removes every store run; give it alone, without RUN_ID or --older-than",
              file=sys.stderr)
        return 2
    for given in args.runs:
        problem = _folder_problem(given)
        if problem:
            print(f"sailrl clean: error: --runs {_clip(given)}: {problem}", file=sys.stderr)
            return 2
    runs = list_store(store, find_run_directories(args.runs, store))
    if not runs:
        console.print(f"the checkpoint store {store} is empty: nothing to clean")
        return 0
    if not selecting:
        _list(runs, store, console)
        return 0
    by_id = {r.run_id: r for r in runs}
    resolved_ids = []
    for given in args.run_ids:  # a run id, or a prefix of exactly one
        matches = [i for i in by_id if i.startswith(given)]
        resolved_ids.append(matches[0] if given not in by_id and len(matches) == 1 else given)
    args.run_ids = resolved_ids
    unknown = [i for i in args.run_ids if i not in by_id]
    if unknown:
        hint = did_you_mean_text(unknown[0], list(by_id))
        print(f"sailrl clean: no store run {unknown[0]!r} in {store}{hint} (`sailrl clean` lists them)",
              file=sys.stderr)
        return 1
    chosen = [r for r in runs if args.all or r.run_id in args.run_ids
              or (args.older_than is not None and r.age_days() > args.older_than)]
    if not chosen:
        console.print(f"no store run is older than {args.older_than:g} days: nothing to remove")
        return 0
    verb = "would remove" if args.dry_run else "removed"
    freed = 0
    for removal in plan_removals(chosen, force=args.force):
        r = removal.run
        freed += removal.freed_bytes if args.dry_run else remove(removal)
        if removal.whole:
            console.print(f"{verb} {r.run_id} ({_size(removal.freed_bytes)}, {_age(r.age_days())} old)")
        else:
            keep = "; ".join(f"{p} ({', '.join(map(_shown, r.needed[p]))} can --resume from it)"
                            for p in removal.kept)
            console.print(f"{verb} {len(removal.paths)} checkpoints and archives of {r.run_id} "
                          f"({_size(removal.freed_bytes)}); kept {keep}. --force removes it too")
    console.print(f"{'would free' if args.dry_run else 'freed'} {_size(freed)}")
    return 0


def _folder_problem(path: str) -> str | None:
    """Why ``path`` cannot be a folder of run directories (missing, not a folder, a name too long), or None."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{exc.strerror or exc}; give a run directory, or a folder of run directories"
    except ValueError:  # a NUL byte
        return "not a path"
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder; give a run directory, or a folder of run directories"
    return None


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else f"{text[:n]}... ({len(text):,} characters)"
