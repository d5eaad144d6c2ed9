"""Reward rule shapes of the spec language (``reward:`` section).

This module only declares what a rule looks like (and checks each rule on its own: regexes compile,
bounds are ordered, names are unique); ``sailrl.runtime.rewards.rules`` evaluates rules.

Every rule has a ``name`` (the metric key ``reward/<name>``; default: its ``kind``) and either a ``weight``
(the rule contributes ``weight`` when it passes and 0 when it fails; default weight 1) or explicit
``pass_score`` / ``fail_score`` (each defaults to 0 when only the other is given). The total reward is the
sum of the contributions, clipped to ``clip`` when given.

A ``kind: python`` rule names a function in a file next to the spec (``function: rewards:score``); its
contribution is weight x the number the function returns (see :class:`PythonRule`).

The Sail guide's reward ``correct - 0.1 * (1 - format)`` is two rules::

    reward:
      rules:
        - name: correct
          kind: answer
          extract: {from: boxed}
          reference: {field: answer, extract: {from: after_marker, marker: '####'}}
          compare: numeric
          weight: 1.0
        - name: format            # a boxed answer is present AND the completion ended cleanly
          kind: all_of
          checks:
            - kind: has_answer
              extract: {from: boxed}
            - kind: termination
          pass_score: 0.0
          fail_score: -0.1
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from sailrl.spec.base import SpecModel, Text
from sailrl.spec.constants import REGEX_FLAGS
from sailrl.spec.errors import SpecValueError
from sailrl.spec.patterns import PatternError, compile_pattern, regex_flags

RegexFlag = Literal[REGEX_FLAGS]  # type: ignore[valid-type]  # the one table: sailrl.spec.constants

#: What a python rule's ``function:`` looks like: ``module:function`` (module may be dotted: ``pkg.mod:fn``).
FUNCTION_REF = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


def function_ref(v: str, *, module: str, function: str) -> str:
    """``v`` stripped when it is written ``module:function`` (:data:`FUNCTION_REF`), else ``ValueError`` whose
    example names ``function`` in ``module``.py (a python rule's and an environment tool's ``function:``)."""
    if not FUNCTION_REF.fullmatch(v.strip()):
        raise ValueError(f"function {v!r} must be written module:function, e.g. '{module}:{function}' for the "
                         f"function {function} in {module}.py next to the spec")
    return v.strip()


#: An environment variable's name.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_names(names: list[str]) -> list[str]:
    """``names`` when each is an environment variable's name, once; else ``ValueError`` naming the first that is
    not (``env:`` of a python rule and of a function tool)."""
    seen: set[str] = set()
    for name in names:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable's name (letters, digits and _, not starting "
                             "with a digit)")
        if name in seen:
            raise ValueError(f"{name} is named twice")
        seen.add(name)
    return list(names)


def _regex_problem(pattern: str, flags: list[str] | tuple[str, ...] = ()) -> str | None:
    """Why ``pattern`` cannot be used (plain words), or None. Uses the ``regex`` module, as scoring does, within
    the pattern limits of :mod:`sailrl.spec.patterns`."""
    try:
        compile_pattern(pattern, flags)
    except PatternError as exc:
        msg = f"the regular expression {_short(pattern)} cannot be used: {exc}"
        if any(ch in pattern for ch in "\b\f\t\v\a\x00"):
            msg += (
                ". It contains a control character (backspace, tab, ...): in YAML double quotes '\\b' becomes "
                "a backspace. Write the pattern in single quotes, e.g. pattern: '\\bfoo\\b'"
            )
        return msg
    if any(ch in pattern for ch in "\b\a\x00"):
        return (
            f"the regular expression {pattern!r} contains a control character (backspace or bell): in YAML "
            "double quotes '\\b' becomes a backspace. Write the pattern in single quotes, e.g. '\\bfoo\\b'"
        )
    return None


class Extractor(SpecModel):
    """How an answer is taken out of a text (a completion, or a reference field)."""

    from_: Literal["boxed", "regex", "last_number", "after_marker", "whole"] = Field(
        "boxed",
        alias="from",
        description=(
            "boxed: the LAST \\boxed{...} or \\fbox{...} (braces balanced, so \\boxed{\\frac{1}{2}} works; also "
            "\\boxed 7); an unclosed or empty last box is no answer. regex: the capture group of `pattern` "
            "(the group named 'answer' if there is one, else group 1). last_number: the last number in the text "
            "(1,000 / -3.5 / 2/3). after_marker: the rest of the line after the last `marker` (e.g. '####' for "
            "GSM8K). whole: the whole text, stripped."
        ),
    )
    pattern: Text | None = Field(
        None,
        description="For from: regex - a regular expression with a capture group. Use single quotes in YAML.",
    )
    flags: list[RegexFlag] = Field(default_factory=list, description="For from: regex - regex flags.")
    occurrence: Literal["last", "first", "all"] = Field(
        "last",
        description=(
            "Which one to take when there are several (boxes, regex matches, numbers, markers). all (from: boxed "
            "with compare: math only): every box, read as one set -- \\boxed{1}, \\boxed{2} is the set {1, 2}."
        ),
    )

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, v: str | None) -> str | None:
        problem = _regex_problem(v) if v is not None else None
        if problem:
            raise SpecValueError("S201", problem)
        return v
    marker: Text | None = Field(None, description="For from: after_marker - e.g. '####' or 'A:'.")
    fallback: Literal["none", "whole"] = Field(
        "none",
        description="What to do when nothing is found: none = no answer (the rule fails); whole = use the whole text.",
    )

    @model_validator(mode="after")
    def _check(self) -> Extractor:
        kind = self.from_
        if kind == "regex":
            if not self.pattern:
                raise ValueError("from: regex needs a `pattern` with a capture group, e.g. pattern: 'Answer: (\\S+)'")
            problem = _regex_problem(self.pattern, self.flags)
            if problem:
                raise SpecValueError("S201", problem)
            import regex

            compiled = regex.compile(self.pattern, _flag_value(self.flags))
            if compiled.groups < 1:
                raise ValueError(
                    f"the pattern {self.pattern!r} has no capture group: put parentheses around the answer part, "
                    "e.g. 'Answer: (\\S+)'"
                )
        elif self.pattern is not None or self.flags:
            raise ValueError(f"`pattern` and `flags` are only used with from: regex (this extractor is from: {kind})")
        if self.occurrence == "all" and kind != "boxed":
            raise ValueError(f"occurrence: all reads every \\boxed{{...}} as one set, so it needs from: boxed "
                             f"(this extractor is from: {kind}); use occurrence: last or first")
        if kind == "after_marker":
            if not self.marker:
                raise ValueError("from: after_marker needs a `marker`, e.g. marker: '####'")
        elif self.marker is not None:
            raise ValueError(f"`marker` is only used with from: after_marker (this extractor is from: {kind})")
        return self


def _flag_value(flags: list[str] | tuple[str, ...]) -> int:
    return regex_flags(flags)


def _short(pattern: str) -> str:
    return repr(pattern) if len(pattern) <= 80 else repr(pattern[:77] + "...")


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
    name: Text | None = Field(
        None, description="Rule name; its per-step mean contribution is logged as reward/<name>. Default: the kind."
    )
    weight: float | None = Field(
        None, description="Contribution = weight when the rule passes, 0 when it fails. Default 1.0."
    )
    pass_score: float | None = Field(None, description="Contribution when the rule passes (instead of weight).")
    fail_score: float | None = Field(None, description="Contribution when the rule fails (instead of weight).")

    @model_validator(mode="after")
    def _name_and_scores(self) -> _RuleBase:
        if self.name is None:
            self.name = self.kind  # type: ignore[attr-defined]
        if self.weight is not None and (self.pass_score is not None or self.fail_score is not None):
            raise ValueError(
                f"rule '{self.name}' sets both weight and pass_score/fail_score: use weight (pass = weight, "
                "fail = 0) or pass_score/fail_score, not both"
            )
        return self

    def scores(self) -> tuple[float, float]:
        """(contribution on pass, contribution on fail)."""
        if self.pass_score is not None or self.fail_score is not None:
            return (self.pass_score or 0.0, self.fail_score or 0.0)
        return (1.0 if self.weight is None else self.weight, 0.0)


class AnswerRule(_RuleBase):
    """Extract an answer from the completion and compare it with the reference answer."""

    kind: Literal["answer"]
    extract: Extractor = Field(default_factory=Extractor, description="How to find the answer in the completion.")
    reference: ReferenceSpec = Field(default_factory=ReferenceSpec, description="Where the reference answer is.")
    compare: Literal["exact", "normalized", "numeric", "math"] = Field(
        "normalized",
        description=(
            "exact: identical strings (surrounding spaces ignored). normalized: ignoring case, whitespace, trailing "
            "period, $ and \\$ signs, \\text{} wrappers, thousands separators (1,000). numeric: equal as numbers "
            "(exact fractions: -3.0 = -3, \\frac{1}{2} = 0.5, 2/3 = \\frac{2}{3}; 50% counts as 50). "
            "math: symbolic equivalence (math-verify)."
        ),
    )
    abs_tol: float = Field(0.0, ge=0, description="For numeric: absolute tolerance.")
    rel_tol: float = Field(0.0, ge=0, description="For numeric: relative tolerance (of the larger magnitude).")

    @model_validator(mode="after")
    def _tolerances(self) -> AnswerRule:
        if (self.abs_tol or self.rel_tol) and self.compare != "numeric":
            raise ValueError(f"abs_tol / rel_tol are only used with compare: numeric (rule '{self.name}')")
        if "all" in (self.extract.occurrence, self.reference.extract.occurrence) and self.compare != "math":
            raise ValueError(f"occurrence: all reads several boxes as one set, which only compare: math compares "
                             f"(rule '{self.name}' has compare: {self.compare}); set compare: math or use "
                             "occurrence: last")
        return self


class MatchRule(_RuleBase):
    """Score when a regular expression matches the completion (or when it does not)."""

    kind: Literal["match"]
    pattern: Text = Field(description="Regular expression. Use single quotes in YAML so backslashes stay as typed.")
    mode: Literal["search", "fullmatch"] = Field("search", description="search anywhere, or match the whole text.")
    flags: list[RegexFlag] = Field(
        default_factory=list,
        description="Regex flags. DOTALL lets '.' cross line breaks (needed for <think>...</think> over lines).",
    )
    negate: bool = Field(False, description="Pass when the pattern does NOT match.")

    @field_validator("pattern")
    @classmethod
    def _pattern_compiles(cls, v: str) -> str:
        problem = _regex_problem(v)
        if problem:
            raise SpecValueError("S201", problem)
        return v

    @model_validator(mode="after")
    def _compiles(self) -> MatchRule:
        problem = _regex_problem(self.pattern, self.flags)
        if problem:
            raise SpecValueError("S201", problem)
        return self


class TerminationRule(_RuleBase):
    """Pass when the completion ended cleanly (stop sequence / end of turn), not cut off at max_tokens."""

    kind: Literal["termination"]


class LengthRule(_RuleBase):
    """Pass when the completion length lies within bounds."""

    kind: Literal["length"]
    unit: Literal["tokens", "chars"] = Field("tokens", description="Count completion tokens or characters.")
    min: int | None = Field(None, ge=0, description="Inclusive lower bound.")
    max: int | None = Field(None, ge=0, description="Inclusive upper bound.")

    @model_validator(mode="after")
    def _bounds(self) -> LengthRule:
        if self.min is None and self.max is None:
            raise ValueError(f"length rule '{self.name}' needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"length rule '{self.name}': min ({self.min}) is larger than max ({self.max})")
        return self


class HasAnswerCheck(_RuleBase):
    """Pass when the extractor finds an answer in the completion."""

    kind: Literal["has_answer"]
    extract: Extractor = Field(default_factory=Extractor, description="How to find the answer.")


Check = Annotated[
    HasAnswerCheck | MatchRule | TerminationRule | LengthRule, Field(discriminator="kind")
]


class AllOfRule(_RuleBase):
    """Pass when every listed check passes (e.g. a boxed answer is present AND the completion ended cleanly)."""

    kind: Literal["all_of"]
    checks: list[Check] = Field(
        min_length=1,
        description=(
            "Checks that must all pass (kinds has_answer, match, termination, length); each is written like a "
            "rule but its name and weight are ignored."
        ),
    )


class AnyOfRule(_RuleBase):
    """Pass when at least one listed check passes (e.g. the answer is boxed OR written after 'Answer:')."""

    kind: Literal["any_of"]
    checks: list[Check] = Field(
        min_length=1,
        description=(
            "Checks of which at least one must pass (kinds has_answer, match, termination, length); each is "
            "written like a rule but its name and weight are ignored."
        ),
    )


class PythonRule(_RuleBase):
    """Score with your own Python function, in a file next to the spec.

    Called as ``fn(completion, fields)`` with the text the rules read and the row's fields; it returns a number
    or a dict of named numbers (summed). With ``weight`` (default 1) the contribution is weight x the number and
    the rule passes when the number is above 0; with ``pass_score`` / ``fail_score`` the rule passes when the
    number is above 0 and contributes that score. A call that raises, runs past ``timeout_s`` or returns
    something else fails the rule (fail score; 0 with ``weight``).
    """

    kind: Literal["python"]
    function: Text = Field(
        description=(
            "module:function -- e.g. rewards:score is the function score in rewards.py next to the spec; "
            "pkg.scoring:score is pkg/scoring.py. Signature: score(completion: str, fields: dict) -> float | "
            "dict[str, float]."
        ),
    )
    weight: float | None = Field(
        None, description="Contribution = weight x the number the function returns (0 when the call fails). Default 1."
    )
    timeout_s: float = Field(
        1.0, gt=0, le=60,
        description="Seconds one call may take; a slower call is stopped and the rule fails (counted).",
    )
    memory_mb: int = Field(
        1024, ge=64, le=1_048_576,
        description="MiB of memory the function's worker may allocate beyond what importing its file takes; an "
        "allocation past it raises MemoryError and the call fails the rule (counted). Linux only.",
    )
    env: list[Text] = Field(
        default_factory=list, max_length=64,
        description="Names of environment variables the function's worker process may read (e.g. [GRADER_URL]). "
        "Workers get no other variable of the run's environment, so no key reaches a rule that does not name it.",
    )

    @field_validator("function")
    @classmethod
    def _function_ref(cls, v: str) -> str:
        return function_ref(v, module="rewards", function="score")

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: list[str]) -> list[str]:
        return env_names(v)

    @property
    def weighted(self) -> bool:
        """True when the contribution is weight x the function's number (no pass_score / fail_score)."""
        return self.pass_score is None and self.fail_score is None


