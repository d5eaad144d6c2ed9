"""Load a spec file: YAML 1.2 scalars, source locations, duplicate keys, limits, and every problem collected.

``load_spec(path)`` parses with PyYAML's composer (which keeps a start/end mark on every node) and builds the
Python data itself, so that:

* plain scalars resolve by YAML 1.2 core rules (``1e-5`` is a float, only ``true``/``false`` in three spellings
  are booleans, ``010`` is decimal, ``0o10``/``0x1f`` are octal/hex) and every plain scalar that is not a
  string is wrapped in :class:`sailrl.spec.base.Plain`, so string fields keep the exact text (``yes``, ``010``);
* a duplicated key is an error that names both lines (PyYAML silently keeps the last one);
* every node's location is remembered by key path, so schema errors (pydantic) and the validation stage's
  semantic checks point at ``file:line:col``;
* inputs are bounded (:mod:`sailrl.spec.constants`): file size, nesting depth, values after alias expansion
  (counted as the composer resolves each alias, so an alias bomb stops at once), integer digits; a
  non-printable character is a located error and the rest of the file is still read;
* after a YAML syntax error, the part of the file before it is still parsed and checked, so one pass reports
  the syntax error and every other problem found before it (``LoadedSpec.complete`` is False then). An invalid
  escape in a double-quoted value (``pattern: "\\d+"``) stops nothing: it is reported, and the file is checked
  on as if that value were single-quoted (same length, so every location stays put).

This module does YAML and the schema only. The semantic checks and the worked reward examples are the
validation stage's (``sailrl.compiler.validate.validate_file``). Problems are raised together as
:class:`sailrl.spec.errors.SpecErrors`.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from sailrl.spec.base import Plain
from sailrl.spec.constants import MAX_INT_DIGITS, MAX_NESTING, MAX_SPEC_BYTES, MAX_VALUES
from sailrl.spec.errors import LINE_BREAK as _LINE_BREAK
from sailrl.spec.errors import Related, SailrlError, SpecError, SpecErrors, yaml_lines
from sailrl.spec.files import special_kind
from sailrl.spec.messages import pydantic_errors
from sailrl.spec.schema import Spec

if TYPE_CHECKING:
    from sailrl.spec.schema import Spec

KeyPath = tuple[str | int, ...]

_PLAIN_TAG = "sailrl:plain"  # an untagged plain scalar, resolved here by YAML 1.2 core rules
_STR = "tag:yaml.org,2002:str"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"

# YAML 1.2.2 core schema, section 10.3.2.
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT10 = re.compile(r"^[-+]?[0-9]+$")
_SURROGATE = re.compile("[\ud800-\udfff]")
_INT8 = re.compile(r"^0o[0-7]+$")
_INT16 = re.compile(r"^0x[0-9a-fA-F]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_INF = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")
_NAN = re.compile(r"^\.(?:nan|NaN|NAN)$")


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else f"{text[:n]}... ({len(text):,} characters)"


def _decimal_digits(text: str) -> int:
    """Digits of an integer literal (decimal, ``0o`` octal or ``0x`` hex) written in decimal; for octal and hex
    an estimate from the bit length, exact to one digit (``str()`` of a longer value would raise)."""
    body = text.lstrip("+-")
    if not body.startswith(("0o", "0x")):
        return len(body)
    return int(int(body, 0).bit_length() * 0.30102999566398120) + 1


def resolve_plain(text: str) -> Any:
    """The YAML 1.2 core value of a plain scalar: None, bool, int, float, or ``text`` itself (a string).

    Examples: ``1e-5`` -> 1e-05, ``010`` -> 10, ``0o10`` -> 8, ``yes`` -> 'yes', ``1_000`` -> '1_000'. A decimal
    integer of more than :data:`~sailrl.spec.constants.MAX_INT_DIGITS` digits stays text.
    """
    if _NULL.match(text):
        return None
    if _BOOL.match(text):
        return text.lower() == "true"
    if _INT10.match(text):
        if len(text.lstrip("+-")) > MAX_INT_DIGITS:
            return text  # more digits than int() converts; the loader reports it (S021)
        return int(text, 10)
    if _INT8.match(text) or _INT16.match(text):
        value = int(text, 0)  # base 8 / 16: no digit limit in int(), so the value is bounded here
        return text if _decimal_digits(text) > MAX_INT_DIGITS else value
    if _FLOAT.match(text):
        return float(text)
    if _INF.match(text):
        return -math.inf if text.startswith("-") else math.inf
    if _NAN.match(text):
        return math.nan
    return text


class _CoreResolver(BaseResolver):
    """Tags plain scalars with a private tag (resolved later by :func:`resolve_plain`), quoted ones as str."""

    def resolve(self, kind: type, value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode:
            return _PLAIN_TAG if implicit[0] else _STR
        return _SEQ if kind is SequenceNode else _MAP


class _Limit(SailrlError, yaml.YAMLError):
    """A loader limit was reached while composing (``code``, plain-words ``message``, ``hint``, ``mark``)."""

    def __init__(self, code: str, message: str, hint: str, mark: yaml.Mark) -> None:
        super().__init__(message)
        self.code, self.message, self.hint, self.mark = code, message, hint, mark


class _Composer(Reader, Scanner, Parser, Composer, _CoreResolver):
    """PyYAML's composer with two limits: nesting depth, and values counted with every alias expanded.

    Each finished node's expanded size (1 + its children's, an alias child counting its anchor's whole size) is
    recorded, so the count of a document grows by an anchor's full size at every alias, as the composer
    resolves it, and composing stops as soon as it passes :data:`~sailrl.spec.constants.MAX_VALUES`.
    """

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _CoreResolver.__init__(self)
        self._depth = 0
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_NESTING:
            raise _Limit("S020", f"mappings and lists are nested more than {MAX_NESTING} levels deep here",
                         "A spec needs about 7 levels; flatten this value.", mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, SequenceNode):
            children = node.value
        else:
            children = []
        size = 1 + sum(self._sizes.get(id(c), 1) for c in children)
        self._sizes[id(node)] = size
        if size > MAX_VALUES:
            raise _Limit(
                "S019",
                f"this value expands to more than {MAX_VALUES:,} values (anchors and aliases repeated in full); "
                f"a spec may hold at most {MAX_VALUES:,}",
                "A spec is a small file; an alias (*name) repeats its anchor's whole value, and nested aliases "
                "multiply. Write the values out, or remove the aliases.",
                mark,
            )
        return node


@dataclass
class NodeInfo:
    """Where one value of the spec is: its node and, for a mapping entry, the key's node."""

    node: Node
    key_node: Node | None = None


