"""Stage fedcmc_partition: every client split FedCMC's grid trains on, plus the tiny backbone's vocabulary
(``fedrepro.fedcmc.partition``), and each partition's clients x classes heat-map.
"""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.fedcmc.partition import build_partition, load_corpus, partition_cells, tiny_tokenizer, write_partition
from fedrepro.io import atomic_dir, write_json
from fedrepro.report.figures import partition_heatmap

PREPARED, OUT, TOKENIZER = Path("data/prepared/re"), Path("data/fedcmc/partitions"), Path("data/fedcmc/tokenizer")


def main() -> None:
    params = load_params()
    corpora = {}
    with atomic_dir(OUT) as tmp:
        for cell in partition_cells(params):
            if cell.dataset not in corpora:
                corpora[cell.dataset] = load_corpus(PREPARED, cell.dataset)
            table, assignment, proportions = build_partition(params, cell, corpora[cell.dataset])
            counts = write_partition(tmp / cell.partition, params, cell, table, assignment, proportions)
            subset = f", {cell.subset} subset" if cell.subset else ""
            partition_heatmap(
                counts,
                f"{cell.dataset}: Dir(alpha={cell.alpha:g}), {cell.clients} clients{subset}",
                tmp / cell.partition / "heatmap.png",
            )
    backbone = params.fedcmc.settings.backbone
    with atomic_dir(TOKENIZER) as tmp:
        if backbone == "tiny":
            tiny_tokenizer(params, list(corpora.values())).save_pretrained(str(tmp))
        write_json(tmp / "info.json", {"backbone": backbone, "trained_here": backbone == "tiny"})


if __name__ == "__main__":
    run_stage(main)
