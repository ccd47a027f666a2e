"""What every paper's PARTIAL.md says about the cells its ledger holds so far (``scripts/cpu_snapshot.py partial``):
how many of the main table's cells are in, seed by seed, and the machines they were trained on."""

from __future__ import annotations

from typing import Mapping, Sequence


def coverage(cells: Sequence, held: Mapping[str, Mapping]) -> tuple[int, str]:
    """(how many of ``cells`` the ledger holds, 'seed 0: 5 of 19, seed 1: ...'); a cell has ``name`` and ``seed``."""
    per_seed = ", ".join(
        f"seed {seed}: {sum(c.name in held for c in cells if c.seed == seed)} of {sum(c.seed == seed for c in cells)}"
        for seed in sorted({c.seed for c in cells})
    )
    return sum(c.name in held for c in cells), per_seed


def machines(held: Mapping[str, Mapping]) -> str:
    """The CPUs (with torch's instruction set) the held cells' metrics say they were trained on, or '-'."""
    found = {
        f"{m['hardware'].get('cpu', '?')} ({m['hardware'].get('torch_cpu_capability', '?')})"
        for m in held.values()
        if m.get("hardware")
    }
    return ", ".join(sorted(found)) or "-"
