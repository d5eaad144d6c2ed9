"""What a run directory's method logs: the method its ``config.json`` names, and the metrics each method writes to
``metrics.jsonl`` that ``sailrl show``, ``sailrl plot`` and the studio's Runs tab put first.

RL and distillation log rollouts (``rollouts.jsonl``) and rewards; SFT and DPO log no rollouts, only each step's
metrics. The curves are grouped in panels that share a unit: a panel is its y-axis label and its series, each a
metric key and its label; a key under ``eval/`` is measured at the eval steps only and drawn as points.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sailrl.runtime.rundir.directory import RunDirectory
from sailrl.spec.methods import METHODS

__all__ = ["METHOD_PANELS", "Panel", "method_keys", "run_method"]

@dataclass(frozen=True)
class Panel:
    """One panel of a method's curves: its y-axis label, its series ``(metric key, label)``, and its y range
    (None: fitted to the values)."""

    ylabel: str
    series: tuple[tuple[str, str], ...]
    ylim: tuple[float, float] | None = None


_FRACTION = (-0.05, 1.05)

#: The panels of the methods that are not RL (RL's figure is :func:`sailrl.plot.build_figure`'s reward panels).
METHOD_PANELS: dict[str, tuple[Panel, ...]] = {
    "sft": (
        Panel("NLL (nats per assistant token)", (("train/nll", "train NLL"), ("eval/nll", "eval NLL (held-out)"))),
        Panel("fraction", (("eval/correct", "eval correct (one sample per held-out row)"),
                           ("eval/train_correct", "train correct (one sample per row of a fixed training sample)")),
              _FRACTION),
    ),
    "dpo": (
        Panel("DPO loss", (("dpo/loss", "train loss"), ("eval/loss", "eval loss (held-out pairs)"))),
        Panel("implicit reward (beta x log-ratio)", (("dpo/chosen_reward", "chosen"),
                                                     ("dpo/rejected_reward", "rejected"), ("dpo/margin", "margin"))),
        Panel("fraction", (("dpo/accuracy", "accuracy (chosen above rejected)"),
                           ("eval/accuracy", "eval accuracy"),
                           ("eval/chosen_rate", "eval chosen rate (samples that write the chosen reply)")),
              _FRACTION),
    ),
    "distill": (
        Panel("reverse KL (nats per sampled token)", (("distill/reverse_kl", "KL(student || teacher)"),)),
        Panel("mean reward", (("reward/total", "reward total"),)),
        Panel("fraction", (("correct", "correct (pass rate)"), ("frac_truncated", "truncated")), _FRACTION),
    ),
}


def method_keys(method: str) -> list[str]:
    """The metric keys of ``method``'s panels, in order (empty for RL)."""
    return [key for panel in METHOD_PANELS.get(method, ()) for key, _ in panel.series]


def run_method(run_dir: str | Path) -> str:
    """The method the run directory's ``config.json`` names (``spec.method``); ``"rl"`` when it names none (an RL
    run, or a run of a version before methods). Raises what :meth:`RunDirectory.read_config` raises for a config
    that cannot be read (``ValueError`` for bad JSON, ``RunFileError`` for an irregular or oversized file)."""
    config = RunDirectory(run_dir).read_config()
    spec = config.get("spec") if isinstance(config, dict) else None
    method = spec.get("method") if isinstance(spec, dict) else None
    return method if method in METHODS else "rl"
