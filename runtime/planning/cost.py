"""What a run costs: per-step cost from token counts, the pre-run estimate, and the budget's next-step estimate.

Token kinds (the loop logs ``tokens/<kind>`` per step and ``tokens_cum/<kind>`` cumulatively):

=================  ==========================================================================================
``prompt``         prompt tokens sent for sampling, counted per rollout request (group_size per group)
``sampled``        tokens sampled in the step's rollouts
``trained``        tokens of the training datums sent to ``forward_backward`` (``model_input.length``)
``eval_prompt``    prompt tokens of the step's eval rollouts (one per held-out row)
``eval_sampled``   tokens sampled in the step's eval rollouts
``reference``      tokens whose reference logprobs the KL penalty computes on the base model (prefill)
``teacher``        tokens the distillation teacher scores (``method: distill``; prefill at the teacher's price)
``warmup_trained`` tokens of the supervised warm-up examples sent to ``forward_backward``
``judge_prompt``   tokens the judge models of ``kind: judge`` rules read (rubric + completion), train and eval
``judge_output``   tokens the judge models wrote (their answers)
=================  ==========================================================================================

Judge tokens are billed at ``pricing.judge`` (``input`` / ``output``), whatever the policy's sampler (see
:func:`sailrl.spec.pricing.resolve_judge_price`).

Who bills which kind (:func:`billing`): with ``sampler: tinker`` Tinker bills everything (``prefill`` for
prompt, eval_prompt and reference; ``sample`` for sampled and eval_sampled; ``train`` for trained and
warmup_trained). With ``sampler: sail`` Sail bills the rollouts at the completion window's price (``input`` for
prompt and eval_prompt, ``output`` for sampled and eval_sampled) and Tinker the rest. ``sampler: local`` bills
nothing: every cost is 0.

Cost of a kind = tokens x USD per million tokens / 1e6. Where the price is unknown the cost is ``None`` (never a
0 that looks like a price); a step's total is ``None`` when any kind it used has an unknown price.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sailrl.runtime.data.order import WARMUP_SEED_OFFSET, rows_for_step, shuffle_seed
from sailrl.runtime.rewards.judge import judge_messages
from sailrl.spec.models import context_window
from sailrl.spec.pricing import SAIL_WINDOWS, PriceKey, ResolvedPrice, resolve_judge_price, resolve_price
from sailrl.spec.schema import Spec, every_due

KINDS = ("prompt", "sampled", "trained", "eval_prompt", "eval_sampled", "reference", "warmup_trained",
         "judge_prompt", "judge_output", "teacher")
STEP_KINDS = ("prompt", "sampled", "trained", "reference", "judge_prompt", "judge_output", "teacher")
JUDGE_KINDS = ("judge_prompt", "judge_output")
#: Characters per token assumed for the judge prompt's fixed text (the judge's tokenizer is not loaded).
JUDGE_CHARS_PER_TOKEN = 4
EVAL_KINDS = ("eval_prompt", "eval_sampled")
RECENT_STEPS = 5  # next_step_estimate looks at this many of the latest steps


def billing(sampler: str, completion_window: str) -> dict[str, PriceKey]:
    """Kind -> the ``pricing:`` key it is billed at, for a run sampled on ``sampler``.

    sampler: ``sail``, ``tinker`` or ``local``. completion_window: Sail's window (``balanced``/``flex``); only read
    for ``sail``. Raises ``ValueError`` for an unknown sampler.
    """
    judge = {"judge_prompt": ("judge", "input"), "judge_output": ("judge", "output")}
    if sampler == "local":
        return {**{k: ("local",) for k in KINDS}, **judge}
    train, prefill = ("tinker", "train"), ("tinker", "prefill")
    out = {"trained": train, "warmup_trained": train, "reference": prefill, "teacher": prefill}
    if sampler == "tinker":
        prompt, sample = prefill, ("tinker", "sample")
    elif sampler == "sail":
        prompt, sample = ("sail", completion_window, "input"), ("sail", completion_window, "output")
    else:
        raise ValueError(f"unknown sampler {sampler!r}: use sail, tinker or local")
    out.update(prompt=prompt, eval_prompt=prompt, sampled=sample, eval_sampled=sample, **judge)
    return out


def judge_rules(spec: Spec) -> list[Any]:
    """The spec's ``kind: judge`` rules."""
    rules = getattr(getattr(spec, "reward", None), "rules", None) or []  # a budget check's view has no reward
    return [r for r in rules if getattr(r, "kind", None) == "judge"]


def judge_overhead_tokens(rule: Any) -> int:
    """Tokens of one judge prompt without the completion (the instructions and the rubric as written), at
    :data:`JUDGE_CHARS_PER_TOKEN` characters a token."""
    text = judge_messages(rule.rubric, "", rule.scale)[0]["content"]
    return math.ceil(len(text) / JUDGE_CHARS_PER_TOKEN)


def _usd(tokens: float, price: float | None) -> float | None:
    if tokens == 0:
        return 0.0  # nothing used costs nothing, whatever the price
    return None if price is None else tokens * price / 1e6


@dataclass(frozen=True)
class Range:
    """A low-high range (tokens or USD) with an optional expected value between them."""

    low: float
    high: float
    expected: float | None = None

    def __add__(self, other: Range) -> Range:
        e = None if self.expected is None or other.expected is None else self.expected + other.expected
        return Range(self.low + other.low, self.high + other.high, e)

    def scale(self, k: float) -> Range:
        return Range(self.low * k, self.high * k, None if self.expected is None else self.expected * k)

    def contains(self, x: float, rel_tol: float = 1e-9) -> bool:
        """``low <= x <= high`` (with a relative tolerance for float sums)."""
        slack = rel_tol * max(1.0, abs(self.high))
        return self.low - slack <= x <= self.high + slack


def extra_groups(spec: Spec) -> int:
    """The most groups a step draws beyond ``groups_per_step`` (``training.dynamic_sampling.max_extra_groups``;
    0 without dynamic sampling)."""
    d = spec.training.dynamic_sampling
    return 0 if d is None else int(d.max_extra_groups)


def _top_sum(lengths: Sequence[int], k: int) -> int:
    """Sum of the ``k`` largest lengths; rows repeat when ``k`` exceeds their number (a bound, not exact)."""
    if not lengths or k <= 0:
        return 0
    top = sorted(lengths, reverse=True)
    if k <= len(top):
        return sum(top[:k])
    return sum(top) + (k - len(top)) * top[0]