@dataclass
class LoadedSpec:
    """A parsed spec file.

    spec: the validated :class:`~sailrl.spec.schema.Spec` (``None`` while the validation stage checks a file
    the schema rejected). path: the file. text: its source. sha256: hex digest of the file bytes.
    data: plain Python data after YAML (YAML 1.2 core values; no ``Plain`` wrappers).
    tree: the same data with ``Plain`` wrappers (what the schema validates).
    complete: False when a YAML syntax error stopped parsing; ``data`` then holds what came before
    ``complete_lines`` lines (the top-level sections in ``complete_sections`` are whole).
    warnings: problems of severity "warning" the validation stage found (the spec is usable).
    """

    spec: Spec
    path: Path
    text: str
    sha256: str
    data: dict
    tree: Any = None
    nodes: dict[KeyPath, NodeInfo] = field(default_factory=dict, repr=False)
    complete: bool = True
    complete_lines: int | None = None
    complete_sections: frozenset[str] = frozenset()
    warnings: list[SpecError] = field(default_factory=list)
    filename: str | None = None  # what errors call the file, when not its path (e.g. "<spec with --set overrides>")

    @property
    def base_dir(self) -> Path:
        """The folder relative paths in the spec are resolved against."""
        return self.path.parent

    def locate(self, key_path: KeyPath | str) -> tuple[int, int] | None:
        """1-based (line, column) of the value at ``key_path`` (or of its key, for a block mapping/list).

        ``key_path`` is a tuple of keys and list indices, or a dotted string ("reward.rules.0.pattern").
        Returns None when the file does not contain that path (e.g. a default value).
        """
        info = self.nodes.get(_as_path(key_path))
        if info is None:
            return None
        node = info.node
        if info.key_node is not None and isinstance(node, (MappingNode, SequenceNode)) and not node.flow_style:
            node = info.key_node
        return node.start_mark.line + 1, node.start_mark.column + 1

    def nearest(self, key_path: KeyPath | str) -> KeyPath:
        """The longest prefix of ``key_path`` that the file contains (``()`` = the document)."""
        path = _as_path(key_path)
        while path and path not in self.nodes:
            path = path[:-1]
        return path

    def error(self, key_path: KeyPath | str, message: str, hint: str | None = None, *, code: str,
              at: str = "value", offset: int | None = None, related: list[Related] | None = None,
              severity: str = "error") -> SpecError:
        """A :class:`SpecError` located at ``key_path`` (or its nearest existing parent).

        code: the problem's code (:mod:`sailrl.spec.codes`). at: "value" (the value's text) or "key" (the key's
        text). offset: characters into a one-line scalar's text (e.g. a position inside a regex), when it can be
        mapped onto the source line. severity: "error" or "warning".
        """
        path = _as_path(key_path)
        found = self.nearest(path)
        info = self.nodes.get(found)
        line = column = 0
        end: int | None = None
        if info is not None:
            node = info.node
            use_key = info.key_node is not None and (
                at == "key" or found != path
                or (isinstance(node, (MappingNode, SequenceNode)) and not node.flow_style)
            )
            if use_key:
                node = info.key_node
            start, stop = node.start_mark, node.end_mark
            line, column = start.line + 1, start.column + 1
            if stop.line == start.line and stop.column > start.column:
                end = stop.column + 1
            if offset is not None and not use_key and isinstance(node, ScalarNode):
                col = _source_column(node, offset)
                if col is not None:
                    column, end = col, col + 1
        elif self.text:
            line, column = 1, 1
        return SpecError(
            file=self.filename or str(self.path), line=line, column=column, key_path=dotted(path), message=message,
            hint=hint,
            end_column=end, related=related or [], code=code, severity=severity,
        )


