"""The order of rows: the load-time shuffle, the evaluation rows carved off, and the rows of each step.

Everything here is deterministic in its seed, so a resumed run sees exactly the rows an uninterrupted run
would: :func:`rows_for_step` depends only on (rows, step, groups_per_step, seed).
"""

from __future__ import annotations

import functools
import random
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

from sailrl.runtime.data.base import DatasetError
from sailrl.spec.schema import Spec

__all__ = ["WARMUP_SEED_OFFSET", "batches", "carve_eval", "order_index", "rows_for_step", "shuffle_rows",
           "shuffle_seed"]

#: Added to the data seed for the supervised warm-up's own row order (RL's order is the same with or without one).
WARMUP_SEED_OFFSET = 7919


def shuffle_seed(spec: Spec) -> int:
    """The data seed: ``dataset.shuffle_seed``, else ``model.seed``."""
    s = spec.dataset.shuffle_seed
    return int(spec.model.seed if s is None else s)


def shuffle_rows(rows: Any, seed: int) -> None:
    """Shuffle ``rows`` (a list, or a :class:`~sailrl.runtime.data.sources.RowList`) in place once with
    ``random.Random(seed).shuffle`` (a ``RowList`` is permuted as a list of its length would be)."""
    if hasattr(rows, "shuffle"):
        rows.shuffle(random.Random(seed))
    else:
        random.Random(seed).shuffle(rows)


def carve_eval(train: Sequence[dict], *, count: int | None,
               fraction: float | None) -> tuple[Sequence[dict], Sequence[dict]]:
    """``(train, eval)``: the LAST ``count`` rows (or ``round(fraction * len(train))``, at least 1) become eval.

    Raises :class:`DatasetError` (key ``dataset.eval``) when that would leave no training rows.
    """
    n = len(train)
    k = int(count) if count is not None else max(1, round(float(fraction or 0.0) * n))
    if k >= n:
        what = f"eval.count {count}" if count is not None else f"eval.fraction {fraction}"
        raise DatasetError(f"{what} would carve {k} evaluation rows off {n} usable training rows, leaving "
                           f"none to train on; lower it", key="dataset.eval")
    return train[: n - k], train[n - k:]


@functools.lru_cache(maxsize=4)
def _epoch_order(n: int, seed: int, epoch: int) -> array | None:
    """The visiting order of epoch ``epoch`` (> 0) over ``n`` rows; None for epoch 0, which keeps the load-time
    order (already shuffled with the seed, or the file order). Cached: a step asks for it again."""
    if epoch == 0:
        return None
    order = list(range(n))
    random.Random(f"sailrl-epoch:{seed}:{epoch}").shuffle(order)
    return array("q", order)


def order_index(n: int, position: int, seed: int, *, reshuffle: bool = True) -> int:
    """The index (into ``n`` training rows) at ``position`` (from 0) of the data order: the row that
    :func:`rows_for_step` draws there. Positions run through the rows epoch after epoch, as there."""
    epoch, offset = divmod(position, n)
    order = _epoch_order(n, seed, epoch if reshuffle else 0)
    return offset if order is None else order[offset]


def rows_for_step(rows: Sequence[dict], step: int, groups_per_step: int, seed: int, *,
                  reshuffle: bool = True) -> list[dict]:
    """The ``groups_per_step`` rows (one per group) of RL step ``step`` (0-based).

    Positions ``step * groups_per_step ...`` run through the rows epoch after epoch; epoch ``e`` visits the
    rows in the load-time order when ``e == 0`` and in a permutation seeded by (``seed``, ``e``) afterwards
    (``reshuffle=False``: the load-time order every epoch). A step that straddles an epoch boundary takes the
    end of one epoch and the start of the next. Raises :class:`DatasetError` for no rows, ``ValueError`` for
    ``groups_per_step <= 0`` or ``step < 0``.
    """
    n = len(rows)
    if n == 0:
        raise DatasetError("no training rows to draw a step from")
    if groups_per_step <= 0 or step < 0:
        raise ValueError("need groups_per_step > 0 and step >= 0")
    out: list[dict] = []
    orders: dict[int, array | None] = {}
    for pos in range(step * groups_per_step, (step + 1) * groups_per_step):
        epoch, offset = divmod(pos, n)
        if epoch not in orders:
            orders[epoch] = _epoch_order(n, seed, epoch if reshuffle else 0)
        order = orders[epoch]
        out.append(rows[offset if order is None else order[offset]])
    return out


def batches(rows: Sequence[dict], groups_per_step: int, seed: int, start_step: int = 0, *,
            reshuffle: bool = True) -> Iterator[tuple[int, list[dict]]]:
    """Endless ``(step, rows_for_step(rows, step, ...))`` from ``start_step`` on (a resumed run passes its step)."""
    step = start_step
    while True:
        yield step, rows_for_step(rows, step, groups_per_step, seed, reshuffle=reshuffle)
        step += 1