class CostModel:
    """Prices of one run, by token kind, and the cost arithmetic the loop calls each step.

    Build with :meth:`from_spec`. ``prices``: kind -> :class:`~sailrl.spec.pricing.ResolvedPrice`.
    """

    def __init__(self, spec: Spec, sampler: str, prices: dict[str, ResolvedPrice], *,
                 prompt_token_lengths: Sequence[int] | None = None,
                 eval_prompt_token_lengths: Sequence[int] | None = None) -> None:
        self.spec = spec
        self.sampler = sampler
        self.prices = prices
        self.prompt_token_lengths = list(prompt_token_lengths) if prompt_token_lengths is not None else None
        self.eval_prompt_token_lengths = (list(eval_prompt_token_lengths)
                                          if eval_prompt_token_lengths is not None else None)

    @classmethod
    def from_spec(cls, spec: Spec, *, sampler: str | None = None, prompt_token_lengths: Sequence[int] | None = None,
                  eval_prompt_token_lengths: Sequence[int] | None = None) -> CostModel:
        """The cost model of ``spec`` (a :class:`~sailrl.spec.schema.Spec`).

        sampler: overrides ``spec.sampling.sampler``. prompt_token_lengths / eval_prompt_token_lengths: the
        prompt length (tokens) of every training / held-out row; with them the per-step upper bound counts prompt
        tokens, without them it counts completions only.
        """
        sampler = sampler or spec.sampling.sampler
        window = spec.sampling.completion_window
        prices: dict[str, ResolvedPrice] = {}
        judges = [(r.judge.sampler, r.judge.model) for r in judge_rules(spec)]
        for kind, key in billing(sampler, window).items():
            if key[0] == "judge":
                prices[kind] = resolve_judge_price(spec.pricing, judges, key)
            elif key[0] == "sail" and key[1] not in SAIL_WINDOWS:
                prices[kind] = ResolvedPrice(key, None, "unknown")  # an invalid window has no price
            else:
                teacher = spec.distill.teacher.name if kind == "teacher" and spec.distill is not None else None
                prices[kind] = resolve_price(spec.pricing, teacher or spec.model.name, key)
        return cls(spec, sampler, prices, prompt_token_lengths=prompt_token_lengths,
                   eval_prompt_token_lengths=eval_prompt_token_lengths)

    @property
    def is_local(self) -> bool:
        return self.sampler == "local"

    def used_kinds(self) -> list[str]:
        """The kinds this run produces: prompt, sampled, trained; eval kinds when it evaluates; reference with a
        KL penalty; warmup_trained with a supervised warm-up."""
        t = self.spec.training
        kinds = ["prompt", "sampled", "trained"]
        if self.spec.dataset.eval is not None and t.eval_every > 0:
            kinds += list(EVAL_KINDS)
        if t.kl_penalty_coef > 0:
            kinds.append("reference")
        if t.warmup is not None and t.warmup.steps > 0:
            kinds.append("warmup_trained")
        if judge_rules(self.spec):
            kinds += list(JUDGE_KINDS)
        if self.spec.method == "distill":
            kinds.append("teacher")
        return kinds

    def missing_prices(self, kinds: Sequence[str] | None = None) -> list[ResolvedPrice]:
        """The distinct unknown prices among ``kinds`` (default :meth:`used_kinds`), in first-use order."""
        out: dict[PriceKey, ResolvedPrice] = {}
        for kind in kinds if kinds is not None else self.used_kinds():
            p = self.prices[kind]
            if p.usd_per_mtok is None:
                out.setdefault(p.key, p)
        return list(out.values())

    def cost_of(self, kind: str, tokens: float) -> float | None:
        """USD for ``tokens`` of ``kind``; ``None`` when its price is unknown (0.0 for 0 tokens)."""
        return _usd(tokens, self.prices[kind].usd_per_mtok)

    def step_cost(self, tokens: Mapping[str, Any]) -> dict[str, float | None]:
        """``cost/<kind>``, ``cost/step`` and ``cost/total`` (USD) from one step's metrics.

        tokens: a mapping with ``tokens/<kind>`` (this step) and ``tokens_cum/<kind>`` (run so far) entries; other
        keys are ignored, a missing or ``None`` count means the kind was not used. ``cost/<kind>`` is ``None`` for
        a kind with tokens but no known price; ``cost/step`` (sum over this step's kinds) and ``cost/total`` (over
        the cumulative counts) are ``None`` when any of their kinds is. ``cost/total`` is left out when there are
        no ``tokens_cum/`` counts.
        """
        out: dict[str, float | None] = {}
        step_total: float | None = 0.0
        for kind in KINDS:
            n = tokens.get(f"tokens/{kind}")
            if n is None:
                continue
            c = self.cost_of(kind, float(n))
            out[f"cost/{kind}"] = c
            step_total = None if c is None or step_total is None else step_total + c
        out["cost/step"] = step_total
        cum = [(k, tokens.get(f"tokens_cum/{k}")) for k in KINDS]
        cum = [(k, n) for k, n in cum if n is not None]
        if cum:
            total: float | None = 0.0
            for kind, n in cum:
                c = self.cost_of(kind, float(n))
                total = None if c is None or total is None else total + c
            out["cost/total"] = total
        return out

    # ---------------------------------------------------------------------------------------------- bounds
    def eval_due(self, step: int) -> bool:
        """Whether RL step ``step`` (numbered from 1, as everywhere) evaluates: as the loop decides, every
        ``eval_every`` steps (:func:`sailrl.spec.schema.every_due`)."""
        return self.spec.dataset.eval is not None and every_due(self.spec.training.eval_every, step)

    def step_token_bound(self, step: int | None = None) -> dict[str, float]:
        """Most tokens one RL step can use, by kind: every rollout samples ``max_tokens`` and every group trains;
        with ``training.dynamic_sampling`` the step draws all ``max_extra_groups`` extra groups (only
        ``groups_per_step`` of them train).

        step: numbered from 1; eval kinds are included when it is an eval step (``None``: when ``eval_every`` is 1).
        Prompt tokens are the ``groups_per_step`` longest prompts x group_size, or 0 when prompt lengths were not
        given (see :attr:`counts_prompts`); eval prompts likewise.
        """
        t, s = self.spec.training, self.spec.sampling
        g, gs = t.groups_per_step, t.group_size
        drawn = g + extra_groups(self.spec)
        prompts = gs * _top_sum(self.prompt_token_lengths or [], g)
        rollouts = g * gs
        out = {"prompt": float(gs * _top_sum(self.prompt_token_lengths or [], drawn)),
               "sampled": float(drawn * gs * s.max_tokens),
               "trained": float(prompts + rollouts * max(s.max_tokens - 1, 0))}
        if t.kl_penalty_coef > 0:
            out["reference"] = float(prompts + rollouts * s.max_tokens)
        if self.spec.method == "distill":  # the teacher reads every rollout's whole sequence
            out["teacher"] = float(prompts + rollouts * s.max_tokens)
        episode = EpisodeBound.of(self.spec)
        if episode is not None:  # every episode at max_turns: later turns re-send the conversation
            longest = sorted(self.prompt_token_lengths or [0], reverse=True)[:g]
            sampled = sorted(self.prompt_token_lengths or [0], reverse=True)[:drawn]
            out["prompt"] = gs * sum(episode.prompt_tokens(n) for n in sampled) if self.prompt_token_lengths else 0.0
            out["sampled"] = drawn * gs * episode.sampled_tokens()
            datum = gs * sum(episode.datum_tokens(n) for n in longest)
            out["trained"] = datum - rollouts
            if t.kl_penalty_coef > 0:
                out["reference"] = datum
        due = self.eval_due(step) if step is not None else (self.spec.dataset.eval is not None and t.eval_every == 1)
        judged = drawn * gs  # every rollout judged by every judge rule (the cache only lowers this)
        if due and self.eval_prompt_token_lengths is not None:
            out["eval_prompt"] = float(sum(self.eval_prompt_token_lengths))
            out["eval_sampled"] = float(len(self.eval_prompt_token_lengths) * s.max_tokens)
            judged += len(self.eval_prompt_token_lengths)
        rules = judge_rules(self.spec)
        if rules:
            out["judge_prompt"] = float(sum(judged * (judge_overhead_tokens(r) + s.max_tokens) for r in rules))
            out["judge_output"] = float(sum(judged * r.judge.max_tokens for r in rules))
        return out

    @property
    def counts_prompts(self) -> bool:
        """True when prompt lengths were given, so bounds include prompt tokens."""
        return self.prompt_token_lengths is not None

    def _tokens_cost(self, tokens: Mapping[str, float]) -> float | None:
        total: float | None = 0.0
        for kind, n in tokens.items():
            c = self.cost_of(kind, n)
            total = None if c is None or total is None else total + c
        return total

    def step_upper_bound(self, step: int | None = None) -> float | None:
        """USD of :meth:`step_token_bound`; ``None`` when a price it needs is unknown."""
        return self._tokens_cost(self.step_token_bound(step))

    def next_step_estimate(self, history: Sequence[Mapping[str, Any]], *, step: int | None = None) -> float | None:
        """USD the next RL step is expected to cost, for the budget stop.

        history: the run's per-step metrics so far (oldest first), with ``tokens/<kind>`` counts.
        step: the next step's number, from 1 (default: ``len(history) + 1``); it decides whether the step evaluates.

        Per kind, the largest count of the last :data:`RECENT_STEPS` steps (completion lengths drift slowly, and
        the largest recent step covers batches of longer prompts), never above :meth:`step_token_bound`'s bound
        when prompt lengths are known; eval kinds, on an eval step, from the last steps that evaluated. Before
        any step has tokens: :meth:`step_upper_bound`. ``None`` when a price it needs is unknown.
        """
        if step is None:
            step = len(history) + 1
        logged = [h for h in history if any(h.get(f"tokens/{k}") is not None for k in STEP_KINDS)]
        if not logged:
            return self.step_upper_bound(step)
        recent = logged[-RECENT_STEPS:]
        bound = self.step_token_bound(step)
        tokens: dict[str, float] = {}
        for kind in STEP_KINDS:
            values = [float(h[f"tokens/{kind}"]) for h in recent if h.get(f"tokens/{kind}") is not None]
            if values:
                n = max(values)
                if self.counts_prompts and kind in bound:
                    n = min(n, bound[kind])
                tokens[kind] = n
        if self.eval_due(step):
            evals = [h for h in history if h.get("tokens/eval_sampled") is not None][-RECENT_STEPS:]
            for kind in EVAL_KINDS:
                values = [float(h[f"tokens/{kind}"]) for h in evals if h.get(f"tokens/{kind}") is not None]
                if values:
                    tokens[kind] = max(values)
                elif kind in bound:
                    tokens[kind] = bound[kind]
        return self._tokens_cost(tokens)


