"""The studio's plain words: each rule's sentence, what a pattern matches, and rules offered as sentences.

- :func:`rule_sentences`: per rule, the line ``sailrl explain`` prints for it (``RewardFunction.explain``, the one
  home of those words), each rule compiled on its own so that a rule with a problem does not take the others'
  sentences with it (it gets None); in it, each pattern of a ``match`` check is said in plain words where
  :func:`pattern_phrase` can ("the reply is only a number"), and as "the pattern '...' (see details)" otherwise.
- :func:`pattern_words`: what a regular expression matches, in words ("the text '2+3=' exactly", "a digit, one
  or more times"), read from Python's own parse of the pattern; a pattern it cannot read gets None.
- :func:`pattern_fields`: the key path of every pattern in the rules with its words (the page shows them beside
  the field).
- :data:`STARTERS`: the rules a new rule is picked from, each a sentence and the rule it makes.
- :func:`page_hint`: a hint written for the terminal ("Score other texts with `sailrl rewards SPEC ...`") in the
  page's words ("try other replies in Try below"); the CLI keeps its own text.
"""

from __future__ import annotations

import re
import re._parser as sre_parse  # the parse tree of a pattern: what pattern_words reads
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sailrl.runtime.rewards.rules import RewardFunction
from sailrl.spec.rewards import RewardSpec

__all__ = ["STARTERS", "page_hint", "pattern_fields", "pattern_phrase", "pattern_words", "rule_sentence", "rule_sentences"]

MAX_WORDS_PATTERN = 500  # longer patterns are not put in words (the parse tree is shown as is)


#: What a terminal hint says, and what the page says instead (the page has Try, the check before a run, and the
#: problems list that scores every example on each edit).
_PAGE_HINTS: list[tuple[re.Pattern[str], str]] = [(re.compile(a), b) for a, b in (
    (r"Score other texts with `sailrl rewards SPEC --completion TEXT[^`]*`\.?", "Try other replies in Try below."),
    (r"Try it: `sailrl rewards SPEC --completion TEXT` shows per rule why it passed or failed\.?",
     "Try a reply in Try below: it shows per rule why it passed or failed."),
    (r"check the rule on a few completions with `sailrl rewards`", "check the rule on a few replies in Try below"),
    (r"\(check it with `sailrl rewards`\)", "(check it on a few replies in Try below)"),
    (r"\(see `sailrl explain`\)", "(see each rule's sentence)"),
    (r"`sailrl preflight SPEC` measures them", "the check before a run measures them"),
    (r"\(`sailrl preflight` shows prompt lengths\)", "(the check before a run shows prompt lengths)"),
    (r"`sailrl preflight SPEC --sample N` estimates the whole run",
     "In a terminal, `sailrl preflight SPEC --sample N` estimates the whole run"),
    (r"this is a warning, and `sailrl validate` still passes", "this is a warning: the spec still saves and runs"),
    (r"\(`sailrl validate` shows where\)", "(the problems list shows where)"),
)]


def page_hint(text: Any) -> Any:
    """``text`` with each terminal command hint of :data:`_PAGE_HINTS` in the page's words (anything else as is)."""
    if not isinstance(text, str) or "`sailrl " not in text:
        return text
    for pattern, words in _PAGE_HINTS:
        text = pattern.sub(words, text)
    return text


def _match_checks(node: Any) -> list[dict[str, Any]]:
    """Every ``kind: match`` mapping in a rule (its own, or its checks')."""
    if not isinstance(node, dict):
        return []
    out = [node] if node.get("kind") == "match" and isinstance(node.get("pattern"), str) else []
    for check in node.get("checks") or [] if isinstance(node.get("checks"), list) else []:
        out += _match_checks(check)
    return out


def rule_sentence(rule: Any, reference_field: str, spec_dir: Path | None = None) -> str | None:
    """``sailrl explain``'s line for ``rule`` (a rule mapping as the spec writes it), each match check's pattern said
    by :func:`pattern_phrase`, or None when the rule does not compile on its own."""
    if not isinstance(rule, dict):
        return None
    try:
        reward = RewardSpec.model_validate({"rules": [rule]})
        fn = RewardFunction.from_spec(reward, reference_field, spec_dir)
        sentence = fn.explain()[0]
    except (ValidationError, ValueError, TypeError, KeyError, re.error):
        return None
    except Exception:  # noqa: BLE001 -- a pattern the regex module refuses, a rule the engine cannot build: no words
        return None
    for check in _match_checks(rule):
        pattern, negate = check["pattern"], bool(check.get("negate"))
        fullmatch = check.get("mode") == "fullmatch"
        if fullmatch:
            said = f"the whole completion {'does not match' if negate else 'matches'} '{pattern}'"
        else:
            said = f"the completion {'does not contain' if negate else 'contains'} a match of '{pattern}'"
        flags = check.get("flags") if isinstance(check.get("flags"), list) else []
        sentence = sentence.replace(said, pattern_phrase(pattern, fullmatch=fullmatch, negate=negate, flags=flags), 1)
    return sentence


