"""``RewardFunction``: a spec's reward rules turned into per-rule scores and a total.

Each rule passes or fails on one completion; a passing rule contributes its pass score (``weight``, default 1,
or ``pass_score``), a failing one its fail score (0, or ``fail_score``). The total is the sum of contributions,
clipped to ``reward.clip`` when given. The Sail guide's ``correct - 0.1 * (1 - format)``
(``shared/seeds/000_ae89c72fb71d9d8c.txt``) is an ``answer`` rule of weight 1 plus an ``all_of`` rule
(has_answer AND termination) with ``pass_score: 0, fail_score: -0.1``.

:meth:`RewardFunction.score` never raises: a rule that errors scores as failed and is reported in
``Score.errors``; a user regex (``match`` rules, ``regex`` extractors) that runs past ``reward.regex_timeout_s``
(and a ``compare: math`` step past ``reward.math_timeout_s``) scores as failed and is counted in
``Score.timeouts``. Rows whose reference answer is unusable are meant to be dropped when the dataset loads
(:meth:`RewardFunction.reference_problem`); if one is scored anyway, its answer rules fail and
``Score.errors`` says why, so the reward is never silently a plain 0 or 1.

Metric keys the training loop logs: ``reward/<rule name>`` (mean contribution), ``reward/total``, ``correct``
(pass rate of :attr:`RewardFunction.correct_rule`), ``regex_timeouts``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import regex

from sailrl.runtime.answers import Comparator, CompiledExtractor, MathTimeout
from sailrl.spec.rewards import (
    AllOfRule,
    AnswerRule,
    HasAnswerCheck,
    LengthRule,
    MatchRule,
    RewardSpec,
    TerminationRule,
)

__all__ = ["RewardFunction", "RuleTrace", "Score"]

_REFERENCE_CACHE_SIZE = 4096


@dataclass
class Score:
    """One completion's reward.

    total: sum of contributions (clipped). contributions / passed: per rule name, in spec order.
    timeouts: user-regex (and math-verify) evaluations that hit their time limit. correct: whether
    ``correct_rule`` passed (None when there is no such rule). errors: rule name -> why the rule could not be
    evaluated (unusable reference, missing token count, an internal error); such rules count as failed.
    """

    total: float
    contributions: dict[str, float]
    passed: dict[str, bool]
    timeouts: int = 0
    correct: bool | None = None
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class RuleTrace:
    """Why one rule passed or failed on one completion (for ``sailrl rewards`` and validate's tables)."""

    name: str
    passed: bool
    contribution: float
    why: str


class _Ctx:
    """What a rule sees: the completion, the row's fields, how it ended, and counters."""

    __slots__ = ("answers", "completion", "error", "fields", "num_tokens", "timeouts", "truncated", "why")

    def __init__(self, completion: str, fields: dict[str, Any], truncated: bool, num_tokens: int | None,
                 explain: bool) -> None:
        self.completion = completion
        self.fields = fields
        self.truncated = truncated
        self.num_tokens = num_tokens
        self.timeouts = 0
        self.why: list[str] | None = [] if explain else None
        self.error: str | None = None
        self.answers: dict[tuple, str | None] = {}  # extractor key -> answer found in the completion

    def note(self, text: str) -> None:
        if self.why is not None:
            self.why.append(text)


def _short(text: str, n: int = 60) -> str:
    """``text`` quoted for a message: backslashes as typed, line breaks shown as ⏎, long texts shortened."""
    text = text.replace("\r\n", "\n").replace("\n", "⏎")
    return "'" + (text if len(text) <= n else text[: n - 3] + "...") + "'"


class _Check:
    """A compiled check: ``passes(ctx) -> bool``; ``describe() -> str`` (a condition in plain words)."""

    def passes(self, ctx: _Ctx) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError


class _Termination(_Check):
    def passes(self, ctx: _Ctx) -> bool:
        if ctx.truncated:
            ctx.note("cut off at max_tokens")
            return False
        ctx.note("ended cleanly")
        return True

    def describe(self) -> str:
        return "the completion ended cleanly (stop sequence or end of turn, not cut off at max_tokens)"


class _Length(_Check):
    def __init__(self, rule: LengthRule) -> None:
        self.unit, self.min, self.max = rule.unit, rule.min, rule.max

    def passes(self, ctx: _Ctx) -> bool:
        if self.unit == "chars":
            n = len(ctx.completion)
        else:
            if ctx.num_tokens is None:
                ctx.error = "this length rule counts tokens but the completion's token count was not given"
                ctx.note(ctx.error)
                return False
            n = ctx.num_tokens
        ok = (self.min is None or n >= self.min) and (self.max is None or n <= self.max)
        if ctx.why is not None:
            ctx.note(f"{n} {self.unit}" + ("" if ok else f", outside {self._bounds()}"))
        return ok

    def _bounds(self) -> str:
        if self.min is not None and self.max is not None:
            return f"{self.min}..{self.max} {self.unit}"
        if self.min is not None:
            return f"at least {self.min} {self.unit}"
        return f"at most {self.max} {self.unit}"

    def describe(self) -> str:
        if self.min is not None and self.max is not None:
            return f"the completion is {self.min} to {self.max} {self.unit} long"
        if self.min is not None:
            return f"the completion is at least {self.min} {self.unit} long"
        return f"the completion is at most {self.max} {self.unit} long"


class _Match(_Check):
    def __init__(self, rule: MatchRule, timeout_s: float) -> None:
        flags = 0
        for f in rule.flags:
            flags |= getattr(regex, f)
        self.source = rule.pattern
        self.flag_names = list(rule.flags)
        self.pattern = regex.compile(rule.pattern, flags)
        self.fullmatch = rule.mode == "fullmatch"
        self.negate = rule.negate
        self.timeout_s = timeout_s

    def matches(self, text: str) -> bool:
        """Whether the pattern matches ``text`` (raises TimeoutError)."""
        fn = self.pattern.fullmatch if self.fullmatch else self.pattern.search
        return fn(text, timeout=self.timeout_s) is not None

    def passes(self, ctx: _Ctx) -> bool:
        try:
            found = self.matches(ctx.completion)
        except TimeoutError:
            ctx.timeouts += 1
            ctx.note(f"the pattern ran past the {self.timeout_s:g} s time limit")
            return False
        if ctx.why is not None:
            ctx.note(("found a match of" if found else "no match of") + f" '{self.source}'")
        return found != self.negate

    def describe(self) -> str:
        flags = f" (flags {', '.join(self.flag_names)})" if self.flag_names else ""
        if self.fullmatch:
            verb = "does not match" if self.negate else "matches"
            return f"the whole completion {verb} '{self.source}'{flags}"
        verb = "does not contain" if self.negate else "contains"
        return f"the completion {verb} a match of '{self.source}'{flags}"


def _extract(extractor: CompiledExtractor, ctx: _Ctx) -> str | None:
    """Run an extractor on the completion (once per completion); a regex timeout counts and yields None."""
    if extractor.key in ctx.answers:
        return ctx.answers[extractor.key]
    try:
        answer = extractor(ctx.completion)
    except TimeoutError:
        ctx.timeouts += 1
        ctx.note(f"the extractor's pattern ran past the {extractor.timeout_s:g} s time limit")
        answer = None
    ctx.answers[extractor.key] = answer
    return answer


class _HasAnswer(_Check):
    def __init__(self, rule: HasAnswerCheck, timeout_s: float) -> None:
        self.extractor = CompiledExtractor(rule.extract, timeout_s)

    def passes(self, ctx: _Ctx) -> bool:
        answer = _extract(self.extractor, ctx)
        if ctx.why is not None:
            ctx.note(f"answer {_short(answer)}" if answer is not None else "no answer found")
        return answer is not None

    def describe(self) -> str:
        return f"the completion has an answer ({self.extractor.describe()})"


class _AllOf(_Check):
    def __init__(self, checks: list[_Check]) -> None:
        self.checks = checks

    def passes(self, ctx: _Ctx) -> bool:
        if ctx.why is None:
            return all(c.passes(ctx) for c in self.checks)
        results = [c.passes(ctx) for c in self.checks]  # explain mode: every check's reason
        return all(results)

    def describe(self) -> str:
        return "all of: " + "; ".join(c.describe() for c in self.checks)


class _Answer(_Check):
    """Extract the completion's answer and compare it with the row's reference answer."""

    def __init__(self, rule: AnswerRule, reference_field: str, timeout_s: float, math_timeout_s: float) -> None:
        self.extractor = CompiledExtractor(rule.extract, timeout_s)
        self.field = rule.reference.field or reference_field
        self.ref_extractor = CompiledExtractor(rule.reference.extract, timeout_s)
        self.comparator = Comparator(
            rule.compare, abs_tol=rule.abs_tol, rel_tol=rule.rel_tol, math_timeout_s=math_timeout_s
        )
        self._refs: dict[str, tuple[Any, str | None, str | None]] = {}

    def reference(self, fields: dict[str, Any]) -> tuple[Any, str | None, str | None]:
        """(prepared reference, extracted text, problem) for a row; cached by the field's text."""
        if self.field not in fields or fields[self.field] is None:
            have = ", ".join(sorted(map(str, fields))) or "none"
            return None, None, f"the row has no field '{self.field}' (its fields: {have})"
        raw = fields[self.field]
        raw = raw if isinstance(raw, str) else str(raw)
        hit = self._refs.get(raw)
        if hit is not None:
            return hit
        result = self._prepare_reference(raw)
        if len(self._refs) >= _REFERENCE_CACHE_SIZE:
            self._refs.clear()
        if not result[2] or "time limit" not in result[2]:
            self._refs[raw] = result
        return result

    def _prepare_reference(self, raw: str) -> tuple[Any, str | None, str | None]:
        where = f"the reference field '{self.field}'"
        if not raw.strip():
            return None, None, f"{where} is empty"
        try:
            text = self.ref_extractor(raw)
        except TimeoutError:
            return None, None, f"extracting the answer from {where} ran past the time limit"
        if text is None:
            return None, None, (f"no answer found in {where} ({_short(raw)}): expected "
                                f"{self.ref_extractor.describe('field')}")
        try:
            prepared = self.comparator.prepare(text)
        except MathTimeout:
            return None, text, f"reading the reference answer {_short(text)} ran past the time limit"
        if prepared is None:
            return None, text, f"the reference answer {_short(text)} ({where}) {self.comparator.unusable()}"
        return prepared, text, None

    def passes(self, ctx: _Ctx) -> bool:
        ref, ref_text, problem = self.reference(ctx.fields)
        if problem is not None:
            ctx.error = problem
            ctx.note(problem)
            return False
        answer = _extract(self.extractor, ctx)
        if answer is None:
            ctx.note("no answer found")
            return False
        try:
            pred = self.comparator.prepare(answer)
            if pred is None:
                if ctx.why is not None:
                    ctx.note(f"answer {_short(answer)} {self.comparator.unusable()}")
                return False
            ok = self.comparator.equal(ref, pred)
        except MathTimeout:
            ctx.timeouts += 1
            ctx.note("math-verify ran past the time limit")
            return False
        if ctx.why is not None:
            ctx.note(f"answer {_short(answer)} {'matches' if ok else 'does not match'} reference "
                     f"{_short(ref_text or '')}")
        return ok

    def describe(self) -> str:
        ref = self.ref_extractor
        if ref.kind == "whole" and ref.spec.fallback == "none":
            ref_words = f"the reference answer (field '{self.field}')"
        else:
            ref_words = f"the reference answer ({ref.describe('field')} in field '{self.field}')"
        return self.comparator.sentence(f"{self.extractor.describe()} in the completion", ref_words)


def _compile(rule: Any, reference_field: str, spec: RewardSpec) -> _Check:
    t = spec.regex_timeout_s
    if isinstance(rule, AnswerRule):
        return _Answer(rule, reference_field, t, spec.math_timeout_s)
    if isinstance(rule, MatchRule):
        return _Match(rule, t)
    if isinstance(rule, TerminationRule):
        return _Termination()
    if isinstance(rule, LengthRule):
        return _Length(rule)
    if isinstance(rule, HasAnswerCheck):
        return _HasAnswer(rule, t)
    if isinstance(rule, AllOfRule):
        return _AllOf([_compile(c, reference_field, spec) for c in rule.checks])
    raise TypeError(f"unknown rule kind {getattr(rule, 'kind', rule)!r}")


def _num(x: float) -> str:
    """A score as a user wrote it: 1, -0.1, 0.25 (no trailing zeros)."""
    return f"{x:g}"


def _signed(x: float) -> str:
    return "0" if x == 0 else f"{x:+g}"


class RewardFunction:
    """A spec's ``reward:`` section, ready to score completions.

    Build with :meth:`from_spec`. ``rule_names``: rule names in spec order. ``correct_rule``: the rule whose
    pass rate is logged as ``correct`` (``reward.correct_rule``, else the first answer rule, else None).
    """

    def __init__(self, reward: RewardSpec, reference_field: str) -> None:
        self.spec = reward
        self.reference_field = reference_field
        self.rule_names: list[str] = [str(r.name) for r in reward.rules]
        self.correct_rule: str | None = reward.default_correct_rule()
        self._checks = [_compile(r, reference_field, reward) for r in reward.rules]
        self._scores = [r.scores() for r in reward.rules]
        self._answers = [c for c in self._checks if isinstance(c, _Answer)]
        self._clip = reward.clip
        self.text_mode: str = reward.text  # which text of a rollout the rules read (see RewardSpec.text)

    @classmethod
    def from_spec(cls, reward: RewardSpec, reference_field: str) -> RewardFunction:
        """Compile ``reward``; ``reference_field`` is the default field of answer rules' references."""
        return cls(reward, reference_field)

    # ------------------------------------------------------------------------------------------ scoring

    def _run(self, ctx: _Ctx) -> tuple[Score, list[str]]:
        contributions: dict[str, float] = {}
        passed: dict[str, bool] = {}
        errors: dict[str, str] = {}
        reasons: list[str] = []
        for name, check, (on_pass, on_fail) in zip(self.rule_names, self._checks, self._scores, strict=False):
            ctx.error = None
            if ctx.why is not None:
                ctx.why = []
            try:
                ok = check.passes(ctx)
            except Exception as exc:  # noqa: BLE001 - score() never raises; the rule fails and is reported
                ok = False
                ctx.error = f"the rule raised {type(exc).__name__}: {exc}"
                ctx.note(ctx.error)
            except MathTimeout:
                ok = False
                ctx.timeouts += 1
            if ctx.error is not None:
                errors[name] = ctx.error
            passed[name] = ok
            contributions[name] = on_pass if ok else on_fail
            if ctx.why is not None:
                reasons.append("; ".join(ctx.why))
        total = sum(contributions.values())
        if self._clip is not None:
            total = min(max(total, self._clip[0]), self._clip[1])
        correct = passed[self.correct_rule] if self.correct_rule is not None else None
        return Score(total, contributions, passed, ctx.timeouts, correct, errors), reasons

    def score(self, completion: str, fields: dict[str, Any], *, truncated: bool = False,
              num_tokens: int | None = None) -> Score:
        """Score one completion against one row's ``fields``. Never raises.

        truncated: the completion was cut off at max_tokens (no stop sequence / end of turn).
        num_tokens: completion length in tokens (needed by ``length`` rules with ``unit: tokens``).
        """
        return self._run(_Ctx(completion, fields, truncated, num_tokens, explain=False))[0]

    def trace(self, completion: str, fields: dict[str, Any], *, truncated: bool = False,
              num_tokens: int | None = None) -> tuple[Score, list[RuleTrace]]:
        """:meth:`score` plus, per rule, why it passed or failed in plain words (slower; for tools)."""
        score, reasons = self._run(_Ctx(completion, fields, truncated, num_tokens, explain=True))
        traces = [
            RuleTrace(name, score.passed[name], score.contributions[name], why)
            for name, why in zip(self.rule_names, reasons, strict=False)
        ]
        return score, traces

    def reference_problem(self, fields: dict[str, Any]) -> str | None:
        """Why this row's reference answer cannot be used by an answer rule (plain words), else None.

        Checks every answer rule: the field exists and is not empty, the reference extractor finds an answer,
        and the comparison can read it (a number for ``numeric``, an expression for ``math``). The data loader
        skips (and counts) rows for which this is not None.
        """
        problems = []
        for name, check in zip(self.rule_names, self._checks, strict=False):
            answers = [check] if isinstance(check, _Answer) else []
            for a in answers:
                try:
                    problem = a.reference(fields)[2]
                except Exception as exc:  # noqa: BLE001
                    problem = f"reading the reference raised {type(exc).__name__}: {exc}"
                except MathTimeout:
                    problem = "reading the reference answer ran past the time limit"
                if problem:
                    prefix = f"rule '{name}': " if len(self._answers) > 1 else ""
                    problems.append(prefix + problem)
        return "; ".join(problems) if problems else None

    def reference_answer(self, fields: dict[str, Any], rule: str | None = None) -> str | None:
        """The reference answer text an answer rule reads from ``fields`` (first answer rule by default)."""
        for name, check in zip(self.rule_names, self._checks, strict=False):
            if isinstance(check, _Answer) and (rule is None or rule == name):
                return check.reference(fields)[1]
        return None

    # ------------------------------------------------------------------------------------------ words

    def pass_fail_scores(self, name: str) -> tuple[float, float]:
        """(contribution on pass, contribution on fail) of rule ``name``."""
        return self._scores[self.rule_names.index(name)]

    def bounds(self) -> tuple[float, float]:
        """Lowest and highest possible total (after clipping)."""
        low = sum(min(p, f) for p, f in self._scores)
        high = sum(max(p, f) for p, f in self._scores)
        if self._clip is not None:
            low, high = (min(max(v, self._clip[0]), self._clip[1]) for v in (low, high))
        return low, high

    def explain(self) -> list[str]:
        """The reward formula in plain words: one line per rule, then the total and what 'correct' means."""
        lines = []
        for name, check, (on_pass, on_fail) in zip(self.rule_names, self._checks, self._scores, strict=False):
            cond = check.describe()
            if on_pass == 0 and on_fail != 0:
                lines.append(f"{name}: {_signed(on_fail)} unless {cond}; otherwise 0.")
            else:
                lines.append(f"{name}: {_signed(on_pass)} if {cond}; otherwise {_signed(on_fail)}.")
        total = "total = " + " + ".join(self.rule_names)
        if self._clip is not None:
            total += f", clipped to [{_num(self._clip[0])}, {_num(self._clip[1])}]"
        low, high = self.bounds()
        lines.append(f"{total} (from {_num(low)} to {_num(high)}).")
        if self.correct_rule is not None:
            lines.append(
                f"'correct' (logged each step) is the fraction of completions that pass '{self.correct_rule}'."
            )
        return lines
