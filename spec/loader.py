"""Load a spec file: YAML 1.2 scalars, source locations, duplicate keys, and every problem collected.

``load_spec(path)`` parses with PyYAML's composer (which keeps a start/end mark on every node) and builds the
Python data itself, so that:

* plain scalars resolve by YAML 1.2 core rules (``1e-5`` is a float, only ``true``/``false`` in three spellings
  are booleans, ``010`` is decimal, ``0o10``/``0x1f`` are octal/hex) and every plain scalar that is not a
  string is wrapped in :class:`sailrl.spec.base.Plain`, so string fields keep the exact text (``yes``, ``010``);
* a duplicated key is an error that names both lines (PyYAML silently keeps the last one);
* every node's location is remembered by key path, so schema errors (pydantic) and semantic checks
  (``sailrl.compiler.checks``) point at ``file:line:col``.

All problems are raised together as :class:`sailrl.spec.errors.SpecErrors`.
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
from sailrl.spec.errors import Related, SpecError, SpecErrors

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
_INT8 = re.compile(r"^0o[0-7]+$")
_INT16 = re.compile(r"^0x[0-9a-fA-F]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_INF = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")
_NAN = re.compile(r"^\.(?:nan|NaN|NAN)$")


def resolve_plain(text: str) -> Any:
    """The YAML 1.2 core value of a plain scalar: None, bool, int, float, or ``text`` itself (a string).

    Examples: ``1e-5`` -> 1e-05, ``010`` -> 10, ``0o10`` -> 8, ``yes`` -> 'yes', ``1_000`` -> '1_000'.
    """
    if _NULL.match(text):
        return None
    if _BOOL.match(text):
        return text.lower() == "true"
    if _INT10.match(text):
        return int(text, 10)
    if _INT8.match(text):
        return int(text, 0)
    if _INT16.match(text):
        return int(text, 0)
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


class _Composer(Reader, Scanner, Parser, Composer, _CoreResolver):
    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _CoreResolver.__init__(self)


@dataclass
class NodeInfo:
    """Where one value of the spec is: its node and, for a mapping entry, the key's node."""

    node: Node
    key_node: Node | None = None


