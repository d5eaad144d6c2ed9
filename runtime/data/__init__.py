"""Dataset rows for a spec: load, select, map fields, check, shuffle and split (:func:`load_rows`).

Order of operations (each step that leaves no rows stops with a :class:`DatasetError` naming that step):

1. **load** the split (:mod:`.sources`): a local ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file, a folder
   written by ``save_to_disk``, or a Hugging Face dataset id. A malformed file is reported with its line.
   Rows are streamed and read only as far as the range / limit reaches; the run keeps two integers a row.
2. **range** ``[start, end)`` of the split, then **limit** (at most N rows) (:mod:`.rows`).
3. **map** dataset columns to the names the templates and reward rules use (``dataset.fields``); a missing
   column is an error naming the columns the dataset has and the closest one.
4. **check** every row (:mod:`.rows`): fields present and not null, templates render, the reward rules accept
   the reference, the prompt fits the context window (when a renderer is given). Failing rows are skipped
   and reported (:class:`SkippedRow`), never rendered with empty strings.
5. **shuffle** once with ``dataset.shuffle_seed`` (default ``model.seed``) (:mod:`.order`).
6. **eval split**: a named split of the same dataset (loaded and checked the same way), or the LAST ``count``
   / ``fraction`` of the shuffled rows carved off (disjoint from training rows by source index ``_index``);
   then ``eval.limit``.

Per-step data order for training is :func:`rows_for_step`: epoch-wise, deterministic in (seed, step), so a
resumed run sees exactly the rows an uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sailrl.runtime.data.base import DatasetError, DatasetRows, SkippedRow
from sailrl.runtime.data.order import batches, carve_eval, rows_for_step, shuffle_rows, shuffle_seed
from sailrl.runtime.data.readers import LOCAL_SUFFIXES
from sailrl.runtime.data.rows import (
    PromptLimit,
    RowChecker,
    check_required,
    field_mapping,
    required_fields,
    select_and_check,
    skip_summary,
    spec_mapping,
)
from sailrl.runtime.data.sources import RowList, load_split
from sailrl.runtime.prompts import PromptBuilder
from sailrl.spec.models import context_window as lookup
from sailrl.spec.schema import Spec

__all__ = [
    "LOCAL_SUFFIXES",
    "DatasetError",
    "DatasetRows",
    "RowList",
    "SkippedRow",
    "batches",
    "dataset_row",
    "field_mapping",
    "load_rows",
    "required_fields",
    "rows_for_step",
    "shuffle_seed",
]


def load_rows(spec: Spec, spec_dir: Path | str, reward_fn: Any = None, *,
              renderer_check: Callable[[dict], str | None] | None = None, renderer: Any = None,
              context_window: int | None = None, tool_specs: list[dict[str, Any]] | None = None) -> DatasetRows:
    """Load, map, check, shuffle and split the spec's dataset (see the module docstring for the order).

    spec: a :class:`~sailrl.spec.schema.Spec`. spec_dir: the folder of the spec file (relative paths start
    there). reward_fn: a ``RewardFunction`` whose ``reference_problem(row)`` rejects unusable references (rows
    skipped). renderer_check: ``row -> reason | None``, an extra per-row check. renderer: the run's
    ``tinker_cookbook`` renderer; with it, a row whose prompt is longer than ``context_window -
    sampling.max_tokens`` tokens is skipped (kind ``too_long``, e.g. "prompt is 5,000 tokens; the model's
    context is 4,096 and sampling.max_tokens is 1,024, ..."). context_window: the model's context in tokens
    (default: ``sailrl.spec.models.context_window(model.name, spec_dir)``; unknown: no length check). tool_specs:
    an episode's tools, whose declaration the renderer puts in every prompt (counted in the length check).

    Returns :class:`DatasetRows`. Raises :class:`DatasetError` for a missing/unreadable/malformed file, an
    unknown split or column, or when a step leaves no rows (the message names the step).
    """
    spec_dir = Path(spec_dir)
    ds = spec.dataset
    src, where = load_split(spec, spec_dir, ds.split, "dataset.split")
    need = required_fields(spec)
    warm = spec.training.warmup
    checker = RowChecker(
        need=need, builder=PromptBuilder(spec.prompt, None, field_names=_field_names(spec, src, need))
        if spec.prompt is not None else None,  # sft.messages_field: the rows hold whole conversations
        warm_template=warm.completion if warm is not None and warm.steps > 0 else None, reward_fn=reward_fn,
        limit=_prompt_limit(spec, spec_dir, renderer, context_window, tool_specs), renderer_check=renderer_check)

    notes: list[str] = []
    try:
        train, skipped, selected = select_and_check(src, ds.split, rng=ds.range, limit=ds.limit,
                                                    key_prefix="dataset", notes=notes, mapping=spec_mapping(spec),
                                                    checker=checker, split=ds.split)
    except DatasetError as exc:
        if src.total == 0 and exc.key == "dataset.split":
            raise DatasetError(f"the {ds.split} split is empty: {where} has no rows", key="dataset.source") from None
        raise
    columns = list(src.columns)
    mapping = field_mapping(spec, columns)  # raises for a mapped column the rows read do not have
    check_required(need, mapping, columns, spec)
    if not train:
        raise DatasetError(f"every one of the {selected} selected rows was skipped ({skip_summary(skipped)}); "
                           f"fix the data or the fields the prompt and reward rules use", key="dataset.fields")
    if ds.shuffle:
        shuffle_rows(train, shuffle_seed(spec))

    eval_rows: Sequence[dict] = []
    ev = ds.eval
    if ev is not None:
        if ev.split is not None:
            if ev.split == ds.split:
                raise DatasetError(f"eval.split {ev.split!r} is the training split itself; name another split, or "
                                   f"carve rows with eval.count / eval.fraction", key="dataset.eval.split")
            esrc, _ = load_split(spec, spec_dir, ev.split, "dataset.eval.split")
            eval_checker = RowChecker(need=need, builder=checker.builder, reward_fn=reward_fn, limit=checker.limit,
                                      renderer_check=renderer_check)
            eval_rows, eskipped, _ = select_and_check(esrc, ev.split, rng=None, limit=ev.limit,
                                                      key_prefix="dataset.eval", notes=notes,
                                                      mapping=spec_mapping(spec), checker=eval_checker,
                                                      split=ev.split)
            field_mapping(spec, list(esrc.columns))
            skipped.extend(eskipped)
            if not eval_rows:
                raise DatasetError(f"every row of the eval split {ev.split!r} was skipped "
                                   f"({skip_summary(eskipped)})", key="dataset.eval.split")
        elif ev.count is not None or ev.fraction is not None:
            train, eval_rows = carve_eval(train, count=ev.count, fraction=ev.fraction)
        if ev.limit is not None:
            eval_rows = eval_rows[: int(ev.limit)]
    return DatasetRows(train=train, eval=eval_rows, skipped=skipped, columns=columns, source=where,
                       loaded=src.total, selected=selected, notes=notes)


def dataset_row(spec: Spec, spec_dir: Path | str, n: int) -> tuple[dict[str, Any], str | None]:
    """Row ``n`` (its index in the split) of the spec's dataset, as training selects it, and a note when training
    skips that row (else None); ``LookupError`` (one line) when the data cannot be loaded or the row is not
    selected (``sailrl rewards --row``, ``sailrl sample --row``)."""
    try:
        rows = load_rows(spec, spec_dir)
    except DatasetError as exc:
        raise LookupError(f"cannot load the dataset: {exc}") from None
    ev = spec.dataset.eval
    carved = rows.eval if ev is not None and ev.split is None else []  # eval rows of the same split
    for row in [*rows.train, *carved]:
        if row.get("_index") == n:
            return {k: v for k, v in row.items() if k != "_index"}, None
    for skipped in rows.skipped:
        if skipped.index == n and skipped.split == spec.dataset.split:
            return ({k: v for k, v in skipped.row.items() if k != "_index"},
                    f"row {n} is skipped in training: {skipped.reason}")
    have = sorted(r["_index"] for r in [*rows.train, *carved])
    span = f"{have[0]}..{have[-1]}" if have else "none"
    raise LookupError(f"row {n} is not among the selected rows of split '{spec.dataset.split}' "
                      f"(rows {span}; dataset.range / dataset.limit select them)")


def _field_names(spec: Spec, src: Any, need: Any) -> list[str] | None:
    """The field names templates may use: the declared fields, or (every column under its own name) the
    source's columns when known before reading, else None (templates are checked against the rows read)."""
    mapping = spec_mapping(spec)
    if mapping is not None:
        return list(mapping)
    return list(src.columns) if src.columns else None


def _prompt_limit(spec: Spec, spec_dir: Path, renderer: Any, context_window: int | None,
                  tool_specs: list[dict[str, Any]] | None = None) -> PromptLimit | None:
    if renderer is None:
        return None
    if context_window is None:
        context_window = lookup(spec.model.name, spec_dir)[0]
    if context_window is None:
        return None
    scores_sequences = spec.method == "distill" or spec.training.kl_penalty_coef > 0  # teacher, KL: their logprobs
    return PromptLimit(renderer=renderer, context_window=int(context_window),
                       max_tokens=int(spec.sampling.max_tokens), tool_specs=tool_specs, spare=int(scores_sequences))