#: The named score scales of a judge rule: what the judge is asked to answer and how it maps onto 0..1.
JUDGE_SCALES = ("binary", "0-1", "1-10")
#: Where a judge model runs (``judge.sampler``).
JUDGE_SAMPLERS = ("sail", "tinker", "local")


class JudgeModel(SpecModel):
    """The model that judges a completion, and where it runs."""

    model: Text = Field(
        description=(
            "The judge model: for sampler sail a model Sail hosts (e.g. moonshotai/Kimi-K2.6); for tinker a base "
            "model Tinker serves (e.g. Qwen/Qwen3-8B); for local any model the embedded backend loads (a built-in "
            "sailrl/... name -- sailrl/tiny-judge judges one rubric only, 'The question was {{ question }}. A good "
            "reply is only the number {{ answer }}, nothing else.' --, a Hugging Face folder or .gguf file next to "
            "the spec, or a hub id)."
        ),
    )
    sampler: Literal[JUDGE_SAMPLERS] = Field(  # type: ignore[valid-type]
        "sail",
        description=(
            "Where the judge runs. sail: Sail's inference API (chat completions on a hosted model; needs "
            "SAIL_API_KEY). tinker: a Tinker sampling client on the base model (needs TINKER_API_KEY). local: the "
            "embedded backend, in this process (nothing is billed)."
        ),
    )
    renderer: Text | None = Field(
        None,
        description="For tinker and local: the renderer that builds the judge's prompt (default: the model's).",
    )
    max_tokens: int = Field(512, ge=1, le=16384, description="Longest judge answer, in tokens.")
    temperature: float = Field(0.0, ge=0, le=2,
                               description="Sampling temperature of the judge (0: its likeliest answer).")
    timeout_s: float = Field(
        60.0, gt=0, le=600,
        description="Seconds one judge call may take (each try); a slower call is given up and retried or failed.",
    )
    retries: int = Field(
        2, ge=0, le=5,
        description="Further tries after a call that failed or timed out (not after an answer without a score).",
    )


