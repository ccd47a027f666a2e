"""The staleness guard of the CPU snapshots: DVC compares what a snapshot's cells depended on (its SNAPSHOT.lock)
with HEAD's code and params, and a stale snapshot's report says so in its first line."""

import importlib.util
import subprocess

import pytest
import yaml

from pipeline_copy import ROOT

spec = importlib.util.spec_from_file_location("cpu_snapshot", ROOT / "scripts" / "cpu_snapshot.py")
cpu_snapshot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_snapshot)


@pytest.mark.parametrize("paper", sorted(cpu_snapshot.PAPERS))
def test_a_stale_snapshot_says_so_at_the_top_of_its_report_and_a_fresh_one_does_not(paper):
    stale = bool(cpu_snapshot.status(paper))
    first_line = (ROOT / "reports" / "cpu" / paper / "report.md").read_text().split("\n", 1)[0]
    assert first_line.startswith(cpu_snapshot.STALE_BANNER) == stale, (
        f"reports/cpu/{paper} is {'stale' if stale else 'fresh'} against HEAD, but its report "
        f"{'lacks' if stale else 'has'} the banner: run `python scripts/cpu_snapshot.py status --mark` and commit")


def test_a_lock_is_fresh_until_a_file_or_a_param_its_cells_depend_on_changes():
    """HEAD's own dvc.lock (the embedded run) against HEAD's code and params.yaml: fresh. Then one param the
    SS-VFNAS table depends on, and one code file's hash in the lock, each make it stale, named."""
    head = lambda path: subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True,
                                       check=True).stdout
    lock, params = head("dvc.lock"), yaml.safe_load(head("params.yaml"))
    targets = ["ssvfnas_table"]
    assert cpu_snapshot.dependency_changes(lock, params, targets) == []
    params["ssvfnas"]["search"]["arch_lr"] = 0.001
    assert cpu_snapshot.dependency_changes(lock, params, targets) == ["ssvfnas_table: param ssvfnas.search (modified)"]
    entries = yaml.safe_load(lock)
    train_script = next(dep for dep in entries["stages"]["ssvfnas_table"]["deps"] if dep["path"] == "stages/ssvfnas_train.py")
    train_script["md5"] = "0" * 32
    changes = cpu_snapshot.dependency_changes(yaml.safe_dump(entries), yaml.safe_load(head("params.yaml")), targets)
    assert changes == ["ssvfnas_table: stages/ssvfnas_train.py (modified)"]
