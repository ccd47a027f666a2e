"""Stage fedmatch_report: reports/fedmatch/{report.md, results.csv, metrics.json, figures/}."""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.fedmatch.render import render_report
from fedrepro.fedmatch.report import (
    bm25_levels,
    chance_levels,
    load_fedmatch,
    results_frame,
    summary_metrics,
    write_figures,
)
from fedrepro.io import atomic_dir, atomic_file, read_json, write_json

OUT = Path("reports/fedmatch")


def main() -> None:
    params = load_params()
    data = load_fedmatch(Path("data/fedmatch"), params)
    chance, bm25 = chance_levels(Path("data/mined")), bm25_levels(Path("data/mined_bm25"))
    with atomic_dir(OUT / "figures") as tmp:
        write_figures(data, params, tmp, chance)
    report = render_report(
        params, data, chance, bm25, read_json("data/partition/summary.json"), read_json("data/mined/summary.json")
    )
    with atomic_file(OUT / "report.md") as handle:
        handle.write(report)
    results_frame(data).to_csv(OUT / "results.csv", index=False, float_format="%.6f")
    write_json(OUT / "metrics.json", summary_metrics(data))


if __name__ == "__main__":
    run_stage(main)
