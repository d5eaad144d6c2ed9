"""The ``pricing:`` section: what the services a run uses charge, in USD per million tokens.

Who bills what (``sailrl.runtime.planning.cost`` applies it):

- **Tinker** trains every run that is not local: ``train`` per token of the training data sent to
  ``forward_backward`` (RL datums and supervised warm-up examples), ``prefill`` per prompt token it reads without
  sampling (the KL penalty's reference logprobs) and, with ``sampling.sampler: tinker``, ``prefill`` per prompt
  token and ``sample`` per sampled token of every rollout and eval rollout.
- **Sail** samples the rollouts of ``sampling.sampler: sail``: ``input`` per prompt token and ``output`` per
  sampled token, at the price of the run's completion window (``balanced`` or ``flex``).
- The **local** backend bills nothing (0).
- **Judge models** (``kind: judge`` rules) are billed per token they read (``judge.input``) and write
  (``judge.output``): at ``pricing.judge`` when written; else 0 when every judge runs locally; else, when every
  judge runs on Tinker, the listed Tinker estimate of the judge model (``prefill`` / ``sample``); else unknown.

Prices depend on the model. :data:`TINKER_PRICES` lists Tinker prices that were public when they were read,
keyed by model name, each with its source address and the date it was read; they are estimates (the provider
may have changed them since). A price written in the spec overrides the listed one for the run's model
(``model.name``). A price that is neither listed nor written is unknown: costs that need it are not computed
(tokens are still counted) and a budget (``training.max_cost_usd``) is refused until it is written.
No default is listed for Sail: its per-model prices were not found in public form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from sailrl.spec.base import SpecModel

SAIL_WINDOWS = ("balanced", "flex")
Service = Literal["tinker", "sail", "local"]


def _price(value: float) -> float:
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"a price must be a finite number of USD per million tokens, got {value}")
    if value < 0:
        raise ValueError(f"a price cannot be negative (USD per million tokens), got {value:g}: write 0 or more")
    return float(value)


Price = Annotated[float, Field(allow_inf_nan=True), AfterValidator(_price)]  # inf/nan reach _price


@dataclass(frozen=True)
class PublishedPrice:
    """A Tinker price list entry for one model, as published by Tinker and read on ``read_on``.

    prefill, sample, train: USD per million tokens, ``None`` where the source gave none. source: the address the
    numbers were read from. read_on: ISO date they were read. note: what the source says about them.
    """

    prefill: float | None
    sample: float | None
    train: float | None
    source: str
    read_on: str
    note: str = ""

    def describe(self, model: str) -> str:
        parts = [f"{k} ${v:g}" for k, v in (("train", self.train), ("prefill", self.prefill),
                                              ("sample", self.sample)) if v is not None]
        missing = [k for k, v in (("train", self.train), ("prefill", self.prefill), ("sample", self.sample))
                   if v is None]
        text = f"{model}: {', '.join(parts)} per million tokens"
        if missing:
            text += f" ({', '.join(missing)}: not published there)"
        return f"{text}; estimate, source {self.source}, read {self.read_on}" + (f"; {self.note}" if self.note else "")


TINKER_PRICES: dict[str, PublishedPrice] = {
    "Qwen/Qwen3-8B": PublishedPrice(
        prefill=0.195, sample=0.60, train=0.44,
        source="https://tinker-docs.thinkingmachines.ai/tinker/models/models_and_pricing/",
        read_on="2026-12-01",
        note="as transcribed from that page on 2026-10-07 in https://github.com/api-evangelist/thinking-machines "
             "(plans/thinking-machines-plans-pricing.yml)",
    ),
    "moonshotai/Kimi-K2.6": PublishedPrice(
        prefill=5.15, sample=12.81, train=None,
        source="https://docs.fireworks.ai/fine-tuning/multi-turn-cost-comparison",
        read_on="2026-12-01",
        note="Tinker's published rates for Kimi K2.6 (128K context) as quoted by that comparison page",
    ),
}


class TinkerPricing(SpecModel):
    """Tinker's prices for the run's model, USD per million tokens (override the listed estimates)."""

    train: Price | None = Field(
        None,
        description=(
            "USD per million tokens of training data (every token of each datum sent to forward_backward: prompt "
            "and completion of trained rollouts, and the supervised warm-up examples). Default: the listed "
            "estimate for model.name, if any."
        ),
    )
    prefill: Price | None = Field(
        None,
        description=(
            "USD per million prompt tokens Tinker reads: rollout and eval prompts with sampler tinker, and the "
            "KL reference's logprobs (kl_penalty_coef > 0). Default: the listed estimate for model.name, if any."
        ),
    )
    sample: Price | None = Field(
        None,
        description=(
            "USD per million tokens Tinker samples (sampler tinker: rollouts and eval). Default: the listed "
            "estimate for model.name, if any."
        ),
    )


class SailWindowPricing(SpecModel):
    """Sail's prices for one completion window, USD per million tokens."""

    input: Price | None = Field(None, description="USD per million prompt tokens sent with each rollout request.")
    output: Price | None = Field(None, description="USD per million tokens Sail samples.")


