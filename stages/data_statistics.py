"""Stage data_statistics: reports/statistics.md, the data tables (FedQA Table 1 shape), without any training."""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.io import atomic_file, read_json
from fedrepro.report.data_tables import render_statistics


def main() -> None:
    params = load_params()
    text = render_statistics(
        params.data.source,
        params.scale,
        read_json("data/prepared/statistics.json"),
        read_json("data/partition/summary.json"),
        read_json("data/mined/summary.json"),
    )
    with atomic_file(Path("reports/statistics.md")) as handle:
        handle.write(text)


if __name__ == "__main__":
    run_stage(main)
