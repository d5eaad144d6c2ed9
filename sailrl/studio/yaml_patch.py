"""Round-trip edits of a spec's reward rules and examples (ruamel.yaml): everything else stays as written.

:func:`replace_sections` parses the spec text with ruamel.yaml's round-trip loader, merges the new
``reward.rules`` and ``examples`` into the existing nodes in place (a value that did not change keeps its node,
its quoting and its comments; a new value is written in block style, regular expressions in single quotes), and
dumps it with the indentation the file already uses. Comments, key order, quoting and blank lines outside the
edited values are kept; a test checks that a no-op edit returns the text unchanged.
"""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.scalarstring import SingleQuotedScalarString
from ruamel.yaml.util import load_yaml_guess_indent

from sailrl.spec.errors import UserError

_MISSING = object()


class PatchError(UserError, ValueError):
    """The spec text cannot be edited this way (plain words in ``str(exc)``)."""

    code = "E213"


def _yaml(text: str) -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    try:
        _, indent, block_seq_indent = load_yaml_guess_indent(text)
    except Exception:  # noqa: BLE001 -- the guess is only a guess; defaults below
        indent, block_seq_indent = None, None
    indent = indent or 2
    offset = block_seq_indent if block_seq_indent is not None else 0
    yaml.indent(mapping=max(indent - offset, 2) if offset else indent, sequence=indent, offset=offset)
    return yaml


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, str) and isinstance(b, str):
        return str(a) == str(b)
    return a is None and b is None


def _fresh(value: Any) -> Any:
    if isinstance(value, dict):
        out = CommentedMap()
        for k, v in value.items():
            out[str(k)] = _fresh(v)
        return out
    if isinstance(value, list):
        seq = CommentedSeq(_fresh(v) for v in value)
        if all(not isinstance(v, (dict, list)) for v in value):
            seq.fa.set_flow_style()
        return seq
    if isinstance(value, str) and ("\\" in value or value != value.strip() or value == ""):
        return SingleQuotedScalarString(value)
    return value


def _merge(node: Any, new: Any) -> Any:
    """``new`` written into ``node`` in place where their shapes agree (keeping comments); else a fresh node."""
    if isinstance(node, CommentedMap) and isinstance(new, dict):
        for key in [k for k in node if k not in new]:
            del node[key]
        for key, value in new.items():
            node[key] = _merge(node[key], value) if key in node else _fresh(value)
        return node
    if isinstance(node, CommentedSeq) and isinstance(new, list):
        for i, value in enumerate(new):
            if i < len(node):
                node[i] = _merge(node[i], value)
            else:
                node.append(_fresh(value))
        del node[len(new):]
        return node
    if not isinstance(node, (CommentedMap, CommentedSeq)) and not isinstance(new, (dict, list)) and _same(node, new):
        return node
    return _fresh(new)


def _identity(item: Any, key: str) -> Any:
    if isinstance(item, dict):
        value = item.get(key)
        return value if value is not None else (item.get("kind") if key == "name" else None)
    return None


def _tail(node: Any) -> tuple[Any, Any] | None:
    """(mapping, key) of the last entry at the bottom of ``node``: where ruamel keeps the blank lines after it."""
    last = None
    while isinstance(node, (CommentedMap, CommentedSeq)) and len(node):
        key = list(node)[-1] if isinstance(node, CommentedMap) else len(node) - 1
        last = (node, key)
        node = node[key]
    return last


def _merge_items(seq: Any, new: list[Any], key: str) -> Any:
    """A list of mappings merged item by item, each new item into the old one of the same ``key`` (a rule's
    name, an example's completion), so a reordered or edited item keeps its comments; the blank lines after the
    old last item stay after the new last item."""
    if not isinstance(seq, CommentedSeq):
        return _fresh(new)
    tail = _tail(seq)
    trailing = None
    if tail is not None and isinstance(tail[0], (CommentedMap, CommentedSeq)):
        entry = tail[0].ca.items.get(tail[1])
        if entry and len(entry) > 2 and entry[2] is not None and not entry[2].value.strip():
            trailing = entry[2]
            entry[2] = None
    pool = list(seq)
    used: set[int] = set()
    out = []
    for i, item in enumerate(new):
        ident = _identity(item, key)
        j = next((j for j, old in enumerate(pool) if j not in used and ident is not None
                  and _identity(old, key) == ident), None)
        if j is None and i < len(pool) and i not in used and _identity(pool[i], key) not in {
                _identity(n, key) for n in new}:
            j = i  # an edited item whose name changed: the one that was here
        if j is None:
            out.append(_fresh(item))
        else:
            used.add(j)
            out.append(_merge(pool[j], item))
    del seq[:]
    seq.extend(out)
    for i in list(seq.ca.items):
        if i >= len(seq):
            del seq.ca.items[i]
    if trailing is not None:
        tail = _tail(seq)
        if tail is not None and isinstance(tail[0], (CommentedMap, CommentedSeq)):
            entry = tail[0].ca.items.setdefault(tail[1], [None, None, None, None])
            while len(entry) < 3:
                entry.append(None)
            if entry[2] is None:
                entry[2] = trailing
            else:
                entry[2].value = entry[2].value.rstrip("\n") + "\n" + trailing.value
    return seq


def replace_sections(text: str, *, rules: list[dict[str, Any]] | None = None,
                     examples: list[dict[str, Any]] | None = None) -> str:
    """``text`` with ``reward.rules`` (and ``examples``, when given) replaced; the rest kept as written.

    ``examples=[]`` removes the ``examples:`` section. Raises :class:`PatchError` when the text does not parse
    as YAML or is not a mapping (then the YAML is edited by hand: the page shows the parse errors).
    """
    yaml = _yaml(text)
    try:
        doc = yaml.load(text)
    except YAMLError as exc:
        raise PatchError(f"the YAML does not parse, so the forms cannot write into it: {str(exc).splitlines()[0]}"
                         ) from None
    if doc is None:
        doc = CommentedMap()
    if not isinstance(doc, CommentedMap):
        raise PatchError("the spec is not a mapping of sections (name:, model:, reward: ...)")
    if rules is not None:
        reward = doc.get("reward")
        if not isinstance(reward, CommentedMap):
            reward = CommentedMap()
            doc["reward"] = reward
        reward["rules"] = _merge_items(reward["rules"], rules, "name") if "rules" in reward else _fresh(rules)
    if examples is not None:
        if examples:
            doc["examples"] = (_merge_items(doc["examples"], examples, "completion") if "examples" in doc
                              else _fresh(examples))
        elif "examples" in doc:
            del doc["examples"]
    out = io.StringIO()
    yaml.dump(doc, out)
    result = out.getvalue()
    if text.startswith("---") and not result.startswith("---"):
        result = "---\n" + result
    return result
