"""A DPO step's record: the supervised run's ``metrics.jsonl`` lines and console line
(:class:`~sailrl.runtime.supervised.records.StepRecords`), with the DPO metrics of the update (``dpo/loss``,
``dpo/accuracy``, ``dpo/margin``, ``dpo/chosen_reward``, ``dpo/rejected_reward``: the loss function's, returned in
the ``forward_backward_custom`` output) in place of the SFT loss, and a summary of how they moved."""

from __future__ import annotations

from typing import Any

from sailrl.runtime.preference.loss import DPO_METRICS
from sailrl.runtime.supervised.records import StepRecords

__all__ = ["PreferenceRecords"]


class PreferenceRecords(StepRecords):
    """``run.records`` of a DPO run: ``train(step, data, output, lr)`` after the update lands; ``add``,
    ``tokens`` and ``end_step`` as the supervised run's."""

    console_keys = (("dpo/loss", "loss"), ("dpo/accuracy", "accuracy"), ("dpo/margin", "margin"),
                    ("eval/accuracy", "eval accuracy"), ("eval/chosen_rate", "eval chosen"))

    def train(self, step: int, data: list[Any], output: Any, lr: float) -> None:
        """The DPO update of step ``step`` landed: its metrics, the learning rate, the pairs and the tokens sent
        (``forward_backward_custom`` runs a forward and a forward_backward over the same datums: twice their
        length)."""
        metrics = {k: float(v) for k, v in (output.metrics or {}).items() if k in DPO_METRICS}
        self.add(step, {**metrics, "learning_rate": lr, "pairs": len(data) // 2})
        self.tokens(step, "trained", 2 * sum(d.model_input.length for d in data))

    def summary(self, state_path: str) -> str:
        """Where the weights are, and how the DPO loss, accuracy and the held-out chosen rate moved."""
        out = [f"done: {self.completed} steps; final state {state_path}"]
        for key, start_key, label in (("dpo/loss", None, "loss"), ("dpo/accuracy", None, "accuracy"),
                                      ("eval/accuracy", "eval/accuracy_start", "eval accuracy"),
                                      ("eval/chosen_rate", "eval/chosen_rate_start", "eval chosen rate")):
            seen = [ln[key] for ln in self.history if isinstance(ln.get(key), float)]
            first = next((ln[start_key] for ln in self.history if start_key and isinstance(ln.get(start_key), float)),
                         seen[0] if seen else None)
            if seen and first is not None:
                out.append(f"{label}: {first:.3f} -> {seen[-1]:.3f}")
        return "\n".join(out)