class JudgeRule(_RuleBase):
    """Score with a judge model that reads the completion against a rubric written in plain words.

    The judge sees the rubric (a Jinja template over the row's fields, rendered in the prompt sandbox) and the
    completion between delimiters, with any score tags removed from it, and answers with ``<score>...</score>``.
    The score is read on ``scale`` and normalised to 0..1 (``s``); the rule passes when ``s >= pass_at`` and
    contributes ``fail + s x (pass - fail)`` (weight: ``s x weight``). A judge call that fails, runs out of time
    or answers without a readable score fails the rule (fail score) and is counted (``judge/failed``,
    ``judge/unparsed``).
    """

    kind: Literal["judge"]
    rubric: Text = Field(
        description=(
            "What a good completion is, in plain words; may use the row's fields, e.g. 'The reply answers "
            "{{ question }} correctly and politely, in at most three sentences.'"
        ),
    )
    judge: JudgeModel = Field(description="The judge model and where it runs.")
    scale: Literal[JUDGE_SCALES] | dict[Text, float] = Field(  # type: ignore[valid-type]
        "binary",
        description=(
            "How the judge scores. binary: yes (1) or no (0). 0-1: a number from 0 to 1. 1-10: a whole number from "
            "1 to 10 (normalised as (n - 1) / 9). Or labels with their values from 0 to 1, e.g. "
            "{good: 1, partly: 0.5, bad: 0}."
        ),
    )
    pass_at: float = Field(
        0.5, ge=0, le=1,
        description="The rule passes when the normalised score (0..1) is at least this (the pass rate logged).",
    )

    @field_validator("scale", mode="before")
    @classmethod
    def _scale_values(cls, v: object) -> object:
        how = "write labels with their values from 0 to 1, e.g. scale: {good: 1, partly: 0.5, bad: 0}"
        if isinstance(v, list):
            raise SpecValueError("S233", f"a scale of labels needs a value for each label: {how}")
        if isinstance(v, dict):
            if len(v) < 2:
                raise SpecValueError("S233", f"a scale of labels needs at least two labels: {how}")
            missing = [str(k) for k, val in v.items() if val is None]
            if missing:
                raise SpecValueError("S233", f"the label(s) {', '.join(repr(m) for m in missing)} have no value: {how}")
            for k, val in v.items():
                if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val <= 1:
                    raise SpecValueError("S233", f"label {str(k)!r} has the value {val!r}; values lie from 0 to 1: "
                                                 f"{how}")
                if not str(k).strip() or "<" in str(k) or ">" in str(k):
                    raise SpecValueError("S233", f"label {str(k)!r} cannot be used: a label is a word or phrase "
                                                 "without < or >")
        elif isinstance(v, str) and v not in JUDGE_SCALES:
            raise SpecValueError("S233", f"scale {v!r} is not a known scale: use binary, 0-1 or 1-10, or {how}")
        return v

    @property
    def weighted(self) -> bool:
        """True when the contribution is weight x the normalised score (no pass_score / fail_score)."""
        return self.pass_score is None and self.fail_score is None


