"""Stage ssvfnas_report: reports/ssvfnas/{report.md, results.csv, metrics.json, figures/} from SS-VFNAS's cells.

Every cell the params ask for must exist; a missing one stops the stage with one line naming its folder and the
stage that writes it. The report is a pure function of the cells, the partitions and params.yaml.
"""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.io import atomic_dir, atomic_file, write_json
from fedrepro.ssvfnas.render import render_report
from fedrepro.ssvfnas.report import results_frame, summary_metrics, write_figures
from fedrepro.ssvfnas.results import load_ssvfnas

DATA, OUT = Path("data/ssvfnas"), Path("reports/ssvfnas")


def main() -> None:
    params = load_params()
    data = load_ssvfnas(DATA, params)
    with atomic_dir(OUT / "figures") as tmp:
        write_figures(data, params, tmp)
    with atomic_file(OUT / "report.md") as handle:
        handle.write(render_report(params, data))
    with atomic_file(OUT / "results.csv") as handle:
        results_frame(data, params).to_csv(handle, index=False, float_format="%.6f")
    write_json(OUT / "metrics.json", summary_metrics(data, params))


if __name__ == "__main__":
    run_stage(main)
