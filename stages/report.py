"""Stage report: reports/report.md, results.csv and metrics.json (for `dvc exp show`), and the README results block."""

from pathlib import Path


from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.io import atomic_file, read_json, write_json
from fedrepro.report.markdown import readme_block, render_report, replace_readme_block
from fedrepro.report.results import load_histories, load_memory, load_results, overall_stats

REPORTS = Path("reports")


def main() -> None:
    params = load_params()
    algorithms, seeds = params.train.algorithms, params.train.seeds
    results = load_results(Path("data/eval"), algorithms, seeds)
    histories = load_histories(Path("data/train"), algorithms, seeds)
    communication = histories.groupby("algorithm", sort=False)[["bytes_up", "bytes_down"]].mean().astype(int)
    communication = communication.reindex(algorithms).join(load_memory(Path("data/train"), algorithms, seeds[0]))
    chance = read_json("data/eval/chance.json")
    report = render_report(
        params, results, chance, histories, read_json("data/partition/summary.json"), read_json("data/mined/summary.json"), communication
    )
    with atomic_file(REPORTS / "report.md") as handle:
        handle.write(report)
    results.to_csv(REPORTS / "results.csv", index=False, float_format="%.6f")
    write_json(REPORTS / "metrics.json", overall_stats(results, algorithms))
    readme = Path("README.md")
    if readme.exists():
        updated = replace_readme_block(readme.read_text(encoding="utf-8"), readme_block(results, chance, params))
        with atomic_file(readme) as handle:
            handle.write(updated)


if __name__ == "__main__":
    run_stage(main)
