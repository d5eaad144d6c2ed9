"""Reward rule shapes of the spec language (``reward:`` section).

This module only declares what a rule looks like; ``sailrl.runtime.rewards`` evaluates rules.
Every rule has a ``name`` (the metric key ``reward/<name>``) and either a ``weight`` (the rule
contributes ``weight * score`` where score is in [0, 1]) or explicit ``pass_score`` / ``fail_score``.

The Sail guide's reward ``correct - 0.1 * (1 - format)`` is two rules::

    rules:
      - name: correct
        kind: answer
        extract: {from: boxed}
        reference: {field: answer, extract: {from: boxed, fallback: whole}}
        compare: numeric
        weight: 1.0
      - name: format
        kind: all_of            # boxed answer present AND clean termination
        ...
        pass_score: 0.0
        fail_score: -0.1
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from sailrl.spec.base import SpecModel, Text


class Extractor(SpecModel):
    """How an answer is taken out of a text (a completion, or a reference field)."""

    from_: Literal["boxed", "regex", "last_number", "after_marker", "whole"] = Field(
        "boxed",
        alias="from",
        description=(
            "boxed: the LAST \\boxed{...} (braces balanced, so \\boxed{\\frac{1}{2}} works; also \\boxed 7). "
            "regex: the capture group of `pattern`. last_number: the last number in the text. "
            "after_marker: the text after the last `marker` (e.g. '####' for GSM8K). whole: the whole text, stripped."
        ),
    )
    pattern: Text | None = Field(
        None, description="For from: regex - a regular expression with one capture group. Use single quotes in YAML."
    )
    occurrence: Literal["last", "first"] = Field(
        "last", description="For from: regex / boxed - which match to take when there are several."
    )
    marker: Text | None = Field(None, description="For from: after_marker - e.g. '####' or 'A:'.")
    fallback: Literal["none", "whole"] = Field(
        "none",
        description="What to do when nothing is found: none = no answer (the rule fails); whole = use the whole text.",
    )


class ReferenceSpec(SpecModel):
    """Where the reference answer comes from."""

    field: Text | None = Field(
        None, description="Dataset field holding the reference (default: prompt.reference_field)."
    )
    extract: Extractor = Field(
        default_factory=lambda: Extractor(**{"from": "whole"}),
        description="How to take the reference answer out of that field (e.g. after_marker '####' for GSM8K).",
    )


class _RuleBase(SpecModel):
    name: Text = Field(description="Rule name; its per-step mean is logged as reward/<name>.")
    weight: float | None = Field(
        None, description="Contribution = weight x score (score 1 on pass, 0 on fail). Default 1.0."
    )
    pass_score: float | None = Field(None, description="Contribution when the rule passes (instead of weight).")
    fail_score: float | None = Field(None, description="Contribution when the rule fails (instead of weight).")


class AnswerRule(_RuleBase):
    """Extract an answer from the completion and compare it with the reference answer."""

    kind: Literal["answer"]
    extract: Extractor = Field(default_factory=Extractor, description="How to find the answer in the completion.")
    reference: ReferenceSpec = Field(default_factory=ReferenceSpec, description="Where the reference answer is.")
    compare: Literal["exact", "normalized", "numeric", "math"] = Field(
        "normalized",
        description=(
            "exact: identical strings. normalized: ignoring case, whitespace, trailing period, $ signs, \\text{}, "
            "thousands separators. numeric: equal as numbers (fractions, -3.0 = -3). math: symbolic equivalence."
        ),
    )
    abs_tol: float = Field(0.0, ge=0, description="For numeric: absolute tolerance.")
    rel_tol: float = Field(0.0, ge=0, description="For numeric: relative tolerance.")


class MatchRule(_RuleBase):
    """Score when a regular expression matches the completion (or when it does not)."""

    kind: Literal["match"]
    pattern: Text = Field(description="Regular expression. Use single quotes in YAML so backslashes stay as typed.")
    mode: Literal["search", "fullmatch"] = Field("search", description="search anywhere, or match the whole text.")
    flags: list[Literal["DOTALL", "IGNORECASE", "MULTILINE", "VERBOSE"]] = Field(
        default_factory=list, description="Regex flags."
    )
    negate: bool = Field(False, description="Pass when the pattern does NOT match.")


class TerminationRule(_RuleBase):
    """Pass when the completion ended cleanly (stop sequence / end of turn), not cut off at max_tokens."""

    kind: Literal["termination"]


class LengthRule(_RuleBase):
    """Pass when the completion length lies within bounds."""

    kind: Literal["length"]
    unit: Literal["tokens", "chars"] = Field("tokens", description="Count completion tokens or characters.")
    min: int | None = Field(None, ge=0, description="Inclusive lower bound.")
    max: int | None = Field(None, ge=0, description="Inclusive upper bound.")


class AllOfRule(_RuleBase):
    """Pass when every listed check passes (e.g. a boxed answer is present AND the completion ended cleanly)."""

    kind: Literal["all_of"]
    checks: list[Annotated[Union["HasAnswerCheck", MatchRule, TerminationRule, LengthRule], Field(discriminator="kind")]] = Field(
        description="Checks that must all pass; each is written like a rule but its name and weight are ignored."
    )


class HasAnswerCheck(_RuleBase):
    """Pass when the extractor finds an answer in the completion."""

    kind: Literal["has_answer"]
    name: Text = Field("has_answer", description="Rule name.")
    extract: Extractor = Field(default_factory=Extractor, description="How to find the answer.")


RewardRule = Annotated[
    Union[AnswerRule, MatchRule, TerminationRule, LengthRule, AllOfRule, HasAnswerCheck],
    Field(discriminator="kind"),
]


class RewardExample(SpecModel):
    """A worked example checked by ``sailrl validate``: a completion and the scores it must get."""

    completion: Text = Field(description="The completion text to score.")
    fields: dict[str, Text] = Field(default_factory=dict, description="Dataset fields for this example (e.g. answer).")
    truncated: bool = Field(False, description="Treat the completion as cut off at max_tokens.")
    expect_total: float | None = Field(None, description="Expected total reward.")
    expect: dict[str, float] = Field(default_factory=dict, description="Expected contribution per rule name.")


class RewardSpec(SpecModel):
    """The reward: a weighted sum of rules, optionally clipped."""

    rules: list[RewardRule] = Field(min_length=1, description="The reward rules; the total is the sum of contributions.")
    clip: tuple[float, float] | None = Field(None, description="Clip the total to [low, high].")
    correct_rule: Text | None = Field(
        None, description="Name of the rule whose pass rate is logged as 'correct' (default: the first answer rule)."
    )
    regex_timeout_s: float = Field(
        0.1, gt=0, description="Seconds one regex may run on one completion before the rule counts as failed."
    )


AllOfRule.model_rebuild()
