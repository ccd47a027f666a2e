"""Matplotlib figures in the papers' style (PNG, fixed size and DPI, no timestamps, so reruns give the same bytes)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fedrepro.report.results import CHANCE, OVERALL  # noqa: E402


def _save(fig, path: Path, dpi: int = 100) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)


def _legend_beside(ax, fontsize: int = 7) -> None:
    """The legend right of the axes, where it cannot cover a line."""
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def distinct_styles(count: int) -> list[dict]:
    """A colour, marker and line style per line, all different up to 20 lines (matplotlib's default cycle has 10
    colours, so an 11th line repeated the first's colour in one panel)."""
    colours, markers, lines = plt.get_cmap("tab20").colors, "osD^v<>ph*", ["-", "--"]
    return [
        {
            "color": colours[(2 * i) % 20 + (i // 10) % 2],
            "marker": markers[i % len(markers)],
            "linestyle": lines[(i // 10) % 2],
        }
        for i in range(count)
    ]


REFERENCE_STYLES = (
    {"color": "black", "linestyle": "-.", "linewidth": 1.3},
    {"color": "dimgray", "linestyle": (0, (6, 2, 1, 2, 1, 2)), "linewidth": 1.6},
    {"color": "black", "linestyle": (0, (1, 1)), "linewidth": 1.8},
)
"""How the levels a model must beat are drawn (trivial baselines, chance): black or grey, dash-dotted or densely
dotted, so none reads as a method's line (solid or dashed, in colour) or a target (thin grey dots)."""


def reference_lines(ax, levels: Mapping[str, float | None], scale: float = 1.0) -> None:
    """One horizontal line per level (label -> value, drawn times ``scale``), each in its own ``REFERENCE_STYLES``
    style and in the legend, so that a point below a trivial baseline or chance shows as such. A level of None (not
    computed) draws nothing but keeps its style's place, so a label has the same style in every figure and caption."""
    for index, (label, level) in enumerate(levels.items()):
        if level is not None:
            ax.axhline(scale * level, label=label, **REFERENCE_STYLES[index % len(REFERENCE_STYLES)])


def _seed_band(ax, x, frame: pd.DataFrame, colour) -> None:
    """A ±1 std band over seeds around ``frame``'s accuracy (%) where it has a spread (``accuracy_std``; NaN for one
    seed, where no band is drawn: a zero-width band would read as a measured zero spread)."""
    if "accuracy_std" in frame and frame["accuracy_std"].notna().any():
        accuracy, band = 100 * frame["accuracy"], 100 * frame["accuracy_std"].fillna(0.0)
        ax.fill_between(x, accuracy - band, accuracy + band, alpha=0.12, color=colour)


def _at_least_span(ax, points: float = 5.0) -> None:
    """Widen a percentage axis to ``points`` at least, top at 100 at most: on a tiny test set (breast: 1 sample =
    0.9 points) a 98-100 axis turned one sample into a steep slope."""
    low, high = ax.get_ylim()
    if high - low < points:
        high = min(100.0, (low + high + points) / 2)
        ax.set_ylim(high - points, high)


def curve_caption(seeds: int) -> str:
    """What a curve of a figure is: a mean with a spread band, or one seed's run with none."""
    return f"mean over {seeds} seeds, band ±1 std" if seeds > 1 else "1 seed, no spread"


def convergence_figure(histories: pd.DataFrame, labels: dict[str, str], path: Path) -> None:
    """Training loss per round of each method: mean over clients and seeds, a ±1 std band over seeds when there
    are several; ``histories`` has a row per (method, seed, round) with ``train_loss``."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    groups = list(histories.groupby("method", sort=False))
    seeds = int(histories["seed"].nunique()) if "seed" in histories and len(histories) else 1
    for (method, frame), style in zip(groups, distinct_styles(len(groups))):
        curve = frame.groupby("round")["train_loss"].agg(["mean", "std"])
        ax.plot(curve.index, curve["mean"], label=labels.get(method, method), markersize=4, **style)
        if seeds > 1:
            ax.fill_between(
                curve.index,
                curve["mean"] - curve["std"],
                curve["mean"] + curve["std"],
                alpha=0.12,
                color=style["color"],
            )
    if len(histories):
        ax.set_xticks(sorted(histories["round"].unique()))
    ax.set(title=f"Training loss per round (mean over clients; {curve_caption(seeds)})", xlabel="round", ylabel="loss")
    _legend_beside(ax)
    _save(fig, path)


def sweep_figure(
    table: pd.DataFrame,
    chance: Mapping[str, float],
    x_label: str,
    title: str,
    path: Path,
    log2: bool = False,
    reverse: bool = False,
) -> None:
    """A figure of Figs 5-7: test MRR of each client (thin) and overall (thick) over the sweep points, with the
    random-ranking level of the same test candidates (the tables' chance row): overall as a reference line, each
    client's dotted in its colour, so a point at or below its own chance shows as such.

    ``table``: index = sweep point, columns = clients (incl. overall); ``chance``: column -> its chance MRR.
    """
    fig, ax = plt.subplots(figsize=(7.5, 4))
    per_client = f"{CHANCE}, per client (dotted, its colour)"
    for client in table.columns:
        thick = client == OVERALL
        (line,) = ax.plot(
            table.index,
            table[client],
            marker="o",
            linewidth=2.5 if thick else 1.2,
            color="saddlebrown" if thick else None,
            label=client,
        )
        if not thick:
            ax.axhline(chance[client], color=line.get_color(), linestyle=":", linewidth=0.9, label=per_client)
            per_client = None
    reference_lines(ax, {f"{CHANCE}, {OVERALL}": chance[OVERALL]})
    if log2:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(table.index), [str(int(v)) for v in table.index])
    else:
        ax.set_xticks(list(table.index), [str(v) for v in table.index])
    if reverse:
        ax.invert_xaxis()
    ax.set(title=title, xlabel=x_label, ylabel="test MRR")
    _legend_beside(ax)
    _save(fig, path)


def data_ratio_figure(
    ours: pd.DataFrame,
    theirs: pd.DataFrame,
    labels: tuple[str, str],
    client: str,
    chance: Mapping[str, float],
    path: Path,
) -> None:
    """Fig 8: MAP and MRR over the share of training data, FedMatch H+LR against individual BERT, each panel with
    the client's random-ranking level of its metric (``chance``: map and mrr)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, metric in zip(axes, ("map", "mrr")):
        ax.plot([100 * v for v in ours.index], ours[metric], marker="o", label=labels[0])
        ax.plot([100 * v for v in theirs.index], theirs[metric], marker="s", label=labels[1])
        reference_lines(ax, {CHANCE: chance[metric]})
        ax.set(title=f"{client}: test {metric.upper()}", xlabel="training data used (%)", ylabel=metric.upper())
        ax.legend(fontsize=8)
    _save(fig, path)


def partition_heatmap(counts: pd.DataFrame, title: str, path: Path) -> None:
    """Clients x classes sample counts of a label-skew split (``total`` column dropped), counts written in cells,
    so the skew of a run can be seen next to its result."""
    table = counts.drop(columns="total", errors="ignore")
    values = table.to_numpy(dtype=float)
    fig, ax = plt.subplots(figsize=(1.5 + 0.7 * table.shape[1], 1.2 + 0.4 * table.shape[0]))
    image = ax.imshow(values, cmap="Blues", aspect="auto", vmin=0)
    top = values.max() if values.size else 0.0
    for (i, j), value in np.ndenumerate(values):
        ax.text(
            j, i, f"{value:.0f}", ha="center", va="center", fontsize=7, color="white" if value > 0.6 * top else "black"
        )
    ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns], rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(table.shape[0]), [str(c) for c in table.index], fontsize=8)
    ax.set(title=title, xlabel="class", ylabel="client")
    fig.colorbar(image, ax=ax, label="samples")
    _save(fig, path, dpi=120)


def _annotated_heatmap(
    ax, table: pd.DataFrame, cmap: str, fmt: str, title: str, mark: str | None, label: str, fig
) -> None:
    """One clients x classes panel with its values written in the cells; ``mark`` = "min" / "max" boxes each
    column's smallest / largest cell (FedCMC's pick of a class's vector, and the class's largest holder)."""
    values = table.to_numpy(dtype=float)
    image = ax.imshow(values, cmap=cmap, aspect="auto")
    for (i, j), value in np.ndenumerate(values):
        red, green, blue, _ = image.cmap(image.norm(value))
        dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
        ax.text(j, i, format(value, fmt), ha="center", va="center", fontsize=6, color="white" if dark else "black")
    if mark is not None and values.size:
        for j in range(values.shape[1]):
            column = values[:, j]
            if mark == "max" and not column.max() > 0:
                continue
            i = int(np.argmin(column) if mark == "min" else np.argmax(column))
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5))
    ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns], rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(table.shape[0]), [str(c) for c in table.index], fontsize=7)
    ax.set(title=title, xlabel="class", ylabel="client")
    fig.colorbar(image, ax=ax, label=label, shrink=0.8)


