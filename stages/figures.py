"""Stage figures: convergence curves and per-client test results as PNG files in reports/figures."""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.io import atomic_dir
from fedrepro.report.figures import convergence_figure, per_client_figure
from fedrepro.report.results import load_histories, load_results


def main() -> None:
    train = load_params().train
    histories = load_histories(Path("data/train"), train.algorithms, train.seeds)
    results = load_results(Path("data/eval"), train.algorithms, train.seeds)
    with atomic_dir(Path("reports/figures")) as tmp:
        convergence_figure(histories, tmp / "convergence.png")
        per_client_figure(results, "map", tmp / "test_map.png")
        per_client_figure(results, "mrr", tmp / "test_mrr.png")
        histories.to_csv(tmp / "convergence.csv", index=False, float_format="%.6g")


if __name__ == "__main__":
    run_stage(main)