def _is_spaces(node: Any) -> bool:
    """``\\s*`` (spaces, any number or none)."""
    op, av = node
    return str(op) in ("MAX_REPEAT", "MIN_REPEAT") and av[0] == 0 and list(av[2]) == [
        (sre_parse.IN, [(sre_parse.CATEGORY, sre_parse.CATEGORY_SPACE)])]


def _core_words(items: list[Any]) -> tuple[str, list[str]] | None:
    """What the middle of a pattern is, when it is plain text or a whole number: ("a number", ["a '-' allowed"])."""
    if items and all(str(op) == "LITERAL" for op, _ in items):
        return "'" + "".join(chr(av) for _, av in items) + "'", []
    notes = []
    if items and str(items[0][0]) == "MAX_REPEAT" and items[0][1][:2] == (0, 1) \
            and list(items[0][1][2]) == [(sre_parse.LITERAL, ord("-"))]:
        notes.append("a '-' allowed")
        items = items[1:]
    digits = [(sre_parse.IN, [(sre_parse.CATEGORY, sre_parse.CATEGORY_DIGIT)])]
    if len(items) == 1 and str(items[0][0]) == "MAX_REPEAT" and items[0][1][0] == 1 \
            and items[0][1][1] == sre_parse.MAXREPEAT and list(items[0][1][2]) == digits:
        return "a number", notes
    return None


def pattern_phrase(pattern: str, *, fullmatch: bool = False, negate: bool = False, flags: Any = ()) -> str:
    """A match check in plain words: "the reply is only a number (a '-' allowed, spaces around it)", "the reply
    contains '='", "the reply starts with 'Answer:'"; a pattern that is not plain text or a whole number (with
    anchors and spaces around it), or one with a flag that changes what its anchors or spaces mean (any but
    IGNORECASE, which the sentence names after it), is "the reply contains a match of the pattern '...' (see
    details)"."""
    try:
        plain = len(pattern) <= MAX_WORDS_PATTERN and not set(flags) - {"IGNORECASE"}
        items = list(sre_parse.parse(pattern)) if plain else None
    except (re.error, RecursionError, OverflowError):
        items = None
    core = None
    if items is not None:
        start = bool(items) and str(items[0][0]) == "AT" and str(items[0][1]) in ("AT_BEGINNING", "AT_BEGINNING_STRING")
        items = items[1:] if start else items
        end = bool(items) and str(items[-1][0]) == "AT" and str(items[-1][1]) in ("AT_END", "AT_END_STRING")
        items = items[:-1] if end else items
        start, end = start or fullmatch, end or fullmatch
        before = start and bool(items) and _is_spaces(items[0])
        items = items[1:] if before else items
        after = end and bool(items) and _is_spaces(items[-1])
        items = items[:-1] if after else items
        core = _core_words(items)
    if core is None:
        if fullmatch:
            return f"the whole reply {'does not match' if negate else 'matches'} the pattern '{pattern}' (see details)"
        return (f"the reply {'does not contain' if negate else 'contains'} a match of the pattern '{pattern}' "
                "(see details)")
    what, notes = core
    spaces = "spaces around it" if before and after else "spaces before it" if before else \
        "spaces after it" if after else None
    notes += [spaces] if spaces else []
    what += f" ({', '.join(notes)})" if notes else ""
    no = " not" if negate else ""
    if start and end:
        return f"the reply is{no} only {what}"
    if start:
        return f"the reply does not start with {what}" if negate else f"the reply starts with {what}"
    if end:
        return f"the reply does not end with {what}" if negate else f"the reply ends with {what}"
    return f"the reply does not contain {what}" if negate else f"the reply contains {what}"


def rule_sentences(rules: Any, reference_field: str, spec_dir: Path | None = None) -> list[str | None]:
    """:func:`rule_sentence` of each rule of ``rules`` (a list, else [])."""
    if not isinstance(rules, list):
        return []
    return [rule_sentence(r, reference_field, spec_dir) for r in rules]


_CATEGORIES = {
    "CATEGORY_DIGIT": "a digit", "CATEGORY_NOT_DIGIT": "a character that is not a digit",
    "CATEGORY_SPACE": "a space (or tab, or line break)", "CATEGORY_NOT_SPACE": "a character that is not a space",
    "CATEGORY_WORD": "a letter, digit or underscore", "CATEGORY_NOT_WORD": "a character that is not a letter or digit",
}
_AT = {"AT_BEGINNING": "the start", "AT_BEGINNING_STRING": "the start", "AT_END": "the end",
       "AT_END_STRING": "the end", "AT_BOUNDARY": "a word boundary", "AT_NON_BOUNDARY": "no word boundary"}


def _char(c: int) -> str:
    ch = chr(c)
    return {" ": "a space", "\n": "a line break", "\t": "a tab"}.get(ch, f"'{ch}'")