# ------------------------------------------------------------------------------------------------ estimate
@dataclass
class RunEstimate:
    """The whole run's tokens and cost before it starts, as low-high ranges.

    tokens: kind -> :class:`Range` of tokens (kinds the run uses and that could be estimated). cost: kind ->
    :class:`Range` of USD, or ``None`` when the kind's price is unknown. total_usd: the sum over kinds, ``None``
    when any price is unknown. step_upper_usd: the most one RL step can cost (:meth:`CostModel.step_upper_bound`
    of step 0), the pre-run budget estimate. prices: kind -> price, for every kind the run uses.
    missing_prices: unknown prices the run needs. unmeasured: kinds the run uses whose tokens could not be
    estimated (not in ``tokens``, not in the totals). completions: how the completion lengths were chosen.
    notes: what the estimate leaves out or assumes.
    """

    spec_name: str
    sampler: str
    model: str
    steps: int
    groups_per_step: int
    group_size: int
    rollouts: int
    warmup_steps: int
    eval_steps: int
    eval_rows: int
    completions: str
    completion_tokens: Range
    tokens: dict[str, Range]
    cost: dict[str, Range | None]
    prices: dict[str, ResolvedPrice]
    total_usd: Range | None
    step_upper_usd: float | None
    max_cost_usd: float | None
    missing_prices: list[ResolvedPrice] = field(default_factory=list)
    unmeasured: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    method: str = "rl"

    def total_tokens(self) -> Range:
        out = Range(0.0, 0.0, 0.0)
        for r in self.tokens.values():
            out = out + r
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (for ``preflight --json``): ranges as ``{low, high, expected}``."""
        def rng(r: Range | None) -> dict[str, float | None] | None:
            return None if r is None else {"low": r.low, "high": r.high, "expected": r.expected}

        return {
            "sampler": self.sampler, "model": self.model, "steps": self.steps,
            "groups_per_step": self.groups_per_step, "group_size": self.group_size, "rollouts": self.rollouts,
            "warmup_steps": self.warmup_steps, "eval_steps": self.eval_steps, "eval_rows": self.eval_rows,
            "completions": self.completions, "completion_tokens": rng(self.completion_tokens),
            "tokens": {k: rng(v) for k, v in self.tokens.items()},
            "cost_usd": {k: rng(v) for k, v in self.cost.items()},
            "total_usd": rng(self.total_usd), "step_upper_usd": self.step_upper_usd,
            "max_cost_usd": self.max_cost_usd,
            "prices": {k: {"key": p.spec_key, "usd_per_mtok": p.usd_per_mtok, "origin": p.origin,
                           "source": p.source} for k, p in self.prices.items()},
            "missing_prices": [p.spec_key for p in self.missing_prices], "unmeasured": list(self.unmeasured),
            "notes": list(self.notes),
        }

    def render(self) -> list[str]:
        """Plain-text lines: the run's shape, a table of tokens and USD by kind, the total, prices and notes."""
        return render_estimate(self)


