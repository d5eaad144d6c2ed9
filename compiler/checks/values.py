"""Value-level checks, over every key of the file: control characters from double-quoted escapes (S202), names and
paths too long for a file system (S225), numbers outside their key's usual range (W101)."""

from __future__ import annotations

from typing import Any

from yaml.nodes import ScalarNode

from sailrl.compiler.checks.reader import SpecReader
from sailrl.spec.constants import MAX_NAME_BYTES, MAX_PATH_BYTES
from sailrl.spec.loader import KeyPath, resolve_plain
from sailrl.spec.messages import model_at
from sailrl.spec.schema import Spec

# Characters a double-quoted YAML escape produces that nobody means to type in a pattern or template.
_CONTROL_ESCAPES = {"\x08": "\\b", "\x07": "\\a", "\x0c": "\\f", "\x0b": "\\v", "\x1b": "\\e", "\x00": "\\0"}
# Keys whose values name files or directories (checked against file-system name limits).
_PATH_KEYS: tuple[KeyPath, ...] = (("model", "name"), ("dataset", "source"), ("output", "run_dir"),
                                   ("training", "init_from"), ("training", "resume_from"))


def check_control_characters(spec: SpecReader) -> None:
    """A double-quoted "\\b" is a backspace character, not a regex word boundary (nor the \\boxed{} b)."""
    for path, info in spec.loaded.nodes.items():
        node = info.node
        if not isinstance(node, ScalarNode) or node.style != '"':
            continue
        found = [(i, ch) for i, ch in enumerate(node.value) if ch in _CONTROL_ESCAPES]
        if not found:
            continue
        _, ch = found[0]
        esc = _CONTROL_ESCAPES[ch]
        spec.add(
            path, "S202",
            f"inside double quotes YAML turned '{esc}' into a control character (U+{ord(ch):04X}), "
            f"not a backslash followed by '{esc[1]}'",
            "Use single quotes, where a backslash stays as typed: e.g. pattern: '\\b\\d+\\b' or "
            "user: '... \\boxed{}'.",
        )


def check_paths(spec: SpecReader) -> None:
    """Names and paths must fit the file system (else every stat() fails with 'File name too long')."""
    for path in _PATH_KEYS:
        value = spec.text(path)
        if value is None:
            continue
        total = len(value.encode("utf-8", "surrogatepass"))
        longest = max((len(part.encode("utf-8", "surrogatepass")) for part in value.split("/")), default=0)
        if longest > MAX_NAME_BYTES:
            spec.add(path, "S225", f"a name in this path is {longest:,} bytes long; file systems allow "
                     f"{MAX_NAME_BYTES} bytes a name", "Use a shorter name (each part between '/' at most "
                     f"{MAX_NAME_BYTES} bytes).")
        elif total > MAX_PATH_BYTES:
            spec.add(path, "S225", f"this path is {total:,} bytes long; file systems allow {MAX_PATH_BYTES:,}",
                     "Use a shorter path.")


def usual_range_of(field_info: Any) -> tuple[float, float, float | None] | None:
    """``(low, high, off)`` from a schema field's ``x-usual-range`` (``off``: a value that means "disabled")."""
    extra = getattr(field_info, "json_schema_extra", None)
    if not isinstance(extra, dict) or "x-usual-range" not in extra:
        return None
    low, high = extra["x-usual-range"]
    return float(low), float(high), extra.get("x-usual-off")


def check_usual_ranges(spec: SpecReader) -> None:
    """A warning for each number outside its key's documented usual range (the spec stays valid)."""
    for path, info in spec.loaded.nodes.items():
        node = info.node
        if not isinstance(node, ScalarNode) or node.style is not None or not path or not isinstance(
                path[-1], str):
            continue
        value = resolve_plain(node.value)
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            continue
        _, field_info = model_at(Spec, spec.data, path)
        usual = usual_range_of(field_info)
        if usual is None:
            continue
        low, high, off = usual
        if off is not None and value == off:
            continue
        if not low <= value <= high:
            key = path[-1]
            spec.warn(path, "W101",
                      f"{key} {node.value} is outside its usual range, {low:g} to {high:g}",
                      "Check for a typo (e.g. 1e5 for 1e-5, a missing minus in the exponent). If the value is "
                      "meant, keep it: this is a warning, and `sailrl validate` still passes. Usual ranges "
                      "are listed in docs/spec-reference.md.")