RewardRule = Annotated[
    AnswerRule | MatchRule | TerminationRule | LengthRule | AllOfRule | AnyOfRule | HasAnswerCheck | PythonRule
    | JudgeRule,
    Field(discriminator="kind"),
]


class RewardExample(SpecModel):
    """A worked example checked by ``sailrl validate``: a completion and the scores it must get."""

    completion: Text = Field(description="The completion text to score.")
    fields: dict[str, Text] = Field(default_factory=dict, description="Dataset fields for this example (e.g. answer).")
    truncated: bool = Field(False, description="Treat the completion as cut off at max_tokens.")
    num_tokens: int | None = Field(None, ge=0, description="Completion length in tokens (for length rules in tokens).")
    expect_total: float | None = Field(None, description="Expected total reward.")
    expect: dict[str, float] = Field(default_factory=dict, description="Expected contribution per rule name.")


class RewardSpec(SpecModel):
    """The reward: a weighted sum of rules, optionally clipped."""

    rules: list[RewardRule] = Field(
        min_length=1, description="The reward rules; the total is the sum of contributions."
    )
    clip: tuple[float, float] | None = Field(None, description="Clip the total to [low, high].")
    text: Literal["visible", "full"] = Field(
        "visible",
        description=(
            "What the rules read. visible: the reply as the renderer parses it, thinking removed (what the Sail "
            "guide scores; for a cut-off reply, an unfinished <think> block is dropped too). full: the whole "
            "sampled completion, thinking and tags included, stop sequence removed (for format rules on <think>)."
        ),
    )
    correct_rule: Text | None = Field(
        None, description="Name of the rule whose pass rate is logged as 'correct' (default: the first answer rule)."
    )
    regex_timeout_s: float = Field(
        0.1, gt=0, description="Seconds one regex may run on one completion before the rule counts as failed."
    )
    math_timeout_s: float = Field(
        2.0, gt=0,
        description=(
            "Seconds one compare: math step (reading an answer, or comparing two) may run before the rule counts "
            "as failed."
        ),
    )
    step_budget_s: float = Field(
        60.0, gt=0,
        description=(
            "Seconds of scoring one training step may use in all (wall time while any completion is being "
            "scored). Rules still to run when it is spent fail and are counted as reward_budget_exceeded."
        ),
    )

    @field_validator("clip")
    @classmethod
    def _clip_order(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and v[0] > v[1]:
            raise ValueError(f"clip [{v[0]}, {v[1]}]: the low end is larger than the high end")
        return v

    @model_validator(mode="after")
    def _names(self) -> RewardSpec:
        seen: set[str] = set()
        for i, rule in enumerate(self.rules):
            if rule.name in seen:
                raise SpecValueError("S221",
                    f"two rules are named '{rule.name}' (rule {i + 1} repeats it): give each rule its own `name`; "
                    "it is the metric key reward/<name>"
                )
            seen.add(rule.name)  # type: ignore[arg-type]
        if self.correct_rule is not None and self.correct_rule not in seen:
            raise ValueError(
                f"correct_rule '{self.correct_rule}' is not a rule name; the rules are: {', '.join(sorted(seen))}"
            )
        return self

    def default_correct_rule(self) -> str | None:
        """``correct_rule``, else the name of the first answer rule, else None."""
        if self.correct_rule is not None:
            return self.correct_rule
        return next((r.name for r in self.rules if r.kind == "answer"), None)
