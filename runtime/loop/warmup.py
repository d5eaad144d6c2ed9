"""The supervised warm-up (``training.warmup``): its steps, each step's datums, and its log (``warmup.jsonl``).

``run.warmup`` in a generated script compiled with a warm-up; the script's ``supervised_warmup`` shows the
update (``cross_entropy`` forward_backward + optim_step) and calls these for the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import tinker

from sailrl.runtime.data.order import WARMUP_SEED_OFFSET, rows_for_step, shuffle_seed
from sailrl.runtime.loop import report
from sailrl.runtime.loop.console import RunConsole
from sailrl.runtime.prompts import PromptBuilder
from sailrl.runtime.rundir.directory import WARMUP_FILE, RunDirectory
from sailrl.spec.schema import Spec

__all__ = ["Warmup"]


class Warmup:
    """The supervised warm-up of one run (``run.warmup``). ``completed``: warm-up steps done so far."""

    def __init__(self, *, spec: Spec, train_rows: list[dict[str, Any]], prompts: PromptBuilder,
                 run_dir: RunDirectory, console: RunConsole, completed: int) -> None:
        self.spec = spec
        self.train_rows = train_rows
        self.prompts = prompts
        self.run_dir = run_dir
        self.console = console
        self.completed = completed

    def steps(self, rl_completed: int) -> Iterator[int]:
        """The warm-up steps still to run (1-based; none once RL has started, ``rl_completed > 0``)."""
        w = self.spec.training.warmup
        if w is None or rl_completed > 0:
            return iter(())
        return iter(range(self.completed + 1, w.steps + 1))

    def batch(self, i: int) -> list[tinker.Datum]:
        """Warm-up step ``i``'s datums: ``cross_entropy`` on the rendered reference completions
        (``training.warmup.completion``), in their own seeded data order."""
        w = self.spec.training.warmup
        completion = w.completion or "{{ " + self.spec.prompt.reference_field + " }}"
        rows = rows_for_step(self.train_rows, i - 1, w.batch_size, shuffle_seed(self.spec) + WARMUP_SEED_OFFSET,
                             reshuffle=self.spec.dataset.shuffle)
        return [self.prompts.supervised_datum(row, completion) for row in rows]

    def record(self, i: int, data: list[tinker.Datum], fb_output: Any) -> None:
        """Log warm-up step ``i`` (``warmup.jsonl``: step, cross-entropy per target token)."""
        n_tok = sum(float(sum(d.loss_fn_inputs["weights"].tolist())) for d in data)
        loss = float((fb_output.metrics or {}).get("loss:sum", 0.0)) / max(n_tok, 1.0)
        self.run_dir.append_jsonl(WARMUP_FILE, {"step": i, "loss_per_token": loss,
                                                   "tokens": report.token_counts(data)})
        self.completed = i
        w = self.spec.training.warmup
        if i == 1 or i % 10 == 0 or i == w.steps:
            self.console.result(f"warm-up {i:4d}/{w.steps} | cross_entropy/token {loss:.3f}")
