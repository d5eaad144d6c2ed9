"""The Jinja2 templates of a spec (the prompt's system and user templates, the warm-up's completion template, an
SFT spec's ``sft.completion``, each judge rule's rubric): they parse (S203), stay within the sandbox's nesting
limits (S208), include nothing (S204), reach no name the sandbox forbids (S207), use known filters (S205) and
declared dataset fields only (S206), and render on an example row in the runtime's own bounded sandbox
(``sailrl.runtime.prompts``)."""

from __future__ import annotations

import re
from typing import Any

from jinja2 import TemplateSyntaxError, meta, nodes

from sailrl.compiler.checks.reader import TEMPLATE_FIELDS, SpecReader
from sailrl.runtime.prompts import PromptError, forbidden_names, make_environment, parse_template, render_template
from sailrl.spec.loader import KeyPath
from sailrl.spec.messages import did_you_mean_text


def check_templates(spec: SpecReader) -> None:
    env = make_environment()  # the same environment the runtime renders with
    declared = spec.declared_fields()
    for path in (*TEMPLATE_FIELDS, *rubric_paths(spec)):
        source = spec.text(path)
        if source is None:
            continue
        try:
            ast = parse_template(source)
        except TemplateSyntaxError as exc:
            lines = source.split("\n")
            lineno = max(1, min(exc.lineno or 1, len(lines)))
            offset = sum(len(x) + 1 for x in lines[: lineno - 1])
            spec.at_offset(
                path, "S203", offset, f"this Jinja template does not parse: {exc.message}",
                "Template syntax: {{ field }} inserts a dataset field; {% if ... %}...{% endif %} for logic. "
                "Check that every {{ has a matching }} and every {% block %} is closed.",
            )
            continue
        except PromptError as exc:
            spec.at_offset(path, "S208", 0, f"this Jinja template cannot be used: {exc}",
                           "Simplify the template: sailrl limits nesting so that no template can crash or hang "
                           "a run.")
            continue
        lookups = [n for n in ast.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends))]
        if lookups:
            spec.at_offset(
                path, "S204", 0, "a prompt template cannot include, import or extend other templates",
                "Write the whole text in the template; use {{ field }} for dataset values.",
            )
            continue
        forbidden = forbidden_names(ast)
        if forbidden:
            name = min(forbidden, key=lambda n: (source.find(n) % (len(source) + 1), n))  # first in the text
            spec.at_offset(
                path, "S207", max(source.find(name), 0),
                f"the template uses '{name}': names starting with '_' reach Python internals, which the "
                "template sandbox forbids (every row would fail to render)",
                "Templates read dataset fields ({{ question }}, {{ meta['key'] }}) and use filters "
                "({{ question | upper }}); they cannot reach object internals.",
            )
            continue
        try:
            undeclared = meta.find_undeclared_variables(ast)
        except TemplateSyntaxError as exc:  # e.g. an unknown filter: found when the template is compiled
            spec.at_offset(path, "S205", 0, f"this Jinja template cannot be used: {exc.message}",
                           "Filters that exist include upper, lower, trim, replace, default and round.")
            continue
        except (RecursionError, MemoryError):
            spec.at_offset(path, "S208", 0, "this Jinja template is too complex to compile (nested too deeply)")
            continue
        if declared is not None:
            unknown = [n for n in sorted(undeclared) if n not in declared and n not in env.globals]
            for name in unknown:
                message = f"the template uses '{name}', which is not a dataset field" + did_you_mean_text(
                    name, declared)
                spec.at_offset(path, "S206", _find_name(source, name), message,
                               f"Declared fields (dataset.fields): {', '.join(declared) or '(none)'}.")
            if unknown:
                continue
        _render_example(spec, path, source, undeclared)


def rubric_paths(spec: SpecReader) -> list[KeyPath]:
    """``reward.rules.<i>.rubric`` of every judge rule (a Jinja template over the row's fields)."""
    rules = spec.get(("reward", "rules"))
    return [("reward", "rules", i, "rubric") for i, r in enumerate(rules if isinstance(rules, list) else [])
            if isinstance(r, dict) and r.get("kind") == "judge" and spec.text(("reward", "rules", i, "rubric"))]


def _example_row(spec: SpecReader, names: set[str]) -> dict[str, Any]:
    """A row to render templates on.

    Every declared field (and every name the template reads) is set to its own name, then the first worked
    example's fields (their real values) replace those placeholders.
    """
    declared = spec.declared_fields() or []
    row: dict[str, Any] = {name: name for name in [*declared, *sorted(names)]}
    examples = spec.get(("examples",))
    fields = examples[0].get("fields") if isinstance(examples, list) and examples and isinstance(
        examples[0], dict) else None
    if isinstance(fields, dict):
        row.update({str(k): v for k, v in fields.items() if isinstance(v, str)})
    return row


def _render_example(spec: SpecReader, path: KeyPath, source: str, names: set[str]) -> None:
    """Render ``source`` on an example row; report what fails whatever the row (sandbox, limits)."""
    row = _example_row(spec, set(names))
    template = ".".join(map(str, path))
    try:
        render_template(source, row, template=template)
    except PromptError as exc:
        if exc.kind == "forbidden":
            spec.at_offset(path, "S207", 0, f"{exc} (on an example row; every row would fail the same way)",
                           "Templates read dataset fields and use filters; they cannot reach object internals.")
        elif exc.kind == "limit":
            spec.at_offset(path, "S208", 0, f"on an example row, {exc}",
                           "Every template is rendered within these limits during training too, so this "
                           "template would fail on every row. Make it do less work.")
        # "failed" / "missing-field" / "null-field" may depend on the row's real values: the data checks
        # (`sailrl preflight`) report those on real rows.


def _find_name(source: str, name: str) -> int:
    m = re.search(r"(?<![\w.])" + re.escape(name) + r"(?!\w)", source)
    return m.start() if m else 0
