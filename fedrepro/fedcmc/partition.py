"""FedCMC's client splits, one per partition some cell trains on (``Cell.partition``), and the tiny backbone's
vocabulary.

* A partition's corpus is capped to the scale's size (a seeded sample that keeps the label mix) or, for Table 3, is
  the subset drawn from the whole training split; then the label-skew partition assigns every training sentence to
  a client and applies the same proportions to valid and test (``fedrepro.data.label_skew``).
* The tiny backbone's WordPiece vocabulary is trained on the corpora's training text (markers removed; they are
  added as special tokens), as FedMatch's is on its clients' text.

Files per partition folder: ``assignment.parquet``, ``counts.csv`` (clients x classes), ``proportions.csv`` (the
drawn proportions) and ``partition.json`` (``write_partition``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from fedrepro.config import Params
from fedrepro.data.label_skew import cap_splits, client_class_counts, partition_corpus, skew_statistic, subsample_train
from fedrepro.errors import DataError
from fedrepro.fedcmc.cells import Cell, all_cells
from fedrepro.io import read_table, write_json, write_table
from fedrepro.models.backbone import train_wordpiece
from fedrepro.models.relation import add_entity_markers

MARKER = re.compile(r"</?e[12]>")


def partition_cells(params: Params) -> list[Cell]:
    """One cell per partition of the grid (the first that names it), by partition name."""
    first: dict[str, Cell] = {}
    for cell in all_cells(params):
        first.setdefault(cell.partition, cell)
    return [first[name] for name in sorted(first)]


def load_corpus(prepared_dir: Path, dataset: str) -> pd.DataFrame:
    path = Path(prepared_dir) / dataset / "table.parquet"
    if not path.exists():
        available = sorted(p.name for p in Path(prepared_dir).iterdir()) if Path(prepared_dir).exists() else []
        hint = " (i2b2 is prepared only when data.i2b2_dir points at the n2c2 files)" if dataset == "i2b2" else ""
        raise DataError(
            f"params: fedcmc names dataset {dataset!r}, but {path} does not exist{hint}; prepared corpora: "
            f"{available}; change whichever of fedcmc.datasets, fedcmc.sweeps.dataset and "
            "fedcmc.sweeps.subset_dataset names it (or data.re_corpora / data.source)"
        )
    return read_table(path)


def build_partition(
    params: Params, cell: Cell, corpus: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(the corpus as the cell's partition caps it, each sentence's client, the drawn proportions)."""
    settings, seed = params.fedcmc.settings, params.data.seed
    if cell.subset is None:
        table = cap_splits(corpus, settings.max_train_sentences, settings.max_eval_sentences, seed)
    else:  # Table 3's subset is drawn from the whole training split (smaller than any cap), from the same corpus and
        # classes as the main table: one reading of ChemProt everywhere (docs/fedcmc.md)
        try:
            subset = subsample_train(corpus, params.fedcmc.sweeps.subset_size, cell.subset, seed)
        except DataError as error:  # the library speaks of its arguments; the user set them as params
            raise DataError(
                f"params: fedcmc.sweeps.subset_size = {params.fedcmc.sweeps.subset_size} with subset mode "
                f"{cell.subset!r} on {cell.dataset}: {str(error).removeprefix('subsample_train: ')}"
            ) from None
        table = cap_splits(subset, 0, settings.max_eval_sentences, seed)
    assignment, proportions = partition_corpus(
        table, cell.clients, settings.partition, cell.alpha, seed, settings.min_client_size, settings.balance
    )
    return table, assignment, proportions


def write_partition(
    folder: Path, params: Params, cell: Cell, table: pd.DataFrame, assignment: pd.DataFrame, proportions: pd.DataFrame
) -> pd.DataFrame:
    """The partition's files in ``folder`` (created); returns its clients x classes training counts."""
    settings = params.fedcmc.settings
    counts = client_class_counts(assignment, "train")
    folder.mkdir()
    write_table(folder / "assignment.parquet", assignment)
    counts.to_csv(folder / "counts.csv")
    proportions.to_csv(folder / "proportions.csv", float_format="%.6f")
    write_json(
        folder / "partition.json",
        {
            "dataset": cell.dataset,
            "alpha": cell.alpha,
            "clients": cell.clients,
            "subset": cell.subset,
            "scheme": settings.partition,
            "balance": settings.balance,
            "seed": params.data.seed,
            "classes": sorted(table["label"].unique().tolist()),
            "sentences": assignment.groupby("split").size().to_dict(),
            "skew": skew_statistic(counts),
        },
    )
    return counts


def tiny_tokenizer(params: Params, corpora: list[pd.DataFrame]):
    """The tiny backbone's WordPiece vocabulary from the corpora's (capped) training text, with the entity markers."""
    settings = params.fedcmc.settings
    capped = [cap_splits(table, settings.max_train_sentences, 0, params.data.seed) for table in corpora]
    texts = (MARKER.sub(" ", text) for table in capped for text in table.loc[table["split"] == "train", "text"])
    tokenizer = train_wordpiece(texts, params.model.tiny.vocab_size)
    add_entity_markers(tokenizer)
    return tokenizer
