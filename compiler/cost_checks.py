"""Validate-time checks of a run's budget (``training.max_cost_usd``) against its prices.

- A budget needs a known price for everything the run is billed for (``sailrl.runtime.planning.cost.billing``): the
  error names each missing ``pricing:`` key, located at ``training.max_cost_usd``.
- A budget below the most one RL step can cost (every rollout sampling and training ``max_tokens`` tokens;
  prompt tokens are not counted here, as the data is not read at validate time) is an error: the budget stop
  would end the run before its first step. The message states the estimate.

Prices themselves (negative, not a number, an unknown completion window) are checked by the schema
(``sailrl.spec.pricing``). The checks read the sections they need from the loaded file one by one, so they also
run when another part of the spec is invalid; a section the schema rejects is skipped (the schema reports it).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel, ValidationError

from sailrl.runtime.planning.cost import CostModel, fmt_usd
from sailrl.spec.errors import SpecError
from sailrl.spec.loader import LoadedSpec
from sailrl.spec.methods import DistillSpec
from sailrl.spec.pricing import SAIL_WINDOWS, PricingSpec
from sailrl.spec.schema import ModelSpec, SamplingSpec, TrainingSpec

_WHAT = {
    ("tinker", "train"): "Tinker's training price",
    ("tinker", "prefill"): "Tinker's prefill (prompt) price",
    ("tinker", "sample"): "Tinker's sampling price",
    ("sail", "input"): "Sail's input (prompt) price",
    ("sail", "output"): "Sail's output (sampled tokens) price",
}


def _section(loaded: LoadedSpec, key: str, model: type[BaseModel]) -> Any:
    tree = loaded.tree if isinstance(loaded.tree, dict) else {}
    raw = tree.get(key, {})
    if raw is None:
        raw = {}
    try:
        return model.model_validate(raw)
    except ValidationError:
        return None


def _run_view(loaded: LoadedSpec) -> Any:
    """The spec, or the sections the cost model reads when the whole spec did not validate (else None)."""
    if loaded.spec is not None:
        return loaded.spec

    parts = {"model": _section(loaded, "model", ModelSpec), "training": _section(loaded, "training", TrainingSpec),
             "sampling": _section(loaded, "sampling", SamplingSpec),
             "pricing": _section(loaded, "pricing", PricingSpec)}
    if any(v is None for v in parts.values()):
        return None
    data = loaded.data if isinstance(loaded.data, dict) else {}
    method = data.get("method", "rl")
    if method not in ("rl", "distill"):
        return None  # sft and dpo estimates measure the data's tokens: only a spec that validates has them
    distill = _section(loaded, "distill", DistillSpec) if method == "distill" else None
    if method == "distill" and distill is None:
        return None
    dataset = data.get("dataset")
    has_eval = isinstance(dataset, dict) and dataset.get("eval") is not None
    return SimpleNamespace(dataset=SimpleNamespace(eval=True if has_eval else None), method=method, distill=distill,
                           **parts)


def _what(key: tuple[str, ...]) -> str:
    return _WHAT.get((key[0], key[-1]), "price") + (f" for the {key[1]} window" if key[0] == "sail" else "")


def _yaml_snippet(keys: list[tuple[str, ...]]) -> str:
    """A ``pricing:`` block with a placeholder at each of ``keys``."""
    tree: dict[str, Any] = {}
    for key in keys:
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = None
    lines = ["pricing:"]

    def walk(node: dict[str, Any], depth: int) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                lines.append(f"{'  ' * depth}{k}:")
                walk(v, depth + 1)
            else:
                lines.append(f"{'  ' * depth}{k}: <USD per million tokens>")

    walk(tree, 1)
    return "\n".join(lines)


def check_costs(loaded: LoadedSpec) -> list[SpecError]:
    """Budget errors of ``loaded`` (see the module docstring); an empty list when there is no budget or it is sound."""
    spec = _run_view(loaded)
    if spec is None or spec.training.max_cost_usd is None:
        return []
    budget = spec.training.max_cost_usd
    if spec.sampling.sampler == "sail" and spec.sampling.completion_window not in SAIL_WINDOWS:
        return []  # the completion window check reports it; its prices cannot be named
    model = CostModel.from_spec(spec)
    path = ("training", "max_cost_usd")
    missing = model.missing_prices()
    if missing:
        names = "; ".join(f"{p.spec_key} ({_what(p.key)})" for p in missing)
        return [loaded.error(
            path,
            f"a budget needs a price for everything the run pays for, and for model '{spec.model.name}' with the "
            f"{spec.sampling.sampler} sampler these are unknown: {names}",
            "Add them in USD per million tokens from the providers' price pages:\n"
            + _yaml_snippet([p.key for p in missing])
            + "\nor remove training.max_cost_usd to run without a budget (costs are then shown as tokens only).",
            code="S241",
        )]
    bound = model.step_upper_bound(1)
    if bound is not None and budget < bound:
        t, s = spec.training, spec.sampling
        return [loaded.error(
            path,
            f"the budget {fmt_usd(budget)} is below the estimated cost of one step, up to {fmt_usd(bound)} "
            f"({t.groups_per_step} groups x {t.group_size} rollouts, each sampling and training up to "
            f"max_tokens={s.max_tokens} tokens; prompt tokens not counted): the run would stop before its first "
            "step",
            f"Raise training.max_cost_usd above {fmt_usd(bound)}, or lower sampling.max_tokens, "
            "training.groups_per_step or training.group_size. `sailrl preflight SPEC --sample N` estimates the "
            "whole run from sampled completion lengths.",
            code="S242",
        )]
    return []
