"""The rows an RL step draws when a step may draw more than ``groups_per_step`` rows or rows may rest.

``training.dynamic_sampling`` lets a step draw extra groups until it has ``groups_per_step`` groups with signal;
``training.difficulty_filter`` rests rows whose groups were degenerate (every rollout scored the same: all right or
all wrong) the last ``degenerate_draws`` times they were drawn. Both make a step's rows depend on the steps before
it, so :class:`RowDraws` keeps a cursor over the data order (:func:`~sailrl.runtime.data.order.order_index`: the
positions :func:`~sailrl.runtime.data.order.rows_for_step` walks) instead of computing rows from the step number:

- :meth:`RowDraws.take` gives the next rows from the cursor, skipping resting rows (a step that takes exactly
  ``groups_per_step`` rows and rests none gets the rows ``rows_for_step`` gives it);
- :meth:`RowDraws.observe` counts each drawn row's degenerate groups in a row and rests a row whose count reaches
  ``degenerate_draws``: for ``rest_steps`` steps from the next step, or (``None``) the rest of the run. A row is not
  rested when that would leave fewer than ``groups_per_step`` rows to draw from; it rests at its next degenerate
  draw that finds room;
- :meth:`RowDraws.saved` is the state after a given number of completed steps (the cursor, the counts, the resting
  rows), which a saved state records and :meth:`RowDraws.restore` continues from, so a resumed run draws the rows
  the uninterrupted run drew.

Rows are named by their index in the run's training rows (the data order's value), as the order is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sailrl.runtime.data.order import order_index

__all__ = ["RowDraws"]


class RowDraws:
    """A cursor over the data order of ``n_rows`` training rows (``seed``, ``reshuffle`` as ``rows_for_step``), the
    degenerate counts and the resting rows (module docstring)."""

    def __init__(self, n_rows: int, groups_per_step: int, seed: int, *, reshuffle: bool = True) -> None:
        if n_rows <= 0 or groups_per_step <= 0:
            raise ValueError("need n_rows > 0 and groups_per_step > 0")
        self.n_rows = n_rows
        self.groups_per_step = groups_per_step
        self.seed = seed
        self.reshuffle = reshuffle
        self.position = 0  # the next position of the data order
        self.streaks: dict[int, int] = {}  # row -> its degenerate draws in a row so far
        self.resting: dict[int, int | None] = {}  # row -> the last step it rests (None: the rest of the run)
        self._step = 0  # the last step that took rows
        self._before: tuple[int, dict[str, Any]] | None = None  # (completed steps, the state then)

    # ------------------------------------------------------------------ drawing
    def is_resting(self, row: int, step: int) -> bool:
        """Whether ``row`` is skipped when step ``step`` draws."""
        if row not in self.resting:
            return False
        until = self.resting[row]
        return until is None or step <= until

    def take(self, step: int, count: int) -> tuple[list[int], int]:
        """``(rows, skipped)``: the next ``count`` rows of the data order for step ``step`` (the cursor moves past
        them), and how many resting rows were skipped on the way. Steps take rows in increasing order."""
        if step != self._step:  # the step's first draw: the state after the steps before it, for a save
            self._before = (step - 1, self.state())
            self._step = step
        rows: list[int] = []
        skipped = run = 0
        while len(rows) < count:
            row = order_index(self.n_rows, self.position, self.seed, reshuffle=self.reshuffle)
            self.position += 1
            if self.is_resting(row, step):
                skipped += 1
                run += 1
                if run > self.n_rows:  # observe() keeps groups_per_step rows unrested: never reached
                    raise RuntimeError(f"step {step}: every one of the {self.n_rows} rows is resting")
                continue
            run = 0
            rows.append(row)
        return rows, skipped

    # ------------------------------------------------------------------ the difficulty filter
    def resting_at(self, step: int) -> int:
        """How many rows step ``step`` skips."""
        return sum(1 for row in self.resting if self.is_resting(row, step))

    def observe(self, step: int, rows: Sequence[int], degenerate: Sequence[bool], *, degenerate_draws: int,
                rest_steps: int | None) -> list[int]:
        """Count step ``step``'s draws (``rows`` with, per draw, whether its group was degenerate, in draw order)
        and rest the rows whose degenerate draws in a row reach ``degenerate_draws``: from step ``step + 1`` for
        ``rest_steps`` steps (``None``: the rest of the run). Returns the rows rested now."""
        for row in [r for r in self.resting if not self.is_resting(r, step + 1)]:
            del self.resting[row]  # their rest is over
        rested: list[int] = []
        room = self.n_rows - self.groups_per_step - len(self.resting)
        for row, flat in zip(rows, degenerate, strict=True):
            if not flat:
                self.streaks.pop(row, None)
                continue
            count = self.streaks.get(row, 0) + 1
            if count >= degenerate_draws and room > 0 and row not in self.resting:
                self.streaks.pop(row, None)
                self.resting[row] = None if rest_steps is None else step + rest_steps
                rested.append(row)
                room -= 1
            else:
                self.streaks[row] = count
        return rested

    # ------------------------------------------------------------------ resume
    def state(self) -> dict[str, Any]:
        """The cursor, the counts and the resting rows as JSON values."""
        return {"position": self.position, "streaks": sorted([r, k] for r, k in self.streaks.items()),
                "resting": sorted(([r, u] for r, u in self.resting.items()), key=lambda p: p[0])}

    def saved(self, completed: int) -> dict[str, Any]:
        """The state after ``completed`` steps (for a save then): the state before the next step's first draw when
        that step has drawn already (a stop in the middle of it), else the state now."""
        if self._before is not None and self._before[0] == completed:
            return self._before[1]
        return self.state()

    def restore(self, state: dict[str, Any], completed: int) -> None:
        """Continue from a :meth:`state` saved after ``completed`` steps."""
        self.position = int(state["position"])
        self.streaks = {int(r): int(k) for r, k in state.get("streaks") or []}
        self.resting = {int(r): (None if u is None else int(u)) for r, u in state.get("resting") or []}
        self._step, self._before = completed, None
