"""The cells of FedCMC's grid. A cell is one training run: (dataset, alpha, clients, local epochs, method,
vector rule, subset, seed). The main table varies dataset x alpha x method; each sweep varies one thing at
the sweep's dataset and alpha, everything else at the settings' values.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedrepro.config import Params, check_names
from fedrepro.fedcmc.methods import VECTORS

SWEEPS = {
    "clients": "the clients table: 10 / 20 / 50 clients",
    "local_epochs": "Fig 3b: local epochs between aggregations",
    "vectors": "Fig 4: major / random / minor / no classifier vectors (FedCMC)",
    "subsets": "Table 3: 500 training sentences, balanced vs natural label mix",
}


@dataclass(frozen=True)
class Cell:
    method: str
    dataset: str
    alpha: float
    clients: int
    local_epochs: int
    seed: int
    vectors: str = "major"
    subset: str | None = None

    @property
    def partition(self) -> str:
        """Folder name of the partition this cell trains on (shared by every method and seed)."""
        return f"{self.dataset}-a{self.alpha:g}-k{self.clients}" + (f"-{self.subset}" if self.subset else "")

    @property
    def name(self) -> str:
        vectors = f"-{self.vectors}" if self.method == "fedcmc" and self.vectors != "major" else ""
        return f"{self.partition}-e{self.local_epochs}-{self.method}{vectors}-s{self.seed}"


def table_cells(params: Params) -> list[Cell]:
    fedcmc, settings = params.fedcmc, params.fedcmc.settings
    return [
        Cell(method, dataset, alpha, settings.clients, settings.local_epochs, seed)
        for method in fedcmc.methods
        for dataset in fedcmc.datasets
        for alpha in fedcmc.alphas
        for seed in fedcmc.seeds
    ]


def sweep_points(params: Params, sweep: str) -> list[Cell]:
    """Every point of a sweep, as the report shows it (some may be main-table cells)."""
    sweeps, settings = params.fedcmc.sweeps, params.fedcmc.settings
    check_names("fedcmc.sweeps.vectors", sweeps.vectors, VECTORS)
    base = dict(
        dataset=sweeps.dataset, alpha=sweeps.alpha, clients=settings.clients, local_epochs=settings.local_epochs
    )
    cells = []
    for seed in sweeps.seeds:
        if sweep == "clients":
            cells += [Cell(m, **{**base, "clients": k}, seed=seed) for k in sweeps.clients for m in sweeps.methods]
        elif sweep == "local_epochs":
            cells += [
                Cell(m, **{**base, "local_epochs": e}, seed=seed) for e in sweeps.local_epochs for m in sweeps.methods
            ]
        elif sweep == "vectors":
            cells += [
                Cell("fedcmc", **{**base, "alpha": sweeps.vectors_alpha}, seed=seed, vectors=v) for v in sweeps.vectors
            ]
        elif sweep == "subsets":
            cells += [
                Cell(m, **{**base, "dataset": sweeps.subset_dataset}, seed=seed, subset=mode)
                for mode in sweeps.subset_modes
                for m in sweeps.subset_methods
            ]
        else:
            raise ValueError(f"FedCMC sweep {sweep!r}: allowed {sorted(SWEEPS)}")
    return cells


def sweep_cells(params: Params, sweep: str) -> list[Cell]:
    """The points of a sweep that need training: a point identical to a main-table cell (e.g. 10 clients, 1 local
    epoch) is that cell, trained once by its table stage and read from there by the report."""
    table = set(table_cells(params))
    return [c for c in sweep_points(params, sweep) if c not in table]


def training_weight(params: Params, cell: Cell) -> float:
    """The cell's training in table cells' worth: its local epochs against the settings', on Table 3's subset the
    subset's share of the training sentences. What a grid starts first (the longest) and a snapshot's plan counts."""
    settings = params.fedcmc.settings
    share = params.fedcmc.sweeps.subset_size / settings.max_train_sentences if settings.max_train_sentences else 1.0
    return cell.local_epochs / settings.local_epochs * (share if cell.subset else 1.0)


def all_cells(params: Params) -> list[Cell]:
    return table_cells(params) + [c for sweep in SWEEPS for c in sweep_cells(params, sweep)]
