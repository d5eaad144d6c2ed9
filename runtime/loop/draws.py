"""A step's rows when they depend on the steps before it: dynamic sampling and the difficulty filter.

``run.sampler`` holds a :class:`StepDraws` when the spec sets ``training.dynamic_sampling`` or
``training.difficulty_filter`` (``run.sampler.draws``; None otherwise, and a step's rows are ``rows_for_step``'s).
The rows come from a cursor over the data order (:class:`sailrl.runtime.data.draws.RowDraws`):

- :meth:`StepDraws.rows`: the step's ``groups_per_step`` rows, the next ones that are not resting;
- :meth:`StepDraws.more_rows` (dynamic sampling): while the step's scored groups hold fewer than
  ``groups_per_step`` groups with signal (not every rollout of the group scored the same), as many rows as it
  lacks, from the next rows of the data order, until ``max_extra_groups`` groups beyond ``groups_per_step`` have
  been drawn; :func:`extend_batch` joins the groups sampled for them to the step's batch;
- :meth:`StepDraws.rest_rows` (the difficulty filter): each drawn row's group, degenerate or not, counted; a row
  degenerate the last ``degenerate_draws`` times it was drawn rests (``RowDraws.observe``).

The counts go to the step's metrics: ``sampling/draws`` (groups drawn), ``sampling/extra_groups`` (beyond
``groups_per_step``), ``sampling/rounds`` (extra sampling rounds), ``sampling/rested_skipped`` (resting rows the
order skipped), ``sampling/short`` (groups with signal the step still lacked when ``max_extra_groups`` ran out),
``sampling/rested_now`` and ``sampling/resting`` (rows the next step skips). The cursor after each completed step
is recorded with every saved state (``row_draws``), so a resumed run draws what the uninterrupted run drew.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sailrl.runtime.data import shuffle_seed
from sailrl.runtime.data.draws import RowDraws
from sailrl.runtime.loop.records import Records
from sailrl.runtime.rollouts.rollout import RolloutBatch
from sailrl.spec.schema import Spec

__all__ = ["StepDraws", "extend_batch", "has_signal"]


def has_signal(group: Any) -> bool:
    """Whether a group can teach: its rollouts did not all score the same total (the degenerate test of
    ``rl.split_degenerate``)."""
    rewards = [float(r) for r in group.get_total_rewards()]
    return not (rewards and len(set(rewards)) == 1)


def extend_batch(batch: RolloutBatch, more: RolloutBatch) -> RolloutBatch:
    """``batch`` with the groups of ``more`` (sampled for the same step from the same policy) after its own:
    groups, rows, failures and provenance joined, seconds and the scoring's counts added (the Sail completer's
    ``sail/*`` counters are the policy's running totals: the later ones are kept)."""
    metrics = dict(batch.extra_metrics)
    for key, value in more.extra_metrics.items():
        metrics[key] = value if key.startswith("sail/") else metrics.get(key, 0.0) + value
    return RolloutBatch(groups=[*batch.groups, *more.groups], rows=[*batch.rows, *more.rows],
                        failed=[*batch.failed, *more.failed], extra_metrics=metrics,
                        sampler_paths=[*batch.sampler_paths, *more.sampler_paths],
                        sampler_steps=[*batch.sampler_steps, *more.sampler_steps],
                        seconds=batch.seconds + more.seconds)


class StepDraws:
    """The rows of each step from the data order's cursor, and their ``sampling/*`` counts (module docstring)."""

    def __init__(self, train_rows: Sequence[dict[str, Any]], cursor: RowDraws, records: Records) -> None:
        self.train_rows = train_rows
        self.cursor = cursor
        self.records = records
        self._rows: dict[int, list[dict[str, Any]]] = {}  # the current step's rows
        self._index: dict[Any, int] = {}  # a drawn row's key -> its index in train_rows
        self._counts: dict[str, float] = {}  # the current step's sampling/* counts

    @classmethod
    def of(cls, spec: Spec, train_rows: Sequence[dict[str, Any]], records: Records) -> StepDraws | None:
        """The draws of a run of ``spec``; None when it sets neither option (or has no rows)."""
        t = spec.training
        if (t.dynamic_sampling is None and t.difficulty_filter is None) or not len(train_rows):
            return None
        return cls(train_rows, RowDraws(len(train_rows), t.groups_per_step, shuffle_seed(spec),
                                        reshuffle=spec.dataset.shuffle), records)

    @property
    def groups_per_step(self) -> int:
        return self.cursor.groups_per_step

    def rows(self, step: int) -> list[dict[str, Any]]:
        """``step``'s ``groups_per_step`` rows: drawn at the first call, the same rows at the next."""
        if step not in self._rows:
            self._counts = {"sampling/draws": 0.0, "sampling/extra_groups": 0.0, "sampling/rounds": 0.0,
                            "sampling/rested_skipped": 0.0}
            self._rows = {step: self._take(step, self.groups_per_step, rounds=0)}
        return self._rows[step]

    def more_rows(self, step: int, batch: RolloutBatch, max_extra_groups: int) -> list[dict[str, Any]]:
        """The rows to draw next for ``step``, whose scored groups so far are ``batch``: as many as it lacks groups
        with signal to have ``groups_per_step``, from the next rows of the data order, within ``max_extra_groups``
        groups drawn beyond ``groups_per_step`` this step (failed groups count as drawn). ``[]``: the step has
        enough, or the bound is reached (``sampling/short``: the groups with signal it lacks then)."""
        g = self.groups_per_step
        self.rows(step)  # the step's own rows come first
        signal = sum(1 for group in batch.groups if has_signal(group))
        want = min(g - signal, g + max_extra_groups - int(self._counts["sampling/draws"]))
        if want <= 0:
            self.records.add(step, {"sampling/short": float(max(g - signal, 0))})
            return []
        return self._take(step, want, rounds=1)

    def rest_rows(self, step: int, batch: RolloutBatch, difficulty_filter: dict[str, Any]) -> list[int]:
        """Count each group of ``step``'s ``batch`` against its row (degenerate or not) and rest the rows whose
        groups were degenerate the last ``degenerate_draws`` times they were drawn, for ``rest_steps`` steps from
        the next (``None``: the rest of the run). Returns the rows rested now (indices into the training rows)."""
        rows = [self._index[_key(row)] for row in batch.rows]
        rested = self.cursor.observe(step, rows, [not has_signal(g) for g in batch.groups],
                                     degenerate_draws=int(difficulty_filter["degenerate_draws"]),
                                     rest_steps=difficulty_filter.get("rest_steps"))
        self.records.add(step, {"sampling/rested_now": float(len(rested)),
                                "sampling/resting": float(self.cursor.resting_at(step + 1))})
        return rested

    def _take(self, step: int, count: int, *, rounds: int) -> list[dict[str, Any]]:
        indices, skipped = self.cursor.take(step, count)
        rows = [self.train_rows[i] for i in indices]
        for row, i in zip(rows, indices, strict=True):
            self._index[_key(row)] = i
        c = self._counts
        c["sampling/draws"] += len(rows)
        c["sampling/extra_groups"] = max(c["sampling/draws"] - self.groups_per_step, 0.0)
        c["sampling/rounds"] += rounds
        c["sampling/rested_skipped"] += skipped
        self.records.add(step, dict(c))
        return rows

    # ------------------------------------------------------------------ resume
    def saved(self, completed: int) -> dict[str, Any]:
        """What a state saved after ``completed`` steps records (``row_draws``)."""
        return self.cursor.saved(completed)

    def resume(self, completed: int, state: dict[str, Any] | None) -> None:
        """Continue the cursor from a state saved after ``completed`` steps. A state saved without one (the options
        were off then) continues where plain steps leave the data order, with no row resting, and says so."""
        if completed == 0:
            return
        saved = (state or {}).get("row_draws")
        if isinstance(saved, dict):
            self.cursor.restore(saved, completed)
            return
        self.cursor.restore({"position": completed * self.groups_per_step}, completed)
        self.records.console.print(f"[yellow]the saved state has no record of the rows drawn (it was saved without "
                                   f"training.dynamic_sampling or difficulty_filter): step {completed + 1} draws "
                                   "from where plain steps leave the data order, with no row resting[/yellow]")


def _key(row: dict[str, Any]) -> Any:
    """A drawn row's key: its source index (``_index``), else the dict itself (rows given as plain dicts)."""
    return row.get("_index", id(row))