def completion_range(completion_token_lengths: Sequence[int] | None, max_tokens: int) -> tuple[Range, str]:
    """(tokens per completion, how it was chosen).

    With sampled lengths (clipped to [0, max_tokens]): expected is their mean; low/high are their 10th/90th
    percentiles (``statistics.quantiles``, inclusive method), widened where needed to the mean -/+ 2 standard
    errors, so the range always holds the mean with room for its sampling error and for lengths drifting as the
    policy trains. Without: 1 to ``max_tokens``, no expected value.
    """
    if completion_token_lengths:
        xs = [min(max(int(x), 0), max_tokens) for x in completion_token_lengths]
        mean = statistics.fmean(xs)
        se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) >= 2 else 0.0
        q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) >= 2 else [float(xs[0])]
        low = max(min(q[0], mean - 2 * se), 0.0)
        high = min(max(q[-1], mean + 2 * se), float(max_tokens))
        how = (f"{len(xs)} sampled completions: 10th-90th percentile {low:.4g}-{high:.4g} tokens, "
               f"mean {mean:.4g}")
        return Range(float(low), float(high), float(mean)), how
    return Range(1.0, float(max_tokens), None), f"not sampled: 1 to max_tokens ({max_tokens}) tokens each"


def drawn_length_sum(lengths: Sequence[int], positions: int, seed: int, *, reshuffle: bool = True,
                     total_rows: int | None = None) -> Range:
    """Total length of the rows the run draws at ``positions`` consecutive draws (``rows_for_step`` order).

    lengths: one per row, in load order. With ``total_rows`` larger than ``len(lengths)`` the lengths are a
    sample of the rows: the result is positions x their mean +- 2 standard errors (finite population corrected).
    Otherwise it is exact: full epochs add every row once, the last partial epoch follows the data order of
    ``sailrl.runtime.data.rows_for_step``.
    """
    n = len(lengths)
    if positions <= 0 or n == 0:
        return Range(0.0, 0.0, 0.0)
    if total_rows is not None and total_rows > n:
        mean = statistics.fmean(lengths)
        sd = statistics.stdev(lengths) if n > 1 else 0.0
        se = sd / math.sqrt(n) * math.sqrt((total_rows - n) / max(total_rows - 1, 1))
        return Range(positions * max(mean - 2 * se, 0.0), positions * (mean + 2 * se), positions * mean)
    epochs, rest = divmod(positions, n)
    total = epochs * sum(lengths)
    if rest:
        # rows_for_step with groups_per_step = n and step = e returns epoch e's whole order.
        order = rows_for_step(list(range(n)), epochs, n, seed, reshuffle=reshuffle)
        total += sum(lengths[i] for i in order[:rest])
    return Range(float(total), float(total), float(total))


@dataclass(frozen=True)
class EpisodeBound:
    """How many tokens one episode (``environment:``) can use, for the cost estimates' high end.

    ``turns``: ``environment.max_turns``, each sampling at most ``max_tokens``. ``budget``: the episode's token
    budget (``environment.max_episode_tokens``, else the model's context window; None when unknown).
    ``observation``: the tokens assumed added between two turns besides the reply (the longest tool result,
    ``max_output_chars`` at one token a character, or the longest feedback message, plus 32 for the turn's
    framing). Turn k (from 0) sends the conversation so far as its prompt: at most ``prompt + k x (max_tokens +
    observation)``, never more than the budget; the episode trains one datum of at most ``prompt + turns x
    max_tokens + (turns - 1) x observation`` tokens, never more than the budget.
    """

    turns: int
    max_tokens: int
    budget: int | None
    observation: int

    @classmethod
    def of(cls, spec: Spec) -> EpisodeBound | None:
        """The bound of ``spec``'s episodes; None for a single-turn spec."""
        env = getattr(spec, "environment", None)
        if env is None:
            return None
        budget = env.max_episode_tokens or context_window(spec.model.name, None)[0]
        longest = max([t.max_output_chars for t in env.tools if t.builtin != "calculator"]
                      + [len(f.message) for f in env.feedback] + [200 if any(t.builtin == "calculator"
                                                                            for t in env.tools) else 0])
        return cls(env.max_turns, int(spec.sampling.max_tokens), budget, longest + 32)

    def _cap(self, n: float) -> float:
        return float(n if self.budget is None else min(n, self.budget))

    def prompt_tokens(self, prompt: int) -> float:
        """Most prompt tokens one episode sends, over its turns."""
        return sum(self._cap(prompt + k * (self.max_tokens + self.observation)) for k in range(self.turns))

    def datum_tokens(self, prompt: int) -> float:
        """Most tokens of the one datum an episode trains."""
        return self._cap(prompt + self.turns * self.max_tokens + (self.turns - 1) * self.observation)

    def sampled_tokens(self) -> float:
        return float(self.turns * self.max_tokens)

    def words(self) -> str:
        """The bound, in explain's words."""
        budget = (f"the episode's token budget ({self.budget:,})" if self.budget is not None else
                  "no token budget (set environment.max_episode_tokens to bound it)")
        return (f"episodes: the high end counts every episode at max_turns ({self.turns}) turns of max_tokens "
                f"({self.max_tokens}) each; each later turn re-sends the conversation so far as its prompt (about "
                f"{self.observation} tokens of tool result or feedback assumed between turns), and the one datum an "
                f"episode trains is counted up to {budget}; the low end is one turn; without measured turns there "
                "is no expected value")


