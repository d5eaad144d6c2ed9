"""Check a spec's reward rules against its worked ``examples:`` (run by ``sailrl validate`` / ``compile``).

Each example is scored with :class:`sailrl.runtime.rewards.RewardFunction`; one located
:class:`~sailrl.spec.errors.SpecError` is returned per example whose scores disagree with its ``expect`` /
``expect_total``, with a small table (rule | expected | got | why) in the message. An example that expects a
score for a rule that does not exist, expects nothing, or whose reference answer is unusable is reported too.

A regular expression (a ``match`` rule or check, or a ``regex`` extractor) that matched none of the examples
that expect its rule to pass is reported once, at the pattern, with a hint (``DOTALL`` for ``.`` across line
breaks, ``mode: search`` instead of ``fullmatch``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sailrl.spec.errors import SpecError

if TYPE_CHECKING:
    from sailrl.spec.loader import LoadedSpec
    from sailrl.spec.rewards import RewardExample

__all__ = ["EXAMPLE_CODES", "check_reward_examples", "format_table", "is_example_error"]

#: Codes of the problems :func:`check_reward_examples` reports (sailrl.spec.codes).
EXAMPLE_CODES = frozenset({"S301", "S302", "S303", "S304", "S305", "W104"})

_TOL = 1e-9


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def format_table(rows: list[tuple[str, str, str, str]], header: tuple[str, str, str, str]) -> str:
    """Rows as a plain-text table with `` | `` between columns (no trailing spaces)."""
    all_rows = [header, *rows]
    widths = [max(len(r[i]) for r in all_rows) for i in range(3)]
    out = []
    for r in all_rows:
        cells = [r[i].ljust(widths[i]) for i in range(3)] + [r[3]]
        out.append("  " + " | ".join(cells).rstrip())
    return "\n".join(out)


def _differs(expected: float, got: float) -> bool:
    return abs(expected - got) > _TOL * max(1.0, abs(expected))


def check_reward_examples(loaded: LoadedSpec) -> list[SpecError]:
    """Score every ``examples:`` entry of ``loaded.spec`` and return the located problems (empty if all agree).

    Never raises for a user error. ``loaded`` must hold a validated spec (``loaded.spec`` not None).
    """
    spec = getattr(loaded, "spec", None)
    if spec is None or not spec.examples:
        return []
    from sailrl.runtime.rewards import RewardFunction
    from sailrl.spec.messages import did_you_mean

    fn = RewardFunction.from_spec(spec.reward, spec.prompt.reference_field)
    errors: list[SpecError] = []
    has_answer_rules = any(r.kind == "answer" for r in spec.reward.rules)
    for i, ex in enumerate(spec.examples):
        if ex is None:  # not scored: a rule it depends on has problems (the validation stage says so once)
            continue
        path: tuple[Any, ...] = ("examples", i)
        unknown = [k for k in ex.expect if k not in fn.rule_names]
        for name in unknown:
            guess = did_you_mean(name, fn.rule_names)
            errors.append(loaded.error(
                (*path, "expect", name),
                f"example {i + 1} expects a score for rule '{name}', but no rule has that name"
                + (f" -- did you mean '{guess}'?" if guess else ""),
                f"The rules are: {', '.join(fn.rule_names)}.", at="key", code="S302",
            ))
        if ex.expect_total is None and not ex.expect:
            errors.append(loaded.error(
                path, f"example {i + 1} expects nothing, so it checks nothing",
                "Add expect_total: <total reward> and/or expect: {<rule name>: <contribution>, ...}.", code="S303",
            ))
            continue
        if has_answer_rules:
            problem = fn.reference_problem(ex.fields)
            if problem is not None:
                errors.append(loaded.error(
                    (*path, "fields"), f"example {i + 1}: {problem}",
                    "Give the example the dataset fields its answer rules read, e.g. fields: {answer: '72'}. "
                    "During training, rows with such a reference are skipped.", code="S304",
                ))
                continue
        score, traces = fn.trace(ex.completion, dict(ex.fields), truncated=ex.truncated, num_tokens=ex.num_tokens)
        err = _disagreement(loaded, i, ex, score, traces, fn.rule_names)
        if err is not None:
            errors.append(err)
    errors += _silent_patterns(loaded, fn)
    return errors


def _disagreement(loaded: LoadedSpec, i: int, ex: RewardExample, score: Any, traces: list[Any],
                  names: list[str]) -> SpecError | None:
    first_bad: tuple[Any, ...] | None = None
    rows = []
    for t in traces:
        expected = ex.expect.get(t.name)
        bad = expected is not None and _differs(expected, t.contribution)
        if bad and first_bad is None:
            first_bad = ("examples", i, "expect", t.name)
        mark = "  <-- differs" if bad else ""
        why = f"{'pass' if t.passed else 'fail'}: {t.why}" if t.why else ("pass" if t.passed else "fail")
        rows.append((t.name, _num(expected), _num(t.contribution), why + mark))
    total_bad = ex.expect_total is not None and _differs(ex.expect_total, score.total)
    if total_bad and first_bad is None:
        first_bad = ("examples", i, "expect_total")
    if first_bad is None:
        return None
    rows.append(("total", _num(ex.expect_total), _num(score.total), "  <-- differs" if total_bad else ""))
    table = format_table(rows, ("rule", "expected", "got", "why"))
    extra = []
    if score.timeouts:
        extra.append(f"{score.timeouts} regex evaluation(s) ran past reward.regex_timeout_s and counted as failed.")
    for name, why in score.errors.items():
        extra.append(f"rule '{name}' could not be evaluated: {why}")
    message = f"example {i + 1} does not score as expected:\n{table}"
    if extra:
        message += "\n" + "\n".join("  " + e for e in extra)
    hint = ("Either the rules do not say what you mean (see `sailrl explain`), or the expectation is off. "
            "Score other texts with `sailrl rewards SPEC --completion TEXT --field answer=...`.")
    return loaded.error(first_bad, message, hint, at="key", code="S301")


def _expects_pass(ex: RewardExample, name: str, on_pass: float, on_fail: float) -> bool:
    expected = ex.expect.get(name)
    if expected is None or not _differs(on_pass, on_fail):
        return False
    return not _differs(expected, on_pass)


def _silent_patterns(loaded: LoadedSpec, fn: Any) -> list[SpecError]:
    """A pattern that matched none of the examples expecting its rule to pass."""
    from sailrl.runtime.answers import CompiledExtractor

    spec = loaded.spec
    timeout = spec.reward.regex_timeout_s
    errors = []
    for j, rule in enumerate(spec.reward.rules):
        on_pass, on_fail = rule.scores()
        texts = [ex.completion for ex in spec.examples
                 if ex is not None and _expects_pass(ex, str(rule.name), on_pass, on_fail)]
        if not texts:
            continue
        base = ("reward", "rules", j)
        candidates: list[tuple[tuple[Any, ...], Any]] = []
        if rule.kind == "all_of":
            candidates = [((*base, "checks", k), c) for k, c in enumerate(rule.checks)]
        else:
            candidates = [(base, rule)]
        for path, part in candidates:
            if part.kind == "match" and not part.negate:
                if not any(_match(part, t, timeout) for t in texts):
                    errors.append(_pattern_error(loaded, (*path, "pattern"), str(rule.name), part.pattern,
                                                 part.flags, part.mode, texts))
            elif part.kind in ("answer", "has_answer") and part.extract.from_ == "regex":
                ex = CompiledExtractor(part.extract, timeout)
                if not any(_extracts(ex, t) for t in texts):
                    errors.append(_pattern_error(loaded, (*path, "extract", "pattern"), str(rule.name),
                                                 part.extract.pattern or "", part.extract.flags, "search", texts))
    return errors


def _match(rule: Any, text: str, timeout: float) -> bool:
    import regex

    flags = 0
    for f in rule.flags:
        flags |= getattr(regex, f)
    pattern = regex.compile(rule.pattern, flags)
    fn = pattern.fullmatch if rule.mode == "fullmatch" else pattern.search
    try:
        return fn(text, timeout=timeout) is not None
    except TimeoutError:
        return False


def _extracts(extractor: Any, text: str) -> bool:
    try:
        return extractor(text) is not None
    except TimeoutError:
        return False


_SILENT = "example(s) that expect the rule to pass"


def is_example_error(err: SpecError) -> bool:
    """Whether ``err`` came from :func:`check_reward_examples` (the rules themselves are valid)."""
    return err.code in EXAMPLE_CODES


def _would_match(pattern: str, flags: list[str], mode: str, texts: list[str], timeout: float) -> bool:
    import regex

    value = 0
    for f in flags:
        value |= getattr(regex, f)
    try:
        compiled = regex.compile(pattern, value)
    except regex.error:
        return False
    fn = compiled.fullmatch if mode == "fullmatch" else compiled.search
    for t in texts:
        try:
            if fn(t, timeout=timeout) is not None:
                return True
        except TimeoutError:
            pass
    return False


def _pattern_error(loaded: LoadedSpec, path: tuple[Any, ...], rule: str, pattern: str, flags: list[str],
                   mode: str, texts: list[str]) -> SpecError:
    n = len(texts)
    message = f"rule '{rule}': the pattern {pattern!r} matches none of the {n} {_SILENT}"
    timeout = loaded.spec.reward.regex_timeout_s
    hints = []
    for extra, words in (("DOTALL", ("'.' then also matches line breaks (e.g. <think>...</think> over several "
                                    "lines)")),
                         ("IGNORECASE", "upper and lower case then match each other"),
                         ("MULTILINE", "^ and $ then match at every line start and end")):
        if extra not in flags and _would_match(pattern, [*flags, extra], mode, texts, timeout):
            hints.append(f"With flags: [{', '.join([*flags, extra])}] it matches: {words}.")
    if mode == "fullmatch" and _would_match(pattern, flags, "search", texts, timeout):
        hints.append("With mode: search it matches: fullmatch needs the WHOLE completion to match.")
    if not hints and "\\boxed" in pattern.replace("\\\\", ""):
        hints.append("In a regular expression '\\b' is a word boundary, so '\\boxed' looks for 'oxed': write "
                     "'\\\\boxed' (two backslashes, in single quotes) to match the text \\boxed.")
    hints.append("Try it: `sailrl rewards SPEC --completion TEXT` shows per rule why it passed or failed.")
    return loaded.error(path, message, "\n".join(hints), code="S305")
