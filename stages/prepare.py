"""Stage prepare: one tidy table per collection (question id, question, answer id, answer, split, domain)."""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.data.embedded import COLLECTION, load_insuranceqa_package
from fedrepro.io import atomic_dir, write_table

RAW, OUT = Path("data/raw"), Path("data/prepared")


def main() -> None:
    params = load_params()
    with atomic_dir(OUT) as tmp:
        if params.data.source == "embedded":
            pairs, answers, pools = load_insuranceqa_package(RAW / "insuranceqa_pkg")
            folder = tmp / "qa" / COLLECTION
            folder.mkdir(parents=True)
            write_table(folder / "pairs.parquet", pairs)
            write_table(folder / "answers.parquet", answers)
            write_table(folder / "pools.parquet", pools)


if __name__ == "__main__":
    run_stage(main)