def estimate_run(spec: Spec, prompt_token_lengths: Sequence[int] | None,
                 completion_token_lengths: Sequence[int] | None = None, *,
                 eval_prompt_token_lengths: Sequence[int] | None = None,
                 warmup_token_lengths: Sequence[int] | None = None,
                 train_rows: int | None = None, degenerate_groups: tuple[int, int] | None = None,
                 sampler: str | None = None) -> RunEstimate:
    """Estimate a run's tokens by kind and its cost, as low-high ranges, before paying for it.

    spec: a :class:`~sailrl.spec.schema.Spec`. prompt_token_lengths: prompt length (tokens, as rendered for the
    model) of each training row, in the order ``load_rows(...).train`` returns them; ``None`` when they cannot be
    measured (prompt tokens are then left out and said so). completion_token_lengths: completion lengths sampled
    from the base policy (e.g. by ``preflight --sample``); ``None``: 1 token (low) to ``max_tokens`` (high).
    eval_prompt_token_lengths: prompt length of each held-out row (needed to count eval tokens).
    warmup_token_lengths: ``model_input.length`` of each row's supervised warm-up datum, in training-row order
    (needed to count warm-up tokens). train_rows: the number of training rows when the lengths given are a sample
    of them. degenerate_groups: ``(degenerate, sampled)`` group counts of the base-policy sample (a degenerate
    group's rollouts all scored the same), for the expected trained tokens. sampler: overrides
    ``spec.sampling.sampler``.

    The RL steps' rollouts are ``steps x groups_per_step x group_size``; each samples a completion in the
    completion range and its prompt is counted once per rollout. A trained rollout's datum is prompt +
    completion - 1 tokens and the KL reference reads prompt + completion; only groups that are not degenerate
    train, so trained and reference tokens range from 0 (every group degenerate) to every group trained at the
    high completion length; expected: the mean length and the expected share of groups that train, by Laplace's
    rule of succession from the sample, ``1 - (degenerate + 1) / (sampled + 2)`` (all of them without a sample,
    so a sample where every group was degenerate still expects some to train once the policy moves). Eval steps
    are ``steps // eval_every`` (one rollout per held-out row each), and the warm-up trains
    ``warmup.steps x batch_size`` examples drawn as the loop draws them. Costs use :class:`CostModel` prices.
    """
    if spec.method == "sft":  # no rollouts: the conversations' tokens, measured by estimate_supervised's callers
        return estimate_supervised(spec, None, sampler=sampler)
    if spec.method == "dpo":  # no rollouts: the pairs' tokens, measured by estimate_preference's callers
        return estimate_preference(spec, None, sampler=sampler)
    model = CostModel.from_spec(spec, sampler=sampler, prompt_token_lengths=prompt_token_lengths,
                                eval_prompt_token_lengths=eval_prompt_token_lengths)
    t, s = spec.training, spec.sampling
    steps, g, gs = t.steps, t.groups_per_step, t.group_size
    rollouts = steps * g * gs
    comp, how = completion_range(completion_token_lengths, s.max_tokens)
    notes: list[str] = []
    seed = shuffle_seed(spec)
    reshuffle = spec.dataset.shuffle
    tokens: dict[str, Range] = {}

    unmeasured: list[str] = []
    if prompt_token_lengths:
        prompts = drawn_length_sum(prompt_token_lengths, steps * g, seed, reshuffle=reshuffle,
                                   total_rows=train_rows).scale(gs)
        tokens["prompt"] = prompts
    else:
        prompts = Range(0.0, 0.0, 0.0)
        unmeasured.append("prompt")
        notes.append("prompt tokens are not counted, here or in trained/reference (prompt lengths not measured): "
                     "`sailrl preflight SPEC` measures them")
    tokens["sampled"] = comp.scale(rollouts)
    kept = 1.0
    if degenerate_groups is not None and degenerate_groups[1] > 0:
        d, n = min(max(degenerate_groups[0], 0), degenerate_groups[1]), degenerate_groups[1]
        kept = 1.0 - (d + 1) / (n + 2)

    def trained_range(per_rollout_extra: float) -> Range:
        high = prompts.high + rollouts * max(comp.high + per_rollout_extra, 0.0)
        expected = None if comp.expected is None or prompts.expected is None else kept * (
            prompts.expected + rollouts * max(comp.expected + per_rollout_extra, 0.0))
        low = prompts.low + rollouts * max(comp.low + per_rollout_extra, 0.0) if spec.method == "distill" else 0.0
        return Range(low, high, expected)

    if spec.method == "distill":  # every group trains, and the teacher reads every rollout's whole sequence
        kept = 1.0
        tokens["teacher"] = Range(prompts.low + rollouts * comp.low, prompts.high + rollouts * comp.high,
                                  None if comp.expected is None or prompts.expected is None else
                                  prompts.expected + rollouts * comp.expected)
    tokens["trained"] = trained_range(-1.0)
    if t.kl_penalty_coef > 0:
        tokens["reference"] = trained_range(0.0)
    episode = EpisodeBound.of(spec)
    if episode is not None:  # the high end at max_turns turns; the low end one turn; no expected value
        tokens["sampled"] = Range(tokens["sampled"].low, rollouts * episode.sampled_tokens(), None)
        lengths = list(prompt_token_lengths or [])
        draw = functools.partial(drawn_length_sum, positions=steps * g, seed=seed, reshuffle=reshuffle,
                                 total_rows=train_rows)
        if lengths:
            tokens["prompt"] = Range(prompts.low, draw([episode.prompt_tokens(n) for n in lengths]).scale(gs).high,
                                     None)
        datum_high = (draw([episode.datum_tokens(n) for n in lengths]).scale(gs).high if lengths else
                      rollouts * episode.datum_tokens(0))
        for kind, extra in (("trained", -rollouts), ("reference", 0)):
            if kind in tokens:
                tokens[kind] = Range(0.0, datum_high + extra, None)
        comp = Range(comp.low, comp.high, None)
        notes.append(episode.words())

    extra = extra_groups(spec)
    if extra:  # dynamic sampling: the high end draws every extra group every step; expected: as many as lack signal
        high, expect = (g + extra) / g, min(1.0 / kept, (g + extra) / g)
        for kind in ("prompt", "sampled"):
            if kind in tokens:
                r = tokens[kind]
                tokens[kind] = Range(r.low, r.high * high, None if r.expected is None else r.expected * expect)
        notes.append(f"dynamic sampling: the high end counts every step drawing all {extra} extra groups beyond "
                     f"groups_per_step (the upper bound); expected: {expect:.2f}x the groups, as many as the expected "
                     "share of groups with signal needs; only groups_per_step groups a step train")

    eval_steps = 0
    eval_rows = 0
    if spec.dataset.eval is not None and t.eval_every > 0:
        eval_steps = steps // t.eval_every
        if eval_prompt_token_lengths is not None:
            eval_rows = len(eval_prompt_token_lengths)
            e = float(eval_steps * sum(eval_prompt_token_lengths))
            tokens["eval_prompt"] = Range(e, e, e)
            tokens["eval_sampled"] = comp.scale(eval_steps * eval_rows)
        else:
            unmeasured += list(EVAL_KINDS)
            notes.append(f"eval is not counted ({eval_steps} eval steps; held-out prompt lengths not measured)")

    warmup_steps = t.warmup.steps if t.warmup is not None else 0
    if warmup_steps > 0:
        if warmup_token_lengths:
            tokens["warmup_trained"] = drawn_length_sum(
                warmup_token_lengths, warmup_steps * t.warmup.batch_size, seed + WARMUP_SEED_OFFSET,
                reshuffle=reshuffle, total_rows=train_rows)
        else:
            unmeasured.append("warmup_trained")
            notes.append(f"the supervised warm-up ({warmup_steps} steps x {t.warmup.batch_size} examples) is not "
                         "counted (its example lengths were not measured)")

    rules = judge_rules(spec)
    if rules:
        judged = rollouts * (g + extra) // g + eval_steps * eval_rows
        groups = steps * g + eval_steps * eval_rows  # at least one judgement per group (the others may be cached)
        prompt_r = output_r = Range(0.0, 0.0, 0.0)
        for r in rules:
            overhead = float(judge_overhead_tokens(r))
            per = Range(overhead + comp.low, overhead + comp.high,
                        None if comp.expected is None else overhead + comp.expected)
            prompt_r = prompt_r + Range(groups * per.low, judged * per.high,
                                        None if per.expected is None else judged * per.expected)
            output_r = output_r + Range(float(groups), float(judged * r.judge.max_tokens),
                                        judged * r.judge.max_tokens / 2)
        tokens["judge_prompt"] = prompt_r
        tokens["judge_output"] = output_r
        notes.append(f"judge rules ({', '.join(str(r.name) for r in rules)}): each of the {judged} rollouts is judged "
                     "once per rule (identical completions of a group once: the low end); judge prompt tokens are "
                     f"the prompt's fixed text at about {JUDGE_CHARS_PER_TOKEN} characters a token plus the "
                     "completion (counted in the policy's tokens); judge answers from 1 token to judge.max_tokens, "
                     "expected half of it")
    if t.max_steps_off_policy > 0:
        notes.append(f"with max_steps_off_policy {t.max_steps_off_policy}, groups sampled too long before the step "
                     "that trains them are dropped: their sampling is paid but not counted here")
    cost: dict[str, Range | None] = {}
    for kind, r in tokens.items():
        price = model.prices[kind].usd_per_mtok
        if price is None and not (r.low == r.high == 0):
            cost[kind] = None
        else:
            cost[kind] = r.scale((price or 0.0) / 1e6)
    total: Range | None = Range(0.0, 0.0, 0.0)
    for c in cost.values():
        total = None if c is None or total is None else total + c
    missing = model.missing_prices()
    if comp.expected is None and total is not None:
        total = Range(total.low, total.high, None)
    return RunEstimate(
        spec_name=spec.name, sampler=model.sampler, model=spec.model.name, steps=steps, groups_per_step=g,
        group_size=gs, rollouts=rollouts, warmup_steps=warmup_steps, eval_steps=eval_steps, eval_rows=eval_rows,
        completions=how, completion_tokens=comp, tokens=tokens, cost=cost,
        prices={k: model.prices[k] for k in model.used_kinds()}, total_usd=total,
        step_upper_usd=model.step_upper_bound(1), max_cost_usd=t.max_cost_usd, missing_prices=missing,
        unmeasured=unmeasured, notes=notes, method="distill" if spec.method == "distill" else "rl",
    )


