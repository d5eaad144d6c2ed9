"""Plot a run's ``metrics.jsonl``: mean reward (total, per rule, eval), the pass rate ``correct`` and the
degenerate / truncated fractions.

``correct`` means what the console's step line means by it: the fraction of completions that pass the answer
rule (30% -> 84%), drawn with the fractions; a rule's line in the reward panel is its mean contribution to the
reward (weight x pass rate), labelled "<rule> (mean score)" so the two are never confused.

The x axis is each line's ``step`` field as written (integer ticks). Lines that overlap stay distinguishable:
every series has its own colour, line style and marker, and a legend names it; the total is a wide translucent
band drawn under the rule lines, so a rule equal to the total shows on top of it. Eval points (``eval/reward/total``)
are drawn as large hollow diamonds at the steps they were measured.

A run of another method draws that method's curves instead (:func:`build_method_figure`, the panels of
:data:`~sailrl.runtime.rundir.method_logs.METHOD_PANELS`): SFT its train and held-out NLL, DPO its loss, implicit
rewards and accuracy, a distillation its reverse KL to the teacher above its reward and pass rate. A held-out
metric measured before training (``eval/<name>_start``, in step 1's line) is drawn at step 0.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sailrl.runtime.rundir.directory import CONFIG_FILE, RunDirectory, RunFileError
from sailrl.runtime.rundir.method_logs import METHOD_PANELS, run_method
from sailrl.spec.methods import METHOD_WORDS

# (line style, marker) per rule line, in order; colours come from the tab10 cycle.
RULE_STYLES = [("--", "s"), ("-.", "^"), (":", "v"), ((0, (5, 1, 1, 1, 1, 1)), "P"), ((0, (1, 1)), "X"),
               ((0, (8, 2)), "*"), ((0, (3, 1, 3, 3)), "h"), ((0, (2, 2)), "<"), ((0, (6, 1, 1, 1)), ">")]
RULE_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
               "tab:cyan", "tab:red"]
MARK_ALL_UP_TO = 60  # steps; longer runs mark every n-th point so markers stay legible


def _value(m: dict[str, Any], key: str) -> float:
    v = m.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return math.nan
    return float(v)


def build_figure(metrics: list[dict[str, Any]], title: str = "") -> Any:
    """A matplotlib ``Figure`` with two panels sharing the step axis.

    Top: ``reward/total`` (label "total"), each ``reward/<rule>`` (label "<rule> (mean score)") and
    ``eval/reward/total`` ("eval total", markers only at eval steps). Bottom, 0..1: ``correct`` ("correct (pass
    rate)", the console's "correct NN%"), ``degenerate_frac`` ("degenerate groups") and ``frac_truncated``
    ("truncated"). Lines without a single finite value are left out. ``metrics`` are the
    lines of ``metrics.jsonl``; those without an integer ``step`` are skipped. Raises ``ValueError`` when none
    has one.
    """
    # lazy: matplotlib takes about a second; a run without steps is reported before it loads
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator  # lazy: see above

    metrics = [m for m in metrics if isinstance(m.get("step"), int) and not isinstance(m.get("step"), bool)]
    if not metrics:
        raise ValueError("metrics.jsonl has no steps yet")
    steps = [m["step"] for m in metrics]
    n = len(steps)
    markevery = 1 if n <= MARK_ALL_UP_TO else max(1, n // 30)
    marker_size = 6 if n <= MARK_ALL_UP_TO else 4

    fig = Figure(figsize=(9, 6.5))
    ax1, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.4])

    def line(ax, key, label, **style):
        ys = [_value(m, key) for m in metrics]
        if all(math.isnan(y) for y in ys):
            return
        ax.plot(steps, ys, label=label, markevery=markevery, markersize=marker_size, **style)

    # The total is a wide translucent band under the rule lines, so a rule that equals it stays visible on top.
    line(ax1, "reward/total", "total", color="black", alpha=0.45, linewidth=4.5, linestyle="-", marker="o",
         zorder=2)
    rule_keys = sorted({k for m in metrics for k in m
                        if k.startswith("reward/") and k != "reward/total"})
    for i, key in enumerate(rule_keys):
        linestyle, marker = RULE_STYLES[i % len(RULE_STYLES)]
        line(ax1, key, f"{key.removeprefix('reward/')} (mean score)", color=RULE_COLORS[i % len(RULE_COLORS)],
             linewidth=1.4,
             linestyle=linestyle, marker=marker, fillstyle="none", markeredgewidth=1.4, zorder=3)
    evals = [(m["step"], _value(m, "eval/reward/total")) for m in metrics]
    evals = [(s, v) for s, v in evals if not math.isnan(v)]
    if evals:
        ax1.plot([s for s, _ in evals], [v for _, v in evals], label="eval total", color="tab:gray",
                 linestyle=":", linewidth=1.2, marker="D", markersize=8, fillstyle="none", markeredgewidth=1.8,
                 zorder=4)
    ax1.set_ylabel("mean reward")
    ax1.grid(alpha=0.3)
    ax1.legend(loc="best", fontsize=8, framealpha=0.85)

    line(ax2, "correct", "correct (pass rate)", color="tab:green", linewidth=1.8, linestyle="-", marker="D",
         fillstyle="none")
    line(ax2, "degenerate_frac", "degenerate groups", color="tab:red", linewidth=1.6, linestyle="-", marker="o",
         fillstyle="none")
    line(ax2, "frac_truncated", "truncated", color="tab:orange", linewidth=1.6, linestyle="--", marker="s",
         fillstyle="none")
    ax2.set_ylabel("fraction")
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_xlabel("step")
    ax2.grid(alpha=0.3)
    if ax2.get_lines():
        ax2.legend(loc="best", fontsize=8, framealpha=0.85)
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    if n == 1:
        ax2.set_xlim(steps[0] - 1, steps[0] + 1)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def build_method_figure(metrics: list[dict[str, Any]], method: str, title: str = "") -> Any:
    """A matplotlib ``Figure`` of a run of ``method`` (``sft``, ``dpo``, ``distill``): one panel per
    :data:`METHOD_PANELS` entry, sharing the step axis, each series labelled; a series without a finite value is
    left out. A key under ``eval/`` is drawn as hollow diamonds at the steps that measured it, its
    ``eval/<name>_start`` value at step 0. Raises ``ValueError`` when no line has an integer ``step``."""
    # lazy: matplotlib takes about a second; a run without steps is reported before it loads
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator  # lazy: see above

    metrics = [m for m in metrics if isinstance(m.get("step"), int) and not isinstance(m.get("step"), bool)]
    if not metrics:
        raise ValueError("metrics.jsonl has no steps yet")
    panels = METHOD_PANELS[method]
    steps = [m["step"] for m in metrics]
    markevery = 1 if len(steps) <= MARK_ALL_UP_TO else max(1, len(steps) // 30)
    fig = Figure(figsize=(9, 2.6 * len(panels) + 1))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    n = 0
    for ax, panel in zip(axes, panels, strict=True):
        for key, label in panel.series:
            color, (linestyle, marker) = RULE_COLORS[n % len(RULE_COLORS)], RULE_STYLES[n % len(RULE_STYLES)]
            n += 1
            if key.startswith("eval/"):
                points = [(0, _value(m, key + "_start")) for m in metrics[:1]]
                points += [(m["step"], _value(m, key)) for m in metrics]
                points = [(x, y) for x, y in points if not math.isnan(y)]
                if points:
                    ax.plot([x for x, _ in points], [y for _, y in points], label=label, color=color,
                            linestyle=":", linewidth=1.2, marker="D", markersize=7, fillstyle="none",
                            markeredgewidth=1.6, zorder=4)
                continue
            ys = [_value(m, key) for m in metrics]
            if not all(math.isnan(y) for y in ys):
                ax.plot(steps, ys, label=label, color=color, linestyle=linestyle, marker=marker, fillstyle="none",
                        linewidth=1.5, markevery=markevery, markersize=4, zorder=3)
        ax.set_ylabel(panel.ylabel, fontsize=9)
        if panel.ylim is not None:
            ax.set_ylim(*panel.ylim)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(loc="best", fontsize=8, framealpha=0.85)
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"{title}: {METHOD_WORDS[method]}" if title else METHOD_WORDS[method])
    fig.tight_layout()
    return fig


def plot_run(run_dir: Path, out: Path) -> None:
    """Write the PNG of ``run_dir/metrics.jsonl`` to ``out``: :func:`build_figure` for an RL run,
    :func:`build_method_figure` for a run of another method (the method its ``config.json`` names).

    Raises ``ValueError`` when the file has no steps or the config cannot be read.
    """
    try:
        method = run_method(run_dir) if (Path(run_dir) / CONFIG_FILE).is_file() else "rl"
    except (ValueError, RunFileError) as exc:
        raise ValueError(f"{Path(run_dir) / CONFIG_FILE} cannot be read: {exc}") from None
    metrics = RunDirectory(run_dir).read_metrics()
    try:
        fig = (build_figure(metrics, title=Path(run_dir).name) if method == "rl"
               else build_method_figure(metrics, method, title=Path(run_dir).name))
    except ValueError:
        raise ValueError(f"{run_dir}/metrics.jsonl has no steps yet") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
