"""``sailrl preflight``: what a run would train on, checked before any training (the report; the command prints it).

:func:`build_report` returns a JSON-able report (a dict):

- ``data``: rows loaded / selected / used for training and evaluation, rows skipped and why (counts by reason and
  the first few rows; a prompt too long for the model's context is one of the reasons), the source and columns.
- ``prompts``: the first ``show`` prompts exactly as the model sees them (the rendered tokens decoded back to text),
  with the reference answer each is graded against.
- ``tokens``: prompt length in tokens (min / median / max over the training rows) against the model's context
  window and ``sampling.max_tokens``.
- ``reward``: the reward formula in words, its possible range, and whether it is constant (every completion gets
  the same total, so every group is degenerate and the run learns nothing -- detected from the rules alone).
- ``sample`` (with ``sample > 0``): ``sample`` groups of ``training.group_size`` rollouts from the BASE policy
  (the LoRA adapter freshly initialised), rolled out and scored by the same code the training loop uses
  (``sailrl.runtime.rollouts.rollout``): per-rule mean contribution and pass rate, the total's distribution, the fraction
  of degenerate groups (every rollout of the group got the same total) and of truncated completions.
  ``stand_in`` is set when the spec's model could not be sampled and :data:`STAND_IN_MODEL` was sampled instead
  (:func:`plan_sampling`); its rewards then draw no verdict.
- ``cost``: the whole run's tokens and cost as ranges (``sailrl.runtime.planning.cost.estimate_run``), from the measured
  prompt lengths and, when the spec's own model was sampled, the sampled completion lengths (else 1 to
  ``max_tokens`` tokens per completion).
- ``problems``: ``{"severity": "error" | "warning", "message", "fix", "short"}``; ``blocking``: True when any is
  an error (the command then exits 1); ``verdict``: one plain-words line naming the problems.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, constants

from sailrl.runtime.backends.backend import BackendError, check_keys, open_backend
from sailrl.runtime.backends.judge_clients import not_checked
from sailrl.runtime.backends.models import get_renderer, get_tokenizer
from sailrl.runtime.backends.role_colon_tools import RoleColonToolsRenderer
from sailrl.runtime.backends.sail import AdaptiveSailCompleter
from sailrl.runtime.data import DatasetError, load_rows, rows_for_step, shuffle_seed
from sailrl.runtime.data.rows import group_by_reason
from sailrl.runtime.planning.cost import estimate_run, fmt_usd
from sailrl.runtime.prompts import PromptBuilder, with_tool_declaration
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.runtime.rollouts.episode import ToolLoadError, build_tools, close_tools, episode_group_builder, tool_specs
from sailrl.runtime.rollouts.rollout import RuleGroupBuilder, SamplingPolicy, rollout_groups
from sailrl.runtime.tools.sailbox import sail_key_problem
from sailrl.spec.errors import ModelError, UserError
from sailrl.spec.models import TINY_MODEL_NAME, classify, context_window, default_renderer
from sailrl.spec.rewards import RewardSpec
from sailrl.spec.schema import Spec

__all__ = [
    "STAND_IN_MAX_TOKENS",
    "STAND_IN_MODEL",
    "PreflightError",
    "SamplingPlan",
    "build_report",
    "check_sampler",
    "constant_reward",
    "plan_sampling",
]

SHOW_SKIPPED = 5
#: What preflight samples when the spec's model is remote and cannot be sampled (no key, or --sampler local).
STAND_IN_MODEL = TINY_MODEL_NAME
#: The stand-in's completions are capped at this many tokens: they check the pipeline, not the model.
STAND_IN_MAX_TOKENS = 64
HUB_PROBE_TIMEOUT_S = 5.0


class PreflightError(UserError):
    """Preflight cannot run as asked (e.g. a sampler without its key). One plain line."""

    code = "E123"


# ------------------------------------------------------------------------------------------------ pieces


def constant_reward(spec: Spec) -> float | None:
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


def _problem(severity: str, message: str, fix: str | None = None, short: str | None = None) -> dict[str, Any]:
    """A problem; ``short`` is its few-word form for the verdict (default: the message)."""
    return {"severity": severity, "message": message, "fix": fix, "short": short or message}


def _skipped_section(skipped: Sequence[Any]) -> dict[str, Any]:
    return {
        "count": len(skipped),
        "by_reason": [{"reason": reason, "count": len(items), "rows": [s.index for s in items[:SHOW_SKIPPED]]}
                      for reason, items in group_by_reason(skipped)],
        "first": [{"index": s.index, "split": s.split, "reason": s.reason, "kind": s.kind,
                   "row": {k: v for k, v in s.row.items() if k != "_index"}} for s in skipped[:SHOW_SKIPPED]],
    }


def _warning_short(w: Any) -> str:
    """A spec warning's few words for the verdict: what it is (``rule 'correct' can be gamed``), not a generic
    "looks unusual" (kept for W101, a value outside its usual range)."""
    if w.code == "W101" or not w.message:
        return f"{w.key_path or 'the spec'} looks unusual"
    first = w.message.split("\n", 1)[0]
    for sep in (" -- ", ": ", "; ", " ("):
        first = first.split(sep, 1)[0]
    return first if len(first) <= 80 else first[:77] + "..."


def _hub_unreachable(model_name: str) -> str | None:
    """Why the hub cannot serve ``model_name``'s tokenizer right now (None: try loading it).

    One metadata request with a :data:`HUB_PROBE_TIMEOUT_S` timeout, so an offline machine is told in seconds
    instead of after a minute of download retries. ``HF_HUB_OFFLINE`` set: None (the cache is used).
    """
    if constants.HF_HUB_OFFLINE:
        return None
    try:
        HfApi().model_info(model_name, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 -- DNS, refused, timeout, 401/404: all mean "not from the hub now"
        return f"the Hugging Face hub did not answer for it ({type(exc).__name__})"
    return None


def _load_text_tools(spec: Spec, spec_dir: Path) -> tuple[Any, Any, str | None]:
    """(tokenizer, renderer, problem): a problem string when they cannot be loaded (e.g. offline)."""
    name = spec.model.name
    try:
        renderer_name = spec.model.renderer or default_renderer(name, spec_dir,
                                                                embedded=spec.sampling.sampler == "local")
    except ValueError as exc:
        return None, None, str(exc)
    if not classify(name, spec_dir).is_local:
        why = _hub_unreachable(name)
        if why is not None:
            return None, None, (f"cannot load the tokenizer of {name}: {why}; with a cached copy, set "
                                f"HF_HUB_OFFLINE=1")
    try:
        tokenizer = get_tokenizer(name, spec_dir)
        return tokenizer, get_renderer(renderer_name, tokenizer), None
    except Exception as exc:  # noqa: BLE001 -- OSError offline, ModelError, ValueError: reported, not raised
        return None, None, f"cannot load the tokenizer of {name} ({type(exc).__name__}: {exc})"


def _decode(tokenizer: Any, tokens: Sequence[int]) -> str:
    return str(tokenizer.decode(list(tokens)))


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": statistics.fmean(values), "min": min(values),
            "median": statistics.median(values), "max": max(values),
            "std": statistics.pstdev(values) if len(values) > 1 else 0.0}


# ------------------------------------------------------------------------------------------------ sampling


@dataclass
class SamplingPlan:
    """What ``--sample`` samples.

    sampler: ``local`` / ``tinker`` / ``sail`` (``custom`` for a policy passed in). spec: the spec to sample with
    (the stand-in spec when ``stand_in``). stand_in: ``{"model", "instead_of", "why", "max_tokens"}`` when the
    spec's model is replaced by :data:`STAND_IN_MODEL`, else None.
    """

    sampler: str
    spec: Spec
    stand_in: dict[str, Any] | None = None

    def note(self) -> str | None:
        """The plain-words line that says which model was sampled instead, or None."""
        s = self.stand_in
        if s is None:
            return None
        return (f"sampled with {s['model']} on the embedded backend instead of {s['instead_of']} ({s['why']}), "
                f"max_tokens capped at {s['max_tokens']}: this checks that prompts render, rollouts run and the "
                f"reward rules score real completions, but the rewards of a tiny model say nothing about "
                f"{s['instead_of']}'s, so they draw no verdict")


def check_sampler(spec: Spec, sampler: str, spec_path: str | None = None) -> None:
    """Raise :class:`PreflightError` (one plain line) when ``sampler`` (``tinker`` / ``sail``) cannot sample:
    an unknown sampler or a missing or malformed API key. Checked before anything slow starts."""
    where = spec_path or "SPEC"
    if sampler not in ("local", "tinker", "sail"):
        raise PreflightError(f"unknown sampler {sampler!r}: use local, tinker or sail")
    if sampler == "sail":  # the base model itself on Sail: no LoRA checkpoint, so no Tinker key
        if not os.environ.get("SAIL_API_KEY"):
            raise PreflightError(f"SAIL_API_KEY is not set: --sampler sail needs it. Export it, or sample on the "
                                 f"embedded backend: sailrl preflight {where} --sample N --sampler local")
        return
    try:
        check_keys(sampler, spec_path)
    except BackendError as exc:
        raise PreflightError(str(exc).replace("sailrl run", "sailrl preflight")) from None


def _declared_tools(spec: Spec, spec_dir: Any, renderer: Any, problems: list) -> list[dict[str, Any]] | None:
    """The tools an episode's prompt declares (counted in the prompt lengths, shown in the prompts), or None:
    no tools, a renderer that cannot declare them (validate says S252), or a tool that cannot load (a problem)."""
    env = getattr(spec, "environment", None)
    if env is None or not env.tools or renderer is None:
        return None
    try:
        specs = tool_specs(env, spec_dir or ".")
        with_tool_declaration(renderer, [{"role": "user", "content": ""}], specs)
    except ToolLoadError as exc:
        problems.append(_problem("error", str(exc), "fix the tool (`sailrl validate` shows where)"))
        return None
    except (NotImplementedError, ModelError):  # a renderer that cannot declare tools: validate says S252
        return None
    return specs


def check_sandbox(spec: Spec) -> None:
    """Raise :class:`PreflightError` when the python tool's code runs in a Sailbox (``environment.sandbox:
    sail``) and this process has no Sail credentials; the episodes of ``--sample`` would call it."""
    env = getattr(spec, "environment", None)
    if env is None or env.sandbox != "sail" or not any(t.builtin == "python" for t in env.tools):
        return
    problem = sail_key_problem()
    if problem:
        raise PreflightError(f"environment.sandbox: sail: {problem}")


def _stand_in_spec(spec: Spec) -> Spec:
    model = spec.model.model_copy(update={"name": STAND_IN_MODEL, "renderer": None})
    sampling = spec.sampling.model_copy(update={"sampler": "local",
                                                "max_tokens": min(spec.sampling.max_tokens, STAND_IN_MAX_TOKENS)})
    return spec.model_copy(update={"model": model, "sampling": sampling})


def plan_sampling(spec: Spec, sampler: str | None, spec_dir: Path | str | None = None,
                  spec_path: str | None = None) -> SamplingPlan:
    """Decide what ``--sample`` samples; raises :class:`PreflightError` before anything slow starts.

    sampler None (auto): a local model (built-in, folder, GGUF file) on the embedded backend; a remote model on
    Tinker when ``TINKER_API_KEY`` is set, else :data:`STAND_IN_MODEL` on the embedded backend (said in
    :meth:`SamplingPlan.note`). ``local``: the embedded backend; a remote model is replaced by the stand-in
    (preflight does not download a hub model). ``tinker`` / ``sail``: that service, which needs its key.
    """
    name = spec.model.name
    local_model = classify(name, spec_dir).is_local
    check_sandbox(spec)
    if sampler in ("tinker", "sail"):
        check_sampler(spec, sampler, spec_path)
        return SamplingPlan(sampler, spec)
    if sampler not in (None, "auto", "local"):
        raise PreflightError(f"unknown sampler {sampler!r}: use local, tinker or sail")
    if local_model:
        return SamplingPlan("local", spec)
    if sampler in (None, "auto") and os.environ.get("TINKER_API_KEY"):
        check_sampler(spec, "tinker", spec_path)  # a malformed key is refused here, in one line
        return SamplingPlan("tinker", spec)
    why = (f"{name} is sampled on Tinker, which needs TINKER_API_KEY" if sampler in (None, "auto") else
           f"--sampler local runs on this machine and {name} is a remote model; to sample it here, download it "
           f"and --set model.name=<its folder>")
    stand_in = {"model": STAND_IN_MODEL, "instead_of": name, "why": why,
                "max_tokens": min(spec.sampling.max_tokens, STAND_IN_MAX_TOKENS)}
    return SamplingPlan("local", _stand_in_spec(spec), stand_in)


async def _base_policy(spec: Spec, sampler: str, workdir: Path, spec_path: str | None) -> tuple[Any, Any]:
    """(policy, tokenizer or None): a TokenCompleter sampling the base model (fresh LoRA) on ``sampler``.

    Same calls as the training loop's first step: a LoRA training client, ``save_weights_for_sampler``, a
    sampling client for that checkpoint (local / tinker); on Sail the base model with no adapter.
    """
    s = spec.sampling
    m = spec.model
    if sampler == "sail":
        return AdaptiveSailCompleter(model=m.name, max_tokens=s.max_tokens, temperature=s.temperature,
                                     top_p=s.top_p, completion_window=s.completion_window), None
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


async def _sample(spec: Spec, rows: list[dict], policy: Any, builder: Any, renderer: Any, reward_fn: Any,
                  spec_dir: Path | str | None = None) -> Any:
    if spec.environment is not None:  # episodes: the same builder the run uses, tools loaded as the run loads them
        tools = build_tools(spec.environment, spec_dir or ".")
        context = context_window(spec.model.name, spec_dir)[0]
        if tools and type(renderer).__name__ == "RoleColonRenderer":  # the stand-in model: role_colon + tool calls
            renderer = RoleColonToolsRenderer(renderer.tokenizer)
            builder = PromptBuilder(spec.prompt, renderer)
        builders: list[Any] = [
            episode_group_builder(spec, row, prompts=builder, renderer=renderer, reward_fn=reward_fn, tools=tools,
                                  group_size=spec.training.group_size, context_window=context) for row in rows]
        try:
            return await rollout_groups(policy, builders)
        finally:
            await close_tools(tools)
    stop = spec.sampling.stop or builder.stop_sequences()
    builders = [RuleGroupBuilder(row=row, model_input=builder.model_input(row), stop=stop, renderer=renderer,
                                 reward_fn=reward_fn, group_size=spec.training.group_size) for row in rows]
    return await rollout_groups(policy, builders)


def _sample_section(spec: Spec, batch: Any, reward_fn: Any, tokenizer: Any, show: int) -> dict[str, Any]:
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
            tr = traj.transitions[-1]  # an episode's verdicts are on its last turn; its length is every turn's
            lengths.append(sum(len(t.ac.tokens) for t in traj.transitions))
            truncated.append(bool(tr.metrics.get("truncated", 0.0)))
            for n in rule_names:
                value = float(tr.metrics.get(f"reward/{n}", 0.0))
                contributions[n].append(value)
                passed = (tr.logs or {}).get(f"passed/{n}")  # the rule's own verdict (weighted python rules too)
                passes[n].append(bool(passed) if passed is not None else value == reward_fn.pass_fail_scores(n)[0])
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
        "completions": len(totals),
        "failed_groups": [{"index": i, "error": e} for i, e in batch.failed],
        "rules": {n: {"mean": statistics.fmean(contributions[n]) if contributions[n] else None,
                      "pass_rate": sum(passes[n]) / len(passes[n]) if passes[n] else None,
                      "passed": sum(passes[n]),
                      "pass_score": reward_fn.pass_fail_scores(n)[0],
                      "fail_score": reward_fn.pass_fail_scores(n)[1]} for n in rule_names},
        "total": _stats(totals),
        "distinct_totals": sorted(set(totals)),
        "degenerate_groups": degenerate,
        "degenerate_fraction": degenerate / n_groups if n_groups else None,
        "truncated_fraction": sum(truncated) / len(truncated) if truncated else None,
        "completion_tokens": _stats(lengths),
        "completion_lengths": lengths,
        "examples": examples,
    }


def _failed_problems(sample: dict[str, Any]) -> list[dict[str, Any]]:
    failed = sample["failed_groups"]
    if sample["groups"] == 0:
        first = failed[0]["error"] if failed else "no rows"
        return [_problem("error", f"every sampled group failed (first error: {first})",
                         "check the sampler and its keys, then run preflight again", "every sampled group failed")]
    if failed:
        return [_problem("warning", f"{len(failed)} of {len(failed) + sample['groups']} sampled groups failed "
                         f"(first: row {failed[0]['index']}: {failed[0]['error']})", None,
                         f"{len(failed)} sampled groups failed")]
    return []


def _rule_problems(sample: dict[str, Any], has_warmup: bool, warm_steps: int) -> list[dict[str, Any]]:
    """A warning for each rule that passed none or all of the sampled completions (it gives no signal)."""
    out: list[dict[str, Any]] = []
    n = sample["completions"]
    later = (f"; the spec's supervised warm-up ({warm_steps} steps) runs before RL and may change that"
             if has_warmup else "")
    for name, r in sample["rules"].items():
        if r["pass_score"] == r["fail_score"] or r["pass_rate"] is None:
            continue
        if r["passed"] == 0:
            teach = ("a longer supervised warm-up (training.warmup.steps)" if has_warmup
                     else "a supervised warm-up (training.warmup) that teaches it")
            out.append(_problem(
                "warning", f"rule {name!r} passed 0 of the {n} sampled completions, so it gives the base policy no "
                f"signal{later}",
                f"check the rule on a few completions with `sailrl rewards`, loosen it, ask for the format in the "
                f"prompt, or add {teach}", f"rule {name!r} never passed (0 of {n})"))
        elif r["passed"] == n:
            out.append(_problem(
                "warning", f"rule {name!r} passed every one of the {n} sampled completions, so it adds the same "
                f"to every rollout and gives no signal",
                "make it stricter if it should separate good from bad completions, or give it weight 0 if it is "
                "only a guard", f"rule {name!r} always passed ({n} of {n})"))
    return out


def _sample_problems(spec: Spec, sample: dict[str, Any]) -> list[dict[str, Any]]:
    out = _failed_problems(sample)
    if sample["groups"] == 0:
        return out
    # method distill: the teacher scores every token, so a group whose rewards are all equal trains too
    frac_deg = 0.0 if spec.method == "distill" else sample["degenerate_fraction"]
    frac_trunc = sample["truncated_fraction"] or 0.0
    warm = spec.training.warmup
    has_warmup = warm is not None and warm.steps > 0
    fixes: list[str] = []
    never = [n for n, r in sample["rules"].items() if r["pass_rate"] == 0 and r["pass_score"] != r["fail_score"]]
    always = [n for n, r in sample["rules"].items() if r["pass_rate"] == 1 and r["pass_score"] != r["fail_score"]]
    if frac_trunc > 0.5:
        fixes.append(f"{frac_trunc:.0%} of completions hit sampling.max_tokens ({spec.sampling.max_tokens}); "
                     f"raise it")
    if never and frac_deg == 1.0:  # below that, each such rule gets its own warning (_rule_problems)
        teach = ("a longer supervised warm-up (training.warmup.steps)" if has_warmup
                 else "a supervised warm-up (training.warmup) that teaches it")
        fixes.append(f"no completion passed {', '.join(repr(n) for n in never)}: loosen the rule (check it with "
                     f"`sailrl rewards`), ask for the format in the prompt, or add {teach}")
    if always and frac_deg == 1.0:
        fixes.append(f"every completion passed {', '.join(repr(n) for n in always)}, so it adds no signal")
    if spec.sampling.temperature < 0.7:
        fixes.append(f"sampling.temperature is {spec.sampling.temperature}; a higher temperature gives more "
                     f"varied groups")
    fix = "; ".join(fixes) or "make the task easier for the base model or add a supervised warm-up"
    if frac_deg == 1.0:
        msg = (f"every one of the {sample['groups']} sampled groups is degenerate (all {sample['group_size']} "
               f"rollouts of a group got the same reward), so the base policy gives no gradient")
        short = f"every sampled group degenerate ({sample['groups']} of {sample['groups']})"
        if has_warmup:
            out.append(_problem("warning", msg + f"; the spec's supervised warm-up ({warm.steps} steps) runs "
                                "before RL and may change that", fix, short))
        else:
            out.append(_problem("error", msg + ": RL from this model would learn nothing", fix))
        return out  # the fix already names the rules that never or always passed
    if frac_deg is not None and frac_deg >= 0.5:
        out.append(_problem("warning", f"{frac_deg:.0%} of sampled groups are degenerate (no gradient from "
                            f"them)", fix, f"{frac_deg:.0%} of sampled groups degenerate"))
    elif frac_trunc > 0.5:
        out.append(_problem("warning", f"{frac_trunc:.0%} of completions were cut off at sampling.max_tokens",
                            fixes[0], f"{frac_trunc:.0%} of completions cut off"))
    out.extend(_rule_problems(sample, has_warmup, warm.steps if has_warmup else 0))
    return out


# ------------------------------------------------------------------------------------------------ report


def build_report(spec: Spec, spec_dir: Path | str, *, sample: int = 0, show: int = 3, sampler: str | None = None,
                 spec_path: str | None = None, loaded: Any = None, policy: Any = None,
                 max_rows_measured: int = 5000, spec_warnings: Sequence[Any] = (),
                 judges: Any = None) -> dict[str, Any]:
    """Check the spec's data, prompts and reward (and, with ``sample`` > 0, the base policy's rewards).

    spec: a validated Spec. spec_dir: the spec file's folder. show: prompts / skipped rows / completions to
    include. sampler: None (auto), "local", "tinker" or "sail" (see :func:`plan_sampling`). loaded: the
    ``LoadedSpec`` (to locate dataset problems in the file). policy: a TokenCompleter to sample from instead of
    opening a backend (tests). max_rows_measured: training rows whose prompt lengths feed the token section and
    the cost estimate (a sample of them beyond that). spec_warnings: the validation stage's warnings
    (``SpecError`` s, e.g. a value outside its usual range); each becomes a warning of the report. judges: a
    callable ``(reward_fn) -> {rule: why not connected}`` that connects the ``kind: judge`` rules before sampling
    (:func:`sailrl.runtime.backends.judge_clients.judge_connector`; ``sailrl preflight`` connects local judges, and every
    judge with ``--judge``); a judge rule left unconnected is reported as not checked, never as passed or failed.

    Returns the report dict (see the module docstring). Raises :class:`PreflightError` when sampling cannot
    start (unknown sampler, missing or malformed key).
    """
    spec_dir = Path(spec_dir)
    plan = None
    if sample > 0:
        plan = SamplingPlan("custom", spec) if policy is not None else plan_sampling(spec, sampler, spec_dir,
                                                                                   spec_path)
    report: dict[str, Any] = {"spec": spec_path, "name": spec.name, "model": spec.model.name}
    problems: list[dict[str, Any]] = []
    report["problems"] = problems
    for w in spec_warnings:
        where = f"{w.file}:{w.line}:{w.column}" if w.line else w.file
        problems.append(_problem("warning", f"{where}: {w.key_path}: {w.message}" if w.key_path else
                                 f"{where}: {w.message}", w.hint, _warning_short(w)))

    reward = spec.reward or RewardSpec.model_construct(rules=[])  # distill without rules: every total is 0
    reward_fn = RewardFunction.from_spec(reward, spec.prompt.reference_field, spec_dir=spec_dir)
    const = constant_reward(spec) if spec.reward is not None else 0.0
    low, high = reward_fn.bounds()
    report["reward"] = {"formula": reward_fn.explain(), "min": low, "max": high, "constant": const}
    if const is not None and spec.method != "distill":  # a distillation learns from its teacher, rules or not
        problems.append(_problem(
            "error",
            f"the reward is {const:g} for every completion whatever the model writes (each rule's pass and fail "
            f"contributions give the same total), so every group is degenerate and the run would learn nothing",
            "give at least one rule a non-zero weight (or different pass_score / fail_score), or widen reward.clip"))

    tokenizer, renderer, tool_problem = _load_text_tools(spec, spec_dir)
    context, context_source = context_window(spec.model.name, spec_dir)
    declared = _declared_tools(spec, spec_dir, renderer, problems)
    try:
        rows = load_rows(spec, spec_dir, reward_fn, renderer=renderer, context_window=context, tool_specs=declared)
    except DatasetError as exc:
        where = loaded.locate(exc.key) if (loaded is not None and exc.key) else None
        problems.append(_problem("error", str(exc), None))
        report["data"] = {"error": str(exc), "key": exc.key, "location": list(where) if where else None}
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
            f"{top['count']} rows, e.g. row {top['rows'][0]})", "fix those rows, or map the right columns",
            f"{len(rows.skipped)} of {rows.selected} rows skipped"))
    t = spec.training
    if len(train) < t.groups_per_step:
        problems.append(_problem("warning", f"only {len(train)} training rows for {t.groups_per_step} groups per "
                                 f"step: every step repeats rows", None,
                                 f"only {len(train)} training rows for {t.groups_per_step} groups per step"))
    if t.eval_every > 0 and not evals:
        problems.append(_problem("warning", "training.eval_every is set but there are no evaluation rows",
                                 "add dataset.eval (split, count or fraction)", "no evaluation rows"))

    seed = shuffle_seed(spec)
    first_rows = rows_for_step(train, 0, min(max(show, 1), len(train)), seed, reshuffle=spec.dataset.shuffle)
    prompt_lengths: list[int] | None = None
    eval_lengths: list[int] | None = None
    warm_lengths: list[int] | None = None
    if tool_problem is not None:
        problems.append(_problem("warning", tool_problem + "; prompts are shown as text and token lengths are "
                                 "unknown", "run preflight where the model's tokenizer can be loaded",
                                 "tokenizer not loaded"))
        text_builder = PromptBuilder(spec.prompt, None, field_names=None)
        report["prompts"] = [{"index": r["_index"], "text": _messages_text(text_builder.messages(r)),
                              "tokens": None, "reference": _reference(reward_fn, spec, r)} for r in first_rows[:show]]
        report["tokens"] = None
    else:
        builder = PromptBuilder(spec.prompt, renderer, tool_specs=declared)
        shown = []
        for r in first_rows[:show]:
            tokens = builder.model_input(r).to_ints()
            shown.append({"index": r["_index"], "text": _decode(tokenizer, tokens), "tokens": len(tokens),
                          "reference": _reference(reward_fn, spec, r)})
        report["prompts"] = shown
        report["stop"] = [repr(s) if isinstance(s, str) else s
                          for s in (spec.sampling.stop or builder.stop_sequences())]
        prompt_lengths = [builder.model_input(r).length for r in train[:max_rows_measured]]
        eval_lengths = [builder.model_input(r).length for r in evals[:max_rows_measured]]
        warm_lengths = _warmup_lengths(spec, builder, train[:max_rows_measured])
        report["tokens"] = _token_section(spec, prompt_lengths, context, context_source, rows.skipped)

    report["sample"] = None
    sampled_lengths: list[int] | None = None
    degenerate: tuple[int, int] | None = None
    if plan is not None:
        unchecked = _connect_judges(reward_fn, judges, problems)
        try:
            section = _sample_with(plan, spec, train, seed, sample, show, spec_path, policy, reward_fn,
                                   tokenizer, renderer, problems)
        finally:
            reward_fn.close_judges()  # what connecting opened (a local judge's backend) ends with the report
        if section is None:
            return _finish(report)
        _mark_not_checked(section, unchecked)
        report["sample"] = section
        if plan.stand_in is None:
            problems.extend(_sample_problems(spec, section))
            sampled_lengths = section["completion_lengths"]
            degenerate = (section["degenerate_groups"], section["groups"])
        else:
            problems.extend(_failed_problems(section))
    report["cost"] = _cost_section(spec, prompt_lengths, sampled_lengths, eval_lengths, warm_lengths, len(train),
                                   degenerate)
    return _finish(report)


def _connect_judges(reward_fn: Any, judges: Any, problems: list[dict[str, Any]]) -> dict[str, str]:
    """Connect the judge rules with ``judges`` (None: none is called); judge rule -> why it is not checked, each
    also a warning of the report."""
    if not reward_fn.judges:
        return {}
    found: dict[str, str] = {}
    if judges is not None:
        try:
            found = dict(judges(reward_fn) or {})
        except Exception as exc:  # noqa: BLE001 - a connector fault leaves the judges unconnected, said so
            found = {n: f"connecting the judge raised {type(exc).__name__}: {exc}" for n in reward_fn.judges}
    unchecked = not_checked(reward_fn, found, "`sailrl preflight --judge`")
    for name, why in unchecked.items():
        fail = reward_fn.pass_fail_scores(name)[1]
        problems.append(_problem(
            "warning", f"judge rule {name!r} was not checked on the sampled completions (needs the judge: {why}); "
            f"each sampled total counts it at its fail score ({fail:g}), and the degenerate groups are counted "
            "without it",
            "run `sailrl preflight --judge` with the judge's keys set to call it (a local judge is always called)",
            f"judge rule {name!r} not checked"))
    return unchecked


def _mark_not_checked(section: dict[str, Any], unchecked: dict[str, str]) -> None:
    """Judge rules that were not called: no pass count, pass rate or mean (they are unknown), and the reason."""
    for name, why in unchecked.items():
        r = section["rules"].get(name)
        if r is not None:
            r.update({"mean": None, "pass_rate": None, "passed": None, "not_checked": why})
        for ex in section["examples"]:
            if name in ex["contributions"]:
                ex["contributions"][name] = None
    section["not_checked"] = dict(unchecked)


def _sample_with(plan: SamplingPlan, spec: Spec, train: list[dict], seed: int, sample: int,
                 show: int, spec_path: str | None, policy: Any, reward_fn: Any, tokenizer: Any, renderer: Any,
                 problems: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``sample`` section, sampled as ``plan`` says; None (with an error added) when it cannot sample."""
    rows = rows_for_step(train, 0, sample, seed, reshuffle=spec.dataset.shuffle)
    sample_spec = plan.spec
    if plan.stand_in is not None:
        tokenizer = get_tokenizer(STAND_IN_MODEL)
        renderer = get_renderer(default_renderer(STAND_IN_MODEL), tokenizer)
        fits = context_window(STAND_IN_MODEL)[0] - sample_spec.sampling.max_tokens  # type: ignore[operator]
        builder = PromptBuilder(sample_spec.prompt, renderer)
        usable = []
        for r in train:  # the first `sample` rows that fit are all rows_for_step(usable, 0, sample) reads
            if builder.model_input(r).length <= fits:
                usable.append(r)
                if len(usable) >= sample:
                    break
        if not usable:
            problems.append(_problem("warning", f"no prompt fits the {STAND_IN_MODEL} stand-in's context, so "
                                     f"nothing was sampled", None, "nothing sampled"))
            return None
        rows = rows_for_step(usable, 0, sample, seed, reshuffle=spec.dataset.shuffle)
    elif renderer is None and policy is None:
        problems.append(_problem("error", "cannot sample without the model's tokenizer and renderer"))
        return None
    builder = PromptBuilder(sample_spec.prompt, renderer)
    batch, sample_tokenizer = asyncio.run(_run_sampling(sample_spec, rows, plan.sampler, spec_path, policy,
                                                        builder, renderer, reward_fn))
    section = _sample_section(sample_spec, batch, reward_fn, tokenizer or sample_tokenizer, show)
    section["sampler"] = plan.sampler
    section["model"] = sample_spec.model.name
    section["stand_in"] = plan.stand_in
    section["note"] = plan.note()
    return section


