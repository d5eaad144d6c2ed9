"""``sailrl preflight``: what a run would train on, checked before any training.

:func:`build_report` returns a JSON-able report (a dict):

- ``data``: rows loaded / selected / used for training and evaluation, rows skipped and why (counts by reason and
  the first few rows), the source and its columns.
- ``prompts``: the first ``show`` prompts exactly as the model sees them (the rendered tokens decoded back to text),
  with the reference answer each is graded against.
- ``tokens``: prompt length in tokens (min / median / max over the training rows) against the model's context
  window and ``sampling.max_tokens``.
- ``reward``: the reward formula in words, its possible range, and whether it is constant (every completion gets
  the same total, so every group is degenerate and the run learns nothing -- detected from the rules alone).
- ``sample`` (with ``sample > 0``): ``sample`` groups of ``training.group_size`` rollouts from the BASE policy
  (the LoRA adapter freshly initialised), rolled out and scored by the same code the training loop uses
  (``sailrl.runtime.rollout``): per-rule mean contribution and pass rate, the total's distribution, the fraction
  of degenerate groups (every rollout of the group got the same total) and of truncated completions.
- ``problems``: ``{"severity": "error" | "warning", "message", "fix"}``; ``blocking``: True when any is an error
  (the command then exits 1); ``verdict``: one plain-words line.

The default sampler is the embedded local backend (no keys); ``sampler="tinker"`` / ``"sail"`` sample the base
model remotely and need their API keys.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CONTEXT_WINDOWS",
    "PreflightError",
    "build_report",
    "check_sampler",
    "constant_reward",
    "context_window",
    "render_report",
]

# Context windows (tokens) of models we can vouch for, from their model cards. Others report "unknown";
# sailrl/tiny and local model folders read max_position_embeddings from their config.
CONTEXT_WINDOWS: dict[str, int] = {
    "Qwen/Qwen3-8B": 32768,  # Qwen3-8B model card: "32,768 natively"
    "meta-llama/Llama-3.1-8B": 131072,  # Llama 3.1 model card: 128k context
    "meta-llama/Llama-3.1-8B-Instruct": 131072,
    "moonshotai/Kimi-K2-Instruct": 131072,  # Kimi K2 model card: 128K context
}

SHOW_SKIPPED = 5


class PreflightError(Exception):
    """Preflight cannot run as asked (e.g. a sampler without its key). One plain line."""


# ------------------------------------------------------------------------------------------------ pieces


def context_window(model_name: str, spec_dir: Path | None = None) -> tuple[int | None, str]:
    """``(tokens, where the number comes from)``; ``(None, reason)`` when unknown.

    ``sailrl/tiny``: its config's ``max_position_embeddings``; a local model folder: its ``config.json``
    ``max_position_embeddings``; otherwise :data:`CONTEXT_WINDOWS`.
    """
    from sailrl.runtime.models import is_tiny

    if is_tiny(model_name):
        from sailrl.runtime.local.tiny import TINY_CONFIG

        return int(TINY_CONFIG["max_position_embeddings"]), "sailrl/tiny config max_position_embeddings"
    folder = Path(model_name).expanduser()
    if not folder.is_absolute() and spec_dir is not None and (spec_dir / folder).is_dir():
        folder = spec_dir / folder
    config = folder / "config.json"
    if config.is_file():
        try:
            value = json.loads(config.read_text()).get("max_position_embeddings")
        except (OSError, ValueError):
            value = None
        if isinstance(value, int):
            return value, f"{config} max_position_embeddings"
    if model_name in CONTEXT_WINDOWS:
        return CONTEXT_WINDOWS[model_name], "model card (sailrl's table)"
    return None, f"unknown for {model_name} (not in sailrl's table)"


def constant_reward(spec: Any) -> float | None:
    """The total every completion gets when the reward cannot vary, else None.

    Each rule contributes its pass score or its fail score (``RuleBase.scores()``); the total is their sum,
    clipped to ``reward.clip``. The reward is constant when every pass/fail combination gives the same total
    (e.g. every weight is 0, or the clip range is a single point). With more than 16 rules only the per-rule
    test (pass == fail for every rule) is made.
    """
    scores = [r.scores() for r in spec.reward.rules]
    clip = spec.reward.clip

    def total(values: Sequence[float]) -> float:
        t = float(sum(values))
        return min(max(t, clip[0]), clip[1]) if clip is not None else t

    if len(scores) > 16:
        return total([p for p, _ in scores]) if all(p == f for p, f in scores) else None
    totals = {round(total(combo), 12) for combo in itertools.product(*scores)}
    return totals.pop() if len(totals) == 1 else None


def _problem(severity: str, message: str, fix: str | None = None) -> dict[str, Any]:
    return {"severity": severity, "message": message, "fix": fix}


def _skipped_section(skipped: Sequence[Any]) -> dict[str, Any]:
    by_reason: dict[str, list[Any]] = {}
    for s in skipped:
        by_reason.setdefault(s.reason, []).append(s)
    return {
        "count": len(skipped),
        "by_reason": [
            {"reason": reason, "count": len(items), "rows": [s.index for s in items[:SHOW_SKIPPED]]}
            for reason, items in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))
        ],
        "first": [{"index": s.index, "split": s.split, "reason": s.reason,
                   "row": {k: v for k, v in s.row.items() if k != "_index"}} for s in skipped[:SHOW_SKIPPED]],
    }


def _load_text_tools(spec: Any, spec_dir: Path) -> tuple[Any, Any, str | None]:
    """(tokenizer, renderer, problem): a problem string when the tokenizer cannot be loaded (e.g. offline)."""
    from sailrl.runtime.models import get_renderer, get_tokenizer
    from sailrl.spec.renderers import default_renderer

    name = spec.model.name
    folder = spec_dir / name
    if not Path(name).is_absolute() and folder.is_dir():
        name = str(folder)
    try:
        renderer_name = spec.model.renderer or default_renderer(spec.model.name, spec_dir)
    except ValueError as exc:
        return None, None, str(exc)
    try:
        tokenizer = get_tokenizer(name)
    except Exception as exc:  # noqa: BLE001 -- OSError offline, ValueError for odd names: reported, not raised
        return None, None, f"cannot load the tokenizer of {spec.model.name} ({type(exc).__name__}: {exc})"
    return tokenizer, get_renderer(renderer_name, tokenizer), None


def _decode(tokenizer: Any, tokens: Sequence[int]) -> str:
    return str(tokenizer.decode(list(tokens)))


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": statistics.fmean(values), "min": min(values),
            "median": statistics.median(values), "max": max(values),
            "std": statistics.pstdev(values) if len(values) > 1 else 0.0}


# ------------------------------------------------------------------------------------------------ sampling


def check_sampler(spec: Any, sampler: str, spec_path: str | None = None) -> None:
    """Raise :class:`PreflightError` (one plain line) when ``sampler`` cannot sample the spec's base model:
    an unknown sampler, a missing API key, or a model the embedded backend cannot run. Checked before anything
    slow (a tokenizer download) starts."""
    import os

    from sailrl.runtime.backends import BackendError, check_keys
    from sailrl.spec.renderers import is_local_model

    where = spec_path or "SPEC"
    if sampler not in ("local", "tinker", "sail"):
        raise PreflightError(f"unknown sampler {sampler!r}: use local, tinker or sail")
    if sampler == "sail":  # the base model itself on Sail: no LoRA checkpoint, so no Tinker key
        if not os.environ.get("SAIL_API_KEY"):
            raise PreflightError(f"SAIL_API_KEY is not set: --sampler sail needs it. Export it, or sample on the "
                                 f"embedded backend: sailrl preflight {where} --sample N --sampler local")
        return
    if sampler == "local" and not is_local_model(spec.model.name, None):
        raise PreflightError(
            f"the embedded backend runs sailrl/tiny or a local model folder, not {spec.model.name}. Sample the "
            f"base model remotely: sailrl preflight {where} --sample N --sampler tinker (TINKER_API_KEY) or "
            f"--sampler sail (SAIL_API_KEY)")
    try:
        check_keys(sampler, spec_path)
    except BackendError as exc:
        raise PreflightError(str(exc).replace("sailrl run", "sailrl preflight")) from None


async def _base_policy(spec: Any, sampler: str, workdir: Path, spec_path: str | None) -> tuple[Any, Any]:
    """(policy, tokenizer or None): a TokenCompleter sampling the base model (fresh LoRA) on ``sampler``.

    Same calls as the training loop's first step: a LoRA training client, ``save_weights_for_sampler``, a
    sampling client for that checkpoint (local / tinker); on Sail the base model with no adapter.
    """
    from sailrl.runtime.backends import open_backend
    from sailrl.runtime.rollout import SamplingPolicy

    check_sampler(spec, sampler, spec_path)
    s = spec.sampling
    m = spec.model
    if sampler == "sail":
        try:
            from sailrl.runtime.sail_adapter import AdaptiveSailCompleter as Completer
        except ImportError:  # pragma: no cover - older tree
            from sail import SailTokenCompleter as Completer
        return Completer(model=m.name, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                         completion_window=s.completion_window), None
    backend = open_backend(spec, sampler=sampler, checkpoint_dir=workdir, spec_path=spec_path)
    service = backend.service_client
    training_client = await service.create_lora_training_client_async(
        base_model=m.name, rank=m.lora_rank, seed=m.seed, train_mlp=m.train_mlp, train_attn=m.train_attn,
        train_unembed=m.train_unembed)
    fut = await training_client.save_weights_for_sampler_async(f"{spec.name}-preflight-base")
    path = (await fut.result_async()).path
    client = await service.create_sampling_client_async(model_path=path)
    tokenizer = training_client.get_tokenizer() if backend.is_local else None
    return SamplingPolicy(client, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p), tokenizer


async def _sample(spec: Any, rows: list[dict], policy: Any, builder: Any, renderer: Any, reward_fn: Any) -> Any:
    from sailrl.runtime.rollout import RuleGroupBuilder, rollout_groups

    stop = spec.sampling.stop or builder.stop_sequences()
    builders = [RuleGroupBuilder(row=row, model_input=builder.model_input(row), stop=stop, renderer=renderer,
                                 reward_fn=reward_fn, group_size=spec.training.group_size) for row in rows]
    return await rollout_groups(policy, builders)


def _sample_section(spec: Any, batch: Any, reward_fn: Any, tokenizer: Any, show: int) -> dict[str, Any]:
    rule_names = list(reward_fn.rule_names)
    contributions: dict[str, list[float]] = {n: [] for n in rule_names}
    passes: dict[str, list[bool]] = {n: [] for n in rule_names}
    totals: list[float] = []
    truncated: list[bool] = []
    degenerate = 0
    lengths: list[int] = []
    examples: list[dict[str, Any]] = []
    for group, row in zip(batch.groups, batch.rows, strict=True):
        group_totals = [float(t) for t in group.get_total_rewards()]
        if len(set(group_totals)) == 1:
            degenerate += 1
        for traj, total in zip(group.trajectories_G, group_totals, strict=True):
            totals.append(total)
            tr = traj.transitions[0]
            lengths.append(len(tr.ac.tokens))
            truncated.append(bool(tr.metrics.get("truncated", 0.0)))
            for n in rule_names:
                value = float(tr.metrics.get(f"reward/{n}", 0.0))
                contributions[n].append(value)
                passes[n].append(value == reward_fn.pass_fail_scores(n)[0])
            if len(examples) < show:
                text = tr.logs.get("completion") if tr.logs else None
                if text is None and tokenizer is not None:
                    text = _decode(tokenizer, tr.ac.tokens)
                examples.append({"index": row.get("_index"), "completion": text, "total": total,
                                 "truncated": truncated[-1],
                                 "contributions": {n: contributions[n][-1] for n in rule_names}})
    n_groups = len(batch.groups)
    return {
        "groups": n_groups,
        "group_size": spec.training.group_size,
        "failed_groups": [{"index": i, "error": e} for i, e in batch.failed],
        "rules": {n: {"mean": statistics.fmean(contributions[n]) if contributions[n] else None,
                      "pass_rate": sum(passes[n]) / len(passes[n]) if passes[n] else None,
                      "pass_score": reward_fn.pass_fail_scores(n)[0],
                      "fail_score": reward_fn.pass_fail_scores(n)[1]} for n in rule_names},
        "total": _stats(totals),
        "distinct_totals": sorted(set(totals)),
        "degenerate_fraction": degenerate / n_groups if n_groups else None,
        "truncated_fraction": sum(truncated) / len(truncated) if truncated else None,
        "completion_tokens": _stats(lengths),
        "examples": examples,
    }


def _sample_problems(spec: Any, sample: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if sample["groups"] == 0:
        first = sample["failed_groups"][0]["error"] if sample["failed_groups"] else "no rows"
        out.append(_problem("error", f"every sampled group failed (first error: {first})",
                            "check the sampler and its keys, then run preflight again"))
        return out
    frac_deg = sample["degenerate_fraction"]
    frac_trunc = sample["truncated_fraction"] or 0.0
    warm = spec.training.warmup
    has_warmup = warm is not None and warm.steps > 0
    fixes: list[str] = []
    never = [n for n, r in sample["rules"].items() if r["pass_rate"] == 0 and r["pass_score"] != r["fail_score"]]
    always = [n for n, r in sample["rules"].items() if r["pass_rate"] == 1 and r["pass_score"] != r["fail_score"]]
    if frac_trunc > 0.5:
        fixes.append(f"{frac_trunc:.0%} of completions hit sampling.max_tokens ({spec.sampling.max_tokens}); "
                     f"raise it")
    if never:
        teach = ("a longer supervised warm-up (training.warmup.steps)" if has_warmup
                 else "a supervised warm-up (training.warmup) that teaches it")
        fixes.append(f"no completion passed {', '.join(repr(n) for n in never)}: loosen the rule (check it with "
                     f"`sailrl rewards`), ask for the format in the prompt, or add {teach}")
    if always:
        fixes.append(f"every completion passed {', '.join(repr(n) for n in always)}, so it adds no signal")
    if spec.sampling.temperature < 0.7:
        fixes.append(f"sampling.temperature is {spec.sampling.temperature}; a higher temperature gives more "
                     f"varied groups")
    fix = "; ".join(fixes) or "make the task easier for the base model or add a supervised warm-up"
    if frac_deg == 1.0:
        msg = (f"every one of the {sample['groups']} sampled groups is degenerate (all {sample['group_size']} "
               f"rollouts of a group got the same reward), so the base policy gives no gradient")
        if has_warmup:
            out.append(_problem("warning", msg + f"; the spec's supervised warm-up ({warm.steps} steps) runs "
                                "before RL and may change that", fix))
        else:
            out.append(_problem("error", msg + ": RL from this model would learn nothing", fix))
    elif frac_deg is not None and frac_deg >= 0.5:
        out.append(_problem("warning", f"{frac_deg:.0%} of sampled groups are degenerate (no gradient from "
                            f"them)", fix))
    elif frac_trunc > 0.5:
        out.append(_problem("warning", f"{frac_trunc:.0%} of completions were cut off at sampling.max_tokens",
                            fixes[0]))
    return out


# ------------------------------------------------------------------------------------------------ report


def build_report(spec: Any, spec_dir: Path | str, *, sample: int = 0, show: int = 3, sampler: str = "local",
                 spec_path: str | None = None, loaded: Any = None, policy: Any = None,
                 max_rows_measured: int = 5000) -> dict[str, Any]:
    """Check the spec's data, prompts and reward (and, with ``sample`` > 0, the base policy's rewards).

    spec: a validated Spec. spec_dir: the spec file's folder. show: prompts / skipped rows / completions to
    include. sampler: "local" (default), "tinker" or "sail". loaded: the ``LoadedSpec`` (to locate dataset
    problems in the file). policy: a TokenCompleter to sample from instead of opening a backend (tests).

    Returns the report dict (see the module docstring). Raises :class:`PreflightError` when sampling cannot
    start (unknown sampler, missing key, a model the embedded backend cannot run).
    """
    from sailrl.runtime.data import DatasetError, load_rows, rows_for_step, shuffle_seed
    from sailrl.runtime.prompts import PromptBuilder, PromptError
    from sailrl.runtime.rewards import RewardFunction

    spec_dir = Path(spec_dir)
    if sample > 0 and policy is None:
        check_sampler(spec, sampler, spec_path)
    report: dict[str, Any] = {"spec": spec_path, "name": spec.name, "model": spec.model.name}
    problems: list[dict[str, Any]] = []
    report["problems"] = problems

    reward_fn = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field)
    const = constant_reward(spec)
    low, high = reward_fn.bounds()
    report["reward"] = {"formula": reward_fn.explain(), "min": low, "max": high, "constant": const}
    if const is not None:
        problems.append(_problem(
            "error",
            f"the reward is {const:g} for every completion whatever the model writes (each rule's pass and fail "
            f"contributions give the same total), so every group is degenerate and the run would learn nothing",
            "give at least one rule a non-zero weight (or different pass_score / fail_score), or widen reward.clip"))

    try:
        rows = load_rows(spec, spec_dir, reward_fn)
    except DatasetError as exc:
        where = loaded.locate(exc.key) if (loaded is not None and exc.key) else None
        problems.append(_problem("error", str(exc), None))
        report["data"] = {"error": str(exc), "key": exc.key,
                          "location": list(where) if where else None}
        return _finish(report)
    train, evals = rows.train, rows.eval
    report["data"] = {
        "source": rows.source, "columns": rows.columns, "loaded": rows.loaded, "selected": rows.selected,
        "train": len(train), "eval": len(evals), "skipped": _skipped_section(rows.skipped), "notes": rows.notes,
    }
    for note in rows.notes:
        problems.append(_problem("warning", note))
    if rows.skipped:
        top = report["data"]["skipped"]["by_reason"][0]
        problems.append(_problem(
            "warning", f"{len(rows.skipped)} of {rows.selected} rows are skipped (most often: {top['reason']}, "
            f"{top['count']} rows, e.g. row {top['rows'][0]})", "fix those rows, or map the right columns"))
    t = spec.training
    if len(train) < t.groups_per_step:
        problems.append(_problem("warning", f"only {len(train)} training rows for {t.groups_per_step} groups per "
                                 f"step: every step repeats rows"))
    if t.eval_every > 0 and not evals:
        problems.append(_problem("warning", "training.eval_every is set but there are no evaluation rows",
                                 "add dataset.eval (split, count or fraction)"))

    tokenizer, renderer, tool_problem = _load_text_tools(spec, spec_dir)
    seed = shuffle_seed(spec)
    first_rows = rows_for_step(train, 0, min(max(show, 1), len(train)), seed, reshuffle=spec.dataset.shuffle)
    if tool_problem is not None:
        problems.append(_problem("warning", tool_problem + "; prompts are shown as text and token lengths are "
                                 "unknown", "run preflight where the model's tokenizer can be downloaded"))
        builder = PromptBuilder(spec.prompt, None, field_names=None)
        report["prompts"] = [{"index": r["_index"], "text": _messages_text(builder.messages(r)), "tokens": None,
                              "reference": _reference(reward_fn, spec, r)} for r in first_rows[:show]]
        report["tokens"] = None
    else:
        builder = PromptBuilder(spec.prompt, renderer)
        shown = []
        for r in first_rows[:show]:
            tokens = builder.model_input(r).to_ints()
            shown.append({"index": r["_index"], "text": _decode(tokenizer, tokens), "tokens": len(tokens),
                          "reference": _reference(reward_fn, spec, r)})
        report["prompts"] = shown
        report["stop"] = [repr(s) if isinstance(s, str) else s
                          for s in (spec.sampling.stop or builder.stop_sequences())]
        report["tokens"] = _token_section(spec, spec_dir, train[:max_rows_measured], builder, problems)

    report["sample"] = None
    if sample > 0:
        if renderer is None and policy is None:
            problems.append(_problem("error", "cannot sample without the model's tokenizer and renderer"))
            return _finish(report)
        rows_to_sample = rows_for_step(train, 0, sample, seed, reshuffle=spec.dataset.shuffle)
        try:
            batch, sample_tokenizer = asyncio.run(_run_sampling(spec, rows_to_sample, sampler, spec_path, policy,
                                                                builder, renderer, reward_fn))
        except PromptError as exc:  # pragma: no cover - rows were checked at load
            problems.append(_problem("error", str(exc)))
            return _finish(report)
        section = _sample_section(spec, batch, reward_fn, tokenizer or sample_tokenizer, show)
        section["sampler"] = sampler if policy is None else "custom"
        report["sample"] = section
        problems.extend(_sample_problems(spec, section))
    return _finish(report)


async def _run_sampling(spec: Any, rows: list[dict], sampler: str, spec_path: str | None, policy: Any,
                        builder: Any, renderer: Any, reward_fn: Any) -> tuple[Any, Any]:
    tokenizer = None
    with tempfile.TemporaryDirectory(prefix="sailrl-preflight-") as tmp:
        if policy is None:
            policy, tokenizer = await _base_policy(spec, sampler, Path(tmp), spec_path)
        batch = await _sample(spec, rows, policy, builder, renderer, reward_fn)
    return batch, tokenizer


def _messages_text(messages: list[dict]) -> str:
    return "\n\n".join(f"[{m['role']}] {m['content']}" for m in messages)


def _reference(reward_fn: Any, spec: Any, row: dict) -> Any:
    try:
        ref = reward_fn.reference_answer(row)
    except Exception:  # noqa: BLE001 -- shown for information only
        ref = None
    return ref if ref is not None else row.get(spec.prompt.reference_field)


def _token_section(spec: Any, spec_dir: Path, rows: list[dict], builder: Any,
                   problems: list[dict[str, Any]]) -> dict[str, Any]:
    lengths = [builder.model_input(r).length for r in rows]
    context, source = context_window(spec.model.name, spec_dir)
    max_tokens = spec.sampling.max_tokens
    section: dict[str, Any] = {
        "measured_rows": len(lengths), "min": min(lengths), "median": statistics.median(lengths),
        "max": max(lengths), "context": context, "context_source": source, "max_tokens": max_tokens,
    }
    if context is None:
        section["rows_over"] = None
        return section
    over = sum(1 for n in lengths if n + max_tokens > context)
    section["rows_over"] = over
    if min(lengths) >= context:
        problems.append(_problem("error", f"even the shortest prompt ({min(lengths)} tokens) fills the model's "
                                 f"context window ({context} tokens)", "shorten the prompt template"))
    elif over:
        problems.append(_problem(
            "warning", f"{over} of {len(lengths)} prompts plus sampling.max_tokens ({max_tokens}) do not fit the "
            f"context window ({context} tokens; longest prompt {max(lengths)} tokens): their completions may be "
            f"cut short", f"lower sampling.max_tokens to {max(1, context - max(lengths))} or shorten the prompts"))
    return section


def _finish(report: dict[str, Any]) -> dict[str, Any]:
    problems = report["problems"]
    errors = [p for p in problems if p["severity"] == "error"]
    warnings_ = [p for p in problems if p["severity"] == "warning"]
    report["blocking"] = bool(errors)
    if errors:
        report["verdict"] = f"not ready: {errors[0]['message']}" + (f" -- {errors[0]['fix']}" if errors[0]["fix"]
                                                                    else "")
    elif warnings_:
        report["verdict"] = f"ready, with {len(warnings_)} warning{'s' if len(warnings_) > 1 else ''}"
    else:
        report["verdict"] = "ready: no problems found"
    return report


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
    """Print ``report`` for people with rich (tables for data, prompts, tokens, rewards, problems)."""
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    console.print(f"[bold]preflight[/bold] {escape(str(report.get('spec') or report['name']))}  "
                  f"(model {escape(report['model'])})")
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
        console.print(Panel(escape(p["text"]), title=f"prompt: row {p['index']}{tokens}",
                            subtitle=f"reference: {escape(repr(p['reference']))}", title_align="left",
                            subtitle_align="left"))
    if report.get("stop"):
        console.print(f"stop sequences: {escape(', '.join(map(str, report['stop'])))}")
    tok = report.get("tokens")
    if tok:
        ctx = f"{tok['context']} ({escape(tok['context_source'])})" if tok["context"] else escape(tok["context_source"])
        console.print(f"prompt tokens: min {tok['min']}, median {_fmt(tok['median'])}, max {tok['max']} over "
                      f"{tok['measured_rows']} rows; max_tokens {tok['max_tokens']}; context {ctx}")
    reward = report.get("reward") or {}
    if reward:
        console.print("[bold]reward[/bold]")
        for line in reward["formula"]:
            console.print(f"  {escape(line)}")
    sample = report.get("sample")
    if sample:
        t = Table(title=f"base policy: {sample['groups']} groups x {sample['group_size']} rollouts "
                        f"({sample['sampler']})", title_justify="left")
        t.add_column("rule")
        t.add_column("pass rate", justify="right")
        t.add_column("mean contribution", justify="right")
        for name, r in sample["rules"].items():
            t.add_row(escape(name), _fmt(r["pass_rate"]), _fmt(r["mean"]))
        tot = sample["total"]
        t.add_row("[bold]total[/bold]", "", f"{_fmt(tot.get('mean'))} (min {_fmt(tot.get('min'))}, "
                                            f"max {_fmt(tot.get('max'))})")
        console.print(t)
        console.print(f"degenerate groups: {_pct(sample['degenerate_fraction'])}; truncated completions: "
                      f"{_pct(sample['truncated_fraction'])}; failed groups: {len(sample['failed_groups'])}")
        for ex in sample["examples"]:
            console.print(f"  row {ex['index']}: {escape(repr(ex['completion']))} -> {_fmt(ex['total'])}"
                          + (" (truncated)" if ex["truncated"] else ""))
    for p in report["problems"]:
        style = "red bold" if p["severity"] == "error" else "yellow"
        console.print(f"[{style}]{p['severity']}:[/{style}] {escape(p['message'])}")
        if p.get("fix"):
            console.print(f"  [cyan]fix:[/cyan] {escape(p['fix'])}")
    style = "red bold" if report["blocking"] else "green bold"
    console.print(f"[{style}]{escape(report['verdict'])}[/{style}]")
