"""``sailrl show RUN_DIR``: print a step's logged rollouts (``rollouts.jsonl``) as readable tables.

For one step (default: the last logged step) it prints a summary line (rollouts and groups logged, mean reward,
degenerate groups, truncated rollouts, the sampler checkpoint and its staleness), one line per rule (mean score,
how many passed), then each rollout: its completion text and every rule's verdict (score, passed, why), with
total, advantage, tokens and truncation.

Options: ``--step N``; ``--kind train|eval`` (default train, or eval when only eval was logged); ``--best`` /
``--worst`` sort by total, or by one rule's score with ``--rule NAME`` (rollouts without that score go last);
``--rule NAME`` shows only that rule's verdicts and does not filter rollouts out (``--rule NAME --worst`` lists
its failures first); ``--limit K`` rollouts (default 8, ``all``). Each rollout's prompt is shown, shortened to
its start and end when longer than :data:`PROMPT_CHARS` characters; ``--prompt`` shows it whole, ``--no-prompt``
leaves it out.

Text from the model is shown literally: rich markup is not interpreted and control characters (ESC, CR, bidi
overrides, zero-width characters) are printed as escapes. Colour only on a terminal (and never with NO_COLOR);
piped output is plain text. Exit codes: 0 shown; 1 not a run directory (missing, a file, no config.json), no
rollouts logged, no such step or kind, unknown rule (with a did-you-mean); 2 usage error.

A run of a method that samples no rollouts (``method: sft`` or ``dpo``) is shown by its steps' metrics instead:
how the method's metrics moved (first to last, the held-out ones from before training), then a table of the first
step, every step that measured the held-out rows and the last (``--step N``: every metric of that step). A
distillation run's rollouts are shown as an RL run's, with the step's reverse KL to the teacher; its groups all
train, so none is called degenerate, and the advantage shown is the rules' part of each token's advantage.
"""

from __future__ import annotations

import argparse
import sys
import unicodedata
from typing import Any

from rich import box
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from sailrl.runtime.loop.console import panel_expand
from sailrl.runtime.rundir.directory import CONFIG_FILE, METRICS_FILE, RunDirectory, RunFileError
from sailrl.runtime.rundir.method_logs import method_keys, run_method
from sailrl.runtime.rundir.rollout_log import ROLLOUTS_FILE, logged_steps, read_rollouts
from sailrl.spec.errors import UserError
from sailrl.spec.messages import did_you_mean_text
from sailrl.spec.methods import METHOD_WORDS

DEFAULT_LIMIT = 8
#: A prompt longer than this (characters) is shown as its first PROMPT_HEAD and last PROMPT_TAIL characters.
PROMPT_CHARS = 600
PROMPT_HEAD = 150
PROMPT_TAIL = 350


def shorten_prompt(text: str) -> str:
    """``text`` when at most :data:`PROMPT_CHARS` long, else its start and end around a line saying how much was
    left out (the end holds the question; the start, a system prompt or instructions)."""
    if len(text) <= PROMPT_CHARS:
        return text
    cut = len(text) - PROMPT_HEAD - PROMPT_TAIL
    return (f"{text[:PROMPT_HEAD]}\n[... {cut:,} characters left out; --prompt shows the whole prompt ...]\n"
            f"{text[-PROMPT_TAIL:]}")


def _limit(value: str) -> int | None:
    if value == "all":
        return None
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 or 'all', got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 or 'all', got {value!r}")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory holding rollouts.jsonl")
    p.add_argument("--step", type=int, metavar="N", help="the step to show (default: the last logged step)")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--best", action="store_true", help="highest total (or --rule score) first")
    order.add_argument("--worst", action="store_true", help="lowest total (or --rule score) first")
    p.add_argument("--rule", metavar="NAME", help="show only this rule's verdicts; --best/--worst sort by its score")
    p.add_argument("--kind", choices=["train", "eval"], help="train or eval rollouts (default: train)")
    p.add_argument("--limit", type=_limit, default=DEFAULT_LIMIT, metavar="K",
                   help=f"how many rollouts to print (default {DEFAULT_LIMIT}; 'all' for every one)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--prompt", dest="prompt", action="store_const", const="whole", default="short",
                       help=f"print each rollout's prompt whole (default: shortened past {PROMPT_CHARS} characters)")
    shown.add_argument("--no-prompt", dest="prompt", action="store_const", const="none",
                       help="leave the prompts out")


