"""The budget stop: ``training.max_cost_usd``, checked before each step (``run.budget.check(step)``).

The rule (README, "Cost and budget"): a step runs only when the spend so far plus the next step's estimate
(:meth:`sailrl.runtime.planning.cost.CostModel.next_step_estimate`: the costliest recent step, or before the first one an
upper bound from the prompt lengths) stays within the budget; otherwise :class:`BudgetReached` stops the run,
state is saved and it exits 3, resumable with a larger budget.
"""

from __future__ import annotations

from sailrl.runtime.loop.errors import BudgetReached
from sailrl.runtime.loop.records import Records
from sailrl.runtime.planning.cost import CostModel
from sailrl.runtime.rundir.directory import RunDirectory
from sailrl.spec.errors import ConfigError

__all__ = ["Budget"]


class Budget:
    """``training.max_cost_usd`` of one run (``run.budget``); ``None`` means no budget."""

    def __init__(self, max_cost_usd: float | None, cost: CostModel, records: Records, run_dir: RunDirectory) -> None:
        self.max_cost_usd = max_cost_usd
        self.cost = cost
        self.records = records
        self.run_dir = run_dir

    def spent(self) -> float | None:
        """What the run has cost so far: the last step's ``cost/total``, or before the first RL step what the
        supervised warm-up has cost (``None``: a price is unknown)."""
        history = self.records.history
        if history:
            return history[-1].get("cost/total")
        return self.cost.cost_of("warmup_trained", sum(r.get("tokens", 0) for r in self.run_dir.read_warmup()))

    def check(self, step: int) -> None:
        """Raise :class:`BudgetReached` when ``step``'s estimated cost would take the run above the budget, and
        ``ConfigError`` when a price the estimate needs is unknown. No budget: nothing to check."""
        budget = self.max_cost_usd
        if budget is None:
            return
        spent = self.spent()
        nxt = self.cost.next_step_estimate(self.records.history, step=step)
        if spent is None or nxt is None:
            missing = ", ".join(p.spec_key for p in self.cost.missing_prices()) or "pricing:"
            raise ConfigError(f"training.max_cost_usd is set but these prices are unknown: {missing}; add them "
                              "under pricing: (USD per million tokens) or remove the budget")
        if spent + nxt > budget:
            raise BudgetReached(
                f"budget reached before step {step}: spent ${spent:.4f} of training.max_cost_usd ${budget:.4f}, and "
                f"the next step is estimated at ${nxt:.4f}. Raise training.max_cost_usd to continue.")
