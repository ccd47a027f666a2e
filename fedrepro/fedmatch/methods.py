"""Every row of FedMatch's Tables 2-3 as a recipe for the one engine: which algorithm, which model, which patch.

A method is not a training loop: it names an algorithm class of ``fedrepro/fl/algorithms`` (what is shared,
what the local loss adds, how the server aggregates), the matching model it trains, and whether clients are
sampled. ``fedmatch_<insertion initial>_<structure>`` are the paper's eight variants.
"""

from __future__ import annotations

from dataclasses import dataclass

INSERTION_NAMES = {"i": "inner", "o": "outer", "v": "vertical", "h": "horizontal"}
STRUCTURE_NAMES = {"pal": "PAL", "lr": "LR"}


@dataclass(frozen=True)
class Method:
    algorithm: str
    """A name in ``fedrepro.fl.algorithms.REGISTRY``."""
    label: str
    """The row label the paper uses."""
    model: str = "bert"
    """``bert`` (the cross-encoder on the configured backbone) or a non-BERT matcher (``re2``, ``esim``)."""
    insertion: str | None = None
    structure: str | None = None
    client_sampling: bool = False
    """True: ``fedmatch.settings.clients_sampled`` of the T clients train each round (the paper's _CS rows)."""


def _fedmatch_variants() -> dict[str, Method]:
    return {
        f"fedmatch_{initial}_{structure}": Method(
            "fedmatch",
            f"FedMatch {initial.upper()}+{STRUCTURE_NAMES[structure]}",
            insertion=insertion,
            structure=structure,
        )
        for initial, insertion in INSERTION_NAMES.items()
        for structure in STRUCTURE_NAMES
    }


METHODS: dict[str, Method] = {
    "individual_re2": Method("individual", "RE2 (individual)", model="re2"),
    "individual_esim": Method("individual", "ESIM (individual)", model="esim"),
    "individual": Method("individual", "BERT (individual)"),
    "centralised": Method("centralised", "BERT (centralised, not private)"),
    "coverquery": Method("coverquery", "CoverQuery"),
    "fedavg": Method("fedavg", "FedAvg"),
    "fedprox": Method("fedprox", "FedProx"),
    "lg_fedavg": Method("lg_fedavg", "LG-FedAvg"),
    "fedper": Method("fedper", "FedPer"),
    **_fedmatch_variants(),
    "fedavg_cs": Method("fedavg", "FedAvg_CS", client_sampling=True),
    "fedmatch_cs": Method(
        "fedmatch", "FedMatch_CS (H+LR)", insertion="horizontal", structure="lr", client_sampling=True
    ),
}

FIGURE_METHOD = "fedmatch_h_lr"
"""The variant the paper's ablations (Figs 5-8) vary: FedMatch H+LR."""
