"""Labelled replies and the rules that agree with them.

She marks replies good or bad (typed, or a run's rollouts). :func:`agreement` says, per rule, which labels it gets
right (a good reply it passes, a bad one it fails). :func:`propose` searches rule kinds and their options, simplest
first, for rules that get every label right -- changes of a rule that gets some wrong (its options varied, or the
same check also requiring the reply to end on its own) and new rules, never one the spec has already; when no single
rule fits, a new check that fits together with an answer rule of the spec (both must pass) -- and keeps only those that pass none of the
gaming probes: ``sailrl validate``'s W110 probes for answer rules
(:func:`sailrl.compiler.reward_checks.probe_answer_rule`) and, for every rule, degenerate replies (empty, one
character repeated and cut at max_tokens, a good reply with a repeated tail cut at max_tokens).
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic import ValidationError

from sailrl.compiler.reward_checks import probe_answer_rule
from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.rewards import RewardSpec
from sailrl.studio.words import rule_sentence

__all__ = ["MAX_LABELS", "Label", "agreement", "propose"]

MAX_LABELS = 200
MAX_PROPOSALS = 3
MAX_CANDIDATES = 400
_NAME = "proposed"


class Label(SimpleNamespace):
    """One labelled reply: ``completion``, ``fields`` (the row's), ``truncated``, ``good``."""


def labels_from(raw: Any) -> list[Label]:
    """The page's labels (a list of ``{completion, fields, truncated, good}``) checked and bounded."""
    if not isinstance(raw, list):
        raise ValueError("labels must be a list")
    out = []
    for x in raw[:MAX_LABELS]:
        if not isinstance(x, dict) or not isinstance(x.get("completion"), str) or not isinstance(x.get("good"), bool):
            raise ValueError("each label needs completion (text) and good (true or false)")
        fields = x.get("fields") if isinstance(x.get("fields"), dict) else {}
        out.append(Label(completion=x["completion"][:20_000], fields={str(k): v for k, v in fields.items()},
                         truncated=bool(x.get("truncated")), good=x["good"]))
    return out


def _compile(rule: dict[str, Any], reference_field: str, spec_dir: Path | None) -> RewardFunction | None:
    try:
        return RewardFunction.from_spec(RewardSpec.model_validate({"rules": [rule]}), reference_field, spec_dir)
    except (ValidationError, ValueError, TypeError):
        return None
    except Exception:  # noqa: BLE001 -- a candidate the engine cannot build is no candidate
        return None


def _passes(fn: Any, name: str, label: Any) -> bool | None:
    """Whether rule ``name`` of ``fn`` passes ``label``; None when it cannot say (a judge rule not called)."""
    score = fn.score(label.completion, label.fields, truncated=label.truncated,
                     num_tokens=None, judged={} if fn.judges else None)
    if name in fn.judges or name in score.errors:
        return None
    return bool(score.passed[name])


def agreement(fn: Any, labels: list[Label], skip: set[str] = frozenset()) -> dict[str, list[bool | None]]:
    """Rule name -> per label: True (it gets the label right), False (wrong), None (it cannot say)."""
    out: dict[str, list[bool | None]] = {}
    for name in fn.rule_names:
        if name in skip:
            out[name] = [None] * len(labels)
            continue
        row: list[bool | None] = []
        for label in labels:
            passed = _passes(fn, name, label)
            row.append(None if passed is None else passed == label.good)
        out[name] = row
    return out


def _probes(labels: list[Label]) -> list[tuple[str, str, bool]]:
    """(what, text, truncated): degenerate replies no rule should pass."""
    good = next((x.completion for x in labels if x.good), "")
    return [("an empty reply", "", False),
            ("one character repeated, cut at max_tokens", "a" * 40, True),
            ("'=' repeated, cut at max_tokens", "=" * 40, True),
            ("a good reply with a repeated tail, cut at max_tokens", good.rstrip() + "a" * 30, True)]


def _gamed_by(rule: dict[str, Any], fn: Any, labels: list[Label]) -> list[str]:
    """The gaming probes ``rule`` (compiled as ``fn``) passes."""
    fields = next((x.fields for x in labels if x.good), labels[0].fields if labels else {})
    found = []
    for what, text, truncated in _probes(labels):
        if what.startswith("a good reply") and rule.get("kind") == "answer":
            continue  # an answer rule reads the answer: the tail is W110's to probe (a second answer)
        if fn.score(text, fields, truncated=truncated).passed[_NAME]:
            found.append(what)
    if rule.get("kind") == "answer":
        found += [label for label, _ in probe_answer_rule(fn, _NAME, [x for x in labels if x.good])]
    return found


def _words(labels: list[Label]) -> list[str]:
    """Pieces of text every good reply contains and some bad reply lacks (words and single symbols)."""
    goods = [x.completion for x in labels if x.good]
    bads = [x.completion for x in labels if not x.good]
    if not goods:
        return []
    pieces: list[str] = []
    for piece in re.findall(r"[A-Za-z]{2,}|\S", goods[0]):
        if piece.isdigit():  # a digit in every good reply is the answers' coincidence, not what makes them good
            continue
        if piece not in pieces and all(piece in g for g in goods) and any(piece not in b for b in bads):
            pieces.append(piece)
    return pieces[:20]


def _candidates(rules: list[Any], labels: list[Label]) -> list[tuple[int, str, dict[str, Any], int | None]]:
    """(complexity, how, rule without name and scores, index of the rule it changes or None) to try, simplest first."""
    out: list[tuple[int, str, dict[str, Any], int | None]] = []
    has_ref = any(x.fields for x in labels)
    ends = {"kind": "termination"}
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        body = {k: v for k, v in rule.items() if k not in ("name", "weight", "pass_score", "fail_score")}
        kind = body.get("kind")
        if kind == "answer":
            for fr in ("last_number", "whole", "boxed"):
                for cmp in ("numeric", "normalized"):
                    out.append((2, "its options changed", {**body, "extract": {"from": fr}, "compare": cmp}, i))
        if kind == "match":
            out.append((2, "its options changed", {**body, "mode": "fullmatch" if body.get("mode") != "fullmatch"
                                                   else "search"}, i))
        if kind in ("match", "length", "has_answer"):
            out.append((3, "also requiring the reply to end on its own", {"kind": "all_of", "checks": [body, ends]}, i))
        if kind == "all_of" and ends not in (body.get("checks") or []):
            out.append((3, "also requiring the reply to end on its own",
                        {**body, "checks": [*(body.get("checks") or []), ends]}, i))
    out.append((1, "a new rule", ends, None))
    if has_ref:
        for fr in ("last_number", "whole", "boxed"):
            for cmp in ("numeric", "normalized"):
                out.append((2, "a new rule", {"kind": "answer", "extract": {"from": fr}, "compare": cmp}, None))
    for piece in _words(labels):
        lit = {"kind": "match", "pattern": re.escape(piece)}
        out.append((2, "a new rule", lit, None))
        out.append((3, "a new rule", {"kind": "all_of", "checks": [lit, ends]}, None))
    goods = [len(x.completion) for x in labels if x.good]
    if goods:
        out.append((2, "a new rule", {"kind": "length", "unit": "chars", "max": max(goods)}, None))
    out.sort(key=lambda t: t[0])
    return out[:MAX_CANDIDATES]


def propose(rules: list[Any], labels: list[Label], reference_field: str, spec_dir: Path | None,
            wrong: dict[int, int]) -> list[dict[str, Any]]:
    """Rules that get every label right and pass no gaming probe, simplest first: at most :data:`MAX_PROPOSALS`.

    ``wrong``: rule index -> labels it gets wrong (only those rules are offered changes). Each proposal:
    ``{"sentence", "rule", "replaces" (an index, or None for a new rule), "how", "probes"}``.
    """
    if not labels or not any(x.good for x in labels) or not any(not x.good for x in labels):
        return []
    out: list[dict[str, Any]] = []
    have = [_body(r) for r in rules if isinstance(r, dict)]
    seen: set[str] = set()
    for _, how, body, index in _candidates(rules, labels):
        if index is not None and not wrong.get(index):
            continue
        if body in have:  # the spec has this rule already (a copy would count it twice)
            continue
        key = repr((body, index))
        if key in seen:
            continue
        seen.add(key)
        fn = _compile({"name": _NAME, **body}, reference_field, spec_dir)
        if fn is None or fn.judges:
            continue
        if any(_passes(fn, _NAME, x) != x.good for x in labels):
            continue
        if _gamed_by(body, fn, labels):
            continue
        if index is not None:
            old = rules[index]
            rule = {"name": old.get("name"), **{k: old[k] for k in ("weight", "pass_score", "fail_score") if k in old},
                    **body}
        else:
            rule = {"name": _new_name(rules), **body, "weight": 1.0}
        rule = {k: v for k, v in rule.items() if v is not None}
        sentence = rule_sentence(rule, reference_field, spec_dir)
        out.append({"sentence": sentence, "rule": rule, "replaces": index, "how": how,
                    "probes": len(_probes(labels)) + (1 if body.get("kind") == "answer" else 0)})
        if len(out) >= MAX_PROPOSALS:
            break
    if not out:
        out = _with_answer_rule(rules, labels, reference_field, spec_dir, have)
    return out


def _body(rule: dict[str, Any]) -> dict[str, Any]:
    """A rule without its name and scores: what it checks (two rules with the same body are the same rule)."""
    return {k: v for k, v in rule.items() if k not in ("name", "weight", "pass_score", "fail_score") and v is not None}


def _new_name(rules: list[Any]) -> str:
    taken = {r.get("name") for r in rules if isinstance(r, dict)}
    n = 1
    while f"rule_{n}" in taken:
        n += 1
    return f"rule_{n}"


def _with_answer_rule(rules: list[Any], labels: list[Label], reference_field: str, spec_dir: Path | None,
                      have: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """When no single rule gets every label right: a new check that, together with an answer rule the spec has,
    does (a reply is good when both pass: "the last number equals the answer AND the reply contains '='"). The pair
    passes no gaming probe together."""
    out: list[dict[str, Any]] = []
    for rule in rules:
        if not isinstance(rule, dict) or rule.get("kind") != "answer" or not rule.get("name"):
            continue
        answer = _compile({**_body(rule), "name": _NAME}, reference_field, spec_dir)
        if answer is None:
            continue
        right = [_passes(answer, _NAME, x) for x in labels]
        if None in right:
            continue
        tried: set[str] = set()
        for _, _, body, index in _candidates(rules, labels):
            if index is not None or body.get("kind") == "answer" or body in have or repr(body) in tried:
                continue
            tried.add(repr(body))
            fn = _compile({"name": _NAME, **body}, reference_field, spec_dir)
            if fn is None or fn.judges:
                continue
            if any((ok and _passes(fn, _NAME, x)) != x.good for ok, x in zip(right, labels, strict=True)):
                continue
            fields = next((x.fields for x in labels if x.good), {})
            if any(answer.score(t, fields, truncated=c).passed[_NAME] and fn.score(t, fields, truncated=c).passed[_NAME]
                   for _, t, c in _probes(labels)):
                continue
            new = {"name": _new_name(rules), **body, "weight": 1.0}
            sentence = rule_sentence(new, reference_field, spec_dir)
            out.append({"sentence": sentence, "rule": new, "replaces": None, "together_with": rule["name"],
                        "how": f"a new rule, together with '{rule['name']}': a reply is good when both pass",
                        "probes": len(_probes(labels))})
            if len(out) >= MAX_PROPOSALS:
                return out
    return out
