"""Helpers several ``sailrl`` subcommands share: colour choice, printing spec problems, lenient spec loading,
per-rule score tables."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, TextIO

from sailrl.compiler.reward_checks import is_example_error
from sailrl.compiler.validate import problems
from sailrl.spec.errors import SpecErrors, format_problems
from sailrl.spec.loader import read_spec_file


def use_color(choice: str, stream: TextIO) -> bool:
    """Whether to colour output on ``stream`` for --color ``choice`` (auto/always/never; honours NO_COLOR)."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def spec_missing(path: str) -> bool:
    """True when nothing exists at ``path`` (a path the file system refuses, e.g. too long, is not "missing")."""
    try:
        return not Path(path).exists()
    except OSError:
        return False


def print_warnings(loaded: Any, color: bool, stream: TextIO | None = None) -> None:
    """Print ``loaded.warnings`` (a validated spec's warnings) as a report, when there are any: each with its
    source line, hint and code (``sailrl validate``)."""
    if loaded.warnings:
        print(format_problems(loaded.warnings, loaded.text, color=color), file=stream or sys.stderr)
        print(file=stream or sys.stderr)


def say_warnings(warnings: list[Any], spec_path: str, stream: TextIO | None = None) -> None:
    """Print ``warnings`` one line each (``file:line:col: warning: key: message [code]``) and where to read them in
    full: for the commands that go on to do something else (``compile``, ``run``, ``rewards``, ``explain``), so a
    spec's warnings take a line each there and ``sailrl validate`` shows their source lines and hints."""
    if not warnings:
        return
    out = stream or sys.stderr
    for w in warnings:
        print(f"{w.headline()} [{w.code}]" if w.code else w.headline(), file=out)
    print(f"(sailrl validate {spec_path} shows each warning with its line and what to do)", file=out)


def load_spec_lenient(path: str, color: bool) -> Any:
    """The validated :class:`~sailrl.spec.schema.Spec` at ``path``, or None after printing its problems.

    A spec whose only errors are its worked ``examples:`` disagreeing still loads (the problems are printed
    first): that is when scoring completions by hand helps most. Warnings are printed one line each
    (:func:`say_warnings`) and do not stop it.
    """
    try:
        text, digest = read_spec_file(path)
    except SpecErrors as exc:
        print(exc.format(color=color), file=sys.stderr)
        return None
    loaded, found = problems(text, path, path=Path(path), sha256=digest)
    errors = [e for e in found if not e.is_warning]
    if errors:
        print(format_problems(errors, loaded.text, color=color), file=sys.stderr)
    say_warnings([e for e in found if e.is_warning], path)
    if not errors:
        return loaded.spec
    if loaded.spec is None or not all(is_example_error(e) for e in errors):
        return None
    print("(the reward examples disagree; scoring anyway)\n", file=sys.stderr)
    return loaded.spec


def _quoted(text: str) -> str:
    """Text in quotes as typed (backslashes single), line breaks shown as ⏎."""
    return "'" + text.replace("\r\n", "\n").replace("\n", "⏎") + "'"


def print_score_tables(fn: Any, results: list[tuple], not_checked: dict[str, str] | None = None) -> None:
    """One table per ``(item, fields, reference problem, score, traces)``: rule | result | score | why, and the total;
    then the completion text and the reference answer (``sailrl rewards``, ``sailrl sample``). A judge rule in
    ``not_checked`` (rule -> why its judge was not called) shows as not checked, never as failed, and the total
    as not known."""
    not_checked = not_checked or {}
    # lazy: rich takes a while to import; validate imports this module and prints no table
    from rich.markup import escape
    from rich.table import Table  # lazy: see above

    from sailrl.runtime.loop.console import make_console  # lazy: rich only when printing

    console = make_console(highlight=False)
    for i, (item, fields, problem, score, traces) in enumerate(results, 1):
        text = item["completion"]
        shown = text if len(text) <= 200 else text[:197] + "..."
        flags = []
        if item.get("truncated"):
            flags.append("cut off at max_tokens")
        if item.get("num_tokens") is not None:
            flags.append(f"{item['num_tokens']} tokens")
        title = f"completion {i}" + (f" ({', '.join(flags)})" if flags else "")
        table = Table(title=escape(title), title_justify="left", show_lines=False)
        table.add_column("rule")
        table.add_column("result")
        table.add_column("score", justify="right")
        table.add_column("why", overflow="fold")
        for t in traces:
            if t.name in not_checked:
                table.add_row(escape(t.name), "[yellow]not checked[/]", "",
                              escape(f"needs the judge: {not_checked[t.name]}"))
                continue
            result = "[green]pass[/]" if t.passed else "[red]fail[/]"
            table.add_row(escape(t.name), result, f"{t.contribution:g}", escape(t.why))
        table.add_section()
        if not_checked:
            names = ", ".join(f"'{n}'" for n in not_checked)
            table.add_row("[bold]total[/]", "", "[bold]not known[/]", escape(f"judge rule {names} not checked"))
        else:
            table.add_row("[bold]total[/]", "", f"[bold]{score.total:g}[/]", "")
        console.print(table)
        console.print(f"  text: {escape(_quoted(shown))}")
        ref = fn.reference_answer(fields)
        if ref is not None:
            console.print(f"  reference answer: {escape(_quoted(ref))}")
        if problem is not None:
            console.print(f"  [red]reference problem:[/] {escape(problem)} (training skips such rows)")
        if score.timeouts:
            console.print(f"  [yellow]{score.timeouts} regex evaluation(s) hit the time limit[/]")
        for name, v in getattr(score, "judge", {}).items():  # judge rules: the judge's answer, the score taken
            if name in not_checked:
                continue
            taken = f"score taken <score>{v.label}</score>" if v.kind == "ok" else f"no score: {v.problem}"
            console.print(f"  judge '{escape(name)}' ({escape(taken)}; {v.prompt_tokens} + {v.output_tokens} "
                          f"tokens) answered: {escape(_quoted(v.answer[:600]))}")
        console.print()
    if len(results) > 1:
        mean = sum(r[3].total for r in results) / len(results)
        line = f"{len(results)} completions, mean total {'not known' if not_checked else f'{mean:.4g}'}"
        corrects = [r[3].correct for r in results if r[3].correct is not None]
        if corrects:
            line += f", correct {sum(corrects)}/{len(corrects)}"
        console.print(line)
