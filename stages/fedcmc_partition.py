"""Stage fedcmc_partition: every client split FedCMC's grid trains on, plus the tiny backbone's vocabulary.

For each (dataset, alpha, clients, subset) some cell uses: the corpus capped to the scale's size (a seeded
sample that keeps the label mix) or, for Table 3, the subset drawn from the whole training split, then the
label-skew partition. Written
per partition: the assignment of every sentence to a client (train, and the same proportions applied to
valid and test), the clients x classes counts and their heat-map, and the drawn proportions.
The tiny backbone's WordPiece vocabulary is trained here on the corpora's training text (markers removed;
they are added as special tokens), as FedMatch's is on its clients' text.
"""

import re
from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.data.label_skew import cap_splits, client_class_counts, partition_corpus, skew_statistic, subsample_train
from fedrepro.errors import DataError
from fedrepro.fedcmc.cells import all_cells
from fedrepro.io import atomic_dir, read_table, write_json, write_table
from fedrepro.models.backbone import train_wordpiece
from fedrepro.models.relation import add_entity_markers
from fedrepro.report.figures import partition_heatmap

PREPARED, OUT, TOKENIZER = Path("data/prepared/re"), Path("data/fedcmc/partitions"), Path("data/fedcmc/tokenizer")
MARKER = re.compile(r"</?e[12]>")


def load_corpus(dataset: str):
    path = PREPARED / dataset / "table.parquet"
    if not path.exists():
        available = sorted(p.name for p in PREPARED.iterdir()) if PREPARED.exists() else []
        hint = " (i2b2 is prepared only when data.i2b2_dir points at the n2c2 files)" if dataset == "i2b2" else ""
        raise DataError(f"params: fedcmc names dataset {dataset!r}, but {path} does not exist{hint}; prepared corpora: "
                        f"{available}; change fedcmc.datasets (or data.re_corpora / data.source)")
    return read_table(path)


def main() -> None:
    params = load_params()
    settings, sweeps, seed = params.fedcmc.settings, params.fedcmc.sweeps, params.data.seed
    corpora = {}
    with atomic_dir(OUT) as tmp:
        for cell in sorted({(c.dataset, c.alpha, c.clients, c.subset, c.partition) for c in all_cells(params)}, key=lambda t: t[4]):
            dataset, alpha, clients, subset, name = cell
            if dataset not in corpora:
                corpora[dataset] = load_corpus(dataset)
            if subset is None:
                table = cap_splits(corpora[dataset], settings.max_train_sentences, settings.max_eval_sentences, seed)
            else:  # Table 3's subset is drawn from the whole training split; it is smaller than any cap
                table = cap_splits(subsample_train(corpora[dataset], sweeps.subset_size, subset, seed,
                                                   settings.negative_labels), 0, settings.max_eval_sentences, seed)
            assignment, proportions = partition_corpus(table, clients, settings.partition, alpha, seed,
                                                       settings.min_client_size, settings.balance)
            counts = client_class_counts(assignment, "train")
            folder = tmp / name
            folder.mkdir()
            write_table(folder / "assignment.parquet", assignment)
            counts.to_csv(folder / "counts.csv")
            proportions.to_csv(folder / "proportions.csv", float_format="%.6f")
            write_json(folder / "partition.json", {
                "dataset": dataset, "alpha": alpha, "clients": clients, "subset": subset, "scheme": settings.partition,
                "balance": settings.balance, "seed": seed, "classes": sorted(table["label"].unique().tolist()),
                "sentences": assignment.groupby("split").size().to_dict(), "skew": skew_statistic(counts)})
            partition_heatmap(counts, f"{dataset}: Dir(alpha={alpha:g}), {clients} clients" + (f", {subset} subset" if subset else ""),
                              folder / "heatmap.png")
    with atomic_dir(TOKENIZER) as tmp:
        if settings.backbone == "tiny":
            capped = [cap_splits(table, settings.max_train_sentences, 0, seed) for table in corpora.values()]
            texts = (MARKER.sub(" ", text) for table in capped for text in table.loc[table["split"] == "train", "text"])
            tokenizer = train_wordpiece(texts, params.model.tiny.vocab_size)
            add_entity_markers(tokenizer)
            tokenizer.save_pretrained(str(tmp))
        write_json(tmp / "info.json", {"backbone": settings.backbone, "trained_here": settings.backbone == "tiny"})


if __name__ == "__main__":
    run_stage(main)