def sft_evals(spec: Spec) -> int:
    """How many times an SFT run measures its held-out rows: before training, every ``eval_every`` steps, and
    after the last step (once when it is also an ``eval_every`` step); 0 without held-out rows."""
    if spec.dataset.eval is None:
        return 0
    steps, every = spec.training.steps, spec.training.eval_every
    due = steps // every if every > 0 else 0
    return 1 + due + (0 if every > 0 and steps % every == 0 else 1)


def estimate_supervised(spec: Spec, datum_token_lengths: Sequence[int] | None,
                        eval_datum_token_lengths: Sequence[int] | None = None, *, train_rows: int | None = None,
                        sampler: str | None = None) -> RunEstimate:
    """An SFT run's tokens and cost: ``training.steps x sft.batch_size`` conversations sent to forward_backward
    (``trained``: each datum's ``model_input.length``, drawn in the loop's order), and each held-out evaluation's
    forward pass over the held-out conversations (``eval_prompt``, billed as prompt tokens). The held-out samples
    scored by reward rules (one per row at the first and last evaluation and every ``eval_every`` steps) are
    ``eval_sampled``, up to ``sampling.max_tokens`` each, with their prompts inside ``eval_prompt``'s count as an
    upper end; so are the samples of as many training rows (the first in load order,
    ``SupervisedRun.train_sample``), their conversations' lengths added to ``eval_prompt``. ``datum_token_lengths``
    (one per training row, load order) / ``eval_datum_token_lengths``: None when not measured (left out and said so)."""
    model = CostModel.from_spec(spec, sampler=sampler)
    t, batch = spec.training, spec.sft.batch_size if spec.sft is not None else 32
    tokens: dict[str, Range] = {}
    unmeasured: list[str] = []
    notes: list[str] = []
    kinds = ["trained"]
    if datum_token_lengths:
        tokens["trained"] = drawn_length_sum(datum_token_lengths, t.steps * batch, shuffle_seed(spec),
                                             reshuffle=spec.dataset.shuffle, total_rows=train_rows)
    else:
        unmeasured.append("trained")
        notes.append("the conversations' tokens are not counted (the data was not measured: `sailrl preflight SPEC` "
                     "measures them); the run logs them per step (tokens/trained, cost/step)")
    evals = sft_evals(spec)
    eval_rows = len(eval_datum_token_lengths or [])
    if evals:
        kinds.append("eval_prompt")
        if eval_datum_token_lengths is not None:
            e = float(evals * sum(eval_datum_token_lengths))
            tokens["eval_prompt"] = Range(e, e, e)
        else:
            unmeasured.append("eval_prompt")
        if spec.reward is not None and eval_rows:
            n_train = train_rows if train_rows is not None else len(datum_token_lengths or []) or None
            sampled = eval_rows + (eval_rows if n_train is None else min(eval_rows, n_train))
            if "eval_prompt" in tokens and datum_token_lengths:
                e = tokens["eval_prompt"].low + evals * sum(datum_token_lengths[:sampled - eval_rows])
                tokens["eval_prompt"] = Range(e, e, e)
            kinds.append("eval_sampled")
            tokens["eval_sampled"] = Range(float(evals * sampled), float(evals * sampled * spec.sampling.max_tokens),
                                           None)
    cost: dict[str, Range | None] = {}
    for kind, r in tokens.items():
        price = model.prices[kind].usd_per_mtok
        cost[kind] = None if price is None and not (r.low == r.high == 0) else r.scale((price or 0.0) / 1e6)
    total: Range | None = Range(0.0, 0.0, 0.0)
    for c in cost.values():
        total = None if c is None or total is None else total + c
    return RunEstimate(
        spec_name=spec.name, sampler=model.sampler, model=spec.model.name, steps=t.steps, groups_per_step=batch,
        group_size=1, rollouts=0, warmup_steps=0, eval_steps=evals, eval_rows=eval_rows,
        completions="none sampled in training (the conversations are the data)",
        completion_tokens=Range(0.0, 0.0, 0.0), tokens=tokens, cost=cost,
        prices={k: model.prices[k] for k in kinds}, total_usd=total, step_upper_usd=None,
        max_cost_usd=t.max_cost_usd, missing_prices=model.missing_prices(kinds), unmeasured=unmeasured, notes=notes,
        method="sft")