class ShowError(UserError):
    """A plain one-line reason ``show`` cannot print what was asked."""

    code = "E220"


def visible(text: str) -> str:
    """``text`` with control and format characters (ESC, CR, bidi overrides, zero-width) written as ``\\xNN`` /
    ``\\uNNNN`` escapes; newlines and tabs kept. Model output can never drive the terminal it is shown on."""
    out = []
    for ch in text:
        if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co"):
            out.append(ch)
        else:
            o = ord(ch)
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)


def _num(v: Any, fmt: str = ".3f") -> str:
    return "-" if not isinstance(v, (int, float)) or isinstance(v, bool) else format(v, fmt)


def _ranges(steps: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    runs: list[list[int]] = []
    for s in sorted(steps):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


_GIVE_RUN_DIR = "give the folder a run wrote, e.g. runs/quickstart next to the spec (output.run_dir)"


def choose(run_dir: Any, step: int | None, kind: str | None) -> tuple[int, str, list[dict[str, Any]]]:
    """(step, kind, records) to show. Raises :class:`ShowError` with the reason in plain words."""
    from pathlib import Path

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        if run_dir.exists():
            raise ShowError(f"{run_dir} is a file, not a run directory: {_GIVE_RUN_DIR}")
        raise ShowError(f"{run_dir}: no such run directory")
    if not (run_dir / ROLLOUTS_FILE).exists():
        if not (run_dir / CONFIG_FILE).is_file():
            raise ShowError(f"{run_dir} is not a run directory (it has no {CONFIG_FILE}): {_GIVE_RUN_DIR}")
        raise ShowError(f"{run_dir} has no {ROLLOUTS_FILE}: this run logged no rollouts "
                        "(output.log_rollouts is 0, or no step has finished yet)")
    steps = logged_steps(run_dir)
    if not steps["train"] and not steps["eval"]:
        raise ShowError(f"{run_dir / ROLLOUTS_FILE} holds no complete step yet")
    kind = kind or ("train" if steps["train"] else "eval")
    if not steps[kind]:
        other = "eval" if kind == "train" else "train"
        raise ShowError(f"{run_dir / ROLLOUTS_FILE} has no {kind} rollouts; {other} steps logged: "
                        f"{_ranges(steps[other])}")
    if step is None:
        step = steps[kind][-1]
    elif step not in steps[kind]:
        raise ShowError(f"{run_dir / ROLLOUTS_FILE} has no {kind} rollouts for step {step}; "
                        f"{kind} steps logged: {_ranges(steps[kind])}")
    records = read_rollouts(run_dir, step=step, kind=kind)
    if not records:
        raise ShowError(f"{run_dir / ROLLOUTS_FILE}: the {kind} rollouts of step {step} could not be read")
    return step, kind, records


def order(records: list[dict[str, Any]], *, best: bool, worst: bool, rule: str | None) -> list[dict[str, Any]]:
    """Logged order, or by total / ``rule``'s score (best: highest first); missing scores go last, ties keep
    logged order."""
    if not (best or worst):
        return list(records)

    def value(r: dict[str, Any]) -> float | None:
        v = (r.get("rules") or {}).get(rule, {}).get("score") if rule else r.get("total")
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    known = [r for r in records if value(r) is not None]
    known.sort(key=lambda r: value(r), reverse=best)  # sort is stable, also reversed
    return known + [r for r in records if value(r) is None]


def rule_names(records: list[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for r in records:
        for name in r.get("rules") or {}:
            names.setdefault(name, None)
    return list(names)


def _summary(step: int, kind: str, records: list[dict[str, Any]], rules: list[str],
             method: str = "rl") -> list[str]:
    groups: dict[Any, bool | None] = {}
    for r in records:  # a distillation trains every group: the teacher tells rollouts of equal reward apart
        degenerate = r.get("degenerate") if method != "distill" else None
        groups[r.get("group")] = degenerate if isinstance(degenerate, bool) else None
    totals = [r["total"] for r in records if _is_num(r.get("total"))]
    mean = sum(totals) / len(totals) if totals else None
    truncated = sum(1 for r in records if r.get("truncated"))
    samplers: dict[Any, Any] = {}
    for r in records:
        samplers.setdefault(r.get("sampler_path"), (r.get("sampler_step"), r.get("staleness")))
    if len(samplers) == 1:
        (path, (s_step, stale)), = samplers.items()
        sampler = (f"sampler checkpoint {visible(str(path))} (policy step {_num(s_step, 'd')}, "
                   f"staleness {_num(stale, 'd')})")
    else:
        sampler = f"{len(samplers)} sampler checkpoints: " + ", ".join(
            f"{visible(str(p))} (step {_num(s, 'd')})" for p, (s, _) in samplers.items())
    lines = [
        f"step {step} ({kind}): {len(records)} rollouts in {len(groups)} groups, mean reward {_num(mean)}",
        (f"degenerate groups: {sum(v is True for v in groups.values())} of {len(groups)}; "
         if any(v is not None for v in groups.values()) else "") + f"truncated: {truncated} of {len(records)}",
        sampler,
    ]
    for name in rules:
        scores = [(r.get("rules") or {}).get(name, {}) for r in records]
        values = [s["score"] for s in scores if _is_num(s.get("score"))]
        verdicts = [s.get("passed") for s in scores if isinstance(s.get("passed"), bool)]
        text = f"  {visible(name)}: mean {_num(sum(values) / len(values) if values else None)}"
        if verdicts:
            text += f", passed {sum(verdicts)} of {len(verdicts)}"
        lines.append(text)
    return lines


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _episode(console: Any, episode: dict[str, Any]) -> None:
    """Every turn of an episode: assistant text and its tool calls, tool results (errors marked), feedback."""
    turns = [t for t in episode.get("turns") or [] if isinstance(t, dict)]
    for n, t in enumerate(turns, 1):
        role = str(t.get("role", ""))
        text = visible(str(t.get("text") or ""))
        if role == "assistant":
            title = f"turn {n} · assistant"
            body = Text(text) if text else Text("(empty)", style="dim")
            for c in t.get("tool_calls") or []:
                body.append(f"\n→ tool call {visible(str(c.get('name')))}({visible(str(c.get('arguments')))})",
                            style="cyan")
        elif role == "tool":
            title = f"turn {n} · tool {visible(str(t.get('name', '')))}" + (" · error" if t.get("error") else "")
            body = Text(text, style="red" if t.get("error") else "")
        else:
            title = f"turn {n} · feedback" if role == "user" else f"turn {n} · {visible(role)}"
            body = Text(text, style="yellow")
        console.print(Panel(body, title=title, title_align="left", box=box.SQUARE, expand=panel_expand(console)))
    replies = sum(1 for t in turns if t.get("role") == "assistant")  # what environment.max_turns counts
    console.print(Text(f"episode ended: {visible(str(episode.get('end', '')))} after {replies} model "
                       f"turn{'' if replies == 1 else 's'}"))


def render(console: Any, step: int, kind: str, records: list[dict[str, Any]], *, best: bool = False,
           worst: bool = False, rule: str | None = None, limit: int | None = DEFAULT_LIMIT,
           show_prompt: str = "short", method: str = "rl", step_metrics: dict[str, Any] | None = None) -> None:
    """Print the summary and the rollouts of one step on a rich ``console``. ``method``: the run's; a
    distillation's summary adds the step's reverse KL from ``step_metrics`` (its ``metrics.jsonl`` line)."""
    rules = [rule] if rule else rule_names(records)
    for line in _summary(step, kind, records, rule_names(records) if rule is None else [rule], method):
        console.print(Text(line))
    if method == "distill" and kind == "train":
        kl = (step_metrics or {}).get("distill/reverse_kl")
        console.print(Text(f"reverse KL to the teacher: {_num(kl)} nats per sampled token (distill/reverse_kl)"))
        console.print(Text("distillation: every group trains; the advantage shown is the rules' part"))
    shown = order(records, best=best, worst=worst, rule=rule)
    if limit is not None:
        shown = shown[:limit]
    how = "in logged order" if not (best or worst) else (
        f"{'best' if best else 'worst'} first by {f'rule {rule!r}' if rule else 'total'}")
    more = "" if len(shown) == len(records) else " (--limit K or --limit all for more)"
    console.print(Text(f"showing {len(shown)} of {len(records)} rollouts, {how}{more}"))
    several_samplers = len({r.get("sampler_path") for r in records}) > 1
    name_width = max((len(visible(n)) for n in rules), default=4)  # the same columns in every rollout's table
    for r in shown:
        head = (f"group {r.get('group')} · sample {r.get('sample')} · row {visible(str(r.get('row')))}"
                f" · total {_num(r.get('total'))} · advantage {_num(r.get('advantage'), '+.3f')}"
                f" · {_num(r.get('num_tokens'), 'd')} tokens")
        if r.get("truncated"):
            head += " · truncated"
        if r.get("degenerate") and method != "distill":
            head += " · degenerate group"
        if several_samplers:
            head += f" · sampler step {_num(r.get('sampler_step'), 'd')}"
        console.print()
        console.print(Text(f"── {head}", style="bold"))
        if show_prompt != "none":
            prompt = str(r.get("prompt") or "")
            prompt = prompt if show_prompt == "whole" else shorten_prompt(prompt)
            console.print(Panel(Text(visible(prompt)), title="prompt", title_align="left",
                                box=box.SQUARE, style="dim", expand=panel_expand(console)))
        if r.get("reference") is not None:
            console.print(Text(f"reference: {visible(str(r.get('reference')))}"))
        episode = r.get("episode")
        if isinstance(episode, dict):
            _episode(console, episode)
        completion = str(r.get("completion") or "")
        console.print(Panel(Text(visible(completion)) if completion else Text("(empty)", style="dim"),
                            title="scored text" if isinstance(episode, dict) else "completion", title_align="left",
                            box=box.SQUARE, expand=panel_expand(console)))
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
        table.add_column("rule", min_width=name_width)
        table.add_column("score", justify="right", min_width=6)
        table.add_column("passed", min_width=6)
        table.add_column("why", overflow="fold")
        verdicts = r.get("rules") or {}
        for name in rules:
            v = verdicts.get(name)
            if v is None:
                table.add_row(Text(visible(name)), "-", "-", Text("(not scored)", style="dim"))
                continue
            passed = v.get("passed")
            mark = (Text("yes", style="green") if passed is True else Text("NO", style="red bold")
                    if passed is False else Text("-"))
            table.add_row(Text(visible(name)), _num(v.get("score")), mark, Text(visible(str(v.get("why") or ""))))
        console.print(table)
        for name in rules:  # judge rules: the judge's own answer, and the score taken from it
            v = verdicts.get(name) or {}
            if "judge" in v:
                taken = v.get("judge_score") or ""
                title = f"judge '{visible(name)}'" + (f": score taken <score>{visible(taken)}</score>" if taken
                                                      else ": no score read")
                answer = str(v.get("judge") or "")
                console.print(Panel(Text(visible(answer)) if answer else Text("(no answer)", style="dim"),
                                    title=title, title_align="left", box=box.SQUARE,
                                    expand=panel_expand(console)))


def _method_of(run_dir: Any) -> str:
    """The run's method (``"rl"`` when ``run_dir`` is no run directory: :func:`choose` says why)."""
    from pathlib import Path

    if not (Path(run_dir) / CONFIG_FILE).is_file():
        return "rl"
    try:
        return run_method(run_dir)
    except (ValueError, RunFileError) as exc:
        raise ShowError(f"{Path(run_dir) / CONFIG_FILE} cannot be read: {exc}") from None


def _step_line(metrics: list[dict[str, Any]], step: int) -> dict[str, Any]:
    return next((m for m in reversed(metrics) if m.get("step") == step), {})


def steps_view(run_dir: Any, method: str, step: int | None) -> list[str]:
    """The lines ``show`` prints for a run that logs no rollouts (SFT, DPO): how its method's metrics moved, then
    the first step, the steps that measured the held-out rows and the last, one row each (``step``: every metric
    of that step). Raises :class:`ShowError` when no step is logged or ``step`` is not."""
    metrics = [m for m in RunDirectory(run_dir).read_metrics()
               if isinstance(m.get("step"), int) and not isinstance(m.get("step"), bool)]
    if not metrics:
        raise ShowError(f"{run_dir}/{METRICS_FILE} holds no step yet: this {method} run logs each step's metrics "
                        "there when the step ends")
    steps = sorted({m["step"] for m in metrics})
    head = (f"{run_dir}: method {method} ({METHOD_WORDS[method]}), {len(steps)} steps logged "
            f"({_ranges(steps)}); it samples no rollouts, so these are its steps' metrics")
    if step is not None:
        if step not in steps:
            raise ShowError(f"{run_dir}/{METRICS_FILE} has no step {step}; steps logged: {_ranges(steps)}")
        line = _step_line(metrics, step)
        width = max(len(k) for k in line)
        return [head, f"step {step}:"] + [f"  {k.ljust(width)}  {_num(v, '.4g') if _is_num(v) else visible(str(v))}"
                                          for k, v in sorted(line.items()) if k not in ("step", "schema")]
    keys = [k for k in method_keys(method) if any(_is_num(m.get(k)) for m in metrics)]
    lines = [head]
    for key in keys:
        seen = [(m["step"], m[key]) for m in metrics if _is_num(m.get(key))]
        start = next((m[key + "_start"] for m in metrics if _is_num(m.get(key + "_start"))), None)
        first = f"{start:.3f} (before training)" if start is not None else f"{seen[0][1]:.3f} (step {seen[0][0]})"
        lines.append(f"  {key}: {first} -> {seen[-1][1]:.3f} (step {seen[-1][0]})")
    shown = sorted({steps[0], steps[-1]} | {m["step"] for m in metrics
                                            if any(k.startswith("eval/") for k in m)})
    columns = ["step", *keys, "tokens/trained", "learning_rate"]
    rows = [columns] + [[str(s)] + [_num(_step_line(metrics, s).get(k), ".4g") for k in columns[1:]]
                        for s in shown]
    width = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines.append(f"the first step, the last and the {len(shown) - 2 if len(shown) > 2 else 0} in between that "
                 "measured the held-out rows (--step N for every metric of one step):")
    lines += ["  " + "  ".join(r[i].rjust(width[i]) for i in range(len(columns))).rstrip() for r in rows]
    return lines


def run(args: argparse.Namespace) -> int:
    from sailrl.runtime.loop.console import make_console  # lazy: rich only when printing

    try:
        method = _method_of(args.run_dir)
        if method in ("sft", "dpo"):
            asked = [o for o, v in (("--rule", args.rule), ("--best", args.best), ("--worst", args.worst),
                                    ("--kind", args.kind)) if v]
            if asked:
                raise ShowError(f"{asked[0]}: this {method} run samples no rollouts to sort or score; "
                                "`sailrl show RUN_DIR` prints its steps' metrics (--step N: one step's)")
            for line in steps_view(args.run_dir, method, args.step):
                print(line)
            return 0
        step, kind, records = choose(args.run_dir, args.step, args.kind)
        if args.rule is not None:
            names = rule_names(records)
            if args.rule not in names:
                hint = did_you_mean_text(args.rule, names)
                raise ShowError(f"no rule '{visible(args.rule)}' in the {kind} rollouts of step {step}{hint} "
                                f"(rules logged: {', '.join(map(visible, names)) or 'none'})")
    except ShowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    console = make_console(highlight=False, emoji=False, markup=False)
    step_metrics = _step_line(RunDirectory(args.run_dir).read_metrics(), step) if method == "distill" else None
    render(console, step, kind, records, best=args.best, worst=args.worst, rule=args.rule, limit=args.limit,
           show_prompt=args.prompt, method=method, step_metrics=step_metrics)
    return 0
