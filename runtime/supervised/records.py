"""A step's record for a run that trains on fixed data (``method: sft``; DPO builds on it): ``metrics.jsonl``
lines (the run directory's stamped format, one per step with ``step``), the console line, tokens and cost, and the
summary.

``run.records`` in the script: ``train(step, data, output, lr)`` after the update lands (the SFT loss: ``train/nll``;
another method overrides it), ``add(step, metrics)`` for anything else (``eval/nll``), ``end_step(step)`` writes the
line. Metrics added for step ``s`` before it starts (the evaluation of the starting weights) join its line.
"""

from __future__ import annotations

import math
import time
from typing import Any

from sailrl.runtime.loop.console import RunConsole
from sailrl.runtime.planning.cost import CostModel
from sailrl.runtime.rundir.directory import RunDirectory
from sailrl.runtime.supervised.datums import mean_nll, trained_tokens
from sailrl.spec.schema import Spec

__all__ = ["StepRecords"]

#: Metrics the console line shows, with their labels, in this order (each when the step has it).
CONSOLE_KEYS = (("train/nll", "train nll"), ("eval/nll", "eval nll"), ("eval/correct", "eval correct"),
                ("eval/train_correct", "train correct"))


class StepRecords:
    """The records of one run (``run.records``). ``completed``: steps whose line is written; ``history``: every
    line so far, a resumed run's earlier steps too (the summary compares the run's first step with its last).
    ``console_keys``: the metrics its console line shows (a method's subclass names its own)."""

    console_keys = CONSOLE_KEYS

    def __init__(self, *, spec: Spec, run_dir: RunDirectory, console: RunConsole, cost: CostModel,
                 completed: int, is_local: bool) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.console = console
        self.cost = cost
        self.completed = completed
        self.is_local = is_local
        self.history: list[dict[str, Any]] = self.run_dir.read_metrics() if completed else []
        self._pending: dict[int, dict[str, Any]] = {}
        self._clock: dict[int, float] = {}
        self._cumulative = self._cumulative_tokens()

    def _cumulative_tokens(self) -> dict[str, float]:
        """``tokens_cum/<kind>`` of the last step already written (a resumed run continues the counts)."""
        last = self.history[-1] if self.history else {}
        return {k: float(v) for k, v in last.items() if k.startswith("tokens_cum/") and isinstance(v, int | float)}

    def start(self, step: int) -> None:
        self._clock[step] = time.monotonic()

    def add(self, step: int, metrics: dict[str, Any]) -> None:
        """Put ``metrics`` into step ``step``'s line."""
        self._pending.setdefault(step, {}).update(metrics)

    def tokens(self, step: int, kind: str, n: float) -> None:
        """Count ``n`` tokens of ``kind`` (``sailrl.runtime.planning.cost.KINDS``) in step ``step``."""
        line = self._pending.setdefault(step, {})
        line[f"tokens/{kind}"] = line.get(f"tokens/{kind}", 0) + n

    def train(self, step: int, data: list[Any], output: Any, lr: float) -> None:
        """The SFT update of step ``step`` landed: ``train/nll`` (:func:`~sailrl.runtime.supervised.datums.mean_nll`
        of the forward_backward logprobs), the learning rate, the conversations, and the tokens sent."""
        logprobs = [o["logprobs"] for o in output.loss_fn_outputs]
        self.add(step, {"train/nll": mean_nll(logprobs, data), "learning_rate": lr, "conversations": len(data),
                        "assistant_tokens": trained_tokens(data)})
        self.tokens(step, "trained", sum(d.model_input.length for d in data))

    def end_step(self, step: int) -> None:
        """Write step ``step``'s metrics line (cumulative tokens and cost included) and print its console line."""
        line = {"step": step, **self._pending.pop(step, {})}
        for key in [k for k in line if k.startswith("tokens/")]:
            kind = key.removeprefix("tokens/")
            self._cumulative[f"tokens_cum/{kind}"] = self._cumulative.get(f"tokens_cum/{kind}", 0.0) + line[key]
        line.update(self._cumulative)
        line.update(self.cost.step_cost(line))
        started = self._clock.pop(step, None)
        if started is not None:
            line["time/step"] = time.monotonic() - started
        # NaN and infinity are not JSON: a value that is not finite is logged as null, as the RL loop logs it.
        line = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in line.items()}
        self.run_dir.append_metrics(line)
        self.history.append(line)
        self.completed = step
        parts = [f"{label} {line[key]:.3f}" for key, label in self.console_keys if isinstance(line.get(key), float)]
        if "learning_rate" in line:
            parts.append(f"lr {line['learning_rate']:.2e}")
        self.console.result(f"step {step:4d}/{self.spec.training.steps} | " + " | ".join(parts))

    def summary(self, state_path: str) -> str:
        """The run's last lines: where the weights are, and how train/eval NLL (and the sampled correct fraction,
        held-out and training rows) moved."""
        lines = self.history
        out = [f"done: {self.completed} steps; final state {state_path}"]
        for key, start_key, label in (("train/nll", None, "train nll"), ("eval/nll", "eval/nll_start", "eval nll"),
                                      ("eval/correct", "eval/correct_start", "eval correct"),
                                      ("eval/train_correct", "eval/train_correct_start", "train correct")):
            seen = [ln[key] for ln in lines if isinstance(ln.get(key), float)]
            first = next((ln[start_key] for ln in lines if start_key and isinstance(ln.get(start_key), float)),
                         seen[0] if seen else None)
            if seen and first is not None:
                out.append(f"{label}: {first:.3f} -> {seen[-1]:.3f}")
        return "\n".join(out)
