"""Reward gaming, caught while a run trains: a rule whose pass rate climbs while correctness does not, or whose
passing replies are degenerate.

A rule written to mean "shows working" (the reply contains ``=``) is met by ``2=aaaaaaaa`` cut at max_tokens: the
reward climbs, the model learns nothing the writer wanted, and nothing fails. :class:`GamingWatch` looks at each
step's metrics line and train rollouts (:meth:`sailrl.runtime.loop.records.Records.end_step` calls
:meth:`GamingWatch.observe`) and, once per rule, returns a warning when

- **climb**: the rule's pass rate (its mean contribution mapped onto 0..1 by its pass and fail scores) over the last
  :data:`WINDOW` steps is at least :data:`CLIMB` above its first :data:`WINDOW` steps while ``correct`` (the spec's
  correct rule; ``eval/correct`` where the run has held-out rows) rose by less than :data:`CORRECT_RISE`; or
- **degenerate**: at least :data:`DEGENERATE_SHARE` of this step's replies that pass the rule (and at least
  :data:`MIN_PASSING` of them) are degenerate: cut at max_tokens, one character repeated (a run of
  :data:`REPEAT_RUN` or more, or one character making up most of the reply), or the same text of
  :data:`IDENTICAL_CHARS` or more characters replied to :data:`IDENTICAL_PROMPTS` or more different prompts.

A goal the model never reaches is said too, once per rule: a rule that passed on no reply for :data:`NEVER_STEPS`
steps in a row (its pass rate 0 in each of the last :data:`NEVER_STEPS` metrics lines) gets one plain warning, that
the model may not be able to write what the rule asks for, and what to try.

Each warning is also appended as one JSON line to the run directory's ``gaming.jsonl`` (what ``sailrl studio``
shows): the step, the rule, what was seen, three passing replies, and a proposed fix in words (and, where the fix
is a rule, the rule: the same check also requiring the reply to end on its own, or to have no long run of one
character).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sailrl.runtime.rundir.directory import GAMING_FILE, append_whole, stamped
from sailrl.runtime.sandbox.redact import redact

__all__ = ["CLIMB", "NEVER_STEPS", "GamingWatch", "degenerate_kind", "pass_rate"]

#: Steps averaged at the start and at the end of the comparison.
WINDOW = 3
#: Rise of a rule's pass rate (0..1) that counts as a climb.
CLIMB = 0.3
#: A rise of ``correct`` below this is "correctness did not climb".
CORRECT_RISE = 0.05
#: Share of the passing replies that must be degenerate.
DEGENERATE_SHARE = 0.5
#: Fewest passing replies the degenerate check looks at.
MIN_PASSING = 8
REPEAT_RUN = 8
#: Steps in a row on which a rule passed on no reply before it is warned of.
NEVER_STEPS = 10
IDENTICAL_CHARS = 8
IDENTICAL_PROMPTS = 3
QUOTE_CHARS = 80
_RUN = re.compile(rf"(.)\1{{{REPEAT_RUN - 1},}}", re.DOTALL)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def pass_rate(value: Any, on_pass: float, on_fail: float) -> float | None:
    """A rule's mean contribution ``value`` mapped onto 0..1 by its contributions on pass and on fail (None when it
    is not a finite number, or when passing and failing score the same)."""
    number = _number(value)
    if number is None or on_pass == on_fail:
        return None
    return min(1.0, max(0.0, (number - on_fail) / (on_pass - on_fail)))


def degenerate_kind(text: str, truncated: bool) -> str | None:
    """Why one reply is degenerate on its own ("cut at max_tokens", "one character repeated"), or None."""
    if truncated:
        return "cut at max_tokens"
    stripped = text.strip()
    if _RUN.search(stripped):
        return "one character repeated"
    if len(stripped) >= 6 and Counter(stripped).most_common(1)[0][1] >= 0.6 * len(stripped):
        return "one character repeated"
    return None


def _quote(text: str) -> str:
    shown = text.replace("\n", "⏎")
    return shown if len(shown) <= QUOTE_CHARS else shown[:QUOTE_CHARS - 3] + "..."


class GamingWatch:
    """The gaming checks of one run. ``rules``: the spec's reward rules (pydantic models, in order);
    ``correct_rule``: the rule logged as ``correct`` (None: the climb check is off); ``run_dir``: where
    ``gaming.jsonl`` goes (None: nowhere)."""

    def __init__(self, rules: Sequence[Any], correct_rule: str | None, run_dir: Path | str | None) -> None:
        self.rules = {str(r.name): r for r in rules}
        self.correct_rule = correct_rule
        self.path = Path(run_dir) / GAMING_FILE if run_dir is not None else None
        self.warned: set[str] = set()
        self.never_warned: set[str] = set()

    # ------------------------------------------------------------------ the two signs
    def _scores(self, name: str) -> tuple[float, float]:
        rule = self.rules[name]
        return rule.scores() if hasattr(rule, "scores") else (1.0, 0.0)

    def _pass_rate(self, line: dict[str, Any], name: str) -> float | None:
        return pass_rate(line.get(f"reward/{name}"), *self._scores(name))

    def _never_passed(self, history: Sequence[dict[str, Any]], name: str) -> bool:
        """Whether rule ``name`` passed on no reply in each of the last :data:`NEVER_STEPS` steps (a rule that
        scores less on pass than on fail is a penalty, which passing on nothing is what it wants)."""
        on_pass, on_fail = self._scores(name)
        if on_pass <= on_fail or len(history) < NEVER_STEPS:
            return False
        rates = [self._pass_rate(x, name) for x in history[-NEVER_STEPS:]]
        return all(r is not None and r <= 1e-9 for r in rates)

    def _climb(self, history: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
        if self.correct_rule is None or name == self.correct_rule or len(history) < 2 * WINDOW:
            return None
        rates = [self._pass_rate(x, name) for x in history]
        first, now = _mean([r for r in rates[:WINDOW] if r is not None]), \
            _mean([r for r in rates[-WINDOW:] if r is not None])
        if first is None or now is None or now - first < CLIMB:
            return None
        key = "eval/correct" if any(_number(x.get("eval/correct")) is not None for x in history) else "correct"
        values = [v for v in (_number(x.get(key)) for x in history) if v is not None]
        if len(values) < 2:
            return None
        c_first, c_now = _mean(values[:WINDOW]), _mean(values[-WINDOW:])
        if c_first is None or c_now is None or c_now - c_first >= CORRECT_RISE:
            return None
        return {"pass_first": round(first, 3), "pass_now": round(now, 3), "correct_key": key,
                "correct_first": round(c_first, 3), "correct_now": round(c_now, 3)}

    @staticmethod
    def _replies(groups: Sequence[Any], name: str) -> list[tuple[int, str, bool]]:
        """(group index, text, truncated) of every reply of ``groups`` that passes rule ``name``."""
        out = []
        for gi, group in enumerate(groups):
            for traj in getattr(group, "trajectories_G", []):
                if not traj.transitions:
                    continue
                last = traj.transitions[-1]
                logs = getattr(last, "logs", None) or {}
                if not logs.get(f"passed/{name}"):
                    continue
                truncated = any((getattr(t, "metrics", None) or {}).get("truncated") for t in traj.transitions)
                out.append((gi, str(logs.get("completion", "")), bool(truncated)))
        return out

    @staticmethod
    def _degenerate(replies: list[tuple[int, str, bool]]) -> dict[str, Any] | None:
        if len(replies) < MIN_PASSING:
            return None
        groups_of: dict[str, set[int]] = {}
        for gi, text, _ in replies:
            key = " ".join(text.split())
            if len(key) >= IDENTICAL_CHARS:
                groups_of.setdefault(key, set()).add(gi)
        kinds: Counter[str] = Counter()
        bad: list[str] = []
        for _group, text, truncated in replies:
            why = degenerate_kind(text, truncated)
            if why is None and len(groups_of.get(" ".join(text.split()), ())) >= IDENTICAL_PROMPTS:
                why = "the same reply to different prompts"
            if why is not None:
                kinds[why] += 1
                bad.append(text)
        if len(bad) < DEGENERATE_SHARE * len(replies):
            return None
        return {"passing": len(replies), "degenerate": len(bad), "kinds": dict(kinds), "examples": bad}

    # ------------------------------------------------------------------ the fix
    def _fix(self, name: str, kinds: dict[str, int]) -> dict[str, Any]:
        rule = self.rules[name]
        body = rule.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True) \
            if hasattr(rule, "model_dump") else {}
        keep = {k: body.pop(k) for k in ("name", "weight", "pass_score", "fail_score") if k in body}
        top = max(kinds, key=kinds.get) if kinds else None
        if top == "cut at max_tokens" or top is None and body.get("kind") != "termination":
            words, extra = "also require the reply to end on its own (not cut off at max_tokens)", \
                {"kind": "termination"}
        elif top == "one character repeated":
            words, extra = (f"also require the reply to have no character repeated {REPEAT_RUN} times in a row",
                            {"kind": "match", "pattern": rf"(.)\1{{{REPEAT_RUN - 1},}}", "negate": True})
        else:
            words = (f"give '{name}' less weight than '{self.correct_rule}', or say what a good reply is more "
                     "precisely (the same reply to different prompts passes it)") if self.correct_rule else \
                "say what a good reply is more precisely (the same reply to different prompts passes it)"
            return {"words": words, "rule": None}
        kind = body.get("kind")
        if kind == "all_of":
            checks = list(body.get("checks") or [])
            new = {**keep, "kind": "all_of", "checks": checks + [extra]}
        elif kind in ("match", "length", "termination", "has_answer"):
            new = {**keep, "kind": "all_of", "checks": [body, extra]}
        else:
            return {"words": words + f" (an extra rule: '{name}' is a {kind} rule, which all_of cannot hold)",
                    "rule": {"name": f"{name}_ends" if extra["kind"] == "termination" else f"{name}_no_repeat",
                             **extra, "weight": keep.get("weight", 1.0)}}
        return {"words": words, "rule": new}

    # ------------------------------------------------------------------ one step
    def observe(self, step: int, history: Sequence[dict[str, Any]], groups: Sequence[Any]) -> list[str]:
        """The warnings for ``step`` (whose metrics line is ``history[-1]``; ``groups``: its train groups), each also
        written to ``gaming.jsonl``. At most one gaming warning and one never-passed warning per rule per run."""
        out = []
        for name in self.rules:
            if name not in self.never_warned and self._never_passed(history, name):
                self.never_warned.add(name)
                out.append(self._never(step, name))
        for name in self.rules:
            if name in self.warned or name == self.correct_rule:
                continue
            climb = self._climb(history, name)
            replies = self._replies(groups, name)
            degenerate = self._degenerate(replies)
            if climb is None and degenerate is None:
                continue
            self.warned.add(name)
            examples = (degenerate or {}).get("examples") or [t for _, t, _ in replies]
            fix = self._fix(name, (degenerate or {}).get("kinds") or {})
            parts = []
            if climb is not None:
                parts.append(f"its pass rate climbed from {climb['pass_first']:.0%} to {climb['pass_now']:.0%} while "
                             f"{climb['correct_key']} went from {climb['correct_first']:.0%} to "
                             f"{climb['correct_now']:.0%}")
            if degenerate is not None:
                kinds = ", ".join(f"{n} {k}" for k, n in sorted(degenerate["kinds"].items(), key=lambda kv: -kv[1]))
                parts.append(f"{degenerate['degenerate']} of the {degenerate['passing']} replies that pass it are "
                             f"degenerate ({kinds})")
            shown = "; ".join(repr(_quote(t)) for t in examples[:3])
            message = (f"step {step}: rule '{name}' looks gamed: {'; and '.join(parts)}. Replies that pass it: "
                       f"{shown}. Proposed fix: {fix['words']}.")
            record = {"step": step, "rule": name, "signs": [s for s, v in (("climb", climb),
                                                                            ("degenerate", degenerate)) if v],
                      "climb": climb, "degenerate": {k: v for k, v in (degenerate or {}).items() if k != "examples"}
                      or None, "examples": [t[:2000] for t in examples[:3]], "fix": fix, "message": message}
            self._write(record)
            out.append(message)
        return out

    def _never(self, step: int, name: str) -> str:
        """The warning for rule ``name``, which passed on no reply in the last :data:`NEVER_STEPS` steps; its record
        carries the page's wording too (``studio_message``: the studio's Try box instead of a command)."""
        head = (f"no reply passed '{name}' in the last {NEVER_STEPS} steps: the model never writes what it asks for; "
                "this model may not be able to")
        tail = "or give it examples (training.warmup)"
        message = f"step {step}: {head} (score a reply you write with `sailrl rewards SPEC --completion TEXT`), {tail}"
        studio = f"{head} (try a reply by hand with Try), {tail}"
        self._write({"step": step, "rule": name, "signs": ["never_passed"], "climb": None, "degenerate": None,
                     "examples": [], "fix": {"words": "try a reply by hand with Try, or give it examples (training.warmup)", "rule": None}, "message": message,
                     "studio_message": studio})
        return message

    def _write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = redact(json.dumps(stamped(GAMING_FILE, record), ensure_ascii=False) + "\n")
        try:
            append_whole(self.path, line.encode("utf-8"))  # whole or not at all; replies hold no secret
        except OSError:
            pass  # the warning is still printed; the studio then has no record of it
