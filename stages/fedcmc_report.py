"""Stage fedcmc_report: reports/fedcmc/{report.md, results.csv, metrics.json, figures/} from FedCMC's cells.

Every cell the params ask for must exist; a missing one stops the stage with one line naming its folder and the
stage that writes it. The report is a pure function of the cells, the partitions and params.yaml.
"""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.fedcmc.render import render_report
from fedrepro.fedcmc.report import results_frame, summary_metrics, write_figures
from fedrepro.fedcmc.results import load_fedcmc
from fedrepro.io import atomic_dir, atomic_file, write_json

DATA, OUT = Path("data/fedcmc"), Path("reports/fedcmc")


def main() -> None:
    params = load_params()
    data = load_fedcmc(DATA, params)
    with atomic_dir(OUT / "figures") as tmp:
        write_figures(data, params, tmp)
    with atomic_file(OUT / "report.md") as handle:
        handle.write(render_report(params, data))
    with atomic_file(OUT / "results.csv") as handle:
        results_frame(data).to_csv(handle, index=False, float_format="%.6f")
    write_json(OUT / "metrics.json", summary_metrics(data, params))


if __name__ == "__main__":
    run_stage(main)