async def _run_sampling(spec: Spec, rows: list[dict], sampler: str, spec_path: str | None, policy: Any,
                        builder: Any, renderer: Any, reward_fn: Any) -> tuple[Any, Any]:
    tokenizer = None
    with tempfile.TemporaryDirectory(prefix="sailrl-preflight-") as tmp:
        if policy is None:
            policy, tokenizer = await _base_policy(spec, sampler, Path(tmp), spec_path)
        batch = await _sample(spec, rows, policy, builder, renderer, reward_fn,
                              Path(spec_path).parent if spec_path else None)
    return batch, tokenizer


def _warmup_lengths(spec: Spec, builder: Any, rows: list[dict]) -> list[int] | None:
    warm = spec.training.warmup
    if warm is None or warm.steps <= 0:
        return None
    completion = warm.completion or "{{ " + spec.prompt.reference_field + " }}"
    return [builder.supervised_datum(r, completion).model_input.length for r in rows]


def _cost_section(spec: Spec, prompt_lengths: list[int] | None, completion_lengths: list[int] | None,
                  eval_lengths: list[int] | None, warm_lengths: list[int] | None, train_rows: int,
                  degenerate: tuple[int, int] | None) -> dict[str, Any]:
    """``sailrl.runtime.planning.cost.estimate_run`` as a dict, plus ``summary`` (one line) and ``lines`` (the table)."""
    measured = len(prompt_lengths) if prompt_lengths is not None else 0
    estimate = estimate_run(spec, prompt_lengths or None, completion_lengths or None,
                            eval_prompt_token_lengths=eval_lengths if eval_lengths else None,
                            warmup_token_lengths=warm_lengths or None,
                            train_rows=train_rows if measured and train_rows > measured else None,
                            degenerate_groups=degenerate)
    out = estimate.as_dict()
    tok = estimate.total_tokens()
    how = ("completion lengths from the sampled base policy" if completion_lengths else
           f"completions of 1 to max_tokens ({spec.sampling.max_tokens}) tokens")
    tokens_text = (f"{_range_text(tok.low / 1e6, tok.high / 1e6, lambda x: f'{x:.3g}')} M" if tok.high >= 1e6
                   else _range_text(tok.low, tok.high, lambda x: f"{x:,.0f}"))
    if estimate.total_usd is None:
        cost_text = ("unknown: add " + ", ".join(p.spec_key for p in estimate.missing_prices) + " (USD per "
                     "million tokens) to the spec")
    elif estimate.sampler == "local":
        cost_text = "$0 (the embedded backend bills nothing)"
    else:
        usd = estimate.total_usd
        cost_text = _range_text(usd.low, usd.high, fmt_usd) + " (estimate)"
    out["summary"] = f"tokens: {tokens_text} ({how}); cost: {cost_text}"
    out["lines"] = estimate.render()
    return out


