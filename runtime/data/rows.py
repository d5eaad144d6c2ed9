"""Rows of a split -> the rows a run can use: range / limit, field mapping, and a check of every row.

A row that cannot be used is skipped with its index and a reason (:class:`~sailrl.runtime.data.base.SkippedRow`),
never rendered with empty strings. The reasons, by ``kind`` (:data:`SKIP_KINDS`), in the order they are checked:

- ``missing_field`` / ``null_field``: a field a template or reward rule uses is absent or null;
- ``template``: the prompt (or the warm-up completion) template fails on the row;
- ``reference``: the reward rules cannot read the row's reference answer (``reward_fn.reference_problem``);
- ``too_long``: the rendered prompt plus ``sampling.max_tokens`` does not fit the model's context window
  (measured only when the caller gives a renderer and the context window);
- ``renderer``: an extra check the caller passes (``renderer_check``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sailrl.runtime.data.base import DatasetError, SkippedRow
from sailrl.runtime.data.sources import RowList, RowSource
from sailrl.runtime.prompts import PromptError, template_variables, with_tool_declaration
from sailrl.spec.messages import did_you_mean_text
from sailrl.spec.schema import Spec

__all__ = [
    "SKIP_KINDS",
    "PromptLimit",
    "RowChecker",
    "check_required",
    "field_mapping",
    "group_by_reason",
    "required_fields",
    "select_and_check",
    "skip_summary",
    "spec_mapping",
]

SKIP_KINDS = ("missing_field", "null_field", "template", "reference", "too_long", "renderer")
SKIPPED_ROWS_KEPT = 1000  # skipped rows whose contents are kept (for preflight and `sailrl rewards --row`)


def field_mapping(spec: Spec, columns: Sequence[str]) -> dict[str, str]:
    """``{field name: dataset column}`` from ``dataset.fields`` (None: every column under its own name).

    Raises :class:`DatasetError` (key ``dataset.fields...``) when a mapped column is not in ``columns``, naming
    the columns the dataset has and the closest one.
    """
    fields = spec.dataset.fields
    if fields is None:
        mapping = {c: c for c in columns}
    elif isinstance(fields, list):
        mapping = {f: f for f in fields}
    else:
        mapping = dict(fields)
    missing = [(i, name, col) for i, (name, col) in enumerate(mapping.items()) if col not in columns]
    if missing:
        i, name, col = missing[0]
        which = f"field {name!r} maps to column {col!r}" if name != col else f"column {col!r}"
        key = ("dataset.source" if fields is None else
               f"dataset.fields.{i}" if isinstance(fields, list) else f"dataset.fields.{name}")
        raise DatasetError(
            f"{which}, but the dataset has no such column{did_you_mean_text(col, columns) or '.'} The dataset's "
            "columns are: "
            f"{', '.join(columns) or '(none)'}",
            key=key,
        )
    return mapping


def required_fields(spec: Spec) -> dict[str, str]:
    """``{field name: what needs it}``: template variables, reference fields of answer rules, warm-up template."""
    need: dict[str, str] = {}
    if spec.prompt is not None and spec.prompt.system:
        for v in sorted(template_variables(spec.prompt.system)):
            need.setdefault(v, "prompt.system")
    for v in sorted(template_variables(spec.prompt.user)) if spec.prompt is not None else []:
        need.setdefault(v, "prompt.user")
    for i, rule in enumerate(spec.reward.rules if spec.reward is not None else []):
        if getattr(rule, "kind", None) == "answer":
            ref = rule.reference.field or (spec.prompt.reference_field if spec.prompt is not None else "answer")
            need.setdefault(ref, f"reward.rules.{i} ({rule.name}) reference")
    warm = spec.training.warmup
    if warm is not None and warm.steps > 0:
        for v in sorted(template_variables(warm.completion)):
            need.setdefault(v, "training.warmup.completion")
    if spec.method == "dpo" and spec.dpo is not None:  # the pair's two completions
        need.setdefault(spec.dpo.chosen_field, "dpo.chosen_field")
        need.setdefault(spec.dpo.rejected_field, "dpo.rejected_field")
    return need


def check_required(need: Mapping[str, str], mapping: Mapping[str, str], columns: Sequence[str], spec: Spec) -> None:
    """Raise :class:`DatasetError` (key ``dataset.fields``) when a field in ``need`` is not mapped."""
    names = list(mapping)
    for name, user in need.items():
        if name in mapping:
            continue
        if spec.dataset.fields is None:
            raise DatasetError(
                f"{user} uses field {name!r}, but the dataset has no column {name!r}"
                f"{did_you_mean_text(name, columns) or '.'} The "
                f"dataset's columns are: {', '.join(columns) or '(none)'}. Map it under dataset.fields "
                f"(e.g. {name}: <column>)", key="dataset.fields")
        raise DatasetError(
            f"{user} uses field {name!r}, but dataset.fields does not declare it"
            f"{did_you_mean_text(name, names) or '.'} Declared "
            f"fields: {', '.join(names) or '(none)'}; the dataset's columns are: {', '.join(columns)}",
            key="dataset.fields")


@dataclass
class PromptLimit:
    """The prompt length a row may have: ``context_window - max_tokens - spare`` tokens.

    renderer: the ``tinker_cookbook`` renderer that turns the row's messages into tokens. context_window: the
    model's context (tokens). max_tokens: ``sampling.max_tokens``. tool_specs: an episode's tools; their
    declaration is part of the prompt (:func:`~sailrl.runtime.prompts.with_tool_declaration`), so it is counted.
    spare: 1 when the run scores each whole sequence, prompt and completion (the teacher of ``method: distill``,
    the base model of ``training.kl_penalty_coef``): ``compute_logprobs`` samples one token after the sequence,
    so the sequence must leave a token of the context free.

    :meth:`tokens` renders a prompt to tokens only when a cheap bound says it might not fit: a token stands for
    at least one byte of text, or for a word boundary (a sentencepiece ``▁``), so a message of ``b`` UTF-8 bytes
    is at most ``2 b`` tokens; the conversation adds the renderer's own tokens, measured once on the same
    roles with empty messages (plus :attr:`SLACK`).
    """

    renderer: Any
    context_window: int
    max_tokens: int
    tool_specs: list[dict[str, Any]] | None = None
    spare: int = 0
    _overhead: dict[tuple[str, ...], int] = field(default_factory=dict, repr=False)

    SLACK = 16

    @property
    def max_prompt_tokens(self) -> int:
        return self.context_window - self.max_tokens - self.spare

    def tokens(self, messages: list[dict[str, str]]) -> int | None:
        """The prompt's length in tokens when it might exceed :attr:`max_prompt_tokens`; None when it surely fits.

        A prompt far longer than the context is not tokenised whole (:meth:`measure`): the number is then a
        lower bound, already over the limit."""
        measured = self.measure(messages)
        return None if measured is None else measured[0]

    def measure(self, messages: list[dict[str, str]]) -> tuple[int, bool] | None:
        """``(tokens, exact)`` when the prompt might exceed :attr:`max_prompt_tokens`, None when it surely fits.

        When the messages' text is long, prefixes of it are tokenised first (``PREFIX_CHARS_PER_TOKEN`` x the
        limit characters, then 4 times more each round): once a prefix alone is :attr:`MARGIN` tokens over the
        limit the whole prompt is too long (``exact`` False, ``tokens`` a lower bound), so the work is bounded by
        the context's size, not the prompt's (a template that renders 400 kB a row costs one short tokenisation).
        """
        declared = functools.partial(with_tool_declaration, self.renderer, tool_specs=self.tool_specs)
        roles = tuple(m["role"] for m in messages)
        if roles not in self._overhead:
            empty = [{"role": r, "content": ""} for r in roles]
            self._overhead[roles] = self.renderer.build_generation_prompt(declared(empty)).length + self.SLACK
        content_bytes = sum(len(m["content"].encode("utf-8")) for m in messages)
        if self._overhead[roles] + 2 * content_bytes <= self.max_prompt_tokens:
            return None
        longest = max(len(m["content"]) for m in messages)
        cut = self.PREFIX_CHARS_PER_TOKEN * (max(self.max_prompt_tokens, 0) + self.MARGIN)
        while cut < longest:
            prefix = [{**m, "content": m["content"][:cut]} for m in messages]
            n = int(self.renderer.build_generation_prompt(declared(prefix)).length)
            if n > self.max_prompt_tokens + self.MARGIN:
                return n - self.MARGIN, False
            cut *= 4
        return int(self.renderer.build_generation_prompt(declared(messages)).length), True

    MARGIN = 64  # tokens a prefix must be over the limit by (a cut inside a word may split a token or two)
    PREFIX_CHARS_PER_TOKEN = 4

    def reason(self, n: int, exact: bool = True) -> str:
        """E.g. "prompt is 5,000 tokens; the model's context is 4,096 and sampling.max_tokens is 1,024"."""
        fit = self.max_prompt_tokens
        room = (f"so a prompt may have at most {fit:,}" if fit > 0 else
                "so no prompt fits; lower sampling.max_tokens")
        size = f"{n:,} tokens" if exact else f"more than {n:,} tokens (its beginning alone)"
        spare = ", and scoring the whole sequence needs 1 token more" if self.spare else ""
        return (f"prompt is {size}; the model's context is {self.context_window:,} and sampling.max_tokens "
                f"is {self.max_tokens:,}{spare}, {room}")


@dataclass
class RowChecker:
    """Checks one mapped row (see the module docstring for the order).

    need: :func:`required_fields`. builder: a ``PromptBuilder`` (its renderer may be None), or None for a spec
    without a prompt (``sft.messages_field``: the row holds its conversation). warm_template: the warm-up
    completion template to render, or None. reward_fn: an object with ``reference_problem(row)``, or
    None. limit: a :class:`PromptLimit`, or None. renderer_check: ``row -> reason | None``, or None.
    """

    need: Mapping[str, str]
    builder: Any
    warm_template: str | None = None
    reward_fn: Any = None
    limit: PromptLimit | None = None
    renderer_check: Callable[[dict], str | None] | None = None

    def problem(self, row: dict) -> tuple[str, str] | None:
        """``(kind, reason)`` when ``row`` cannot be used, else None."""
        for name, user in self.need.items():
            if name not in row:
                return "missing_field", f"field {name!r} is missing (used by {user})"
            if row[name] is None:
                return "null_field", f"field {name!r} is empty (null) (used by {user})"
        try:
            messages = self.builder.messages(row) if self.builder is not None else []
            if self.warm_template is not None:
                self.builder.completion(row, self.warm_template)
        except PromptError as exc:
            return "template", str(exc).removeprefix(f"row {row.get('_index')}: ")
        if self.reward_fn is not None:
            problem = self.reward_fn.reference_problem(row)
            if problem:
                return "reference", f"reference rejected by the reward rules: {problem}"
        if self.limit is not None:
            measured = self.limit.measure(messages)
            if measured is not None and measured[0] > self.limit.max_prompt_tokens:
                return "too_long", self.limit.reason(*measured)
        if self.renderer_check is not None:
            problem = self.renderer_check(row)
            if problem:
                return "renderer", problem
        return None


def spec_mapping(spec: Spec) -> dict[str, str] | None:
    """``{field name: column}`` as ``dataset.fields`` declares it; None: every column under its own name."""
    fields = spec.dataset.fields
    if fields is None:
        return None
    return {f: f for f in fields} if isinstance(fields, list) else dict(fields)


def select_and_check(src: RowSource, split_label: str, *, rng: tuple[int, int] | None, limit: int | None,
                     key_prefix: str, notes: list[str], mapping: Mapping[str, str] | None, checker: RowChecker,
                     split: str) -> tuple[RowList, list[SkippedRow], int]:
    """``(kept rows, skipped rows, rows selected)`` of ``range`` then ``limit``: each row read once, mapped to the
    spec's field names plus ``_index`` and checked; reading stops at the end of the selection. A range clipped
    to the data adds a note.

    At most :data:`SKIPPED_ROWS_KEPT` skipped rows keep their contents (the rest keep index and reason).
    Raises :class:`DatasetError` for an empty split or a range that selects nothing.
    """
    start, stop = 0, None
    if rng is not None:
        start, stop = int(rng[0]), int(rng[1])
        if start < 0 or stop <= start:
            raise DatasetError(f"{key_prefix}.range [{start}, {stop}) is not a valid range: need 0 <= start < end",
                               key=f"{key_prefix}.range")
    end = stop
    if limit is not None:
        end = start + int(limit) if end is None else min(end, start + int(limit))
    kept = RowList(src, mapping)
    skipped: list[SkippedRow] = []
    selected = 0
    for idx, key, raw in src.scan(start, end):
        selected += 1
        row = kept.map(raw, idx)
        problem = checker.problem(row)
        if problem is None:
            kept.append(key, idx)
        else:
            kind, reason = problem
            skipped.append(SkippedRow(index=idx, reason=reason, row=row if len(skipped) < SKIPPED_ROWS_KEPT else {},
                                      kind=kind, split=split))
    n = src.total
    if n == 0:
        raise DatasetError(f"the {split_label} split is empty: it has no rows", key=f"{key_prefix}.split")
    if n is not None and rng is not None:
        if start >= n:
            raise DatasetError(f"{key_prefix}.range [{start}, {stop}) selects no rows: the {split_label} split has "
                               f"only {n} rows (indices 0..{n - 1})", key=f"{key_prefix}.range")
        if stop is not None and stop > n:
            notes.append(f"{key_prefix}.range ends at {stop} but the {split_label} split has {n} rows; "
                         f"using rows {start}..{n - 1}")
    return kept, skipped, selected


def group_by_reason(skipped: Sequence[SkippedRow]) -> list[tuple[str, list[SkippedRow]]]:
    """``[(reason, rows)]``, the most frequent reason first.

    Rows skipped as ``too_long`` (whose reasons differ only in their token counts) form one group, labelled
    with the first such row's reason after "e.g. row N:".
    """
    groups: dict[str, list[SkippedRow]] = {}
    labels: dict[str, str] = {}
    for s in skipped:
        key = "\0too_long" if s.kind == "too_long" else s.reason
        labels.setdefault(key, f"prompt too long for the model's context (e.g. row {s.index}: {s.reason})"
                          if s.kind == "too_long" else s.reason)
        groups.setdefault(key, []).append(s)
    return [(labels[k], rows) for k, rows in sorted(groups.items(), key=lambda kv: -len(kv[1]))]


def skip_summary(skipped: Sequence[SkippedRow], limit: int = 3) -> str:
    """``"3 x reason; 1 x other reason"``: the most frequent reasons first, at most ``limit`` of them."""
    groups = group_by_reason(skipped)
    parts = [f"{len(rows)} x {reason}" for reason, rows in groups[:limit]]
    more = "" if len(groups) <= limit else f"; and {len(groups) - limit} more reasons"
    return "; ".join(parts) + more