def _repeat(lo: int, hi: int) -> str:
    big = hi == sre_parse.MAXREPEAT
    if lo == 0 and hi == 1:
        return "optionally"
    if lo == 0 and big:
        return "any number of times (or none)"
    if lo == 1 and big:
        return "one or more times"
    if big:
        return f"{lo} or more times"
    if lo == hi:
        return f"{lo} times"
    return f"{lo} to {hi} times"


def _in(items: list[Any]) -> str:
    parts, negate = [], False
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            parts.append(_char(av))
        elif name == "RANGE":
            parts.append(f"'{chr(av[0])}' to '{chr(av[1])}'")
        elif name == "CATEGORY":
            parts.append(_CATEGORIES.get(str(av), str(av)))
        else:
            parts.append(name.lower())
    one = parts[0] if len(parts) == 1 else "one of " + ", ".join(parts)
    return f"any character except {', '.join(parts)}" if negate else one


def _seq(items: list[Any]) -> list[str]:
    out: list[str] = []
    literal = ""
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            literal += chr(av)
            continue
        if literal:
            out.append(f"'{literal}'" if len(literal) > 1 else _char(ord(literal)))
            literal = ""
        if name == "AT":
            out.append(f"at {_AT.get(str(av), str(av).lower())}")
        elif name == "ANY":
            out.append("any character")
        elif name == "IN":
            out.append(_in(av))
        elif name == "NOT_LITERAL":
            out.append(f"any character except {_char(av)}")
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, sub = av
            inner = _seq(list(sub))
            what = inner[0] if len(inner) == 1 else "(" + ", then ".join(inner) + ")"
            out.append(f"{what}, {_repeat(lo, hi)}")
        elif name == "SUBPATTERN":
            inner = _seq(list(av[-1]))
            out.append(inner[0] if len(inner) == 1 else "(" + ", then ".join(inner) + ")")
        elif name == "BRANCH":
            alts = [", then ".join(_seq(list(b))) for b in av[1]]
            out.append("either " + " or ".join(alts))
        elif name == "GROUPREF":
            out.append(f"the same text as group {av} again")
        elif name in ("ASSERT", "ASSERT_NOT"):
            inner = ", then ".join(_seq(list(av[1])))
            out.append(("followed by " if name == "ASSERT" else "not followed by ") + inner if av[0] >= 0 else
                       ("after " if name == "ASSERT" else "not after ") + inner)
        else:
            out.append(name.lower().replace("_", " "))
    if literal:
        out.append(f"'{literal}'" if len(literal) > 1 else _char(ord(literal)))
    return out


def pattern_words(pattern: Any, *, fullmatch: bool = False) -> str | None:
    """What ``pattern`` matches, in words, or None (not a string, too long, or a pattern Python cannot read)."""
    if not isinstance(pattern, str) or len(pattern) > MAX_WORDS_PATTERN:
        return None
    if pattern == "":
        return "the empty text: every reply contains it"
    try:
        tree = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None
    items = list(tree)
    if all(str(op) == "LITERAL" for op, _ in items):
        text = "".join(chr(av) for _, av in items)
        return f"the text '{text}' exactly" + (" and nothing else" if fullmatch else ", anywhere in the reply")
    words = ", then ".join(_seq(items))
    return words + (" (the whole reply)" if fullmatch else "")


def _walk_patterns(node: Any, path: str, out: dict[str, str]) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            words = pattern_words(node["pattern"], fullmatch=node.get("mode") == "fullmatch")
            if words is not None:
                out[f"{path}.pattern"] = words
        for k, v in node.items():
            if isinstance(v, (dict, list)):
                _walk_patterns(v, f"{path}.{k}", out)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _walk_patterns(v, f"{path}.{i}", out)


def pattern_fields(rules: Any) -> dict[str, str]:
    """Key path (``reward.rules.1.checks.0.pattern``) -> :func:`pattern_words` of every pattern in ``rules``."""
    out: dict[str, str] = {}
    if isinstance(rules, list):
        _walk_patterns(rules, "reward.rules", out)
    return out


#: The rules a new rule starts from: (sentence with "..." / N where she fills in, kind, the rule's fields).
STARTERS: list[dict[str, Any]] = [
    {"id": "last_number", "sentence": "the last number in the reply equals the answer",
     "rule": {"kind": "answer", "extract": {"from": "last_number"}, "compare": "numeric"}},
    {"id": "contains", "sentence": "the reply contains ...", "ask": "the text the reply must contain",
     "rule": {"kind": "match", "pattern": ""}},
    {"id": "max_words", "sentence": "the reply is at most N words", "ask": "the most words",
     "rule": {"kind": "match", "mode": "fullmatch", "pattern": r"\W*(?:\w+\W*){0,N}"}},
    {"id": "ends", "sentence": "the reply ends on its own (not cut off at the length limit)",
     "rule": {"kind": "termination"}},
    {"id": "judge", "sentence": "a judge decides: ...", "ask": "what a good reply is, in your words",
     "rule": {"kind": "judge", "rubric": "", "judge": {"model": "sailrl/tiny-judge", "sampler": "local"}}},
]
