"""Matplotlib figures of the runs (PNG, fixed size and DPI so reruns give the same picture)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from fedrepro.report.results import OVERALL  # noqa: E402


def convergence_figure(histories: pd.DataFrame, path: Path) -> None:
    """Overall validation MRR and training loss per round: mean over seeds with a ±1 std band."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for algorithm, frame in histories.groupby("algorithm", sort=False):
        for ax, column in zip(axes, ("valid_mrr", "train_loss")):
            stats = frame.groupby("round")[column].agg(["mean", "std"]).fillna(0.0)
            ax.plot(stats.index, stats["mean"], marker="o", label=algorithm)
            ax.fill_between(stats.index, stats["mean"] - stats["std"], stats["mean"] + stats["std"], alpha=0.15)
    axes[0].set(title="Validation MRR (mean over clients)", xlabel="round", ylabel="MRR")
    axes[1].set(title="Training hinge loss", xlabel="round", ylabel="loss")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def per_client_figure(results: pd.DataFrame, metric: str, path: Path) -> None:
    """Test ``metric`` per client and overall: bars are the mean over seeds, whiskers ±1 std."""
    frame = results[results.metric == metric]
    stats = frame.groupby(["client", "algorithm"], sort=False)["value"].agg(["mean", "std"]).fillna(0.0)
    means, stds = stats["mean"].unstack(), stats["std"].unstack()
    order = [c for c in means.index if c != OVERALL] + [OVERALL]
    algorithms = list(dict.fromkeys(frame["algorithm"]))
    ax = means.loc[order, algorithms].plot.bar(yerr=stds.loc[order, algorithms], figsize=(10, 4), capsize=2, rot=20)
    ax.set(title=f"Test {metric.upper()} per client (mean ± std over seeds)", xlabel="", ylabel=metric.upper())
    ax.legend(fontsize=8, ncols=len(algorithms))
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(ax.figure)
