"""``RewardFunction``: a spec's reward rules turned into per-rule scores, reasons and a total.

Each rule passes or fails on one completion; a passing rule contributes its pass score (``weight``, default 1,
or ``pass_score``), a failing one its fail score (0, or ``fail_score``); a ``kind: python`` rule with ``weight``
contributes weight x the number its function returns. The total is the sum of contributions, clipped to
``reward.clip`` when given. The Sail guide's ``correct - 0.1 * (1 - format)`` is an ``answer`` rule of weight 1
plus an ``all_of`` rule (has_answer AND termination) with ``pass_score: 0, fail_score: -0.1``.

:meth:`RewardFunction.score` never raises: a rule that errors scores as failed and is reported in
``Score.errors``; a user regex (``match`` rules, ``regex`` extractors) that runs past ``reward.regex_timeout_s``
(and a ``compare: math`` step past ``reward.math_timeout_s``) scores as failed and is counted in
``Score.timeouts``; a python call that raises, runs past its ``timeout_s`` or returns something else fails and
is counted in ``Score.python_failures``. Every rule gets a reason in plain words (``Score.reasons``, at most
:data:`REASON_CHARS` characters). Rows whose reference answer is unusable are meant to be dropped when the
dataset loads (:meth:`RewardFunction.reference_problem`); if one is scored anyway, its answer rules fail and
``Score.errors`` says why, so the reward is never silently a plain 0 or 1.

Size caps: the rules read completions of at most :data:`MAX_COMPLETION_CHARS` characters (a longer one fails
every rule that reads the text) and references of at most :data:`MAX_REFERENCE_CHARS`; ``numeric`` and
``math`` read answers of at most ``sailrl.runtime.rewards.answers.MAX_ANSWER_CHARS``. With a ``budget``
(:class:`sailrl.runtime.rewards.scoring.ScoringBudget`), each time limit is cut to what the step has left and rules past
it fail (``Score.budget_exceeded``).

Metric keys the training loop logs (``sailrl.runtime.rollouts.rollout.RuleEnv``): ``reward/<rule name>`` (mean
contribution), ``reward/total``, ``correct`` (pass rate of :attr:`RewardFunction.correct_rule`),
``regex_timeouts``, ``rule_errors``, ``python_rule_failures``, ``reward_budget_exceeded``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from sailrl.runtime.rewards.answers import (
    Comparator,
    CompiledExtractor,
    MathTimeout,
    UnreadableAnswer,
    cpu_time_limited,
)
from sailrl.runtime.rewards.judge import Judge
from sailrl.runtime.rewards.python_rules import PythonFunction
from sailrl.spec.rewards import (
    AllOfRule,
    AnswerRule,
    AnyOfRule,
    HasAnswerCheck,
    JudgeRule,
    LengthRule,
    MatchRule,
    PythonRule,
    RewardSpec,
    TerminationRule,
)

__all__ = ["MAX_COMPLETION_CHARS", "MAX_REFERENCE_CHARS", "REASON_CHARS", "RewardFunction", "RuleTrace", "Score"]

_REFERENCE_CACHE_SIZE = 4096
#: Longest completion the rules read (characters); a longer one fails every rule that reads the text.
MAX_COMPLETION_CHARS = 200_000
#: Longest reference field an answer rule reads; a row with a longer one is unusable (skipped when loading).
MAX_REFERENCE_CHARS = 100_000
#: Longest per-rule reason (``Score.reasons``).
REASON_CHARS = 200


@dataclass
class Score:
    """One completion's reward.

    total: sum of contributions (clipped). contributions / passed: per rule name, in spec order.
    reasons: per rule, why it passed or failed in plain words (at most :data:`REASON_CHARS` characters), e.g.
    ``"answer '72' matches reference '72'"``. timeouts: user-regex and math-verify evaluations that hit their time
    limit. correct: whether ``correct_rule`` passed (None when there is no such rule). errors: rule name -> why
    the rule could not be evaluated (unusable reference, missing token count, a python rule that raised, timed
    out or returned something else, an internal error); such rules count as failed. subscores: python rule name
    -> the named numbers its function returned. python_failures: python calls that failed (also in ``errors``).
    budget_exceeded: rules that were not (fully) run because the step's scoring budget was used up.
    """

    total: float
    contributions: dict[str, float]
    passed: dict[str, bool]
    timeouts: int = 0
    correct: bool | None = None
    errors: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    subscores: dict[str, dict[str, float]] = field(default_factory=dict)
    python_failures: int = 0
    budget_exceeded: int = 0
    #: judge rule name -> its :class:`sailrl.runtime.rewards.judge.Verdict` (the judge's answer and the score read from it).
    judge: dict[str, Any] = field(default_factory=dict)
    #: python rule name -> what its call printed: (the first MAX_OUTPUT_BYTES as text, bytes printed, lines printed).
    output: dict[str, tuple[str, int, int]] = field(default_factory=dict)


@dataclass
class RuleTrace:
    """Why one rule passed or failed on one completion (for ``sailrl rewards`` and validate's tables)."""

    name: str
    passed: bool
    contribution: float
    why: str


class _Ctx:
    """What a rule sees: the completion, the row's fields, how it ended, the step's budget, and counters."""

    __slots__ = ("answers", "budget", "budget_exceeded", "completion", "error", "fields", "judge_stats", "judged",
                 "num_tokens", "output", "python_failures", "quoted", "subscores", "timeouts", "too_long", "truncated",
                 "value", "verdicts", "why")

    def __init__(self, completion: str, fields: dict[str, Any], truncated: bool, num_tokens: int | None,
                 budget: Any = None) -> None:
        self.completion = completion
        self.fields = fields
        self.truncated = truncated
        self.num_tokens = num_tokens
        self.budget = budget
        self.timeouts = 0
        self.budget_exceeded = 0
        self.python_failures = 0
        self.why: list[str] = []
        self.error: str | None = None
        self.value: float | None = None  # a contribution set by the rule itself (weighted python rules)
        self.subscores: dict[str, float] | None = None
        self.output: tuple[str, int, int] | None = None  # a python rule's call printed: (text kept, bytes, lines)
        self.quoted: tuple[str, str] | None = None  # (answer, its quoted form) for reasons
        self.too_long = len(completion) > MAX_COMPLETION_CHARS
        self.answers: dict[tuple, str | None] = {}  # extractor key -> answer found in the completion
        self.judged: dict[str, Any] | None = None  # judge verdicts given by the caller (None: judge here)
        self.verdicts: dict[str, Any] = {}  # judge rule name -> Verdict
        self.judge_stats: Any = None

    def note(self, text: str) -> None:
        self.why.append(text)

    def limit(self, seconds: float) -> float:
        """``seconds``, or less when the step's scoring budget has less left (<= 0: nothing left)."""
        if self.budget is None:
            return seconds
        return min(seconds, self.budget.remaining())

    def over_budget(self, what: str = "") -> None:
        self.budget_exceeded += 1
        self.note(f"{what}not scored: the step's scoring budget (reward.step_budget_s = "
                  f"{_num(self.budget.budget_s)} s) was used up")

    def text_too_long(self) -> bool:
        """True (and the reason noted, an error) when the completion is over MAX_COMPLETION_CHARS."""
        if self.too_long:
            self.error = (f"the completion is {len(self.completion):,} characters long; the rules read at most "
                          f"{MAX_COMPLETION_CHARS:,}")
            self.note(self.error)
        return self.too_long


def _short(text: str, n: int = 60) -> str:
    """``text`` quoted for a message: backslashes as typed, line breaks shown as ⏎, long texts shortened."""
    if len(text) <= n and "\n" not in text and "\r" not in text:
        return "'" + text + "'"
    if len(text) > n:
        text = text[: n - 3] + "..."
    text = text.replace("\r\n", "\n").replace("\n", "⏎")
    return "'" + text + "'"


def _cap(text: str, n: int = REASON_CHARS) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


class _Check:
    """A compiled check: ``passes(ctx) -> bool``; ``describe() -> str`` (a condition in plain words)."""

    def passes(self, ctx: _Ctx) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError


class _Termination(_Check):
    def passes(self, ctx: _Ctx) -> bool:
        if ctx.truncated:
            ctx.why.append("cut off at max_tokens")
            return False
        ctx.why.append("ended cleanly")
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
        self._quoted = _short(rule.pattern)

    def matches(self, text: str, timeout_s: float | None = None) -> bool:
        """Whether the pattern matches ``text`` (raises TimeoutError)."""
        fn = self.pattern.fullmatch if self.fullmatch else self.pattern.search
        return cpu_time_limited(lambda t: fn(text, timeout=t),
                                self.timeout_s if timeout_s is None else timeout_s) is not None

    def passes(self, ctx: _Ctx) -> bool:
        if ctx.too_long and ctx.text_too_long():
            return False
        limit = self.timeout_s if ctx.budget is None else ctx.limit(self.timeout_s)
        if limit <= 0:
            ctx.over_budget()
            return False
        try:
            fn = self.pattern.fullmatch if self.fullmatch else self.pattern.search
            found = cpu_time_limited(lambda t: fn(ctx.completion, timeout=t), limit) is not None
        except TimeoutError:
            if limit < self.timeout_s:
                ctx.over_budget("the pattern was stopped: ")
            else:
                ctx.timeouts += 1
                ctx.note(f"the pattern ran past the {self.timeout_s:g} s time limit")
            return False
        ctx.why.append(("found a match of " if found else "no match of ") + self._quoted)
        return found != self.negate

    def describe(self) -> str:
        flags = f" (flags {', '.join(self.flag_names)})" if self.flag_names else ""
        if self.fullmatch:
            verb = "does not match" if self.negate else "matches"
            return f"the whole completion {verb} '{self.source}'{flags}"
        verb = "does not contain" if self.negate else "contains"
        return f"the completion {verb} a match of '{self.source}'{flags}"


_BUDGET = object()  # _extract's answer when the step's budget stopped it


def _quoted(ctx: _Ctx, answer: str) -> str:
    """``_short(answer)``, once per completion (the has_answer and answer rules quote the same answer)."""
    q = ctx.quoted
    if q is None or q[0] is not answer:
        q = ctx.quoted = (answer, _short(answer))
    return q[1]


def _extract(extractor: CompiledExtractor, ctx: _Ctx) -> Any:
    """Run an extractor on the completion (once per completion); a regex timeout counts and yields None.

    Returns the answer, None, or ``_BUDGET`` when the step's scoring budget stopped (or forbade) the regex.
    """
    if extractor.key in ctx.answers:
        return ctx.answers[extractor.key]
    limit = None
    if extractor.kind == "regex" and ctx.budget is not None:
        limit = ctx.limit(extractor.timeout_s)
        if limit <= 0:
            ctx.over_budget()
            return _BUDGET
    try:
        answer = extractor(ctx.completion, limit)
    except TimeoutError:
        if limit is not None and limit < extractor.timeout_s:
            ctx.over_budget("the extractor's pattern was stopped: ")
            return _BUDGET
        ctx.timeouts += 1
        ctx.note(f"the extractor's pattern ran past the {extractor.timeout_s:g} s time limit")
        answer = None
    ctx.answers[extractor.key] = answer
    return answer


class _HasAnswer(_Check):
    def __init__(self, rule: HasAnswerCheck, timeout_s: float) -> None:
        self.extractor = CompiledExtractor(rule.extract, timeout_s)

    def passes(self, ctx: _Ctx) -> bool:
        if ctx.too_long and ctx.text_too_long():
            return False
        answer = _extract(self.extractor, ctx)
        if answer is _BUDGET:
            return False
        ctx.why.append(f"answer {_quoted(ctx, answer)}" if answer is not None else "no answer found")
        return answer is not None

    def describe(self) -> str:
        return f"the completion has an answer ({self.extractor.describe()})"


class _AllOf(_Check):
    def __init__(self, checks: list[_Check]) -> None:
        self.checks = checks

    def passes(self, ctx: _Ctx) -> bool:
        results = [c.passes(ctx) for c in self.checks]  # every check, so that the reason names each
        return all(results)

    def describe(self) -> str:
        return "all of: " + "; ".join(c.describe() for c in self.checks)


class _AnyOf(_AllOf):
    def passes(self, ctx: _Ctx) -> bool:
        results = [c.passes(ctx) for c in self.checks]  # every check, so that the reason names each
        return any(results)

    def describe(self) -> str:
        return "any of: " + "; ".join(c.describe() for c in self.checks)


class _Answer(_Check):
    """Extract the completion's answer and compare it with the row's reference answer."""

    def __init__(self, rule: AnswerRule, reference_field: str, timeout_s: float, math_timeout_s: float) -> None:
        self.extractor = CompiledExtractor(rule.extract, timeout_s)
        self.field = rule.reference.field or reference_field
        self.ref_extractor = CompiledExtractor(rule.reference.extract, timeout_s)
        self.comparator = Comparator(
            rule.compare, abs_tol=rule.abs_tol, rel_tol=rule.rel_tol, math_timeout_s=math_timeout_s
        )
        self._refs: dict[str, tuple[Any, str | None, str | None, str]] = {}

    def reference(self, fields: dict[str, Any]) -> tuple[Any, str | None, str | None, str]:
        """(prepared reference, extracted text, problem, the text quoted for reasons) for a row; cached by the
        field's text."""
        if self.field not in fields or fields[self.field] is None:
            have = ", ".join(sorted(map(str, fields))) or "none"
            return None, None, f"the row has no field '{self.field}' (its fields: {have})", ""
        raw = fields[self.field]
        try:
            raw = raw if isinstance(raw, str) else str(raw)
        except ValueError:  # an int over Python's 4,300-digit str() limit
            return None, None, f"the reference field '{self.field}' holds a number too long to read", ""
        hit = self._refs.get(raw)
        if hit is not None:
            return hit
        prepared, text, problem = self._prepare_reference(raw)
        result = (prepared, text, problem, _short(text or ""))
        if len(self._refs) >= _REFERENCE_CACHE_SIZE:
            self._refs.clear()
        if not result[2] or "time limit" not in result[2]:
            self._refs[raw] = result
        return result

    def _prepare_reference(self, raw: str) -> tuple[Any, str | None, str | None]:
        where = f"the reference field '{self.field}'"
        if not raw.strip():
            return None, None, f"{where} is empty"
        if len(raw) > MAX_REFERENCE_CHARS:
            return None, None, (f"{where} is {len(raw):,} characters long; answer rules read at most "
                                f"{MAX_REFERENCE_CHARS:,}")
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
            return None, text, f"the reference answer {_short(text)} ({where}) {self.comparator.unusable(text)}"
        return prepared, text, None

    def passes(self, ctx: _Ctx) -> bool:
        ref, ref_text, problem, ref_quoted = self.reference(ctx.fields)
        if problem is not None:
            ctx.error = problem
            ctx.note(problem)
            return False
        if ctx.too_long and ctx.text_too_long():
            return False
        answer = _extract(self.extractor, ctx)
        if answer is _BUDGET:
            return False
        if answer is None:
            ctx.why.append("no answer found")
            return False
        math_kind = self.comparator.kind == "math"
        limit = ctx.limit(self.comparator.math_timeout_s) if math_kind and ctx.budget is not None else None
        if limit is not None and limit <= 0:
            ctx.over_budget()
            return False
        try:
            pred = self.comparator.prepare(answer)
            if pred is None:
                ctx.note(f"answer {_short(answer)} {self.comparator.unusable(answer)}")
                return False
            ok = self.comparator.equal(ref, pred, timeout_s=limit) if math_kind else self.comparator.equal(ref, pred)
        except MathTimeout:
            if limit is not None and limit < self.comparator.math_timeout_s:
                ctx.over_budget("math-verify was stopped: ")
            else:
                ctx.timeouts += 1
                ctx.note("math-verify ran past the time limit")
            return False
        except UnreadableAnswer as exc:
            if exc.side == "reference":
                ctx.error = f"the reference answer {ref_quoted} {self.comparator.unusable()}"
                ctx.note(ctx.error)
            else:
                ctx.note(f"answer {_short(answer)} {self.comparator.unusable()}")
            return False
        ctx.why.append(f"answer {_quoted(ctx, answer)} {'matches' if ok else 'does not match'} reference {ref_quoted}")
        return ok

    def describe(self) -> str:
        ref = self.ref_extractor
        if ref.kind == "whole" and ref.spec.fallback == "none":
            ref_words = f"the reference answer (field '{self.field}')"
        else:
            ref_words = f"the reference answer ({ref.describe('field')} in field '{self.field}')"
        return self.comparator.sentence(self.extractor.describe(located=True), ref_words)


class _Python(_Check):
    """A ``kind: python`` rule: the user's function, called in a worker process (see python_rules)."""

    def __init__(self, rule: PythonRule, spec_dir: Path | str | None) -> None:
        self.fn = PythonFunction(spec_dir, rule.function, rule.timeout_s, rule.memory_mb,
                                 env=list(getattr(rule, "env", []) or []))
        self.weighted = rule.weighted
        self.weight = 1.0 if rule.weight is None else float(rule.weight)
        self.label = f"python: {self.fn.label}"

    def passes(self, ctx: _Ctx) -> bool:
        if ctx.too_long and ctx.text_too_long():
            return False
        limit = ctx.limit(self.fn.timeout_s)
        if limit <= 0:
            ctx.over_budget()
            return False
        fields = {k: v for k, v in ctx.fields.items() if k != "_index"}
        result = self.fn.call(ctx.completion, fields, timeout_s=limit)
        if result.output_bytes:
            ctx.output = (result.output, result.output_bytes, result.output_lines)
        if result.value is None:
            if result.timed_out and limit < self.fn.timeout_s:
                ctx.over_budget(f"{self.fn.label} was stopped: ")
                return False
            ctx.python_failures += 1
            ctx.error = result.problem
            ctx.note(result.problem or "failed")
            return False
        value = result.value
        if self.weighted:
            ctx.value = self.weight * value
        ctx.subscores = result.subscores
        parts = ""
        if result.subscores:
            parts = " = " + " + ".join(f"{k} {v:g}" for k, v in result.subscores.items())
        ctx.note(f"{self.fn.label} returned {value:g}{parts}")
        return value > 0

    def describe(self) -> str:
        return self.label


_PENDING = "pending: judged alongside the other rules"


class _JudgeCheck(_Check):
    """A ``kind: judge`` rule (see :mod:`sailrl.runtime.rewards.judge`): the verdict is given (``ctx.judged``, from the
    step's concurrent judge calls), or judged here, blocking, within the budget."""

    def __init__(self, name: str, rule: JudgeRule) -> None:
        self.judge = Judge(name, rule)
        self.on_pass, self.on_fail = rule.scores()

    def passes(self, ctx: _Ctx) -> bool:
        name = self.judge.name
        if ctx.judged is not None:
            verdict = ctx.judged.get(name)
            if verdict is None:  # deferred: RewardFunction.with_verdicts fills it in
                ctx.note(_PENDING)
                return False
        else:
            verdict = self.judge.judge_blocking(ctx.completion, ctx.fields, budget=ctx.budget,
                                                stats=ctx.judge_stats)
        return self.apply(ctx, verdict)

    def apply(self, ctx: _Ctx, verdict: Any) -> bool:
        ctx.verdicts[self.judge.name] = verdict
        ok, value = verdict.contribution(self.on_pass, self.on_fail, self.judge.pass_at)
        ctx.value = value
        if verdict.kind == "budget":
            ctx.budget_exceeded += 1
        elif verdict.kind != "ok":
            ctx.error = _cap(verdict.problem)
        ctx.note(verdict.reason())
        return ok

    def describe(self) -> str:
        return self.judge.describe()


def _compile(rule: Any, reference_field: str, spec: RewardSpec, spec_dir: Path | str | None = None) -> _Check:
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
        return _AllOf([_compile(c, reference_field, spec, spec_dir) for c in rule.checks])
    if isinstance(rule, AnyOfRule):
        return _AnyOf([_compile(c, reference_field, spec, spec_dir) for c in rule.checks])
    if isinstance(rule, PythonRule):
        return _Python(rule, spec_dir)
    if isinstance(rule, JudgeRule):
        return _JudgeCheck(str(rule.name), rule)
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
    ``python_rules``: names of the ``kind: python`` rules. ``step_budget_s``: ``reward.step_budget_s``.
    """

    def __init__(self, reward: RewardSpec, reference_field: str, spec_dir: Path | str | None = None) -> None:
        self.spec = reward
        self.reference_field = reference_field
        self.spec_dir = spec_dir
        self.rule_names: list[str] = [str(r.name) for r in reward.rules]
        self.correct_rule: str | None = reward.default_correct_rule()
        self._checks = [_compile(r, reference_field, reward, spec_dir) for r in reward.rules]
        self._scores = [r.scores() for r in reward.rules]
        self._answers = [c for c in self._checks if isinstance(c, _Answer)]
        self.python_rules: list[str] = [n for n, c in zip(self.rule_names, self._checks, strict=True)
                                        if isinstance(c, _Python)]
        #: judge rule name -> its :class:`sailrl.runtime.rewards.judge.Judge` (connect a client with ``.connect``).
        self.judges: dict[str, Any] = {n: c.judge for n, c in zip(self.rule_names, self._checks, strict=True)
                                       if isinstance(c, _JudgeCheck)}
        # What _run walks: (name, check, pass score, fail score, sets its own contribution).
        self._plan = [(n, c, p, f, isinstance(c, (_Python, _JudgeCheck)))
                      for n, c, (p, f) in zip(self.rule_names, self._checks, self._scores, strict=True)]
        self._clip = reward.clip
        self.text_mode: str = reward.text  # which text of a rollout the rules read (see RewardSpec.text)
        self.step_budget_s: float = reward.step_budget_s

    @classmethod
    def from_spec(cls, reward: RewardSpec, reference_field: str, spec_dir: Path | str | None = None
                  ) -> RewardFunction:
        """Compile ``reward``; ``reference_field`` is the default field of answer rules' references.

        ``spec_dir``: the spec's folder, where ``kind: python`` rules find their files (the generated script's
        ``SPEC_DIR``). Without it a python rule fails every call, saying so. Nothing is started here: python
        workers start on the first call (or :meth:`python_problems`).
        """
        return cls(reward, reference_field, spec_dir)

    def close_judges(self) -> None:
        """Disconnect every judge rule and close what its client opened for itself (a local judge's own embedded
        backend: its threads and model), after the judgements already started. The judge rules are then not
        connected; whoever connected them calls this when it is done scoring."""
        for judge in self.judges.values():
            judge.close()

    # ------------------------------------------------------------------------------------------ scoring

    def _run(self, ctx: _Ctx) -> Score:
        contributions: dict[str, float] = {}
        passed: dict[str, bool] = {}
        errors: dict[str, str] = {}
        reasons: dict[str, str] = {}
        subscores: dict[str, dict[str, float]] = {}
        output: dict[str, tuple[str, int, int]] = {}
        budget = ctx.budget
        for name, check, on_pass, on_fail, is_python in self._plan:
            ctx.error = None
            why = ctx.why = []
            if ctx.judged is not None and isinstance(check, _JudgeCheck) and name not in ctx.judged:
                ok = check.passes(ctx)  # pending: with_verdicts fills it in (the budget is the judge's to check)
            elif budget is not None and budget.remaining() <= 0:
                ok = False
                ctx.over_budget()
            else:
                try:
                    ok = check.passes(ctx)
                except Exception as exc:  # noqa: BLE001 - score() never raises; the rule fails and is reported
                    ok = False
                    ctx.error = _cap(f"the rule raised {type(exc).__name__}: {exc}")
                    why.append(ctx.error)
                except MathTimeout:
                    ok = False
                    ctx.timeouts += 1
                    why.append("math-verify ran past the time limit")
            if ctx.error is not None:
                errors[name] = ctx.error
            passed[name] = ok
            if is_python and ctx.value is not None:
                contributions[name] = ctx.value
                ctx.value = None
            else:
                contributions[name] = on_pass if ok else on_fail
            if is_python and ctx.subscores:
                subscores[name] = ctx.subscores
                ctx.subscores = None
            if is_python and ctx.output is not None:
                output[name] = ctx.output
                ctx.output = None
            reason = why[0] if len(why) == 1 else "; ".join(why)
            reasons[name] = reason if len(reason) <= REASON_CHARS else _cap(reason)
        total = math.fsum(contributions.values()) if len(contributions) > 2 else sum(contributions.values())
        if self._clip is not None:
            total = min(max(total, self._clip[0]), self._clip[1])
        correct = passed[self.correct_rule] if self.correct_rule is not None else None
        return Score(total, contributions, passed, ctx.timeouts, correct, errors, reasons, subscores,
                     ctx.python_failures, ctx.budget_exceeded, dict(ctx.verdicts), output)

    def with_verdicts(self, score: Score, verdicts: dict[str, Any]) -> Score:
        """``score`` (computed with the judge rules deferred: ``score(..., judged={})``) completed with the judge
        rules' verdicts: their pass, contribution, reason and error, then the total and ``correct`` again."""
        for name, verdict in verdicts.items():
            check = self._checks[self.rule_names.index(name)]
            ctx = _Ctx("", {}, False, None)
            ok = check.apply(ctx, verdict)  # type: ignore[attr-defined]
            score.passed[name] = ok
            score.contributions[name] = float(ctx.value if ctx.value is not None else 0.0)
            score.reasons[name] = _cap("; ".join(ctx.why))
            if ctx.error is not None:
                score.errors[name] = ctx.error
            else:
                score.errors.pop(name, None)
            score.budget_exceeded += ctx.budget_exceeded
            score.judge[name] = verdict
        values = score.contributions.values()
        total = math.fsum(values) if len(score.contributions) > 2 else sum(values)
        if self._clip is not None:
            total = min(max(total, self._clip[0]), self._clip[1])
        score.total = total
        if self.correct_rule is not None:
            score.correct = score.passed[self.correct_rule]
        return score

    def score(self, completion: str, fields: dict[str, Any], *, truncated: bool = False,
              num_tokens: int | None = None, budget: Any = None, judged: dict[str, Any] | None = None,
              judge_stats: Any = None) -> Score:
        """Score one completion against one row's ``fields``. Never raises.

        truncated: the completion was cut off at max_tokens (no stop sequence / end of turn).
        num_tokens: completion length in tokens (needed by ``length`` rules with ``unit: tokens``).
        budget: the step's scoring budget (an object with ``remaining() -> seconds`` and ``budget_s``, e.g.
        :class:`sailrl.runtime.rewards.scoring.ScoringBudget`); time limits are cut to what it has left and rules past
        it fail (``Score.budget_exceeded``). Blocking: up to the rules' time limits (regexes, math-verify,
        python calls, judge calls); the training loop calls it through :class:`sailrl.runtime.rewards.scoring.StepScorer`.
        judged: judge rule name -> verdict already reached (a judge rule missing from it is left pending for
        :meth:`with_verdicts`); None: judge rules call their judge here (counted in ``judge_stats``).
        """
        ctx = _Ctx(completion, fields, truncated, num_tokens, budget)
        ctx.judged = judged
        ctx.judge_stats = judge_stats
        return self._run(ctx)

    def trace(self, completion: str, fields: dict[str, Any], *, truncated: bool = False,
              num_tokens: int | None = None, judged: dict[str, Any] | None = None) -> tuple[Score, list[RuleTrace]]:
        """:meth:`score` plus, per rule, why it passed or failed (``Score.reasons``) as :class:`RuleTrace` s.
        ``judged``: as for :meth:`score` (None: judge rules call their judge)."""
        score = self.score(completion, fields, truncated=truncated, num_tokens=num_tokens, judged=judged)
        traces = [RuleTrace(name, score.passed[name], score.contributions[name], score.reasons[name])
                  for name in self.rule_names]
        return score, traces

    def rule_verdict(self, name: str, completion: str, fields: dict[str, Any], *, truncated: bool = False,
                     num_tokens: int | None = None) -> tuple[bool, str]:
        """(passed, reason) of rule ``name`` alone on one completion (the other rules are not run). Never raises."""
        ctx = _Ctx(completion, fields, truncated, num_tokens)
        check = self._checks[self.rule_names.index(name)]
        try:
            ok = check.passes(ctx)
        except Exception as exc:  # noqa: BLE001 - as in score(): the rule fails
            ok = False
            ctx.note(_cap(f"the rule raised {type(exc).__name__}: {exc}"))
        except MathTimeout:
            ok = False
            ctx.note("math-verify ran past the time limit")
        return ok, _cap("; ".join(ctx.why))

    def reference_problem(self, fields: dict[str, Any]) -> str | None:
        """Why this row's reference answer cannot be used by an answer rule (plain words), else None.

        Checks every answer rule: the field exists, is not empty and at most :data:`MAX_REFERENCE_CHARS`
        characters, the reference extractor finds an answer, and the comparison can read it (a number within
        range for ``numeric``, an expression for ``math``). The data loader skips (and counts) rows for which this
        is not None. Time: bounded by the regex and math time limits.
        """
        problems = []
        for name, check in zip(self.rule_names, self._checks, strict=False):
            answers = [check] if isinstance(check, _Answer) else []
            for a in answers:
                try:
                    problem = a.reference(fields)[2]
                except Exception as exc:  # noqa: BLE001
                    problem = _cap(f"reading the reference raised {type(exc).__name__}: {exc}")
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

    def python_problems(self) -> dict[str, tuple[str, str]]:
        """Rule name -> ``(code, plain words)`` for each python rule whose function cannot be loaded.

        Loads each function in a worker (bounded by the import time limit); a loadable one stays loaded.
        Codes: see :meth:`sailrl.runtime.rewards.python_rules.PythonFunction.load_problem`.
        """
        out = {}
        for name, check in zip(self.rule_names, self._checks, strict=True):
            if isinstance(check, _Python):
                problem = check.fn.load_problem()
                if problem is not None:
                    out[name] = problem
        return out

    # ------------------------------------------------------------------------------------------ words

    def pass_fail_scores(self, name: str) -> tuple[float, float]:
        """(contribution on pass, contribution on fail) of rule ``name`` (a weighted python rule's pass score is
        its weight, the contribution of a returned 1)."""
        return self._scores[self.rule_names.index(name)]

    def _weighted_python(self) -> list[str]:
        return [n for n, c in zip(self.rule_names, self._checks, strict=True) if isinstance(c, _Python) and c.weighted]

    def bounds(self) -> tuple[float, float]:
        """Lowest and highest possible total (after clipping); -inf / inf when a weighted python rule (which
        returns any number) is not clipped."""
        low = high = 0.0
        for name, (p, f) in zip(self.rule_names, self._scores, strict=True):
            if name in self._weighted_python():
                low, high = -math.inf, math.inf
            else:
                low += min(p, f)
                high += max(p, f)
        if self._clip is not None:
            low, high = (min(max(v, self._clip[0]), self._clip[1]) for v in (low, high))
        return low, high

    def explain(self, *, held_out: bool = False) -> list[str]:
        """The reward formula in plain words: one line per rule, then the total and what 'correct' means
        (``held_out``: the rules score only held-out samples, as an SFT run's evaluation does: ``eval/correct``)."""
        lines = []
        for name, check, (on_pass, on_fail) in zip(self.rule_names, self._checks, self._scores, strict=False):
            if isinstance(check, _Python):
                lines.append(self._explain_python(name, check, on_pass, on_fail))
                continue
            if isinstance(check, _JudgeCheck):
                lines.append(self._explain_judge(name, check, on_pass, on_fail))
                continue
            cond = check.describe()
            if on_pass == on_fail == 0:  # weight 0: a rule that only measures ("0 if ...; otherwise 0" says nothing)
                lines.append(f"{name}: measured only (weight 0, adds nothing to the total): passes if {cond}.")
                continue
            lines.append(f"{name}: {_signed(on_pass)} if {cond}; otherwise {_signed(on_fail)}.")
        total = "total = " + " + ".join(self.rule_names)
        if self._clip is not None:
            total += f", clipped to [{_num(self._clip[0])}, {_num(self._clip[1])}]"
        low, high = self.bounds()
        if math.isinf(low) or math.isinf(high):
            lines.append(f"{total} (unbounded: the python rule(s) {', '.join(self._weighted_python())} can "
                         "return any number).")
        elif low == high:
            lines.append(f"{total} (always {_num(low)}: no rule can move it).")
        else:
            lines.append(f"{total} (from {_num(low)} to {_num(high)}).")
        if self.correct_rule is not None and held_out:
            lines.append(f"'eval/correct' (logged at each evaluation) is the fraction of the held-out samples that "
                         f"pass '{self.correct_rule}'.")
        elif self.correct_rule is not None:
            lines.append(
                f"'correct' (logged each step) is the fraction of completions that pass '{self.correct_rule}'."
            )
        return lines

    @staticmethod
    def _explain_judge(name: str, check: _JudgeCheck, on_pass: float, on_fail: float) -> str:
        j = check.judge
        low, high = (_num(on_fail), _num(on_pass))
        return (f"{name}: {j.describe()}; the score, normalised to 0..1, maps onto {low} .. {high} "
                f"(it passes at {j.pass_at:g} or more); {low} if the judge fails, times out or gives no readable "
                "<score>.")

    @staticmethod
    def _explain_python(name: str, check: _Python, on_pass: float, on_fail: float) -> str:
        call = f"{check.label}(completion, fields)"
        limit = f"raises or runs past {check.fn.timeout_s:g} s"
        if check.weighted:
            times = "" if check.weight == 1 else f"{_num(check.weight)} x "
            return (f"{name}: {times}the number returned by {call} (a dict of named numbers counts as their sum); "
                    f"0 if it {limit}.")
        cond = f"{call} returns a number above 0 (True counts as 1)"
        return (f"{name}: {_signed(on_pass)} if {cond}; otherwise {_signed(on_fail)} (also if it {limit}).")
