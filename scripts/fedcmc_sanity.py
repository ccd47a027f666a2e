"""FedCMC's training-sanity sweep: the pooled reference per learning rate against the trivial baselines, on valid.

Run it in a checkout whose data stages ran at the scale being checked (e.g. the CPU clone of
`scripts/cpu_snapshot.py`), then commit the table it writes:

    cd <clone> && python <this repo>/scripts/fedcmc_sanity.py --lrs 2e-5 5e-5 1e-4 5e-4 --rounds 5 \
        --out <this repo>/reports/cpu/fedcmc

With ``--federated fedavg`` it trains that method's cells at every alpha of the grid instead (the federated
reference: which lr and rounds a federation needs under the grid's label skew), written to sanity-federated-*.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.fedcmc.sanity import run_federated_sanity, run_sanity
from fedrepro.io import tree_digest, write_json
from fedrepro.report.sanity import write_sanity

PREPARED, PARTITIONS, TOKENIZER = (
    Path("data/prepared/re"),
    Path("data/fedcmc/partitions"),
    Path("data/fedcmc/tokenizer"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", type=float, nargs="+", required=True)
    parser.add_argument(
        "--rounds", type=int, required=True, help="epochs of the pooled reference (valid scored after each)"
    )
    parser.add_argument(
        "--margin", type=float, default=0.05, help="micro-F1 the reference must beat the best trivial baseline by"
    )
    parser.add_argument("--datasets", nargs="+", default=None, help="default: fedcmc.datasets")
    parser.add_argument("--federated", metavar="METHOD", help="sweep this method's cells at every alpha instead")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = load_params()
    verdicts = {}
    folders, checkpoints = (PREPARED, PARTITIONS, TOKENIZER), Path("data/checkpoints/fedcmc-sanity")
    prefix = "sanity-federated-" if args.federated else "sanity-"
    for dataset in args.datasets or params.fedcmc.datasets:
        digests = {
            alpha: tree_digest(
                PREPARED / dataset, PARTITIONS / f"{dataset}-a{alpha:g}-k{params.fedcmc.settings.clients}", TOKENIZER
            )
            for alpha in params.fedcmc.alphas
        }
        if args.federated:
            result = run_federated_sanity(
                params,
                dataset,
                args.federated,
                params.fedcmc.alphas,
                args.lrs,
                args.rounds,
                digests,
                folders,
                checkpoints,
                args.margin,
            )
        else:
            result = run_sanity(
                params,
                dataset,
                args.lrs,
                args.rounds,
                folders,
                digests[params.fedcmc.alphas[0]],
                checkpoints,
                args.margin,
            )
        verdicts[dataset] = write_sanity(result, args.out / f"{prefix}{dataset}")
        print(dataset, verdicts[dataset])
    write_json(args.out / f"{prefix.rstrip('-')}.json", verdicts)


if __name__ == "__main__":
    run_stage(main)
