"""Semantic checks of a spec: what the schema alone cannot say, each error located and in plain words.

The checks read the loaded YAML (``LoadedSpec.data`` and its node locations), not the validated model, so
they also run on a file the schema rejected and every problem of a file is reported together. A value of
the wrong type is skipped here (the schema already reports it).

Checked: regular expressions compile (with the ``regex`` module the runtime uses) and carry no control
characters from double-quoted escapes; Jinja2 templates parse and use only declared dataset fields; the
renderer name and LoRA rank; group_size >= 2; num_substeps divides groups_per_step; the Sail completion
window; resume_from is a save_state checkpoint; reference fields are declared dataset fields; local dataset
files exist. (Rule-level checks -- unique names, extractor needs, weights vs scores, clip order -- are model
validators in ``sailrl.spec.rewards`` and reach the user through the schema errors.) Then the spec's worked reward
``examples`` are scored (``sailrl.compiler.reward_checks``) when the rest is valid.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from yaml.nodes import ScalarNode

from sailrl.spec.errors import SpecError
from sailrl.spec.loader import KeyPath, LoadedSpec, resolve_plain
from sailrl.spec.messages import did_you_mean

TEMPLATE_FIELDS: tuple[KeyPath, ...] = (("prompt", "system"), ("prompt", "user"), ("training", "warmup", "completion"))
RETIRED_WINDOWS = {"priority": "retired", "15m": "retired", "asap": "not supported by sail.SailTokenCompleter"}
COMPLETION_WINDOWS = ("balanced", "flex")
LOCAL_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
# Characters a double-quoted YAML escape produces that nobody means to type in a pattern or template.
_CONTROL_ESCAPES = {"\x08": "\\b", "\x07": "\\a", "\x0c": "\\f", "\x0b": "\\v", "\x1b": "\\e", "\x00": "\\0"}
_REGEX_FLAGS = {"DOTALL", "IGNORECASE", "MULTILINE", "VERBOSE", "ASCII"}


def check_spec(loaded: LoadedSpec) -> list[SpecError]:
    """Every semantic problem of ``loaded`` (possibly rejected by the schema; ``loaded.spec`` may be None).

    Returns a list of SpecError (empty when the spec is sound); never raises for a user error.
    """
    c = _Checker(loaded)
    c.control_characters()
    c.templates()
    c.regexes()
    c.rules()
    c.model()
    c.training()
    c.sampling()
    c.dataset()
    errors = c.errors
    if not errors and loaded.spec is not None:
        errors += _reward_examples(loaded)
    return errors


def _reward_examples(loaded: LoadedSpec) -> list[SpecError]:
    try:
        module = importlib.import_module("sailrl.compiler.reward_checks")
    except ModuleNotFoundError as exc:
        if exc.name != "sailrl.compiler.reward_checks":
            raise
        return []
    return list(module.check_reward_examples(loaded))


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

    def add(self, path: KeyPath, message: str, hint: str | None = None, **kw: Any) -> SpecError:
        err = self.loaded.error(path, message, hint, **kw)
        self.errors.append(err)
        return err

    def at_offset(self, path: KeyPath, offset: int, message: str, hint: str | None = None) -> None:
        """An error pointing at character ``offset`` of the string at ``path`` (block scalars included)."""
        err = self.add(path, message, hint, offset=offset)
        info = self.loaded.nodes.get(path)
        if info is None or not isinstance(info.node, ScalarNode) or info.node.style != "|":
            return
        value = info.node.value
        line_in_value = value.count("\n", 0, offset)
        col_in_line = offset - (value.rfind("\n", 0, offset) + 1)
        line = info.node.start_mark.line + 2 + line_in_value  # content starts on the line after '|'
        src = self.loaded.text.splitlines()
        if 1 <= line <= len(src):
            indent = len(src[line - 1]) - len(src[line - 1].lstrip(" "))
            err.line, err.column, err.end_column = line, indent + col_in_line + 1, None

    def declared_fields(self) -> list[str] | None:
        """Names the templates and rules may use (dataset.fields keys or items), or None when not declared."""
        fields = self.get(("dataset", "fields"))
        if isinstance(fields, dict):
            return [str(k) for k in fields]
        if isinstance(fields, list):
            return [str(self.text(("dataset", "fields", i)) or v) for i, v in enumerate(fields)]
        return None

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
                path,
                f"inside double quotes YAML turned '{esc}' into a control character (U+{ord(ch):04X}), "
                f"not a backslash followed by '{esc[1]}'",
                "Use single quotes, where a backslash stays as typed: e.g. pattern: '\\b\\d+\\b' or "
                "user: '... \\boxed{}'.",
            )

    def templates(self) -> None:
        from jinja2 import TemplateSyntaxError, meta, nodes

        from sailrl.runtime.prompts import make_environment

        env = make_environment()  # the same environment the runtime renders with
        declared = self.declared_fields()
        for path in TEMPLATE_FIELDS:
            source = self.text(path)
            if source is None:
                continue
            try:
                ast = env.parse(source)
            except TemplateSyntaxError as exc:
                lines = source.split("\n")
                lineno = max(1, min(exc.lineno or 1, len(lines)))
                offset = sum(len(x) + 1 for x in lines[: lineno - 1])
                self.at_offset(
                    path, offset, f"this Jinja template does not parse: {exc.message}",
                    "Template syntax: {{ field }} inserts a dataset field; {% if ... %}...{% endif %} for logic. "
                    "Check that every {{ has a matching }} and every {% block %} is closed.",
                )
                continue
            lookups = [n for n in ast.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends))]
            if lookups:
                self.at_offset(
                    path, 0, "a prompt template cannot include, import or extend other templates",
                    "Write the whole text in the template; use {{ field }} for dataset values.",
                )
                continue
            try:
                undeclared = meta.find_undeclared_variables(ast)
            except TemplateSyntaxError as exc:  # e.g. an unknown filter: found when the template is compiled
                self.at_offset(path, 0, f"this Jinja template cannot be used: {exc.message}",
                               "Filters that exist include upper, lower, trim, replace, default and round.")
                continue
            if declared is None:
                continue
            for name in sorted(undeclared):
                if name in declared or name in env.globals:
                    continue
                guess = did_you_mean(name, declared)
                message = f"the template uses '{name}', which is not a dataset field" + (
                    f" -- did you mean '{guess}'?" if guess else "")
                offset = _find_name(source, name)
                self.at_offset(path, offset, message,
                               f"Declared fields (dataset.fields): {', '.join(declared) or '(none)'}.")

    def regexes(self) -> None:
        """Every `pattern` under reward: compiles with `regex`; extractor patterns have a capture group."""
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
            self._compile(p_path, pattern, [f for f in flags if f in _REGEX_FLAGS])

    def _compile(self, path: KeyPath, pattern: str, flags: list[str]) -> Any:
        import regex

        value = 0
        for f in flags:
            value |= getattr(regex, f)
        try:
            return regex.compile(pattern, value)
        except regex.error as exc:
            pos = exc.pos if isinstance(exc.pos, int) else None
            where = f" at position {pos}" if pos is not None else ""
            hint = None
            if pos is not None:
                hint = f"In the pattern:\n{pattern}\n{' ' * pos}^ {exc.msg}"
            info = self.loaded.nodes.get(path)
            if "\\" in pattern and info is not None and getattr(info.node, "style", None) == '"':
                tip = "Write patterns in single quotes: inside double quotes YAML interprets backslashes."
                hint = f"{hint}\n{tip}" if hint else tip
            if pos is not None:
                self.at_offset(path, pos, f"this regular expression does not compile: {exc.msg}{where}", hint)
            else:
                self.add(path, f"this regular expression does not compile: {exc.msg}", hint)
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
                self.add((*path, *at), f"two rules are named '{name}' (the first is at line {line}): give each "
                         "rule its own `name`; it is the metric key reward/<name>")
            elif name is not None:
                first_with_name[name] = i
            for sub_path, _owner in _walk_dicts(rule, path):
                if sub_path[-1] == "reference" and declared is not None:
                    ref_field = self.text((*sub_path, "field"))
                    if ref_field is not None and ref_field not in declared:
                        self._unknown_field((*sub_path, "field"), ref_field, declared)

    def _unknown_field(self, path: KeyPath, name: str, declared: list[str]) -> None:
        guess = did_you_mean(name, declared)
        self.add(path, f"'{name}' is not a dataset field" + (f" -- did you mean '{guess}'?" if guess else ""),
                 f"Declared fields (dataset.fields): {', '.join(declared) or '(none)'}.")

    def model(self) -> None:
        from sailrl.spec.renderers import KNOWN_RENDERERS, UnknownModelError, default_renderer

        rank = self.integer(("model", "lora_rank"))
        if rank is not None and (rank < 1 or rank & (rank - 1)):
            self.add(("model", "lora_rank"), f"LoRA rank must be a positive power of two, got {rank}",
                     "Use 1, 2, 4, 8, 16, 32 (the Tinker default), 64, 128, ... For RL small ranks are enough.")
        renderer = self.text(("model", "renderer"))
        if renderer is not None:
            if renderer not in KNOWN_RENDERERS:
                guess = did_you_mean(renderer, KNOWN_RENDERERS)
                self.add(("model", "renderer"), f"unknown renderer '{renderer}'"
                         + (f" -- did you mean '{guess}'?" if guess else ""),
                         "Known renderers: " + ", ".join(KNOWN_RENDERERS) + ".")
            return
        info = self.loaded.nodes.get(("model", "name"))
        if info is not None and not isinstance(info.node, ScalarNode):
            return  # the schema reports the wrong type
        from sailrl.spec.schema import ModelSpec

        name = self.text(("model", "name")) or ModelSpec.model_fields["name"].default
        try:
            default_renderer(name, self.loaded.base_dir)
        except UnknownModelError:
            self.add(("model", "name"), f"no renderer is known for model '{name}'; set model.renderer",
                         "Add `renderer:` under model:, e.g. qwen3, llama3, kimi_k26 or role_colon. Known: "
                         + ", ".join(KNOWN_RENDERERS) + ".")

    def training(self) -> None:
        group = self.integer(("training", "group_size"))
        if group is not None and group < 2:
            self.add(("training", "group_size"), f"group_size must be at least 2, got {group}",
                     "Advantages are rewards minus the mean of their group; with one rollout per group every "
                     "advantage is zero, so nothing trains. Use 4 or more (the Sail guide uses 4).")
        groups = self.integer(("training", "groups_per_step"))
        sub = self.integer(("training", "num_substeps"))
        if groups and sub and groups > 0 and sub > 0 and groups % sub:
            self.add(("training", "num_substeps"),
                     f"num_substeps ({sub}) must divide groups_per_step ({groups}) so every substep gets "
                     "the same number of groups",
                     f"Divisors of {groups}: {', '.join(str(d) for d in range(1, groups + 1) if groups % d == 0)}.")
        resume = self.text(("training", "resume_from"))
        if resume is not None and "sampler_weights/" in resume:
            self.add(("training", "resume_from"),
                     "this is a sampler checkpoint (sampler_weights/): it holds weights for sampling only, "
                     "so a run cannot resume from it",
                     "Resumable checkpoints come from save_state and have weights/ in their path "
                     "(tinker://.../weights/...). To start from these weights with a fresh optimizer, "
                     "use training.init_from instead.")

    def sampling(self) -> None:
        window = self.text(("sampling", "completion_window"))
        if window is None or window in COMPLETION_WINDOWS:
            return
        why = RETIRED_WINDOWS.get(window)
        if why:
            self.add(("sampling", "completion_window"),
                     f"completion_window '{window}' is {why} in the current sail SDK; use 'balanced' or 'flex'",
                     "The Sail guide's `completion_window: priority` predates the SDK change. "
                     "Write `completion_window: balanced` (the default) or `flex`.")
        else:
            guess = did_you_mean(window, COMPLETION_WINDOWS)
            self.add(("sampling", "completion_window"),
                     f"completion_window must be 'balanced' or 'flex', got '{window}'"
                     + (f" -- did you mean '{guess}'?" if guess else ""))

    def dataset(self) -> None:
        declared = self.declared_fields()
        ref = self.text(("prompt", "reference_field"))
        if declared is not None and ref is not None and ref not in declared:
            self._unknown_field(("prompt", "reference_field"), ref, declared)
        if declared is not None and len(set(declared)) != len(declared):
            dup = next(n for n in declared if declared.count(n) > 1)
            self.add(("dataset", "fields"), f"field '{dup}' is listed twice")
        rng = self.get(("dataset", "range"))
        if isinstance(rng, list) and len(rng) == 2 and all(_is_int(x) for x in rng) and (
            rng[0] < 0 or rng[0] >= rng[1]
        ):
            self.add(("dataset", "range"), f"range [{rng[0]}, {rng[1]}) is empty or negative",
                     "range: [start, end] takes rows start .. end-1; start must be >= 0 and below end.")
        ev = self.get(("dataset", "eval"))
        if isinstance(ev, dict):
            chosen = [k for k in ("split", "count", "fraction") if ev.get(k) is not None]
            if len(chosen) != 1:
                self.add(("dataset", "eval"),
                         "dataset.eval needs exactly one of split, count or fraction"
                         + (f" (got {', '.join(chosen)})" if chosen else ""),
                         "split: a named split (e.g. test); count / fraction: rows carved from the training data.")
        source = self.text(("dataset", "source"))
        if source and source.lower().endswith(LOCAL_DATA_SUFFIXES) and self.loaded.path.is_file():
            p = Path(source).expanduser()
            full = p if p.is_absolute() else self.loaded.base_dir / p
            if not full.exists():
                self.add(("dataset", "source"), f"data file not found: {full}",
                         "Relative paths are relative to the spec file's folder.")


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