class SailPricing(SpecModel):
    """Sail's prices for the run's model per completion window (sampling.completion_window picks one)."""

    balanced: SailWindowPricing | None = Field(None, description="Prices of the balanced completion window.")
    flex: SailWindowPricing | None = Field(None, description="Prices of the flex completion window.")


def _defaults_text() -> str:
    return " | ".join(p.describe(m) for m, p in TINKER_PRICES.items())


class JudgePricing(SpecModel):
    """What the judge models of ``kind: judge`` rules cost, USD per million tokens (one price for every judge)."""

    input: Price | None = Field(None, description="USD per million tokens of judge prompts (rubric + completion).")
    output: Price | None = Field(None, description="USD per million tokens the judge writes (its answers).")


class PricingSpec(SpecModel):
    """USD per million tokens each service charges; used for cost/... metrics, estimates and the budget."""

    tinker: TinkerPricing = Field(
        default_factory=TinkerPricing,
        description=(
            "Tinker's prices for model.name (train, prefill, sample). Listed estimates, used where the spec writes "
            "none: " + _defaults_text() + "."
        ),
    )
    sail: SailPricing = Field(
        default_factory=SailPricing,
        description=(
            "Sail's prices for model.name per completion window (balanced, flex: input, output). No estimate is "
            "listed; without them a Sail run's sampling cost is shown as tokens only."
        ),
    )
    judge: JudgePricing = Field(
        default_factory=JudgePricing,
        description=(
            "Prices of the judge models of kind: judge rules (input, output). Default: 0 for local judges, the "
            "listed Tinker estimate of the judge model for tinker judges, else unknown (Sail's are not listed)."
        ),
    )


PriceKey = tuple[str, ...]  # ("tinker", "train"), ("sail", "balanced", "input"), ("local",)


@dataclass(frozen=True)
class ResolvedPrice:
    """One price the run is billed at.

    key: where it lives under ``pricing:`` (``("tinker", "train")``, ``("sail", "flex", "output")``, ``("local",)``).
    usd_per_mtok: USD per million tokens, ``None`` when unknown. origin: ``"spec"`` (written in the spec),
    ``"estimate"`` (from :data:`TINKER_PRICES`), ``"local"`` (the local backend: 0) or ``"unknown"``.
    source: for an estimate, its description (address and date).
    """

    key: PriceKey
    usd_per_mtok: float | None
    origin: Literal["spec", "estimate", "local", "unknown"]
    source: str = ""

    @property
    def spec_key(self) -> str:
        """The dotted spec key to write this price at, e.g. ``pricing.tinker.train``."""
        return "pricing." + ".".join(self.key)


LOCAL_PRICE = ResolvedPrice(("local",), 0.0, "local", "the local backend bills nothing")


def resolve_judge_price(pricing: PricingSpec, judges: list[tuple[str, str]], key: PriceKey) -> ResolvedPrice:
    """The price at ``("judge", "input" | "output")`` for judges ``[(sampler, model), ...]``: the spec's value,
    else 0 when every judge is local, else the listed Tinker estimate when every judge is one Tinker model, else
    unknown."""
    written = getattr(pricing.judge, key[1])
    if written is not None:
        return ResolvedPrice(key, written, "spec")
    samplers = {s for s, _ in judges}
    if samplers == {"local"}:
        return ResolvedPrice(key, 0.0, "local", "local judges bill nothing")
    models = {m for _, m in judges}
    if samplers == {"tinker"} and len(models) == 1:
        model = next(iter(models))
        listed = TINKER_PRICES.get(model)
        value = getattr(listed, "prefill" if key[1] == "input" else "sample") if listed is not None else None
        if value is not None:
            return ResolvedPrice(key, value, "estimate", listed.describe(model))
    return ResolvedPrice(key, None, "unknown")


def resolve_price(pricing: PricingSpec, model: str, key: PriceKey) -> ResolvedPrice:
    """The price at ``key`` for ``model``: the spec's value, else the listed estimate, else unknown.

    key: ``("tinker", "train" | "prefill" | "sample")``, ``("sail", "balanced" | "flex", "input" | "output")`` or
    ``("local",)``. Raises ``KeyError`` for any other key.
    """
    if key == ("local",):
        return LOCAL_PRICE
    if len(key) == 2 and key[0] == "tinker" and key[1] in ("train", "prefill", "sample"):
        written = getattr(pricing.tinker, key[1])
        if written is not None:
            return ResolvedPrice(key, written, "spec")
        listed = TINKER_PRICES.get(model)
        value = getattr(listed, key[1]) if listed is not None else None
        if value is not None:
            return ResolvedPrice(key, value, "estimate", listed.describe(model))
        return ResolvedPrice(key, None, "unknown")
    if len(key) == 3 and key[0] == "sail" and key[1] in SAIL_WINDOWS and key[2] in ("input", "output"):
        window = getattr(pricing.sail, key[1])
        written = getattr(window, key[2]) if window is not None else None
        if written is not None:
            return ResolvedPrice(key, written, "spec")
        return ResolvedPrice(key, None, "unknown")
    raise KeyError(f"no price is kept at pricing.{'.'.join(key)}")