def similarity_figure(
    first: pd.DataFrame, last: pd.DataFrame, counts: pd.DataFrame, titles: tuple[str, str, str], path: Path
) -> None:
    """FedCMC Fig 1: each client's local average similarity d_{k,c} (clients x classes) after its local training
    at two rounds, beside the clients' training counts. Red boxes: each class's smallest d (the client FedCMC's
    major rule picks) and each class's largest holder; Observation 3 says they coincide."""
    width = 1.6 + 0.55 * first.shape[1]
    fig, axes = plt.subplots(1, 3, figsize=(3 * width + 1.5, 1.6 + 0.36 * first.shape[0]))
    _annotated_heatmap(axes[0], first, "viridis", ".2f", titles[0], "min", "d_{k,c}", fig)
    _annotated_heatmap(axes[1], last, "viridis", ".2f", titles[1], "min", "d_{k,c}", fig)
    _annotated_heatmap(axes[2], counts, "Blues", ".0f", titles[2], "max", "training samples", fig)
    _save(fig, path, dpi=110)


def f1_curves_figure(
    curves: pd.DataFrame,
    title: str,
    path: Path,
    target: float | None = None,
    styles: dict[str, dict] | None = None,
    references: Mapping[str, float] | None = None,
    diverged: Iterable[str] = (),
) -> None:
    """FedCMC Fig 3: test micro-F1 (%) of the global model per round, one line per column (index = round), the
    target F1 dotted, the trivial baselines (``references``: label -> micro-F1) as reference lines, and a cross at
    the last point of each curve in ``diverged`` (a cell of it diverged by the health rule, so its end is no result)."""
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    diverged = set(diverged)
    for column, style in zip(curves.columns, distinct_styles(len(curves.columns))):
        series = curves[column].dropna()
        (line,) = ax.plot(
            series.index,
            100 * series.to_numpy(),
            markersize=3,
            label=str(column),
            **{**style, **(styles or {}).get(column, {})},
        )
        if column in diverged and len(series):
            ax.plot(
                series.index[-1],
                100 * series.iloc[-1],
                marker="X",
                markersize=11,
                color=line.get_color(),
                markeredgecolor="black",
                linestyle="none",
            )
    if target is not None:
        ax.axhline(100 * target, color="grey", linestyle=":", linewidth=1, label=f"target {100 * target:g}%")
    reference_lines(ax, references or {}, scale=100.0)
    if diverged & set(curves.columns):
        ax.plot(
            [],
            [],
            marker="X",
            markersize=9,
            color="white",
            markeredgecolor="black",
            linestyle="none",
            label="X: the curve's cell(s) diverged",
        )
    if len(curves.index):
        ax.set_xticks(list(curves.index))
    ax.set(title=title, xlabel="communication round", ylabel="test micro-F1 (%)")
    _legend_beside(ax)
    _save(fig, path)