#: Samples per held-out prompt at a DPO evaluation: the DPO run's ``EVAL_SAMPLES`` (runtime/preference/run.py,
#: which this folder may not import; a test checks that the two agree).
DPO_EVAL_SAMPLES = 8


def estimate_preference(spec: Spec, pair_token_lengths: Sequence[int] | None,
                        eval_pair_token_lengths: Sequence[int] | None = None, *, train_rows: int | None = None,
                        sampler: str | None = None) -> RunEstimate:
    """A DPO run's tokens and cost. ``pair_token_lengths``: one per training row, its chosen datum's
    ``model_input.length`` plus its rejected one's (load order); ``eval_pair_token_lengths`` the held-out rows'.

    ``trained``: ``training.steps x dpo.batch_size`` pairs drawn in the loop's order, each sent twice
    (``forward_backward_custom`` runs a forward for the policy's logprobs, then a forward_backward over the same
    datums). ``reference``: the frozen reference reads each distinct pair once (its two sequences, a token longer
    than their datums), the held-out pairs too, at the prefill price. ``eval_prompt``: each evaluation's forward
    pass over the held-out pairs; ``eval_sampled``: its samples of the held-out prompts (:data:`DPO_EVAL_SAMPLES` each,
    1 to ``sampling.max_tokens`` tokens). Lengths not measured are left out and said so."""
    model = CostModel.from_spec(spec, sampler=sampler)
    t, batch = spec.training, spec.dpo.batch_size if spec.dpo is not None else 16
    tokens: dict[str, Range] = {}
    unmeasured: list[str] = []
    notes: list[str] = []
    kinds = ["trained", "reference"]
    drawn = t.steps * batch
    if pair_token_lengths:
        tokens["trained"] = drawn_length_sum(pair_token_lengths, drawn, shuffle_seed(spec),
                                             reshuffle=spec.dataset.shuffle, total_rows=train_rows).scale(2.0)
        rows = train_rows or len(pair_token_lengths)
        read = drawn_length_sum([n + 2 for n in pair_token_lengths], min(drawn, rows), shuffle_seed(spec),
                                reshuffle=spec.dataset.shuffle, total_rows=train_rows)
        tokens["reference"] = read
    else:
        unmeasured += ["trained", "reference"]
        notes.append("the pairs' tokens are not counted (the data was not measured: `sailrl preflight SPEC` measures "
                     "them); the run logs them per step (tokens/trained, tokens/reference, cost/step)")
    evals = sft_evals(spec)
    eval_rows = len(eval_pair_token_lengths or [])
    if evals:
        kinds += ["eval_prompt", "eval_sampled"]
        if eval_pair_token_lengths is not None:
            e = float(evals * sum(eval_pair_token_lengths))
            tokens["eval_prompt"] = Range(e, e, e)
            if "reference" in tokens:  # the held-out pairs, read once
                held_out = float(sum(n + 2 for n in eval_pair_token_lengths))
                tokens["reference"] = tokens["reference"] + Range(held_out, held_out, held_out)
            n = evals * eval_rows * DPO_EVAL_SAMPLES
            tokens["eval_sampled"] = Range(float(n), float(n * spec.sampling.max_tokens), None)
        else:
            unmeasured += ["eval_prompt", "eval_sampled"]
    cost: dict[str, Range | None] = {}
    for kind, r in tokens.items():
        price = model.prices[kind].usd_per_mtok
        cost[kind] = None if price is None and not (r.low == r.high == 0) else r.scale((price or 0.0) / 1e6)
    total: Range | None = Range(0.0, 0.0, 0.0)
    for c in cost.values():
        total = None if c is None or total is None else total + c
    return RunEstimate(
        spec_name=spec.name, sampler=model.sampler, model=spec.model.name, steps=t.steps, groups_per_step=batch,
        group_size=1, rollouts=0, warmup_steps=0, eval_steps=evals, eval_rows=eval_rows,
        completions="none sampled in training (the pairs are the data)", completion_tokens=Range(0.0, 0.0, 0.0),
        tokens=tokens, cost=cost, prices={k: model.prices[k] for k in kinds}, total_usd=total, step_upper_usd=None,
        max_cost_usd=t.max_cost_usd, missing_prices=model.missing_prices(kinds), unmeasured=unmeasured, notes=notes,
        method="dpo")