def dotted(path: KeyPath) -> str:
    """("reward", "rules", 0, "pattern") -> "reward.rules.0.pattern"."""
    return ".".join(str(p) for p in path)


def _as_path(key_path: KeyPath | str) -> KeyPath:
    if isinstance(key_path, str):
        return tuple(int(p) if p.isdigit() else p for p in key_path.split(".")) if key_path else ()
    return tuple(key_path)


def _source_column(node: ScalarNode, offset: int) -> int | None:
    """1-based source column of character ``offset`` of a one-line plain or single-quoted scalar, else None."""
    start, stop = node.start_mark, node.end_mark
    if start.line != stop.line or node.style not in (None, "'"):
        return None
    if node.style == "'":
        raw = start.buffer[start.pointer + 1:stop.pointer - 1] if start.buffer else None
        if raw is None:
            return None
        # '' in the source is one quote in the value: walk the source to find the offset.
        i = j = 0
        while i < len(raw) and j < offset:
            i += 2 if raw.startswith("''", i) else 1
            j += 1
        return start.column + 2 + i
    return start.column + 1 + offset


def _pos(mark: yaml.Mark) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


class _Builder:
    """Turns a composed node tree into (tree with Plain, plain data), recording locations and errors."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.nodes: dict[KeyPath, NodeInfo] = {}
        self.errors: list[SpecError] = []
        self._active: set[int] = set()

    def fail(self, node: Node, path: KeyPath, code: str, message: str, hint: str | None = None,
             related: list[Related] | None = None) -> None:
        line, col = _pos(node.start_mark)
        end = node.end_mark.column + 1 if node.end_mark.line == node.start_mark.line else None
        self.errors.append(SpecError(self.filename, line, col, dotted(path), message, hint, end, related or [],
                                     code=code))

    def build(self, node: Node, path: KeyPath) -> tuple[Any, Any]:
        if id(node) in self._active:
            self.fail(node, path, "S018", "this alias refers to itself (a recursive structure)",
                      "Remove the recursive alias; a spec is a tree.")
            return None, None
        if len(path) > MAX_NESTING:  # aliases inside anchors can nest deeper than the text itself
            self.fail(node, path, "S020", f"mappings and lists are nested more than {MAX_NESTING} levels deep "
                      "here (aliases expanded)", "A spec needs about 7 levels; flatten this value.")
            return None, None
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        self._active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _SEQ:
                    self.fail(node, path, "S016", f"unsupported YAML tag {_short_tag(node.tag)}",
                              "Remove the tag; a spec uses plain lists.")
                tree_items, data_items = [], []
                for i, child in enumerate(node.value):
                    self.nodes[(*path, i)] = NodeInfo(child)
                    t, d = self.build(child, (*path, i))
                    tree_items.append(t)
                    data_items.append(d)
                return tree_items, data_items
            assert isinstance(node, MappingNode)
            template = _unquoted_template(node)
            if template is not None:
                self.fail(node, path, "S022", "unquoted template: YAML reads {{ ... }} as a mapping, not text",
                          f"Quote the template: '{template}'")
                return template, template
            if node.tag != _MAP:
                self.fail(node, path, "S016", f"unsupported YAML tag {_short_tag(node.tag)}",
                          "Remove the tag; a spec uses plain mappings.")
            return self._mapping(node, path)
        finally:
            self._active.discard(id(node))

    def _mapping(self, node: MappingNode, path: KeyPath) -> tuple[dict, dict]:
        tree: dict[Any, Any] = {}
        data: dict[Any, Any] = {}
        seen: dict[Any, Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self.fail(key_node, path, "S023", "a key must be a simple name, not a list or mapping",
                          "Write keys as plain words followed by a colon, e.g. `name: value`.")
                continue
            tree_key, _ = self._scalar(key_node, path, record=False)
            key = tree_key.raw if isinstance(tree_key, Plain) else tree_key
            if key == "<<" and key_node.style is None:
                self.fail(key_node, path, "S017", "merge keys (<<) are not part of YAML 1.2 and are not supported",
                          "Repeat the keys you meant to merge, or use an anchor for a whole value (&name / *name).")
                continue
            child_path = (*path, key)
            if key in seen:
                first = seen[key]
                first_line = first.start_mark.line + 1
                self.fail(
                    key_node, child_path, "S015",
                    f"duplicate key '{key}' (first written on line {first_line})",
                    "YAML would silently keep only the last one; delete one of them or merge their contents.",
                    related=[Related(first_line, first.start_mark.column + 1, f"'{key}' first written here")],
                )
                continue
            seen[key] = key_node
            self.nodes[child_path] = NodeInfo(value_node, key_node)
            tree[tree_key], data[key] = self.build(value_node, child_path)
        return tree, data

    def _scalar(self, node: ScalarNode, path: KeyPath, record: bool = True) -> tuple[Any, Any]:
        text = node.value
        half = _SURROGATE.search(text)
        if half is not None:  # a "\ud800" escape: half of a UTF-16 pair, which no file or UTF-8 text can hold
            self.fail(node, path, "S025", f"the escape \\u{ord(half.group()):04x} is half of a UTF-16 surrogate "
                      f"pair, not a character", "Write the character itself, or one escape for the whole character "
                      "(\\U0001F600, not \\ud83d\\ude00).")
            text = _SURROGATE.sub("\ufffd", text)
        if node.tag == _STR:
            return text, text
        if (_INT10.match(text) or _INT8.match(text) or _INT16.match(text)) and _decimal_digits(text) > MAX_INT_DIGITS:
            digits = _decimal_digits(text)
            size = f"{digits:,} digits" if _INT10.match(text) else f"about {digits:,} digits in decimal"
            self.fail(node, path, "S021", f"this integer has {size}; a number in a spec has at most "
                      f"{MAX_INT_DIGITS:,}", "Write a smaller number (or quote it if it is text).")
            return text, text
        if node.tag == _PLAIN_TAG:
            value = resolve_plain(text)
            if isinstance(value, str):
                return value, value
            return Plain(value, text), value
        tag = _short_tag(node.tag)
        explicit = {"!!int": _INT10, "!!float": _FLOAT, "!!bool": _BOOL, "!!null": _NULL}
        if tag in explicit:
            value = resolve_plain(text)
            ok = {"!!int": isinstance(value, int) and not isinstance(value, bool),
                  "!!float": isinstance(value, (int, float)) and not isinstance(value, bool),
                  "!!bool": isinstance(value, bool), "!!null": value is None}[tag]
            if not ok:
                self.fail(node, path, "S024", f"'{_clip(text)}' is not a valid {tag[2:]}")
                return text, text
            if tag == "!!float":
                try:
                    value = float(value)
                except OverflowError:
                    self.fail(node, path, "S110", f"'{_clip(text)}' is too large for a floating-point number",
                              "Write a number below about 1.8e308.")
                    return text, text
            return Plain(value, text), value
        self.fail(node, path, "S016", f"unsupported YAML tag {tag}", "Remove the tag (a spec needs no YAML tags).")
        return text, text


def _unquoted_template(node: MappingNode) -> str | None:
    """The source text when ``node`` is an unquoted Jinja expression (``{{ question }}``) YAML took as a mapping."""
    if not node.flow_style or len(node.value) != 1:
        return None
    key, value = node.value[0]
    if not (isinstance(key, MappingNode) and key.flow_style and isinstance(value, ScalarNode) and value.value == ""):
        return None
    start, stop = node.start_mark, node.end_mark
    if start.buffer is None:
        return None
    return start.buffer[start.pointer:stop.pointer]


def _short_tag(tag: str) -> str:
    return "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag


def _yaml_error(exc: yaml.MarkedYAMLError, filename: str, text: str) -> SpecError:
    """Plain words for a YAML syntax error, with the classic traps explained."""
    mark = exc.problem_mark or exc.context_mark
    line, col = _pos(mark) if mark else (0, 0)
    problem = (exc.problem or exc.context or "invalid YAML").strip()
    lines = yaml_lines(text)
    src = lines[line - 1] if 1 <= line <= len(lines) else ""
    message, hint, related, line, col, code = _yaml_message(exc, problem, src, line, col)
    if "{{" in src or "{%" in src:
        hint = "A value that starts with {{ or {% is a Jinja template and must be quoted: user: '{{ question }} ...'"
    return SpecError(filename, line, col, "", message, hint, None, related, code=code)


def _yaml_message(exc: yaml.MarkedYAMLError, problem: str, src: str, line: int, col: int
                  ) -> tuple[str, str | None, list[Related], int, int, str]:
    hint = None
    related: list[Related] = []
    code = "S010"
    if "'\\t'" in problem or (src[: max(col - 1, 0)].strip() == "" and "\t" in src[: max(col, 1)]):
        code = "S011"
        message = "tab character used for indentation: YAML forbids tabs for indentation"
        hint = "Indent with spaces only (e.g. two spaces per level); set your editor to insert spaces for Tab."
        tab = src.find("\t")
        if tab >= 0:
            col = tab + 1
    elif "unknown escape character" in problem:
        code = "S012"
        ch = problem.rsplit("'", 2)[-2] if problem.count("'") >= 2 else "?"
        message = f"'\\{ch}' is not a valid escape inside double quotes"
        hint = (
            "Inside double quotes YAML treats a backslash as an escape. For regular expressions and LaTeX use "
            "single quotes, where a backslash stays as typed: pattern: '\\d+'"
        )
        col = max(col - 1, 1)  # point at the backslash
    elif exc.context_mark is not None and (
        "end of stream" in problem or "<stream end>" in problem
        or ("flow" in (exc.context or "") and exc.problem_mark is not None
            and exc.problem_mark.line != exc.context_mark.line)
    ):
        # The file ended inside something unclosed: point at where it was opened.
        line, col = _pos(exc.context_mark)
        context = exc.context or ""
        code = "S013"
        if "quoted scalar" in context:
            message = "unclosed quote: this quoted text has no closing quote"
            hint = "Add the closing quote. Inside single quotes, write '' for a literal single quote."
        elif "flow sequence" in context:
            message = "unclosed '[': this list has no closing ']'"
        elif "flow mapping" in context:
            message = "unclosed '{': this mapping has no closing '}'"
            hint = "A template such as {{ question }} must be quoted: user: '{{ question }}'"
        else:
            code = "S010"
            message = f"YAML syntax error: the file ends {context}".strip()
    else:
        problem = problem.replace("found '?'", "found a key").replace("<block end>", "the end of the block")
        message = f"YAML syntax error: {problem}"
        if exc.context and exc.context_mark and exc.problem:
            c_line, c_col = _pos(exc.context_mark)
            if c_line != line:
                related.append(Related(c_line, c_col, exc.context))
            else:
                message = f"YAML syntax error {exc.context}: {problem}"
        if "mapping values are not allowed here" in problem:
            hint = ("A value containing ': ' must be quoted, or a key is indented wrongly. Quote the text "
                    "(single quotes keep backslashes) or check the indentation.")
        elif "could not find expected ':'" in problem:
            hint = "Each line of a mapping is `key: value`; check for a missing colon or wrong indentation."
        elif "the end of the block" in problem:
            hint = "Check the indentation: items of one mapping or list must start in the same column."
    return message, hint, related, line, col, code


_CONTROL_NAMES = {"\x00": "NUL", "\x07": "bell", "\x08": "backspace", "\x0b": "vertical tab", "\x0c": "form feed",
                  "\x1b": "escape", "\x7f": "delete"}


def _non_printable(text: str, filename: str) -> tuple[str, list[SpecError]]:
    """(``text`` with every character YAML refuses replaced by a space, one located error per such character)."""
    found = list(Reader.NON_PRINTABLE.finditer(text))
    if not found:
        return text, []
    starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)]
    import bisect

    errors = []
    for m in found:
        i = bisect.bisect_right(starts, m.start()) - 1
        ch = m.group()
        name = _CONTROL_NAMES.get(ch, "a control character" if ord(ch) < 0x20 or 0x7f <= ord(ch) < 0xa0
                                  else "a non-printable character")
        errors.append(SpecError(
            filename, i + 1, m.start() - starts[i] + 1, "",
            f"non-printable character U+{ord(ch):04X} ({name}): YAML does not allow it anywhere in the file, "
            "not even in a comment",
            "Delete it (editors may show it as ^L, a box or nothing at all). To put such a character in a value, "
            "write it as an escape inside double quotes, e.g. \"\\f\".",
            m.start() - starts[i] + 2, code="S014",
        ))
    return Reader.NON_PRINTABLE.sub(" ", text), errors


@dataclass
class _Parsed:
    tree: Any = None
    data: Any = None
    nodes: dict[KeyPath, NodeInfo] = field(default_factory=dict)
    errors: list[SpecError] = field(default_factory=list)
    complete: bool = True
    complete_lines: int | None = None
    complete_sections: frozenset[str] = frozenset()


def _compose(text: str) -> tuple[Node | None, Exception | None, yaml.Mark | None]:
    """(root node, the exception that stopped composing or None, where it stopped)."""
    loader = _Composer(text)
    try:
        return loader.get_single_node(), None, None
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        # ValueError/OverflowError: PyYAML's scanner on an escape such as "\U99999999" (chr() out of range).
        try:
            mark = loader.get_mark()
        except Exception:  # noqa: BLE001 -- the reader's state after a failure is only best-effort
            mark = None
        return None, exc, mark
    finally:
        loader.dispose()


def _stop_error(exc: Exception, mark: yaml.Mark | None, filename: str, text: str) -> SpecError:
    """The located problem for an exception that stopped composing."""
    if isinstance(exc, _Limit):
        line, col = _pos(exc.mark)
        return SpecError(filename, line, col, "", exc.message, exc.hint, code=exc.code)
    if isinstance(exc, yaml.MarkedYAMLError):
        return _yaml_error(exc, filename, text)
    line, col = _pos(mark) if mark is not None else (0, 0)
    detail = str(exc) if not isinstance(exc, yaml.YAMLError) else str(exc).splitlines()[0]
    if isinstance(exc, ValueError | OverflowError):
        return SpecError(filename, line, col, "", f"YAML syntax error: a double-quoted escape here is not a valid "
                         f"character ({detail})", "Check the \\x, \\u and \\U escapes inside double quotes.",
                         code="S012")
    return SpecError(filename, line, col, "", f"YAML syntax error: cannot read the YAML here ({detail})", code="S010")


def _top_level(line: str) -> bool:
    return bool(line) and not line[0].isspace() and not line.startswith(("#", "-", "...", "---"))


def _recover_prefix(text: str, stop_line: int, filename: str) -> _Parsed | None:
    """Parse the lines before ``stop_line`` (1-based), or before the top-level key that contains it."""
    lines = yaml_lines(text)
    cuts = [stop_line - 1]
    section = next((i for i in range(min(stop_line - 1, len(lines)) - 1, -1, -1) if _top_level(lines[i])), None)
    if section is not None and section < stop_line - 1:
        cuts.append(section)
    for cut in cuts:
        if cut <= 0:
            continue
        prefix = "\n".join(lines[:cut]) + "\n"
        root, exc, _ = _compose(prefix)
        if exc is not None or root is None:
            continue
        builder = _Builder(filename)
        builder.nodes[()] = NodeInfo(root)
        tree, data = builder.build(root, ())
        whole = cut < len(lines) and _top_level(lines[cut])  # the cut falls between two sections
        sections = [k.value for k, _ in root.value if isinstance(k, ScalarNode)] if isinstance(
            root, MappingNode) else []
        complete = frozenset(sections if whole else sections[:-1])
        return _Parsed(tree, data, builder.nodes, builder.errors, complete=False, complete_lines=cut,
                       complete_sections=complete)
    return None


# Files up to this size are parsed a second time, up to a syntax error, to check what comes before it (a spec
# is a few kilobytes; a second pass of a large file would double its time: ``benchmarks/limits.md``).
_RECOVER_CHARS = 64 * 1024


#: Invalid escapes one pass repairs (each costs a parse) before the rest of the file is left unchecked.
_MAX_ESCAPE_REPAIRS = 20


def _single_quoted(text: str, exc: Exception) -> str | None:
    """``text`` with the double-quoted scalar that holds an invalid escape (``pattern: "\\d+ please"``) written in
    single quotes instead, where a backslash stays as typed (what such a value almost always means). Same
    length, so every location stays put. None when it cannot be done that way (a ``'`` inside, no scalar start)."""
    mark = getattr(exc, "context_mark", None)
    if mark is None or not 0 <= mark.index < len(text) or text[mark.index] != '"':
        return None
    i = mark.index + 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            return None
        if c == '"':
            return text[:mark.index] + "'" + text[mark.index + 1:i] + "'" + text[i + 1:]
        i += 1
    return None


def _parse(text: str, filename: str) -> _Parsed:
    text, errors = _non_printable(text, filename)
    return _parse_printable(text, filename, errors)


def _parse_printable(text: str, filename: str, errors: list[SpecError], repairs: int = 0) -> _Parsed:
    root, exc, mark = _compose(text)
    if exc is not None:
        stop = _stop_error(exc, mark, filename, text)
        errors.append(stop)
        repaired = (_single_quoted(text, exc) if stop.code == "S012" and repairs < _MAX_ESCAPE_REPAIRS
                    and len(text) <= _RECOVER_CHARS else None)
        if repaired is not None:
            # One bad escape need not hide the rest of the file: check it as if the value were single-quoted
            # (the error above still says what to fix).
            return _parse_printable(repaired, filename, errors, repairs + 1)
        stop_line = stop.line
        if isinstance(exc, yaml.MarkedYAMLError) and exc.context_mark is not None:
            stop_line = min(stop_line or 10**9, exc.context_mark.line + 1)
        recover = stop_line and stop_line > 1 and len(text) <= _RECOVER_CHARS
        partial = _recover_prefix(text, stop_line, filename) if recover else None
        if partial is None:
            return _Parsed(errors=errors, complete=False, complete_lines=0)
        partial.errors = errors + partial.errors
        return partial
    if root is None:
        return _Parsed(errors=errors)
    builder = _Builder(filename)
    builder.nodes[()] = NodeInfo(root)
    tree, data = builder.build(root, ())
    return _Parsed(tree, data, builder.nodes, errors + builder.errors)


def parse_yaml(text: str, filename: str = "<string>") -> tuple[Any, Any, dict[KeyPath, NodeInfo], list[SpecError]]:
    """Parse ``text`` -> (tree with Plain, plain data, locations, errors). No schema validation.

    After a YAML syntax error the tree holds what came before it (see the module docstring); the errors
    include the syntax error.
    """
    parsed = _parse(text, filename)
    return parsed.tree, parsed.data, parsed.nodes, parsed.errors


def _too_large(size: int, filename: str) -> SpecError:
    return SpecError(filename, 0, 0, "", f"the spec is {_size(size)}; a spec file may be at most "
                     f"{_size(MAX_SPEC_BYTES)}", "A spec is a few kilobytes of settings: keep data in the dataset "
                     "file and long texts short.", code="S004")


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB" if n >= 1024 * 1024 else f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n} bytes"


# Problems that may only mean "this part comes after the syntax error" when parsing stopped early.
_MISSING = ("S102", "S106")


def parse_spec_text(text: str, filename: str = "<string>", *, path: Path | None = None,
                    sha256: str | None = None) -> tuple[LoadedSpec, list[SpecError]]:
    """YAML and schema of spec source ``text``: (the :class:`LoadedSpec`, every problem found). Never raises.

    ``loaded.spec`` is the validated Spec, or None when the schema rejected the file or parsing stopped at a
    syntax error. ``filename`` is used in error locations; relative paths in the spec resolve against ``path``'s
    folder (default: the current one).
    """
    from pydantic import ValidationError


    the_path = path if path is not None else Path(filename)
    if len(text) > MAX_SPEC_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        empty = LoadedSpec(spec=None, path=the_path, text="", sha256=sha256 or "", data={},  # type: ignore[arg-type]
                           complete=False, complete_lines=0)
        return empty, [_too_large(len(text.encode("utf-8", "surrogatepass")), filename)]
    digest = sha256 or hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    parsed = _parse(text, filename)
    errors = list(parsed.errors)
    loaded = LoadedSpec(spec=None, path=the_path, text=text, sha256=digest,  # type: ignore[arg-type]
                        data=parsed.data if isinstance(parsed.data, dict) else {}, tree=parsed.tree,
                        nodes=parsed.nodes, complete=parsed.complete, complete_lines=parsed.complete_lines,
                        complete_sections=parsed.complete_sections,
                        filename=filename if path is not None and filename != str(path) else None)
    if parsed.tree is None:
        if parsed.complete:
            errors.append(SpecError(filename, 1 if text else 0, 1 if text else 0, "", "the spec file is empty",
                                    "Run `sailrl init` to write a commented starter spec.", code="S005"))
        return loaded, errors
    if not isinstance(parsed.tree, dict):
        errors.append(loaded.error((), "a spec must be a mapping of sections (name:, model:, dataset:, ...)",
                                   "Run `sailrl init` to see a starter spec.", code="S006"))
        return loaded, errors
    try:
        spec = Spec.model_validate(parsed.tree)
    except ValidationError as exc:
        schema_errors = pydantic_errors(exc, loaded, Spec)
    else:
        schema_errors = []
        if parsed.complete:
            loaded.spec = spec
    if not parsed.complete:
        schema_errors = [e for e in schema_errors if not _after_cut(e, loaded)]
    return loaded, dedupe(errors + schema_errors)


def _after_cut(err: SpecError, loaded: LoadedSpec) -> bool:
    """Whether ``err`` may only say that the part after a syntax error is missing or cut short (not reported).

    In a section the cut left incomplete, only problems of the values inside it are kept.
    """
    top = err.key_path.split(".")[0]
    if top in loaded.complete_sections:
        return False
    return err.code in _MISSING or "." not in err.key_path


def load_spec_text(text: str, filename: str = "<string>", *, path: Path | None = None,
                   sha256: str | None = None) -> LoadedSpec:
    """YAML and schema of spec source ``text`` (see :func:`parse_spec_text`); raises SpecErrors on any error.

    Semantic checks and reward examples are not run: ``sailrl.compiler.validate.validate_text`` does everything.
    """
    loaded, errors = parse_spec_text(text, filename, path=path, sha256=sha256)
    if errors:
        raise SpecErrors(errors, loaded.text)
    return loaded


def read_spec_file(path: str | Path) -> tuple[str, str]:
    """(text, sha256 of the bytes) of the spec file at ``path``; a leading byte-order mark is dropped.

    Raises SpecErrors (one located problem) for a missing, unreadable, oversized or non-UTF-8 file.
    """
    p = Path(path)
    name = str(path)
    kind = special_kind(p)
    if kind is not None:  # refused before opening: a FIFO blocks open() until a writer comes, a device never ends
        raise SpecErrors([SpecError(name, 0, 0, "", f"this is {kind}, not a spec file",
                                    "Give the path of a .yaml file.", code="S002")])
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise SpecErrors([SpecError(name, 0, 0, "", "file not found",
                                    "Check the path, or run `sailrl init` to write a starter spec.",
                                    code="S001")]) from None
    except IsADirectoryError:
        raise SpecErrors([SpecError(name, 0, 0, "", "this is a folder, not a spec file",
                                    "Give the path of a .yaml file.", code="S002")]) from None
    except OSError as exc:
        what = f"cannot read the file: {exc.strerror or exc}"
        raise SpecErrors([SpecError(name, 0, 0, "", what, code="S002")]) from None
    if len(raw) > MAX_SPEC_BYTES:
        try:
            size = p.stat().st_size
        except OSError:
            size = len(raw)
        raise SpecErrors([_too_large(size, name)]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecErrors([SpecError(name, line, 0, "", "the file is not UTF-8 text",
                                    "Save the spec as UTF-8.", code="S003")]) from None
    return text.removeprefix("\ufeff"), hashlib.sha256(raw).hexdigest()


def load_spec(path: str | Path) -> LoadedSpec:
    """Read, parse and schema-validate the spec at ``path``; raises SpecErrors with every problem found.

    A missing or unreadable file is one SpecError too. Semantic checks and reward examples are the validation
    stage's: ``sailrl.compiler.validate.validate_file(path)``.
    """
    text, digest = read_spec_file(path)
    return load_spec_text(text, str(path), path=Path(path), sha256=digest)


def dedupe(errors: list[SpecError]) -> list[SpecError]:
    """``errors`` without repeats: one problem per (line, column, key path, code), the first one kept."""
    seen: set[tuple] = set()
    out = []
    for e in errors:
        key = (e.line, e.column, e.key_path, e.code)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out
