"""Semantic checks of a spec: what the schema alone cannot say, each problem located, coded and in plain words.

The checks read the loaded YAML (``LoadedSpec.data`` and its node locations), not the validated model, so
they also run on a file the schema rejected (or the part of a file before a YAML syntax error) and every
problem of a file is reported together. A value of the wrong type is skipped here (the schema reports it).

Errors: regular expressions compile within the pattern limits (``sailrl.spec.patterns``) and carry no control
characters from double-quoted escapes; Jinja2 templates parse, stay within the sandbox's nesting limits, use only
declared dataset fields and no attribute the sandbox forbids, and render on an example row (the spec's
``examples:`` fields over a row of placeholder values) in the runtime's own bounded sandbox
(``sailrl.runtime.prompts``); the renderer name and LoRA rank; names and paths fit a file system; group_size >= 2;
num_substeps divides groups_per_step; lr_warmup_steps < steps; the Sail completion window; resume_from is a
save_state checkpoint; reference fields are declared dataset fields; local dataset files exist.

Warnings: a number outside its key's usual range (``x-usual-range`` in the schema, :func:`usual_range_of`),
kl_discount_factor without kl_penalty_coef, max_tokens not below the model's context window.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from jinja2 import TemplateSyntaxError, meta, nodes
from yaml.nodes import ScalarNode

from sailrl.runtime.data.base import DatasetError
from sailrl.runtime.data.readers import is_local, json_rows, read_text, resolve
from sailrl.runtime.data.sources import CsvSource, JsonlSource, ListSource
from sailrl.runtime.prompts import (
    PromptError,
    forbidden_names,
    make_environment,
    parse_template,
    render_template,
    template_variables,
)
from sailrl.spec import schema
from sailrl.spec.constants import (
    COMPLETION_WINDOWS,
    LOCAL_DATA_SUFFIXES,
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    REGEX_FLAGS,
    RETIRED_WINDOWS,
)
from sailrl.spec.errors import SpecError, yaml_lines
from sailrl.spec.files import special_kind
from sailrl.spec.loader import KeyPath, LoadedSpec, dotted, resolve_plain
from sailrl.spec.lr_advice import far_limit, lr_advice, lr_far
from sailrl.spec.messages import did_you_mean_text, model_at, number_text
from sailrl.spec.models import (
    BUILTIN_MODELS,
    TINY_JUDGE_MODEL_NAME,
    TINY_JUDGE_RUBRIC,
    UnknownModelError,
    classify,
    context_window,
    default_renderer,
    is_remote_only,
    is_unknown_builtin,
)
from sailrl.spec.patterns import PatternError, compile_pattern
from sailrl.spec.renderers import KNOWN_RENDERERS
from sailrl.spec.schema import ModelSpec, Spec

TEMPLATE_FIELDS: tuple[KeyPath, ...] = (("prompt", "system"), ("prompt", "user"), ("training", "warmup", "completion"))
# Characters a double-quoted YAML escape produces that nobody means to type in a pattern or template.
_CONTROL_ESCAPES = {"\x08": "\\b", "\x07": "\\a", "\x0c": "\\f", "\x0b": "\\v", "\x1b": "\\e", "\x00": "\\0"}
# Keys whose values name files or directories (checked against file-system name limits).
_PATH_KEYS: tuple[KeyPath, ...] = (("model", "name"), ("dataset", "source"), ("output", "run_dir"),
                                   ("training", "init_from"), ("training", "resume_from"))


#: Dataset rows validate renders the prompt templates on (a template failing on all of them is S209).
DATA_ROWS_CHECKED = 5
_DATA_TYPES_HINT = ("Point dataset.source at a .jsonl, .json, .csv or .parquet file, or a folder written by "
                    "Dataset.save_to_disk (relative paths are relative to the spec file's folder).")
#: Seconds validate spends rendering templates on dataset rows.
DATA_RENDER_BUDGET_S = 1.0


def check_spec(loaded: LoadedSpec) -> list[SpecError]:
    """Every semantic problem of ``loaded`` (possibly rejected by the schema; ``loaded.spec`` may be None).

    Returns errors and warnings (``severity``), each with its code; never raises for a user error.
    """
    c = _Checker(loaded)
    c.control_characters()
    c.paths()
    c.templates()
    c.templates_on_data()
    c.regexes()
    c.rules()
    c.judges()
    c.model()
    c.training()
    c.sampling()
    c.dataset()
    c.usual_ranges()
    return c.errors


def usual_range_of(field_info: Any) -> tuple[float, float, float | None] | None:
    """``(low, high, off)`` from a schema field's ``x-usual-range`` (``off``: a value that means "disabled")."""
    extra = getattr(field_info, "json_schema_extra", None)
    if not isinstance(extra, dict) or "x-usual-range" not in extra:
        return None
    low, high = extra["x-usual-range"]
    return float(low), float(high), extra.get("x-usual-off")