def _range_text(low: float, high: float, fmt: Any) -> str:
    return fmt(low) if fmt(low) == fmt(high) else f"{fmt(low)}-{fmt(high)}"


def _messages_text(messages: list[dict]) -> str:
    return "\n\n".join(f"[{m['role']}] {m['content']}" for m in messages)


def _reference(reward_fn: Any, spec: Spec, row: dict) -> Any:
    try:
        ref = reward_fn.reference_answer(row)
    except Exception:  # noqa: BLE001 -- shown for information only
        ref = None
    return ref if ref is not None else row.get(spec.prompt.reference_field)


def _token_section(spec: Spec, lengths: list[int], context: int | None, source: str,
                   skipped: Sequence[Any]) -> dict[str, Any]:
    """Prompt lengths of the kept rows against the context; rows too long were skipped at load."""
    too_long = [s for s in skipped if s.kind == "too_long"]
    return {
        "measured_rows": len(lengths), "min": min(lengths), "median": statistics.median(lengths),
        "max": max(lengths), "context": context, "context_source": source,
        "max_tokens": spec.sampling.max_tokens,
        "max_prompt_tokens": None if context is None else context - spec.sampling.max_tokens,
        "skipped_too_long": len(too_long),
    }


def _finish(report: dict[str, Any]) -> dict[str, Any]:
    problems = report["problems"]
    errors = [p for p in problems if p["severity"] == "error"]
    warnings_ = [p for p in problems if p["severity"] == "warning"]
    report["blocking"] = bool(errors)
    sample = report.get("sample") or {}
    unchecked = (f" (base-policy rewards not judged: sampled with the {sample['stand_in']['model']} stand-in)"
                 if sample.get("stand_in") else "")
    if errors:
        first = errors[0]
        report["verdict"] = f"not ready: {first['message']}" + (f" -- {first['fix']}" if first["fix"] else "")
    elif warnings_:
        shorts = "; ".join(p["short"] for p in warnings_)
        report["verdict"] = f"ready, with {len(warnings_)} warning{'s' if len(warnings_) > 1 else ''}: {shorts}"
    else:
        report["verdict"] = "ready: no problems found"
    report["verdict"] += unchecked
    return report