@dataclass
class LoadedSpec:
    """A parsed spec file.

    spec: the validated :class:`~sailrl.spec.schema.Spec` (``None`` only while ``check_spec`` runs on a file
    the schema rejected). path: the file. text: its source. sha256: hex digest of the file bytes.
    data: plain Python data after YAML (YAML 1.2 core values; no ``Plain`` wrappers).
    tree: the same data with ``Plain`` wrappers (what the schema validates).
    """

    spec: Spec
    path: Path
    text: str
    sha256: str
    data: dict
    tree: Any = None
    nodes: dict[KeyPath, NodeInfo] = field(default_factory=dict, repr=False)

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

    def error(self, key_path: KeyPath | str, message: str, hint: str | None = None, *, at: str = "value",
              offset: int | None = None, related: list[Related] | None = None) -> SpecError:
        """A :class:`SpecError` located at ``key_path`` (or its nearest existing parent).

        at: "value" (the value's text) or "key" (the key's text). offset: characters into a one-line scalar's
        text (e.g. a position inside a regex), when it can be mapped onto the source line.
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
            file=str(self.path), line=line, column=column, key_path=dotted(path), message=message, hint=hint,
            end_column=end, related=related or [],
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

    def fail(self, node: Node, path: KeyPath, message: str, hint: str | None = None,
             related: list[Related] | None = None) -> None:
        line, col = _pos(node.start_mark)
        end = node.end_mark.column + 1 if node.end_mark.line == node.start_mark.line else None
        self.errors.append(SpecError(self.filename, line, col, dotted(path), message, hint, end, related or []))

    def build(self, node: Node, path: KeyPath) -> tuple[Any, Any]:
        if id(node) in self._active:
            self.fail(node, path, "this alias refers to itself (a recursive structure)",
                      "Remove the recursive alias; a spec is a tree.")
            return None, None
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        self._active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _SEQ:
                    self.fail(node, path, f"unsupported YAML tag {_short_tag(node.tag)}",
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
                self.fail(node, path, "unquoted template: YAML reads {{ ... }} as a mapping, not text",
                          f"Quote the template: '{template}'")
                return template, template
            if node.tag != _MAP:
                self.fail(node, path, f"unsupported YAML tag {_short_tag(node.tag)}",
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
                self.fail(key_node, path, "a key must be a simple name, not a list or mapping",
                          "Write keys as plain words followed by a colon, e.g. `name: value`.")
                continue
            tree_key, _ = self._scalar(key_node, path, record=False)
            key = tree_key.raw if isinstance(tree_key, Plain) else tree_key
            if key == "<<" and key_node.style is None:
                self.fail(key_node, path, "merge keys (<<) are not part of YAML 1.2 and are not supported",
                          "Repeat the keys you meant to merge, or use an anchor for a whole value (&name / *name).")
                continue
            child_path = (*path, key)
            if key in seen:
                first = seen[key]
                first_line = first.start_mark.line + 1
                self.fail(
                    key_node, child_path,
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
        if node.tag == _STR:
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
                self.fail(node, path, f"'{text}' is not a valid {tag[2:]}")
                return text, text
            if tag == "!!float":
                value = float(value)
            return Plain(value, text), value
        self.fail(node, path, f"unsupported YAML tag {tag}", "Remove the tag (a spec needs no YAML tags).")
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
    lines = text.splitlines()
    src = lines[line - 1] if 1 <= line <= len(lines) else ""
    message, hint, related, line, col = _yaml_message(exc, problem, src, line, col)
    if "{{" in src or "{%" in src:
        hint = "A value that starts with {{ or {% is a Jinja template and must be quoted: user: '{{ question }} ...'"
    return SpecError(filename, line, col, "", message, hint, None, related)


def _yaml_message(exc: yaml.MarkedYAMLError, problem: str, src: str, line: int, col: int
                  ) -> tuple[str, str | None, list[Related], int, int]:
    hint = None
    related: list[Related] = []
    if "'\\t'" in problem or (src[: max(col - 1, 0)].strip() == "" and "\t" in src[: max(col, 1)]):
        message = "tab character used for indentation: YAML forbids tabs for indentation"
        hint = "Indent with spaces only (e.g. two spaces per level); set your editor to insert spaces for Tab."
        tab = src.find("\t")
        if tab >= 0:
            col = tab + 1
    elif "unknown escape character" in problem:
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
        if "quoted scalar" in context:
            message = "unclosed quote: this quoted text has no closing quote"
            hint = "Add the closing quote. Inside single quotes, write '' for a literal single quote."
        elif "flow sequence" in context:
            message = "unclosed '[': this list has no closing ']'"
        elif "flow mapping" in context:
            message = "unclosed '{': this mapping has no closing '}'"
            hint = "A template such as {{ question }} must be quoted: user: '{{ question }}'"
        else:
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
    return message, hint, related, line, col


def parse_yaml(text: str, filename: str = "<string>") -> tuple[Any, Any, dict[KeyPath, NodeInfo], list[SpecError]]:
    """Parse ``text`` -> (tree with Plain, plain data, locations, errors). No schema validation."""
    loader = _Composer(text)
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        return None, None, {}, [_yaml_error(exc, filename, text)]
    except yaml.YAMLError as exc:  # reader errors (e.g. control characters) have no problem_mark
        return None, None, {}, [SpecError(filename, 0, 0, "", f"cannot read YAML: {exc}")]
    finally:
        loader.dispose()
    if root is None:
        return None, None, {}, []
    builder = _Builder(filename)
    builder.nodes[()] = NodeInfo(root)
    tree, data = builder.build(root, ())
    return tree, data, builder.nodes, builder.errors


def load_spec_text(text: str, filename: str = "<string>", *, path: Path | None = None,
                   sha256: str | None = None) -> LoadedSpec:
    """Parse, validate and check spec source ``text``; ``filename`` is used in error locations.

    Relative paths in the spec (dataset.source) resolve against ``path``'s folder (default: the current one).
    Raises SpecErrors with every problem found (YAML, schema, semantic checks, reward examples).
    """
    from sailrl.spec.messages import pydantic_errors
    from sailrl.spec.schema import Spec

    tree, data, nodes, errors = parse_yaml(text, filename)
    the_path = path if path is not None else Path(filename)
    digest = sha256 or hashlib.sha256(text.encode("utf-8")).hexdigest()
    if errors and tree is None:
        raise SpecErrors(errors, text)
    loaded = LoadedSpec(spec=None, path=the_path, text=text, sha256=digest,  # type: ignore[arg-type]
                        data=data if isinstance(data, dict) else {}, tree=tree, nodes=nodes)
    if tree is None:
        errors.append(SpecError(filename, 1 if text else 0, 1 if text else 0, "",
                                "the spec file is empty",
                                "Run `sailrl init` to write a commented starter spec."))
        raise SpecErrors(errors, text)
    if not isinstance(tree, dict):
        errors.append(loaded.error((), "a spec must be a mapping of sections (name:, model:, dataset:, ...)",
                                   "Run `sailrl init` to see a starter spec."))
        raise SpecErrors(errors, text)
    from pydantic import ValidationError

    schema_errors: list[SpecError] = []
    try:
        loaded.spec = Spec.model_validate(tree)
    except ValidationError as exc:
        schema_errors = pydantic_errors(exc, loaded, Spec)
    from sailrl.compiler.checks import check_spec

    check_errors = check_spec(loaded)
    errors.extend(_drop_covered(schema_errors, check_errors))
    errors.extend(check_errors)
    if errors:
        raise SpecErrors(_dedupe(errors), text)
    return loaded


def load_spec(path: str | Path) -> LoadedSpec:
    """Read, parse, validate and check the spec at ``path``.

    Raises SpecErrors with every problem found; a missing or unreadable file is one SpecError too.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise SpecErrors([SpecError(str(path), 0, 0, "", "file not found",
                                    "Check the path, or run `sailrl init` to write a starter spec.")]) from None
    except OSError as exc:
        raise SpecErrors([SpecError(str(path), 0, 0, "", f"cannot read the file: {exc.strerror}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecErrors([SpecError(str(path), line, 0, "", "the file is not UTF-8 text",
                                    "Save the spec as UTF-8.")]) from None
    text = text.removeprefix("\ufeff")
    return load_spec_text(text, str(path), path=p, sha256=hashlib.sha256(raw).hexdigest())


def _drop_covered(schema_errors: list[SpecError], check_errors: list[SpecError]) -> list[SpecError]:
    """Drop a schema validator's regex complaint where a check already located the same pattern precisely."""
    patterns = [e.key_path for e in check_errors if e.key_path.endswith("pattern")]

    duplicate_names = any("two rules are named" in e.message for e in check_errors)

    def covered(e: SpecError) -> bool:
        if duplicate_names and "two rules are named" in e.message and e.key_path == "reward":
            return True  # the check located it at the repeating rule
        if "regular expression" not in e.message and "control character" not in e.message:
            return False
        return any(p == e.key_path or p.startswith(e.key_path + ".") for p in patterns)

    return [e for e in schema_errors if not covered(e)]


def _dedupe(errors: list[SpecError]) -> list[SpecError]:
    seen: set[tuple] = set()
    out = []
    for e in errors:
        key = (e.line, e.column, e.key_path, e.message)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out
