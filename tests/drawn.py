"""The figures a report draws, caught before they are saved, so that a test reads their lines and legends rather than
the PNG's pixels."""

from pathlib import Path

from fedrepro.report import figures


def catch_figures(monkeypatch) -> dict:
    """File name -> the matplotlib figure of every figure drawn after this call (saved nowhere)."""
    caught = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path, dpi=100: caught.__setitem__(Path(path).name, fig))
    return caught


def labels(ax) -> list[str]:
    """The legend's labels of an axes, in drawing order."""
    return ax.get_legend_handles_labels()[1]


def line(ax, label: str):
    """The one line of an axes drawn with ``label``."""
    found = [drawn for drawn in ax.get_lines() if drawn.get_label() == label]
    assert len(found) == 1, (label, [drawn.get_label() for drawn in ax.get_lines()])
    return found[0]
