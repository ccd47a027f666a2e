"""FedMatch's training-sanity sweep: the pooled reference per learning rate against BM25 alone and random order.

Run it in a checkout whose data stages (`dvc repro fedmatch_mine fedmatch_tokenizer`) ran at the scale being checked,
then commit the tables it writes (sanity.md, sanity.csv, sanity.json):

    cd <clone> && python <this repo>/scripts/fedmatch_sanity.py --lrs 2e-5 5e-5 1e-4 5e-4 --rounds 3 \
        --margin 0.02 --deeper 0 5e-5 2 --out <this repo>/reports/cpu/fedmatch
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.fedmatch.sanity import BM25, RANDOM, per_collection, pooled_reference, run_sanity
from fedrepro.io import read_json, tree_digest, write_json
from fedrepro.report.sanity import write_sanity

MINED, PARTITION, TOKENIZER = Path("data/mined"), Path("data/partition/qa"), Path("data/tokenizer")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", type=float, nargs="+", required=True)
    parser.add_argument(
        "--rounds", type=int, required=True, help="rounds of the pooled reference (valid scored after each)"
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=0.02,
        help="MAP the reference must beat BM25 and random order by, on every collection",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--deeper",
        nargs=3,
        metavar=("KEEP_LAYERS", "LR", "ROUNDS"),
        default=None,
        help="also train one pooled reference with model.keep_layers = KEEP_LAYERS (0 = all) and report it "
        "beside the protocol (not part of the choice): what a deeper backbone would buy",
    )
    args = parser.parse_args()
    params = load_params()
    result, baselines = run_sanity(
        params,
        args.lrs,
        args.rounds,
        MINED,
        PARTITION,
        TOKENIZER,
        tree_digest(MINED, TOKENIZER),
        Path("data/checkpoints/fedmatch-sanity"),
        args.margin,
    )
    verdict = write_sanity(result, args.out)
    table = per_collection(result, baselines)
    passed = bool(len(table)) and bool(table["passed"].all())
    with open(args.out / "sanity.md", "a", encoding="utf-8") as handle:
        handle.write(
            "\n".join(
                [
                    "",
                    "## Per collection at the chosen setting (the protocol's test)",
                    "",
                    "Validation MAP of the chosen pooled reference against BM25 alone and "
                    "a random order of the same candidates; required margin over the better of the two: "
                    f"+{args.margin:g} MAP on every collection: **{'passed' if passed else 'FAILED'}**.",
                    "",
                    table.to_markdown(index=False, floatfmt=".4f") if len(table) else "No setting trained soundly.",
                    "",
                ]
            )
        )
    if args.deeper:
        deeper_section(params, args, baselines)
    summary = read_json(args.out / "sanity.json")
    summary.update(
        {
            "per_collection": table.to_dict(orient="records"),
            "passed_every_collection": passed,
            "baselines_per_collection": baselines,
        }
    )
    write_json(args.out / "sanity.json", summary)
    print(verdict, "every collection:", passed)


def deeper_section(params, args, baselines: dict) -> None:
    """One pooled reference on a deeper backbone, per round and per collection against the same baselines."""
    keep, lr, rounds = int(args.deeper[0]), float(args.deeper[1]), int(args.deeper[2])
    deeper = params.model_copy(update={"model": params.model.model_copy(update={"keep_layers": keep})})
    points = pooled_reference(
        deeper,
        lr,
        rounds,
        MINED,
        TOKENIZER,
        tree_digest(MINED, TOKENIZER),
        Path(f"data/checkpoints/fedmatch-sanity-extra/keep{keep}-lr{lr:g}"),
    )
    rows = []
    for point in points:
        row = {"round": point["round"], "train_loss": point["train_loss"], "valid (mean)": point["valid"]}
        for client in sorted(baselines[BM25]):
            best = max(baselines[BM25][client], baselines[RANDOM][client])
            row[f"{client} (margin)"] = f"{point[f'valid {client}']:.4f} ({point[f'valid {client}'] - best:+.4f})"
        rows.append(row)
    layers = "all" if keep == 0 else f"the lowest {keep}"
    with open(args.out / "sanity.md", "a", encoding="utf-8") as handle:
        handle.write(
            "\n".join(
                [
                    "",
                    f"## Beside the protocol: {layers} layers of the backbone (not part of the choice)",
                    "",
                    f"The same pooled reference with model.keep_layers = {keep}, lr {lr:g}, {rounds} rounds (the "
                    f"schedule over {rounds}), validation MAP per collection and its margin over the better of BM25 "
                    "and random order.",
                    "",
                    pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4f"),
                    "",
                ]
            )
        )


if __name__ == "__main__":
    run_stage(main)
