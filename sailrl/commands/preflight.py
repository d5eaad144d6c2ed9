"""``sailrl preflight SPEC``: check data, prompts and (optionally) base-policy rewards before training.

Reports rows loaded and skipped (and why), the train / eval split, the first prompts exactly as the model sees
them with their reference answers, prompt token lengths against the context window and ``max_tokens``, the
reward formula, the whole run's token and cost estimate, and with ``--sample N`` the base policy's reward per
rule, degenerate groups and truncated completions, ending with a plain-words verdict. The report is built by
``sailrl.preflight.build_report`` (for ``method: sft`` and ``dpo``, ``sailrl.preflight_methods``: the
conversations or pairs, their token lengths and the estimate; ``--sample`` says what the run samples instead);
:func:`render_report` prints it.

The run directories the spec starts from are read as ``sailrl run SPEC`` reads them before its first step
(``training.init_from``'s, S261 / S262 at the key; a distillation teacher's): a run that would stop there is not
ready.

``--set KEY=VALUE`` overrides spec values as ``sailrl run`` does (checked like ``sailrl validate``). ``--sample``
samples the spec's model where it can (see ``sailrl.preflight.plan_sampling``); a remote model without
its key is replaced by ``sailrl/tiny`` on the embedded backend, and the report says so.

Exit codes: 0 ready (warnings allowed); 1 invalid spec, unusable data or a blocking problem (e.g. a reward that
cannot vary, every sampled group degenerate); 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from sailrl.compiler.validate import validate_file
from sailrl.launch import build_spec
from sailrl.runtime.loop.console import panel_expand
from sailrl.runtime.rundir.directory import RunDirectory, RunFileError
from sailrl.runtime.rundir.init_from import InitFromError, resolve_init_from
from sailrl.spec.errors import ConfigError, SpecErrors


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the spec YAML file")
    p.add_argument("--sample", type=int, default=0, metavar="N",
                   help="sample N groups (training.group_size rollouts each) from the base policy and score them")
    p.add_argument("--sampler", choices=("auto", "local", "tinker", "sail"), default="auto",
                   help="where --sample samples: auto (default: a local model here; a remote model on Tinker when "
                        "TINKER_API_KEY is set, else sailrl/tiny here as a stand-in), local (the embedded "
                        "backend), tinker (TINKER_API_KEY) or sail (SAIL_API_KEY)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec value by dotted key (VALUE is YAML), e.g. --set model.name=sailrl/tiny")
    p.add_argument("--show", type=int, default=3, metavar="K",
                   help="how many prompts, skipped rows and sampled completions to show (default 3)")
    p.add_argument("--judge", action="store_true",
                   help="with --sample: call the judge models of kind: judge rules (keys needed) on the sampled "
                        "completions; without it only local judges are called and the other judge rules are shown "
                        "as not checked")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


def _with_overrides(loaded: Any, overrides: list[str], spec_dir: Any) -> Any:
    """The spec with ``--set`` overrides, checked as ``sailrl run`` checks them (raises ValueError / SpecErrors)."""
    return build_spec(loaded.spec.resolved(), overrides, spec_dir)


def _overridden(key: str, overrides: list[str]) -> bool:
    keys = [o.partition("=")[0] for o in overrides]
    return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in keys)


def run(args: argparse.Namespace) -> int:
    if args.sample < 0 or args.show < 0:
        print("sailrl preflight: error: --sample and --show must be >= 0", file=sys.stderr)
        return 2
    import json

    color = sys.stderr.isatty()
    try:
        loaded = validate_file(args.spec)
    except SpecErrors as exc:
        print(exc.format(color=color), file=sys.stderr)
        return 1
    spec_dir = Path(args.spec).resolve().parent
    spec = loaded.spec
    if args.overrides:
        try:
            spec = _with_overrides(loaded, args.overrides, spec_dir)
        except ValueError as exc:
            print(f"sailrl preflight: error: {exc}", file=sys.stderr)
            return 2
        except SpecErrors as exc:
            print(exc.format(color=color), file=sys.stderr)
            print("(these come from the --set overrides: " + " ".join(args.overrides) + ")", file=sys.stderr)
            return 1

    # lazy: sailrl.preflight loads torch and transformers (seconds); an invalid spec is reported first
    from sailrl.preflight import PreflightError
    from sailrl.preflight_methods import report_for  # lazy: see above

    # lazy: the runtime loads after the spec validates
    from sailrl.runtime.backends.judge_clients import judge_connector

    try:
        report = report_for(spec, spec_dir, sample=args.sample, show=args.show,
                            sampler=None if args.sampler == "auto" else args.sampler, spec_path=args.spec,
                            loaded=loaded, spec_warnings=[] if args.overrides else loaded.warnings,
                            judges=judge_connector(spec_dir, every=args.judge))
    except PreflightError as exc:
        print(f"sailrl preflight: {exc}", file=sys.stderr)
        return 1
    report["overrides"] = list(args.overrides)
    located = _run_directory_problems(spec, spec_dir, loaded, args.overrides, report)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        from sailrl.runtime.loop.console import make_console  # lazy: rich only when printing a report

        data = report.get("data") or {}
        if data.get("error") and data.get("key") and not _overridden(data["key"], args.overrides):
            print(SpecErrors([loaded.error(data["key"], data["error"], code="S227")], loaded.text).format(color=color),
                  file=sys.stderr)
        if located:
            print(SpecErrors(located, loaded.text).format(color=color), file=sys.stderr)
        render_report(report, make_console(highlight=False))
    return 1 if report["blocking"] else 0


def _run_directory_problems(spec: Any, spec_dir: Any, loaded: Any, overrides: list[str],
                            report: dict[str, Any]) -> list[Any]:
    """The run directories the spec reads before its first step, checked as ``sailrl run SPEC`` checks them:
    ``training.init_from``'s (a finished run of this model, LoRA rank and backend: S261 / S262) and a distillation
    teacher's (``distill.teacher.checkpoint``: a run that saved an adapter). Each problem is added to ``report``
    as an error (its verdict redone); returns the ones located in the file, for the terminal."""
    from sailrl.preflight import _finish, _problem  # lazy: loads torch and transformers, as in run()
    from sailrl.runtime.distillation.teacher import teacher_checkpoint  # lazy: loads torch and tinker

    located, found = [], []
    init_from = spec.training.init_from
    if init_from:
        m = spec.model
        try:
            resolve_init_from(init_from, spec_dir, model=m.name, lora_rank=m.lora_rank,
                              local=spec.sampling.sampler == "local")
        except InitFromError as exc:
            found.append((f"training.init_from: {exc.message}", exc.hint))
            if not _overridden("training.init_from", overrides):
                located.append(loaded.error(("training", "init_from"), exc.message, exc.hint, code=exc.problem))
    if spec.method == "distill" and spec.distill is not None:
        teacher = spec.distill.teacher
        try:
            teacher_checkpoint(teacher.checkpoint, spec_dir)
        except ConfigError as exc:
            found.append((str(exc), None))
        else:
            trained = _run_model(teacher.checkpoint, spec_dir)
            if trained is not None and trained != teacher.name:
                found.append((f"distill.teacher.checkpoint: the run in {teacher.checkpoint} trained {trained}, not "
                              f"distill.teacher.name {teacher.name}: its adapter loads only into {trained}",
                              f"set distill.teacher.name: {trained}"))
    if found:
        report["problems"] += [_problem("error", message, fix) for message, fix in found]
        _finish(report)
    return located


def _run_model(checkpoint: str | None, spec_dir: Path) -> str | None:
    """The model a run directory named as a checkpoint trained (its ``config.json``), or None (a service's path,
    a config that does not say)."""
    if checkpoint is None or "://" in checkpoint:
        return None
    folder = Path(checkpoint) if Path(checkpoint).is_absolute() else spec_dir / checkpoint
    try:
        config = RunDirectory(folder).read_config()
    except (RunFileError, ValueError):
        return None
    spec = config.get("spec") if isinstance(config, dict) else None
    model = spec.get("model") if isinstance(spec, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return name if isinstance(name, str) else None


# ------------------------------------------------------------------------------------------------ rendering


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def render_report(report: dict[str, Any], console: Any) -> None:
    """Print a ``build_report`` report for people with rich: tables for data, prompts, tokens, rewards, the
    sampled base policy and the cost estimate, then the problems and the verdict."""
    overrides = report.get("overrides") or []
    console.print(f"[bold]preflight[/bold] {escape(str(report.get('spec') or report['name']))}  "
                  f"(model {escape(report['model'])})" + (f"  with --set {escape(' '.join(overrides))}"
                                                          if overrides else ""))
    data = report.get("data") or {}
    if data and "error" not in data:  # a data error is listed with the problems below
        t = Table(title="data", show_header=False, title_justify="left")
        t.add_row("source", escape(data["source"]))
        t.add_row("columns", escape(", ".join(data["columns"])))
        t.add_row("rows", f"{data['loaded']} in the split, {data['selected']} selected")
        t.add_row("train / eval", f"{data['train']} / {data['eval']}")
        t.add_row("skipped", str(data["skipped"]["count"]))
        console.print(t)
        if data["skipped"]["count"]:
            s = Table(title="skipped rows by reason", title_justify="left")
            s.add_column("count", justify="right")
            s.add_column("reason")
            s.add_column("rows (first)")
            for item in data["skipped"]["by_reason"]:
                s.add_row(str(item["count"]), escape(item["reason"]), ", ".join(map(str, item["rows"])))
            console.print(s)
    for p in report.get("prompts") or []:
        tokens = f", {p['tokens']} tokens" if p.get("tokens") is not None else ""
        if "subtitle" in p:  # a conversation or a pair (method sft / dpo): what it trains, under it
            console.print(Panel(escape(p["text"]), title=f"{p['label']}: row {p['index']}{tokens}",
                                title_align="left", expand=panel_expand(console)))
            console.print(f"  {escape(p['subtitle'])}")
            continue
        console.print(Panel(escape(p["text"]), title=f"prompt: row {p['index']}{tokens}",
                            subtitle=f"reference: {escape(repr(p['reference']))}", title_align="left",
                            subtitle_align="left", expand=panel_expand(console)))
    if report.get("stop"):
        console.print(f"stop sequences: {escape(', '.join(map(str, report['stop'])))}")
    tok = report.get("tokens")
    if tok:
        ctx = f"{tok['context']} ({escape(tok['context_source'])})" if tok["context"] else escape(tok["context_source"])
        too_long = (f"; {tok['skipped_too_long']} rows skipped as too long" if tok.get("skipped_too_long") else "")
        max_tokens = f"; max_tokens {tok['max_tokens']}" if tok.get("max_tokens") is not None else ""
        console.print(f"{tok.get('what', 'prompt tokens')}: min {tok['min']}, median {_fmt(tok['median'])}, max "
                      f"{tok['max']} over {tok['measured_rows']} rows{max_tokens}; context {ctx}{too_long}")
    reward = report.get("reward") or {}
    if reward:
        console.print("[bold]reward[/bold]")
        for line in reward["formula"]:
            console.print(f"  {escape(line)}")
    sample = report.get("sample")
    if sample:
        _render_sample(sample, console)
    cost = report.get("cost")
    if cost:
        console.print(f"[bold]run estimate[/bold] {escape(cost['summary'])}")
        for line in cost["lines"]:
            console.print(f"  {escape(line)}")
    for p in report["problems"]:
        style = {"error": "red bold", "warning": "yellow"}.get(p["severity"], "cyan")
        console.print(f"[{style}]{p['severity']}:[/{style}] {escape(p['message'])}")
        if p.get("fix"):
            console.print(f"  [cyan]fix:[/cyan] {escape(p['fix'])}")
    style = "red bold" if report["blocking"] else "green bold"
    console.print(f"[{style}]{escape(report['verdict'])}[/{style}]")


def _render_sample(sample: dict[str, Any], console: Any) -> None:
    if sample.get("note"):
        console.print(f"[yellow]note:[/yellow] {escape(sample['note'])}")
    t = Table(title=f"base policy of {escape(sample.get('model') or '')}: {sample['groups']} groups x "
                    f"{sample['group_size']} rollouts ({sample['sampler']})", title_justify="left")
    t.add_column("rule")
    t.add_column("passed", justify="right")
    t.add_column("mean contribution", justify="right")
    for name, r in sample["rules"].items():
        if r.get("not_checked"):
            t.add_row(escape(name), "[yellow]not checked[/yellow]", "(needs the judge: see the warning below)")
            continue
        t.add_row(escape(name), f"{r['passed']} of {sample['completions']}", _fmt(r["mean"]))
    tot = sample["total"]
    t.add_row("[bold]total[/bold]", "", f"{_fmt(tot.get('mean'))} (min {_fmt(tot.get('min'))}, "
                                        f"max {_fmt(tot.get('max'))})")
    console.print(t)
    console.print(f"degenerate groups: {_pct(sample['degenerate_fraction'])}; truncated completions: "
                  f"{_pct(sample['truncated_fraction'])}; failed groups: {len(sample['failed_groups'])}")
    for ex in sample["examples"]:
        console.print(f"  row {ex['index']}: {escape(repr(ex['completion']))} -> {_fmt(ex['total'])}"
                      + (" (truncated)" if ex["truncated"] else "")
                      + (" (judge rules not checked count at their fail score)" if sample.get("not_checked") else ""))
