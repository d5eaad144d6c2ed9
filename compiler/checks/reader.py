"""`SpecReader`: what every section's checks read from a loaded spec, and where they put the problems they find.

The checks read the loaded YAML (``LoadedSpec.data`` and its node locations), not the validated model, so they also
run on a file the schema rejected (or the part of a file before a YAML syntax error). A value of the wrong type
reads as None here (the schema reports it).
"""

from __future__ import annotations

from typing import Any

from yaml.nodes import ScalarNode

from sailrl.runtime.prompts import template_variables
from sailrl.spec import schema
from sailrl.spec.errors import SpecError, yaml_lines
from sailrl.spec.loader import KeyPath, LoadedSpec, resolve_plain
from sailrl.spec.messages import did_you_mean_text

#: The prompt templates (system, user) and the supervised warm-up's completion template.
TEMPLATE_FIELDS: tuple[KeyPath, ...] = (("prompt", "system"), ("prompt", "user"), ("training", "warmup", "completion"),
                                         ("sft", "completion"))


class SpecReader:
    """A loaded spec's values by key path (exact typed text, whole numbers, numbers) and the problems found so far.

    ``errors`` collects every error and warning in the order the checks add them; `add` / `warn` / `at_offset`
    locate each at its key (or at a character of the string there).
    """

    def __init__(self, loaded: LoadedSpec) -> None:
        self.loaded = loaded
        self.data = loaded.data if isinstance(loaded.data, dict) else {}
        self.errors: list[SpecError] = []

    # -- values ---------------------------------------------------------------------------------------------
    def get(self, path: KeyPath, default: Any = None) -> Any:
        cur: Any = self.data
        for p in path:
            if isinstance(cur, dict) and p in cur or isinstance(cur, list) and isinstance(p, int) and 0 <= p < len(cur):
                cur = cur[p]
            else:
                return default
        return cur

    def text(self, path: KeyPath) -> str | None:
        """The string a Text field gets at ``path`` (exact typed text), or None if absent / not a scalar."""
        info = self.loaded.nodes.get(path)
        if info is None or not isinstance(info.node, ScalarNode):
            return None
        node = info.node
        if node.style is None and resolve_plain(node.value) is None:
            return None
        return node.value

    def integer(self, path: KeyPath) -> int | None:
        value = self.get(path)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def number(self, path: KeyPath) -> float | None:
        value = self.get(path)
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    def whole(self, section: str) -> bool:
        """Whether top-level ``section`` was read completely (always, unless a syntax error cut the file)."""
        return self.loaded.complete or section in self.loaded.complete_sections

    # -- problems -------------------------------------------------------------------------------------------
    def add(self, path: KeyPath, code: str, message: str, hint: str | None = None, **kw: Any) -> SpecError:
        err = self.loaded.error(path, message, hint, code=code, **kw)
        self.errors.append(err)
        return err

    def warn(self, path: KeyPath, code: str, message: str, hint: str | None = None) -> SpecError:
        return self.add(path, code, message, hint, severity="warning")

    def at_offset(self, path: KeyPath, code: str, offset: int, message: str, hint: str | None = None) -> None:
        """An error pointing at character ``offset`` of the string at ``path`` (block scalars included)."""
        err = self.add(path, code, message, hint, offset=offset)
        info = self.loaded.nodes.get(path)
        if info is None or not isinstance(info.node, ScalarNode) or info.node.style != "|":
            return
        value = info.node.value
        line_in_value = value.count("\n", 0, offset)
        col_in_line = offset - (value.rfind("\n", 0, offset) + 1)
        line = info.node.start_mark.line + 2 + line_in_value  # content starts on the line after '|'
        src = yaml_lines(self.loaded.text)
        if 1 <= line <= len(src):
            indent = len(src[line - 1]) - len(src[line - 1].lstrip(" "))
            err.line, err.column, err.end_column = line, indent + col_in_line + 1, None

    def path_ok(self, path: KeyPath) -> bool:
        """Whether the name or path at ``path`` fits the file system (no S225 reported on it)."""
        return not any(e.code == "S225" and e.key_path == ".".join(map(str, path)) for e in self.errors)

    # -- dataset fields ---------------------------------------------------------------------------------------
    def declared_fields(self) -> list[str] | None:
        """Names the templates and rules may use (dataset.fields keys or items), or None when not declared."""
        if not self.whole("dataset"):
            return None  # cut by a syntax error: the list may be incomplete
        fields = self.get(("dataset", "fields"))
        if isinstance(fields, dict):
            return [str(k) for k in fields]
        if isinstance(fields, list):
            return [str(self.text(("dataset", "fields", i)) or v) for i, v in enumerate(fields)]
        return None

    def reference_fields(self) -> list[str]:
        """Fields answer rules read their reference from (``reference.field`` or prompt.reference_field)."""
        default = self.text(("prompt", "reference_field")) or "answer"
        out = [default]
        rules = self.get(("reward", "rules"))
        for i, rule in enumerate(rules if isinstance(rules, list) else []):
            if isinstance(rule, dict) and rule.get("kind") == "answer":
                out.append(self.text(("reward", "rules", i, "reference", "field")) or default)
        return list(dict.fromkeys(out))

    def template_fields(self) -> set[str]:
        """Field names the prompt templates read (they are the question, not the reference answer)."""
        names: set[str] = set()
        for path in TEMPLATE_FIELDS[:2]:
            source = self.text(path)
            if source is None:
                continue
            try:
                names |= template_variables(source)
            except Exception:  # noqa: BLE001 -- a broken template is reported by the template checks
                continue
        return names

    def unknown_field(self, path: KeyPath, name: str, declared: list[str], *, reference: bool = False) -> None:
        """S219: ``name`` at ``path`` is not among the ``declared`` dataset fields (a reference's "did you mean"
        prefers the fields answer rules read and the fields no prompt shows)."""
        preferred: list[str] = []
        if reference:
            shown = self.template_fields()
            preferred = [f for f in self.reference_fields() if f in declared]
            preferred += [f for f in declared if f not in shown and f not in preferred]
        self.add(path, "S219",
                 f"'{name}' is not a dataset field" + did_you_mean_text(name, declared, preferred=preferred),
                 f"Declared fields (dataset.fields): {', '.join(declared) or '(none)'}.")


def schema_default(model: str, key: str) -> Any:
    """The schema's default of ``<model>.<key>`` (e.g. ``("TrainingSpec", "steps")``), for a key the spec omits."""
    return getattr(schema, model).model_fields[key].default

