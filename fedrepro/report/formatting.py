"""How every paper's report words its numbers, so a table caption reads the same in each."""

from __future__ import annotations


def over_seeds(count: int) -> str:
    """What a table cell's number is: the mean ± std over ``count`` seeds, or one seed's value."""
    return f"mean ± std over {count} seeds" if count > 1 else "1 seed"


def sweep_not_run(key: str, reason: str = "") -> list[str]:
    """The lines standing in for a figure whose sweep (params ``key``) is empty at this scale, in place of a table
    that would have no points; ``reason`` follows the sentence's parenthesis."""
    return [f"Not run at this scale (`{key}` is empty){reason}.", ""]