def bar_figure(
    table: pd.DataFrame,
    title: str,
    ylabel: str,
    path: Path,
    seeds: int,
    references: Mapping[str, float | None] | None = None,
    marks: Mapping[str, str] | None = None,
) -> None:
    """FedCMC Fig 4: one bar per row of ``table`` (columns mean, std, in %) over ``seeds`` seeds, with ±1 std whiskers
    only over several (one seed's std is 0, and a zero-length whisker would read as a measured zero spread); the
    trivial rows the bars are read against (``references``, in %, ``reference_lines``) and each bar's health mark after
    its name (``marks``: row -> mark)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    positions = np.arange(len(table))
    ax.bar(positions, table["mean"], yerr=table["std"] if seeds > 1 else None, capsize=4, color="steelblue")
    for x, value in zip(positions, table["mean"]):
        ax.text(x, value, f"{value:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(positions, [f"{i}{(marks or {}).get(str(i), '')}" for i in table.index])
    reference_lines(ax, references or {})
    if references:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set(title=title, ylabel=ylabel)
    _save(fig, path)


def accuracy_bytes_figure(
    panels: dict[str, dict[str, pd.DataFrame]],
    title: str,
    path: Path,
    target: float | None = None,
    references: Mapping[str, float | None] | None = None,
) -> None:
    """SS-VFNAS: test accuracy (%) of the searched supernets against the megabytes exchanged so far, one panel per
    DP level, one line per method, and in every panel the trivial rows (``references``: label -> accuracy, which
    send nothing). ``panels``: panel title -> method label -> frame with columns bytes, accuracy and, over several
    seeds, accuracy_std (a ±1 std band)."""
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5.2 * max(len(panels), 1) + 1.5, 4), squeeze=False)
    for ax, (name, curves) in zip(axes[0], panels.items()):
        for label, frame in curves.items():
            dashed = label.startswith("SS-")
            megabytes = frame["bytes"] / 1e6
            line = ax.plot(
                megabytes,
                100 * frame["accuracy"],
                marker="o",
                markersize=3,
                label=label,
                linestyle="--" if dashed else "-",
            )
            _seed_band(ax, megabytes, frame, line[0].get_color())
        if target is not None:
            ax.axhline(100 * target, color="grey", linestyle=":", linewidth=1, label=f"target {100 * target:g}%")
        reference_lines(ax, references or {}, scale=100.0)
        ax.set(title=name, xlabel="MB exchanged in the search", ylabel="test accuracy (%)")
        _at_least_span(ax)
    _legend_beside(axes[0][-1])
    fig.suptitle(title, fontsize=10)
    _save(fig, path)


def accuracy_epsilon_figure(
    points: dict[str, pd.DataFrame],
    unbounded: dict[str, float],
    curves: dict[str, pd.DataFrame],
    title: str,
    path: Path,
    references: Mapping[str, float | None] | None = None,
) -> None:
    """SS-VFNAS, two panels. Left: retrained test accuracy (%) against the total epsilon of each DP level with noise,
    one line per method (``points``: label -> frame with columns epsilon, accuracy and, over several seeds,
    accuracy_std: a ±1 std band), each method's no-DP accuracy dotted (``unbounded``). Right: the supernets' test
    accuracy against the epsilon spent so far during the search (``curves``: label -> frame with the same columns).
    Both panels draw the trivial rows (``references``, which send nothing) as reference lines, each in its own style.
    Log x when epsilon spans more than a factor 10."""
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.2))
    colours: dict[str, str] = {}
    for ax, series in ((axes[0], points), (axes[1], curves)):
        values = []
        for label, frame in series.items():
            frame = frame.dropna(subset=["epsilon", "accuracy"])
            if frame.empty:
                continue
            line = ax.plot(
                frame["epsilon"],
                100 * frame["accuracy"],
                marker="o",
                markersize=3,
                label=label,
                linestyle="--" if label.startswith("SS-") else "-",
                color=colours.get(label),
            )
            colours.setdefault(label, line[0].get_color())
            _seed_band(ax, frame["epsilon"], frame, line[0].get_color())
            values += frame["epsilon"].tolist()
        if values and min(values) > 0 and max(values) / min(values) > 10:
            ax.set_xscale("log")
    for label, accuracy in unbounded.items():
        axes[0].axhline(
            100 * accuracy, linestyle=":", linewidth=1, color=colours.get(label, "grey"), label=f"{label}, no DP"
        )
    for ax in axes:
        reference_lines(ax, references or {}, scale=100.0)
    axes[0].set(
        title="retrained networks, by DP level",
        xlabel="epsilon (search + retraining, worst party)",
        ylabel="test accuracy (%)",
    )
    axes[1].set(
        title="supernets during the search", xlabel="epsilon spent so far (worst party)", ylabel="test accuracy (%)"
    )
    for ax in axes:
        _at_least_span(ax)
        _legend_beside(ax, fontsize=6)
    fig.suptitle(title, fontsize=10)
    _save(fig, path)


def messages_figure(table: pd.DataFrame, title: str, path: Path) -> None:
    """SS-VFNAS: messages and sequential exchanges per collaborative step (``table``: index = method label,
    columns = 'messages K=..' and 'exchanges K=..'), grouped bars."""
    fig, ax = plt.subplots(figsize=(1.5 + 1.3 * len(table.index) * max(1, len(table.columns) / 2), 4))
    width = 0.8 / max(len(table.columns), 1)
    positions = np.arange(len(table.index))
    for i, column in enumerate(table.columns):
        bars = ax.bar(positions + i * width, table[column].to_numpy(dtype=float), width, label=str(column))
        for bar in bars:
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                bar.get_height(),
                f"{bar.get_height():.0f}",
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(positions + width * (len(table.columns) - 1) / 2, [str(i) for i in table.index], fontsize=8)
    ax.set(title=title, ylabel="per collaborative step")
    ax.legend(fontsize=7)
    _save(fig, path)
