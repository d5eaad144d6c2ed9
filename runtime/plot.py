"""Plot a run's ``metrics.jsonl``: total and per-rule reward, and the degenerate-group fraction, per step."""

from __future__ import annotations

from pathlib import Path

from sailrl.runtime.rundir import RunDirectory


def plot_run(run_dir: Path, out: Path) -> None:
    """Write a PNG with two panels (reward per step; degenerate_frac per step). Raises ValueError on no steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = RunDirectory(run_dir).read_metrics()
    metrics = [m for m in metrics if isinstance(m.get("step"), int)]
    if not metrics:
        raise ValueError(f"{run_dir}/metrics.jsonl has no steps yet")
    steps = [m["step"] for m in metrics]
    reward_keys = sorted({k for m in metrics for k in m if k.startswith("reward/") and k != "reward/total"})
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[3, 1])
    ax1.plot(steps, [m.get("reward/total") for m in metrics], label="total", linewidth=2.2, color="black")
    for k in reward_keys:
        ax1.plot(steps, [m.get(k) for m in metrics], label=k.removeprefix("reward/"), linewidth=1.2)
    if any(m.get("eval/reward/total") is not None for m in metrics):
        ev = [(m["step"], m["eval/reward/total"]) for m in metrics if m.get("eval/reward/total") is not None]
        ax1.plot([s for s, _ in ev], [v for _, v in ev], "o--", label="eval total", color="gray")
    ax1.set_ylabel("mean reward")
    ax1.legend(loc="best", fontsize=8)
    ax1.grid(alpha=0.3)
    ax2.plot(steps, [m.get("degenerate_frac") for m in metrics], color="tab:red")
    ax2.set_ylabel("degenerate frac")
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_xlabel("step")
    ax2.grid(alpha=0.3)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
