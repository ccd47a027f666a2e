"""One end-to-end `dvc repro` of the embedded default in a fresh copy, then no-op, kill-and-resume and `dvc exp run -S`."""

import json
import signal
import subprocess
import sys
import time

import pytest

from pipeline_copy import ENV, ROOT, fresh_copy, run

MIRROR = ROOT.parent / "shared" / "data" / "raw"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = fresh_copy(tmp_path_factory.mktemp("fedrepro"))
    result = run(["dvc", "repro"], root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root


def test_repro_writes_the_report_with_every_algorithm(project):
    metrics = json.loads((project / "reports" / "metrics.json").read_text())
    assert set(metrics) == {"individual", "centralised", "fedavg", "fedprox", "fedper"}
    for values in metrics.values():
        assert 0.0 < values["mrr_mean"] <= 1.0 and values["mrr_std"] >= 0.0
    report = (project / "reports" / "report.md").read_text()
    assert "mean ± std over 3 seeds" in report and "Claims checked at this scale" in report
    for figure in ("convergence.png", "test_map.png", "test_mrr.png"):
        assert (project / "reports" / "figures" / figure).stat().st_size > 10_000
    readme = (project / "README.md").read_text()
    assert "| fedavg" in readme and "reports/figures/convergence.png" in readme
    curves = project / "data" / "live" / "fedavg-0" / "plots" / "metrics" / "valid_mrr.tsv"
    assert len(curves.read_text().splitlines()) == 1 + 5


def test_second_repro_reruns_nothing(project):
    started = time.perf_counter()
    result = run(["dvc", "repro"], project)
    assert result.returncode == 0
    assert "Running stage" not in result.stdout
    assert time.perf_counter() - started < 120


def test_a_killed_train_cell_resumes_to_identical_metrics(project):
    cell = "fedavg-0"
    reference = (project / "data" / "train" / cell / "metrics.json").read_bytes()
    state = project / "data" / "checkpoints" / cell / "latest" / "state.json"
    subprocess.run(["rm", "-rf", str(state.parent.parent)], check=True)
    process = subprocess.Popen([sys.executable, "stages/train.py", "--algorithm", "fedavg", "--seed", "0"], cwd=project,
                               env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if state.exists() and json.loads(state.read_text())["next_round"] >= 2:
            break
        time.sleep(0.2)
    assert process.poll() is None, "training finished before it could be killed"
    time.sleep(0.7)  # land somewhere inside round 3
    process.send_signal(signal.SIGKILL)
    process.wait()
    resumed = run([sys.executable, "stages/train.py", "--algorithm", "fedavg", "--seed", "0"], project)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (project / "data" / "train" / cell / "metrics.json").read_bytes() == reference


def test_exp_run_with_a_changed_param(project):
    result = run(["dvc", "exp", "run", "-S", "train.rounds=2", "-S", "train.algorithms=[fedavg,fedper]", "-S", "train.seeds=[0]"], project)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    shown = run(["dvc", "exp", "show", "--json"], project)
    assert shown.returncode == 0 and "mrr_mean" in shown.stdout
    history = json.loads((project / "data" / "train" / "fedper-0" / "metrics.json").read_text())["history"]
    assert len(history) == 2


@pytest.mark.mirror
def test_mirror_source_at_cpu_scale_through_mining(project):
    """Issue 3's run: real collections from the mirror, acquire -> prepare -> partition -> mine -> statistics."""
    if not MIRROR.is_dir():
        pytest.skip(f"raw-data mirror not found at {MIRROR}")
    result = run(["dvc", "exp", "run", "-S", "data.source=mirror", "-S", f"data.mirror={MIRROR}", "-S", "scale=cpu",
                  "data_statistics"], project)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    statistics = (project / "reports" / "statistics.md").read_text()
    for collection in ("privacyqa", "bioasq", "fiqa", "insuranceqa", "medquad", "chemprot_cpr_groups", "pgr", "motor"):
        assert f"| {collection}" in statistics
    assert "i2b2: data.i2b2_dir is not set" in statistics