@dataclass
class TokenLengths:
    """Measured lengths (tokens) per training row: ``prompt`` (the generation prompt) and ``warmup`` (the
    supervised warm-up datum's ``model_input.length``; ``None`` without a warm-up)."""

    prompt: list[int]
    warmup: list[int] | None = None


def measure_token_lengths(spec: Spec, rows: Sequence[Mapping[str, Any]], prompts: Any) -> TokenLengths:
    """Token lengths of ``rows`` as the run renders them, for :func:`estimate_run`.

    spec: the run's Spec. rows: training (or held-out) rows in load order. prompts: a
    ``sailrl.runtime.prompts.PromptBuilder`` with the run's renderer. The warm-up datum is the prompt plus
    ``training.warmup.completion`` (default: the reference field), as the loop builds it.
    """
    prompt = [int(prompts.model_input(r).length) for r in rows]
    w = spec.training.warmup
    warmup = None
    if w is not None and w.steps > 0:
        completion = w.completion or "{{ " + spec.prompt.reference_field + " }}"
        warmup = [int(prompts.supervised_datum(r, completion).model_input.length) for r in rows]
    return TokenLengths(prompt, warmup)


# ------------------------------------------------------------------------------------------------ text
def fmt_tokens(x: float) -> str:
    return f"{x:,.0f}"


def fmt_usd(x: float) -> str:
    """``$1,234.57``, ``$0.0123``, ``$0.000012`` (4 significant digits below a dollar), ``$0`` for zero."""
    if x == 0:
        return "$0"
    if abs(x) >= 1:
        return f"${x:,.2f}"
    return f"${x:.4g}" if abs(x) >= 1e-4 else f"${x:.2g}"


def _span(r: Range, fmt: Any) -> str:
    text = fmt(r.low) if r.low == r.high else f"{fmt(r.low)} - {fmt(r.high)}"
    if r.expected is not None and r.low != r.high:
        text += f" (expected {fmt(r.expected)})"
    return text


def _price_text(p: ResolvedPrice) -> str:
    if p.origin == "local":
        return "local backend: free"
    if p.usd_per_mtok is None:
        return f"{p.spec_key}: unknown"
    where = "from the spec" if p.origin == "spec" else "estimate"
    return f"{p.spec_key} ${p.usd_per_mtok:g}/M tokens ({where})"


def render_estimate(e: RunEstimate) -> list[str]:
    """The lines of :meth:`RunEstimate.render`."""
    head = (f"Estimated cost of '{e.spec_name}' ({e.sampler} sampler, {e.model}): {e.steps} RL steps x "
            f"{e.groups_per_step} groups x {e.group_size} rollouts = {e.rollouts:,} rollouts")
    if e.method == "sft":
        head = (f"Estimated cost of '{e.spec_name}' ({e.sampler} backend, {e.model}): {e.steps} SFT steps x "
                f"{e.groups_per_step} conversations = {e.steps * e.groups_per_step:,} conversations trained")
    if e.method == "distill":
        head = head.replace(" RL steps x ", " distillation steps x ")
    if e.method == "dpo":
        head = (f"Estimated cost of '{e.spec_name}' ({e.sampler} backend, {e.model}): {e.steps} DPO steps x "
                f"{e.groups_per_step} pairs = {e.steps * e.groups_per_step:,} pairs trained")
    extra = []
    if e.warmup_steps:
        extra.append(f"{e.warmup_steps} warm-up steps")
    if e.eval_steps:
        extra.append(f"{e.eval_steps} {'evaluations' if e.method in ('sft', 'dpo') else 'eval steps'}"
                     + (f" x {e.eval_rows} rows" if e.eval_rows else ""))
    lines = [head + (f", {', '.join(extra)}" if extra else "") + "."]
    if e.method in ("rl", "distill"):
        lines.append(f"Completion lengths: {e.completions}.")
    rows = [("kind", "tokens", "USD", "price")]
    for kind in e.prices:
        r = e.tokens.get(kind)
        if r is None:
            rows.append((kind, "not measured", "-", _price_text(e.prices[kind])))
            continue
        c = e.cost.get(kind)
        rows.append((kind, _span(r, fmt_tokens), "unknown price" if c is None else _span(c, fmt_usd),
                     _price_text(e.prices[kind])))
    width = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        lines.append("  " + "  ".join(row[i].ljust(width[i]) for i in range(3)) + "  " + row[3])
    label = "total" + (f" (without {', '.join(e.unmeasured)})" if e.unmeasured else "")
    lines.append(f"  {label}: {_span(e.total_tokens(), fmt_tokens)} tokens, "
                 + ("cost unknown (prices missing)" if e.total_usd is None else _span(e.total_usd, fmt_usd)))
    if e.step_upper_usd is not None:
        kind = "distillation" if e.method == "distill" else "RL"
        lines.append(f"One {kind} step costs at most {fmt_usd(e.step_upper_usd)} (every completion at max_tokens, "
                     "every group trained).")
    if e.max_cost_usd is not None:
        lines.append(f"Budget (training.max_cost_usd): {fmt_usd(e.max_cost_usd)}.")
    if e.missing_prices:
        lines.append("Unknown prices (add them under pricing:, in USD per million tokens, to see the cost): "
                     + ", ".join(p.spec_key for p in e.missing_prices) + ".")
    estimates = {p.source for p in e.prices.values() if p.origin == "estimate"}
    for source in sorted(estimates):
        lines.append(f"Price estimate: {source}.")
    if "trained" in e.tokens and e.method == "rl":
        lines.append("Note: trained tokens start at 0 because degenerate groups (every rollout scored the same) are "
                     "not trained.")
    lines += [f"Note: {n}." for n in e.notes]
    return lines
