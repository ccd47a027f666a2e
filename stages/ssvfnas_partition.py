"""Stage ssvfnas_partition: every vertical partition SS-VFNAS's grid runs on, made once.

For each (dataset, K) of the grid (``fedrepro.ssvfnas.cells.partitions``): the prepared vertical set's parties
aligned by a plain id intersection (not a PSI; the ids each side loses are counted), capped to the scale's size,
split once (stratified, seeded) into train / search-valid / test, each party's features scaled from its own
training rows. Writes ``data/ssvfnas/partitions/<dataset>-k<K>/`` and a ``summary.json`` over all of them.
"""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.errors import DataError
from fedrepro.io import atomic_dir, write_json
from fedrepro.ssvfnas.cells import partitions, skipped_partitions
from fedrepro.ssvfnas.partition import build_partition, write_partition

PREPARED, OUT = Path("data/prepared/vertical"), Path("data/ssvfnas/partitions")


def main() -> None:
    params = load_params()
    split, seed = params.ssvfnas.split, params.data.seed
    summaries = {}
    with atomic_dir(OUT) as tmp:
        for dataset, k, prepared in partitions(params):
            folder = PREPARED / prepared
            if not (folder / "meta.json").exists():
                available = sorted(p.name for p in PREPARED.iterdir()) if PREPARED.exists() else []
                hint = (
                    " (the embedded source prepares only the digits; set data.source=mirror)"
                    if params.data.source == "embedded"
                    else ""
                )
                raise DataError(
                    f"params: ssvfnas.datasets names {dataset!r}, but {folder} does not exist{hint}; prepared "
                    f"vertical sets: {available}"
                )
            tables, labels, splits, summary = build_partition(
                folder, dataset, k, split.test_fraction, split.valid_fraction, split.max_samples, seed
            )
            write_partition(tmp / summary["name"], tables, labels, splits, summary)
            summaries[summary["name"]] = summary
        write_json(
            tmp / "summary.json",
            {
                "partitions": summaries,
                "skipped": [
                    {"dataset": d, "parties": k, "allowed": allowed} for d, k, allowed in skipped_partitions(params)
                ],
            },
        )


if __name__ == "__main__":
    run_stage(main)
