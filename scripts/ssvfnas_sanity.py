"""SS-VFNAS's training-sanity protocol: per dataset-K the pooled reference against the majority class and the label
party alone, and VFNAS-2's architecture lr x search steps x retraining lr sweep, all on a held-out share of train
(never test).

Run it in a checkout whose `ssvfnas_partition` stage ran at the scale being checked (e.g. a CPU clone on the mirror),
then commit what it writes:

    cd <clone> && python <this repo>/scripts/ssvfnas_sanity.py --out <this repo>/reports/cpu/ssvfnas

Each run is cached under --work, so an interrupted sweep resumes; --partitions runs a subset (the files are written
from every partition of the grid, so run them all, or once more without --partitions, before committing).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.errors import ConfigError
from fedrepro.ssvfnas.cells import partitions
from fedrepro.ssvfnas.phases import load_partition
from fedrepro.ssvfnas.sanity import SanitySettings, preset, sanity_partition, write_ssvfnas_sanity

PARTITIONS = Path("data/ssvfnas/partitions")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--lrs",
        type=float,
        nargs="+",
        default=[0.01, 0.05, 0.2],
        help="learning rates of the pooled reference and of the label party alone",
    )
    parser.add_argument("--arch-lrs", type=float, nargs="+", default=[3e-4, 3e-3, 3e-2])
    parser.add_argument("--search-steps", type=int, nargs="+", default=[100, 200])
    parser.add_argument("--retrain-lrs", type=float, nargs="+", default=[0.05, 0.2], help="VFNAS-2's retraining lr")
    parser.add_argument(
        "--margin", type=float, default=0.01, help="accuracy the reference must beat the best trivial baseline by"
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.005,
        help="mean held-out accuracy within which two sweep settings count as tied",
    )
    parser.add_argument(
        "--held-out",
        type=float,
        default=None,
        help="share of each partition's train split held out (default: ssvfnas.retrain.held_out_fraction, "
        "so the protocol scores the rows the grid's cells are validated on)",
    )
    parser.add_argument("--eval-every", type=int, default=50, help="retraining steps between held-out points")
    parser.add_argument(
        "--partitions", nargs="+", default=None, help="dataset-K names (default: every one of the grid)"
    )
    parser.add_argument("--work", type=Path, default=Path("data/ssvfnas/sanity"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = load_params()
    settings = SanitySettings(
        tuple(args.lrs),
        tuple(args.arch_lrs),
        tuple(args.search_steps),
        tuple(args.retrain_lrs),
        args.margin,
        params.ssvfnas.retrain.held_out_fraction if args.held_out is None else args.held_out,
        args.eval_every,
    )
    names = [f"{dataset}-k{k}" for dataset, k, _ in partitions(params)]
    unknown = sorted(set(args.partitions or []) - set(names))
    if unknown:
        raise ConfigError(f"--partitions {unknown}: the grid's partitions are {names}")
    started = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f} s] {message}", file=sys.stderr, flush=True)

    results = {
        name: sanity_partition(params, load_partition(PARTITIONS / name), settings, args.work, progress)
        for name in args.partitions or names
    }
    if set(results) != set(names):
        progress(f"ran {sorted(results)} only: files not written (every partition of the grid is needed)")
        return
    out = write_ssvfnas_sanity(results, settings, preset(params), args.tolerance, args.out, params.scale)
    progress(f"wrote {args.out}/sanity.md: choice {out['arch_choice']}")


if __name__ == "__main__":
    run_stage(main)