class _Checker:
    def __init__(self, loaded: LoadedSpec) -> None:
        self.loaded = loaded
        self.data = loaded.data if isinstance(loaded.data, dict) else {}
        self.errors: list[SpecError] = []

    # -- access helpers -------------------------------------------------------------------------------------
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
            except Exception:  # noqa: BLE001 -- a broken template is reported by templates()
                continue
        return names

    # -- checks --------------------------------------------------------------------------------------------
    def control_characters(self) -> None:
        """A double-quoted "\\b" is a backspace character, not a regex word boundary (nor the \\boxed{} b)."""
        for path, info in self.loaded.nodes.items():
            node = info.node
            if not isinstance(node, ScalarNode) or node.style != '"':
                continue
            found = [(i, ch) for i, ch in enumerate(node.value) if ch in _CONTROL_ESCAPES]
            if not found:
                continue
            _, ch = found[0]
            esc = _CONTROL_ESCAPES[ch]
            self.add(
                path, "S202",
                f"inside double quotes YAML turned '{esc}' into a control character (U+{ord(ch):04X}), "
                f"not a backslash followed by '{esc[1]}'",
                "Use single quotes, where a backslash stays as typed: e.g. pattern: '\\b\\d+\\b' or "
                "user: '... \\boxed{}'.",
            )

    def paths(self) -> None:
        """Names and paths must fit the file system (else every stat() fails with 'File name too long')."""
        for path in _PATH_KEYS:
            value = self.text(path)
            if value is None:
                continue
            total = len(value.encode("utf-8", "surrogatepass"))
            longest = max((len(part.encode("utf-8", "surrogatepass")) for part in value.split("/")), default=0)
            if longest > MAX_NAME_BYTES:
                self.add(path, "S225", f"a name in this path is {longest:,} bytes long; file systems allow "
                         f"{MAX_NAME_BYTES} bytes a name", "Use a shorter name (each part between '/' at most "
                         f"{MAX_NAME_BYTES} bytes).")
            elif total > MAX_PATH_BYTES:
                self.add(path, "S225", f"this path is {total:,} bytes long; file systems allow {MAX_PATH_BYTES:,}",
                         "Use a shorter path.")

    def _path_ok(self, path: KeyPath) -> bool:
        return not any(e.code == "S225" and e.key_path == ".".join(map(str, path)) for e in self.errors)

    def templates(self) -> None:
        env = make_environment()  # the same environment the runtime renders with
        declared = self.declared_fields()
        for path in (*TEMPLATE_FIELDS, *self.rubric_paths()):
            source = self.text(path)
            if source is None:
                continue
            try:
                ast = parse_template(source)
            except TemplateSyntaxError as exc:
                lines = source.split("\n")
                lineno = max(1, min(exc.lineno or 1, len(lines)))
                offset = sum(len(x) + 1 for x in lines[: lineno - 1])
                self.at_offset(
                    path, "S203", offset, f"this Jinja template does not parse: {exc.message}",
                    "Template syntax: {{ field }} inserts a dataset field; {% if ... %}...{% endif %} for logic. "
                    "Check that every {{ has a matching }} and every {% block %} is closed.",
                )
                continue
            except PromptError as exc:
                self.at_offset(path, "S208", 0, f"this Jinja template cannot be used: {exc}",
                               "Simplify the template: sailrl limits nesting so that no template can crash or hang "
                               "a run.")
                continue
            lookups = [n for n in ast.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends))]
            if lookups:
                self.at_offset(
                    path, "S204", 0, "a prompt template cannot include, import or extend other templates",
                    "Write the whole text in the template; use {{ field }} for dataset values.",
                )
                continue
            forbidden = forbidden_names(ast)
            if forbidden:
                name = min(forbidden, key=lambda n: (source.find(n) % (len(source) + 1), n))  # first in the text
                self.at_offset(
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
                self.at_offset(path, "S205", 0, f"this Jinja template cannot be used: {exc.message}",
                               "Filters that exist include upper, lower, trim, replace, default and round.")
                continue
            except (RecursionError, MemoryError):
                self.at_offset(path, "S208", 0, "this Jinja template is too complex to compile (nested too deeply)")
                continue
            if declared is not None:
                unknown = [n for n in sorted(undeclared) if n not in declared and n not in env.globals]
                for name in unknown:
                    message = f"the template uses '{name}', which is not a dataset field" + did_you_mean_text(
                        name, declared)
                    self.at_offset(path, "S206", _find_name(source, name), message,
                                   f"Declared fields (dataset.fields): {', '.join(declared) or '(none)'}.")
                if unknown:
                    continue
            self._render_example(path, source, undeclared)

    def rubric_paths(self) -> list[KeyPath]:
        """``reward.rules.<i>.rubric`` of every judge rule (a Jinja template over the row's fields)."""
        rules = self.get(("reward", "rules"))
        return [("reward", "rules", i, "rubric") for i, r in enumerate(rules if isinstance(rules, list) else [])
                if isinstance(r, dict) and r.get("kind") == "judge" and self.text(("reward", "rules", i, "rubric"))]

    def judges(self) -> None:
        """A judge model that its sampler cannot serve (S231, S232); ``sailrl/tiny-judge`` asked to judge what it
        was not taught (W113)."""
        rules = self.get(("reward", "rules"))
        for i, rule in enumerate(rules if isinstance(rules, list) else []):
            if not isinstance(rule, dict) or rule.get("kind") != "judge" or not isinstance(rule.get("judge"), dict):
                continue
            path = ("reward", "rules", i, "judge")
            model = self.text((*path, "model"))
            sampler = self.text((*path, "sampler")) or "sail"
            if not model or sampler not in ("sail", "tinker", "local"):
                continue  # the schema reports these
            if is_unknown_builtin(model):
                self.add((*path, "model"), "S231", f"'{model}' is not a model built into sailrl, so no judge can "
                         "run it" + did_you_mean_text(model, list(BUILTIN_MODELS)), _BUILTIN_HINT)
                continue
            try:
                kind = classify(model, self.loaded.base_dir).kind
            except OSError:
                continue
            if sampler in ("sail", "tinker") and kind != "remote":
                where = {"builtin": "a model built into sailrl's embedded backend", "local_dir": "a model folder "
                         "on this machine", "gguf": "a .gguf file on this machine"}[kind]
                service = "Sail" if sampler == "sail" else "Tinker"
                self.add((*path, "model"), "S231",
                         f"the judge model '{model}' is {where}; {service} (judge.sampler: {sampler}) cannot serve it",
                         "Use judge.sampler: local to judge with it on the embedded backend, or name a model "
                         f"{service} hosts (e.g. {'moonshotai/Kimi-K2.6' if sampler == 'sail' else 'Qwen/Qwen3-8B'}).")
            if model == TINY_JUDGE_MODEL_NAME and sampler == "local":
                self._tiny_judge(i, rule)
            if sampler == "local" and kind == "remote" and is_remote_only(model):
                self.add((*path, "model"), "S232",
                         f"the judge model '{model}' is served only by remote services; the embedded backend "
                         "(judge.sampler: local) cannot load a model of that size",
                         "Use judge.sampler: sail (Sail's hosted model) or tinker, or a small local model (a "
                         "Hugging Face folder or .gguf file next to the spec).")

    def _tiny_judge(self, i: int, rule: dict) -> None:
        """W113: ``sailrl/tiny-judge`` with another rubric (the field names aside), scale or renderer."""
        untaught = []
        rubric = self.text(("reward", "rules", i, "rubric"))
        if rubric is not None and _rubric_words(rubric) != _rubric_words(TINY_JUDGE_RUBRIC):
            untaught.append(("rubric", "its rubric"))
        if rule.get("scale", "binary") != "binary":
            untaught.append(("scale", "its scale"))
        renderer = rule["judge"].get("renderer")
        if renderer not in (None, "role_colon"):
            untaught.append((("judge", "renderer"), f"the renderer {renderer!r}"))
        if not untaught:
            return
        key, _ = untaught[0]
        key = key if isinstance(key, tuple) else (key,)
        self.warn(("reward", "rules", i, *key), "W113",
                  f"judge rule '{rule.get('name') or 'judge'}': sailrl/tiny-judge was taught one rubric only, on the "
                  f"binary scale with the role_colon renderer, and {' and '.join(w for _, w in untaught)} "
                  f"{'differs' if len(untaught) == 1 else 'differ'}: "
                  "its answers here mean nothing",
                  f"Write the rubric as '{TINY_JUDGE_RUBRIC}' (your field names in the braces), with scale: binary; "
                  "or judge with a real instruction model (a local folder or .gguf, or judge.sampler: sail).")

    def templates_on_data(self) -> None:
        """Render the prompt templates on the first :data:`DATA_ROWS_CHECKED` rows of a local ``.jsonl`` /
        ``.csv`` / ``.json`` dataset: a template that fails on every one of them (an ``OverflowError``, a forbidden
        attribute reached through ``|attr``, a limit; not a missing or empty field, which skips the row) is an
        error (S209) quoting the failure. Within :data:`DATA_RENDER_BUDGET_S` seconds of rendering."""
        paths = [p for p in (("prompt", "system"), ("prompt", "user")) if self.text(p) is not None
                 and not any(e.key_path == dotted(p) for e in self.errors)]
        rows = self._data_rows() if paths else []
        if not rows:
            return
        deadline = time.monotonic() + DATA_RENDER_BUDGET_S
        for path in paths:
            template = dotted(path)
            tried, failures = 0, []
            for row in rows:
                if time.monotonic() > deadline:
                    break
                try:
                    render_template(self.text(path) or "", row, template=template)
                except PromptError as exc:
                    if exc.kind in ("missing-field", "null-field"):
                        continue
                    failures.append(exc)
                tried += 1
            if tried and len(failures) == tried:
                first = str(failures[0]).removeprefix(f"{template} ")
                self.at_offset(path, "S209", 0, f"fails on every one of the first {tried} dataset rows it was "
                               f"rendered on: {first}",
                               "Every row would fail the same way and be skipped; fix the template (sailrl "
                               "preflight shows rows and their prompts).")

    def _data_rows(self) -> list[dict[str, Any]]:
        """The first rows of a local dataset file under the spec's field names (``_index`` included), or ``[]``
        when there is none or it cannot be read (the run and preflight report that)."""
        source = self.text(("dataset", "source"))
        if not source or not self.loaded.path.is_file() or not self._path_ok(("dataset", "source")):
            return []
        p = Path(source.strip()).expanduser()
        full = p if p.is_absolute() else self.loaded.base_dir / p
        suffix = full.suffix.lower()
        fields = self.get(("dataset", "fields"))
        mapping = ({str(f): str(f) for f in fields} if isinstance(fields, list) else
                   {str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else None)
        rng = self.get(("dataset", "range"))
        start = rng[0] if isinstance(rng, list) and rng and isinstance(rng[0], int) and rng[0] >= 0 else 0
        try:
            if special_kind(full) is not None or not full.is_file():
                return []
            if suffix == ".jsonl":
                src: Any = JsonlSource(full)
            elif suffix == ".csv":
                src = CsvSource(full)
            elif suffix == ".json":
                src = ListSource(json_rows(read_text(full), full, lines=False))
            else:
                return []
            raw = [(i, r) for i, _, r in src.scan(start, start + DATA_ROWS_CHECKED)]
        except (DatasetError, OSError, ValueError):
            return []
        out = []
        for i, r in raw:
            row = dict(r) if mapping is None else {name: r[col] for name, col in mapping.items() if col in r}
            row["_index"] = i
            out.append(row)
        return out

    def _example_row(self, names: set[str]) -> dict[str, Any]:
        """A row to render templates on.

        Every declared field (and every name the template reads) is set to its own name, then the first worked
        example's fields (their real values) replace those placeholders.
        """
        declared = self.declared_fields() or []
        row: dict[str, Any] = {name: name for name in [*declared, *sorted(names)]}
        examples = self.get(("examples",))
        fields = examples[0].get("fields") if isinstance(examples, list) and examples and isinstance(
            examples[0], dict) else None
        if isinstance(fields, dict):
            row.update({str(k): v for k, v in fields.items() if isinstance(v, str)})
        return row

    def _render_example(self, path: KeyPath, source: str, names: set[str]) -> None:
        """Render ``source`` on an example row; report what fails whatever the row (sandbox, limits)."""
        row = self._example_row(set(names))
        template = ".".join(map(str, path))
        try:
            render_template(source, row, template=template)
        except PromptError as exc:
            if exc.kind == "forbidden":
                self.at_offset(path, "S207", 0, f"{exc} (on an example row; every row would fail the same way)",
                               "Templates read dataset fields and use filters; they cannot reach object internals.")
            elif exc.kind == "limit":
                self.at_offset(path, "S208", 0, f"on an example row, {exc}",
                               "Every template is rendered within these limits during training too, so this "
                               "template would fail on every row. Make it do less work.")
            # "failed" / "missing-field" / "null-field" may depend on the row's real values: the data checks
            # (`sailrl preflight`) report those on real rows.

    def regexes(self) -> None:
        """Every `pattern` under reward: compiles with `regex`, within the pattern limits."""
        reward = self.get(("reward",))
        if not isinstance(reward, dict):
            return
        for path, owner in _walk_dicts(reward, ("reward",)):
            if "pattern" not in owner:
                continue
            p_path = (*path, "pattern")
            pattern = self.text(p_path)
            if pattern is None:
                continue
            flags = owner.get("flags") if isinstance(owner.get("flags"), list) else []
            self._compile(p_path, pattern, [f for f in flags if f in REGEX_FLAGS])

    def _compile(self, path: KeyPath, pattern: str, flags: list[str]) -> Any:
        try:
            return compile_pattern(pattern, flags)
        except PatternError as exc:
            pos = exc.pos
            where = f" at position {pos}" if pos is not None else ""
            hint = None
            if pos is not None and len(pattern) <= 200:
                hint = f"In the pattern:\n{pattern}\n{' ' * pos}^ {exc.message}"
            info = self.loaded.nodes.get(path)
            if "\\" in pattern and info is not None and getattr(info.node, "style", None) == '"':
                tip = "Write patterns in single quotes: inside double quotes YAML interprets backslashes."
                hint = f"{hint}\n{tip}" if hint else tip
            if exc.limit:
                message = f"this regular expression is over a limit: {exc.message}"
            else:
                message = f"this regular expression does not compile: {exc.message}{where}"
            if pos is not None:
                self.at_offset(path, "S201", pos, message, hint)
            else:
                self.add(path, "S201", message, hint)
            return None

    def rules(self) -> None:
        rules = self.get(("reward", "rules"))
        if not isinstance(rules, list):
            return
        declared = self.declared_fields()
        first_with_name: dict[str, int] = {}
        for i, rule in enumerate(rules):
            if not isinstance(rule, dict):
                continue
            path = ("reward", "rules", i)
            name = self.text((*path, "name")) or self.text((*path, "kind"))
            if name is not None and name in first_with_name:
                at = ("name",) if self.text((*path, "name")) is not None else ("kind",)
                line = (self.loaded.locate(("reward", "rules", first_with_name[name])) or (0, 0))[0]
                self.add((*path, *at), "S221", f"two rules are named '{name}' (the first is at line {line}): give "
                         "each rule its own `name`; it is the metric key reward/<name>")
            elif name is not None:
                first_with_name[name] = i
            for sub_path, _owner in _walk_dicts(rule, path):
                if sub_path[-1] == "reference" and declared is not None:
                    ref_field = self.text((*sub_path, "field"))
                    if ref_field is not None and ref_field not in declared:
                        self._unknown_field((*sub_path, "field"), ref_field, declared, reference=True)

    def _unknown_field(self, path: KeyPath, name: str, declared: list[str], *, reference: bool = False) -> None:
        preferred: list[str] = []
        if reference:
            # A reference is an answer: prefer the fields answer rules read and the fields no prompt shows.
            shown = self.template_fields()
            preferred = [f for f in self.reference_fields() if f in declared]
            preferred += [f for f in declared if f not in shown and f not in preferred]
        self.add(path, "S219",
                 f"'{name}' is not a dataset field" + did_you_mean_text(name, declared, preferred=preferred),
                 f"Declared fields (dataset.fields): {', '.join(declared) or '(none)'}.")

    def model(self) -> None:
        named = self.text(("model", "name"))
        if named is not None and is_unknown_builtin(named):
            self.add(("model", "name"), "S212", f"'{named}' is not a model built into sailrl"
                     + did_you_mean_text(named, list(BUILTIN_MODELS)), _BUILTIN_HINT)
        rank = self.integer(("model", "lora_rank"))
        if rank is not None and (rank < 1 or rank & (rank - 1)):
            self.add(("model", "lora_rank"), "S213",
                     f"LoRA rank must be a positive power of two, got {number_text(rank)}",
                     "Use 1, 2, 4, 8, 16, 32 (the Tinker default), 64, 128, ... For RL small ranks are enough.")
        renderer = self.text(("model", "renderer"))
        if renderer is not None:
            if renderer not in KNOWN_RENDERERS:
                self.add(("model", "renderer"), "S211", f"unknown renderer '{renderer}'"
                         + did_you_mean_text(renderer, KNOWN_RENDERERS),
                         "Known renderers: " + ", ".join(KNOWN_RENDERERS) + ".")
            return
        info = self.loaded.nodes.get(("model", "name"))
        if info is not None and not isinstance(info.node, ScalarNode):
            return  # the schema reports the wrong type
        if not self.whole("model"):
            return  # cut by a syntax error: model.renderer may come after it
        if not self._path_ok(("model", "name")):
            return

        name = self.text(("model", "name")) or ModelSpec.model_fields["name"].default
        if is_unknown_builtin(name):
            return  # said above
        try:
            default_renderer(name, self.loaded.base_dir, embedded=self.text(("sampling", "sampler")) == "local")
        except UnknownModelError as exc:
            self.add(("model", "name"), "S212", f"no renderer is known for model '{name}'; set model.renderer",
                     f"{exc} Add `renderer:` under model:, e.g. qwen3, llama3, kimi_k26 or role_colon.")
        except OSError as exc:  # an unreadable local model folder
            self.add(("model", "name"), "S212", f"cannot look at model '{name}': {exc.strerror or exc}",
                     "Check the path, or set model.renderer.")

    def training(self) -> None:
        group = self.integer(("training", "group_size"))
        if group is not None and group < 2:
            self.add(("training", "group_size"), "S214", f"group_size must be at least 2, got {group}",
                     "Advantages are rewards minus the mean of their group; with one rollout per group every "
                     "advantage is zero, so nothing trains. Use 4 or more (the Sail guide uses 4).")
        groups = self.integer(("training", "groups_per_step"))
        sub = self.integer(("training", "num_substeps"))
        if groups and sub and groups > 0 and sub > 0 and groups % sub and self.whole("training"):
            divisors = [str(d) for d in range(1, min(groups, 10_000) + 1) if groups % d == 0]
            self.add(("training", "num_substeps"), "S215",
                     f"num_substeps ({sub}) must divide groups_per_step ({groups}) so every substep gets "
                     "the same number of groups",
                     f"Divisors of {groups}: {', '.join(divisors)}.")
        resume = self.text(("training", "resume_from"))
        if resume is not None and "sampler_weights/" in resume:
            self.add(("training", "resume_from"), "S216",
                     "this is a sampler checkpoint (sampler_weights/): it holds weights for sampling only, "
                     "so a run cannot resume from it",
                     "Resumable checkpoints come from save_state and have weights/ in their path "
                     "(tinker://.../weights/...). To start from these weights with a fresh optimizer, "
                     "use training.init_from instead.")
        warm = self.integer(("training", "lr_warmup_steps"))
        steps = self.integer(("training", "steps"))
        if warm is not None and warm > 0 and self.whole("training"):
            total = steps if steps is not None else _default("TrainingSpec", "steps")
            if isinstance(total, int) and warm >= total:
                self.add(("training", "lr_warmup_steps"), "S226",
                         f"lr_warmup_steps ({warm}) must be fewer than training.steps ({total}): the learning rate "
                         "would never leave its warm-up",
                         f"Use at most {max(total - 1, 0)} warm-up steps (often 5-10% of the steps), or 0 for none.")
        self.learning_rate_advice()
        discount = self.number(("training", "kl_discount_factor"))
        coef = self.number(("training", "kl_penalty_coef"))
        if discount and discount > 0 and not coef and self.whole("training"):
            self.warn(("training", "kl_discount_factor"), "W102",
                      f"kl_discount_factor ({discount:g}) only shapes the KL penalty, and kl_penalty_coef is "
                      f"{'0' if coef is not None else 'not set (0)'}: it has no effect",
                      "Set training.kl_penalty_coef (usually 0.001-0.1) to use a KL penalty, or remove "
                      "kl_discount_factor.")

    def learning_rate_advice(self) -> None:
        """W120 when the learning rate is more than 10x above (or 100x below) tinker_cookbook's ``get_lr`` for the
        model's LoRA."""
        if not (self.whole("model") and self.whole("training")):
            return
        name = self.get(("model", "name"), _default("ModelSpec", "name"))
        lr = self.number(("training", "learning_rate"))
        if lr is None and self.get(("training", "learning_rate")) is None:
            lr = _default("TrainingSpec", "learning_rate")
        if not isinstance(name, str) or lr is None or not lr_far(name, lr):
            return
        self.warn(("training", "learning_rate"), "W120",
                  f"{lr_advice(name, lr)}, more than {far_limit(name, lr):g}x away",
                  "get_lr is calibrated on supervised LoRA fine-tuning (10x the full fine-tuning rate); RL runs "
                  "often use a few times less. If the value is meant, keep it: this is a warning, and "
                  "`sailrl validate` still passes.")

    def sampling(self) -> None:
        window = self.text(("sampling", "completion_window"))
        if window is not None and window not in COMPLETION_WINDOWS:
            why = RETIRED_WINDOWS.get(window)
            if why:
                self.add(("sampling", "completion_window"), "S217",
                         f"completion_window '{window}' is {why} in the current sail SDK; use 'balanced' or 'flex'",
                         "The Sail guide's `completion_window: priority` predates the SDK change. "
                         "Write `completion_window: balanced` (the default) or `flex`.")
            else:
                self.add(("sampling", "completion_window"), "S218",
                         f"completion_window must be 'balanced' or 'flex', got '{window}'"
                         + did_you_mean_text(window, COMPLETION_WINDOWS))
        max_tokens = self.integer(("sampling", "max_tokens"))
        if max_tokens is None or not self._path_ok(("model", "name")) or not self.whole("model"):
            return

        name = self.text(("model", "name")) or _default("ModelSpec", "name")
        try:
            window_tokens, source = context_window(str(name), self.loaded.base_dir)
        except (OSError, ValueError):
            return
        if window_tokens is not None and max_tokens >= window_tokens:
            self.warn(("sampling", "max_tokens"), "W103",
                      f"max_tokens ({max_tokens:,}) is not below the context window of '{name}' "
                      f"({window_tokens:,} tokens, from {source}): the prompt and the completion must fit in it "
                      "together",
                      f"Use a max_tokens well below {window_tokens:,}, leaving room for the longest prompt "
                      "(`sailrl preflight` shows prompt lengths).")

    def dataset(self) -> None:
        declared = self.declared_fields()
        ref = self.text(("prompt", "reference_field"))
        if declared is not None and ref is not None and ref not in declared:
            self._unknown_field(("prompt", "reference_field"), ref, declared, reference=True)
        if declared is not None and len(set(declared)) != len(declared):
            dup = next(n for n in declared if declared.count(n) > 1)
            self.add(("dataset", "fields"), "S220", f"field '{dup}' is listed twice")
        rng = self.get(("dataset", "range"))
        if isinstance(rng, list) and len(rng) == 2 and all(_is_int(x) for x in rng) and (
            rng[0] < 0 or rng[0] >= rng[1]
        ):
            self.add(("dataset", "range"), "S222", f"range [{rng[0]}, {rng[1]}) is empty or negative",
                     "range: [start, end] takes rows start .. end-1; start must be >= 0 and below end.")
        ev = self.get(("dataset", "eval"))
        if isinstance(ev, dict) and self.whole("dataset"):
            chosen = [k for k in ("split", "count", "fraction") if ev.get(k) is not None]
            if len(chosen) != 1:
                self.add(("dataset", "eval"), "S223",
                         "dataset.eval needs exactly one of split, count or fraction"
                         + (f" (got {', '.join(chosen)})" if chosen else ""),
                         "split: a named split (e.g. test); count / fraction: rows carved from the training data.")
        source = self.text(("dataset", "source"))
        if source and self._path_ok(("dataset", "source")) and self.loaded.path.is_file():
            try:
                local = is_local(source, self.loaded.base_dir)
            except (OSError, ValueError):  # a name no file system takes (the path checks report it)
                local = False
            if local:
                self._local_data(source)

    def _local_data(self, source: str) -> None:
        """The local ``dataset.source`` as the loader (``runtime.data.sources``) takes it: a device, pipe or
        socket (S228), a missing file (S224), a file of a type it cannot read or a folder ``save_to_disk`` did not
        write (S229) is refused here, at the key, as the run and preflight would refuse it."""
        full = resolve(source, self.loaded.base_dir)
        kind = special_kind(full)
        if kind is not None:
            self.add(("dataset", "source"), "S228", f"{full} is {kind}, not a data file",
                     "Point dataset.source at a .jsonl, .json, .csv or .parquet file (a device or a pipe "
                     "never ends or blocks).")
            return
        try:
            exists, is_dir = full.exists(), full.is_dir()
        except OSError:
            exists = is_dir = False
        if not exists:
            self.add(("dataset", "source"), "S224", f"data file not found: {full}",
                     "Relative paths are relative to the spec file's folder.")
        elif is_dir:
            if not ((full / "dataset_info.json").is_file() and (full / "state.json").is_file()) \
                    and not (full / "dataset_dict.json").is_file():
                self.add(("dataset", "source"), "S229", f"{full} is a folder but not one written by "
                         "Dataset.save_to_disk", _DATA_TYPES_HINT)
        elif full.suffix.lower() not in LOCAL_DATA_SUFFIXES:
            self.add(("dataset", "source"), "S229", f"{full} is not a file type sailrl reads "
                     f"({full.suffix or 'no suffix'})", _DATA_TYPES_HINT)

    def usual_ranges(self) -> None:
        """A warning for each number outside its key's documented usual range (the spec stays valid)."""
        for path, info in self.loaded.nodes.items():
            node = info.node
            if not isinstance(node, ScalarNode) or node.style is not None or not path or not isinstance(
                    path[-1], str):
                continue
            value = resolve_plain(node.value)
            if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
                continue
            _, field_info = model_at(Spec, self.data, path)
            usual = usual_range_of(field_info)
            if usual is None:
                continue
            low, high, off = usual
            if off is not None and value == off:
                continue
            if not low <= value <= high:
                key = path[-1]
                self.warn(path, "W101",
                          f"{key} {node.value} is outside its usual range, {low:g} to {high:g}",
                          "Check for a typo (e.g. 1e5 for 1e-5, a missing minus in the exponent). If the value is "
                          "meant, keep it: this is a warning, and `sailrl validate` still passes. Usual ranges "
                          "are listed in docs/spec-reference.md.")


def _default(model: str, key: str) -> Any:
    return getattr(schema, model).model_fields[key].default


def _walk_dicts(value: Any, path: KeyPath):
    """Yield (path, dict) for ``value`` and every dict nested in it."""
    if isinstance(value, dict):
        yield path, value
        for k, v in value.items():
            yield from _walk_dicts(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk_dicts(v, (*path, i))


def _find_name(source: str, name: str) -> int:
    import re

    m = re.search(r"(?<![\w.])" + re.escape(name) + r"(?!\w)", source)
    return m.start() if m else 0


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


_BUILTIN_HINT = ("Built-in models (names starting sailrl/): " + ", ".join(BUILTIN_MODELS) + ". Otherwise name a "
                 "model folder or .gguf file next to the spec, or a Hugging Face hub id.")


def _rubric_words(rubric: str) -> str:
    """A rubric's words with each ``{{ ... }}`` as ``{}`` and runs of whitespace as one space (W113 compares them)."""
    return " ".join(re.sub(r"\{\{.*?\}\}", "{}", rubric, flags=re.DOTALL).split())
