"""The staleness guard of the CPU snapshots: DVC compares what a snapshot's cells depended on (its SNAPSHOT.lock)
with HEAD's code and params, and a stale snapshot's report says so in its first line."""

import importlib.util
import json
import subprocess

import pytest
import yaml

from pipeline_copy import ROOT

spec = importlib.util.spec_from_file_location("cpu_snapshot", ROOT / "scripts" / "cpu_snapshot.py")
cpu_snapshot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_snapshot)


@pytest.mark.parametrize("paper", sorted(cpu_snapshot.PAPERS))
def test_a_stale_snapshot_says_so_at_the_top_of_its_report_and_a_fresh_one_does_not(paper):
    report = ROOT / "reports" / "cpu" / paper / "report.md"
    if not report.is_file():
        assert cpu_snapshot.status(paper)[0].startswith(cpu_snapshot.NO_REPORT)
        pytest.skip(f"reports/cpu/{paper} has no report yet: its ledger is being built")
    stale = bool(cpu_snapshot.status(paper))
    first_line = report.read_text().split("\n", 1)[0]
    assert first_line.startswith(cpu_snapshot.STALE_BANNER) == stale, (
        f"reports/cpu/{paper} is {'stale' if stale else 'fresh'} against HEAD, but its report "
        f"{'lacks' if stale else 'has'} the banner: run `python scripts/cpu_snapshot.py status --mark` and commit"
    )


def test_a_lock_is_fresh_until_a_file_or_a_param_its_cells_depend_on_changes():
    """HEAD's own dvc.lock (the embedded run) against HEAD's code and params.yaml: fresh. Then one param the
    SS-VFNAS table depends on, and one code file's hash in the lock, each make it stale, named."""

    def head(path):
        return subprocess.run(
            ["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout

    lock, params = head("dvc.lock"), yaml.safe_load(head("params.yaml"))
    targets = ["ssvfnas_table"]
    assert cpu_snapshot.dependency_changes(lock, params, targets) == []
    params["ssvfnas"]["search"]["arch_lr"] = 0.001
    assert cpu_snapshot.dependency_changes(lock, params, targets) == ["ssvfnas_table: param ssvfnas.search (modified)"]
    entries = yaml.safe_load(lock)
    train_script = next(
        dep for dep in entries["stages"]["ssvfnas_table"]["deps"] if dep["path"] == "stages/ssvfnas_train.py"
    )
    train_script["md5"] = "0" * 32
    changes = cpu_snapshot.dependency_changes(yaml.safe_dump(entries), yaml.safe_load(head("params.yaml")), targets)
    assert changes == ["ssvfnas_table: stages/ssvfnas_train.py (modified)"]
    train_script["md5"] = next(  # back as it was; now a Flower module: no change on the engine, a change on Flower
        dep["md5"]
        for dep in yaml.safe_load(lock)["stages"]["ssvfnas_table"]["deps"]
        if dep["path"] == train_script["path"]
    )
    flower = next(
        dep for dep in entries["stages"]["ssvfnas_table"]["deps"] if dep["path"].startswith("fedrepro/fl/flower/")
    )
    flower["md5"] = "0" * 32
    assert cpu_snapshot.dependency_changes(yaml.safe_dump(entries), yaml.safe_load(head("params.yaml")), targets) == []
    on_flower = yaml.safe_load(head("params.yaml"))
    on_flower["train"]["runtime"] = "flower-simulation"
    changes = cpu_snapshot.dependency_changes(yaml.safe_dump(entries), on_flower, targets)
    assert f"ssvfnas_table: {flower['path']} (modified)" in changes


def test_a_canarys_restamp_takes_heads_code_and_keeps_what_the_cells_read_and_wrote():
    old = {
        "stages": {
            "table": {
                "cmd": "python stages/t.py",
                "deps": [
                    {"path": "data/partitions", "md5": "data-as-trained"},
                    {"path": "fedrepro/old.py", "md5": "old"},
                    {"path": "stages/t.py", "md5": "script-then"},
                ],
                "params": {"params.yaml": {"k": 1}},
                "outs": [{"path": "data/out", "md5": "as-trained"}],
            }
        }
    }
    canary = {
        "stages": {
            "table": {
                "cmd": "python stages/t.py --tables",
                "deps": [
                    {"path": "data/partitions", "md5": "data-of-the-sample"},
                    {"path": "fedrepro/new.py", "md5": "new"},
                    {"path": "stages/t.py", "md5": "script-now"},
                ],
                "params": {"params.yaml": {"k": "the sample's"}},
                "outs": [{"path": "data/out", "md5": "the sample's"}],
            }
        }
    }
    stamped = cpu_snapshot.restamped_lock(old, canary, ["table"])["stages"]["table"]
    assert stamped["cmd"] == "python stages/t.py --tables"
    assert stamped["deps"] == [
        {"path": "data/partitions", "md5": "data-as-trained"},
        {"path": "fedrepro/new.py", "md5": "new"},
        {"path": "stages/t.py", "md5": "script-now"},
    ]
    assert stamped["params"] == {"params.yaml": {"k": 1}} and stamped["outs"] == [
        {"path": "data/out", "md5": "as-trained"}
    ]
    assert old["stages"]["table"]["deps"][1]["path"] == "fedrepro/old.py", "the snapshot's own lock is not edited"


def test_a_cells_digest_is_its_files_bytes_without_the_machine_it_ran_on(tmp_path):
    import json

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "curve.csv").write_text("1,2\n")
    (tmp_path / "a" / "metrics.json").write_text(json.dumps({"accuracy": 0.5, "hardware": {"cpu": "one"}}))
    first = cpu_snapshot.cell_digest(tmp_path / "a")
    (tmp_path / "a" / "metrics.json").write_text(json.dumps({"hardware": {"cpu": "another"}, "accuracy": 0.5}))
    assert cpu_snapshot.cell_digest(tmp_path / "a") == first
    (tmp_path / "a" / "curve.csv").write_text("1,3\n")
    assert cpu_snapshot.cell_digest(tmp_path / "a") != first


def test_a_canary_compares_each_cell_by_its_recorded_sha256_else_its_results_row(tmp_path):
    work, snapshot = tmp_path / "clone", tmp_path / "snapshot"
    for cell in ("a", "b", "alone"):
        (work / "data" / "ssvfnas" / "tables" / "m" / cell).mkdir(parents=True)
        (work / "data" / "ssvfnas" / "tables" / "m" / cell / "curve.csv").write_text(f"{cell}\n")
        (work / "data" / "ssvfnas" / "tables" / "m" / cell / "metrics.json").write_text(
            "{}"
        )  # what marks a cell folder
    (work / "reports" / "ssvfnas").mkdir(parents=True)
    (work / "reports" / "ssvfnas" / "results.csv").write_text("cell,accuracy\na,0.5\nb,0.7\n")
    snapshot.mkdir()
    (snapshot / "results.csv").write_text("cell,accuracy\na,0.5\nb,0.6\n")  # b's row moved, but b has bits on record
    b = cpu_snapshot.cell_digest(work / "data" / "ssvfnas" / "tables" / "m" / "b")
    (snapshot / cpu_snapshot.CELL_DIGESTS).write_text(f'{{"tables/m/b": "{b}"}}')
    assert cpu_snapshot._compare_cells("ssvfnas", work, snapshot) == (
        [],
        ["a", "b"],
        "1 by every output file's sha256, 1 by their results.csv rows, every column as written; not "
        "compared, for want of a recorded sha256 or a results.csv row, its digest recorded for the next "
        "canary: alone",
    )
    (work / "reports" / "ssvfnas" / "results.csv").write_text("cell,accuracy\na,0.4\nb,0.7\n")
    (work / "data" / "ssvfnas" / "tables" / "m" / "b" / "curve.csv").write_text("other\n")
    differences, _, _ = cpu_snapshot._compare_cells("ssvfnas", work, snapshot)
    assert differences == ["a: accuracy 0.5 -> 0.4", "b: its output files differ from the snapshot's (sha256)"]


def test_ledger_status_counts_each_tables_cells_by_machine_class_and_the_stale_entries(tmp_path, monkeypatch):
    """A plan of every FedCMC snapshot cell (at HEAD's code and params); the ledger holds two of Table 2's cells at
    their HEAD runs, one on each machine class, and an older run of a third: two done, the third missing, one stale."""
    from fedrepro.config import parse_params, read_raw_params
    from fedrepro.fedcmc.runs import run_fingerprint

    monkeypatch.setattr(cpu_snapshot, "ledger_dir", lambda paper: tmp_path)
    monkeypatch.setattr(cpu_snapshot, "dependency_changes", lambda lock, params, targets, since=None: [])
    params = parse_params(cpu_snapshot.snapshot_params("fedcmc", read_raw_params(ROOT / "params.yaml"), "mirror"))
    groups = cpu_snapshot.snapshot_cells("fedcmc", params)
    cells = {
        cell.name: {
            "group": group,
            "seed": cell.seed,
            "weight": weight(cell),
            "inputs": "digest",
            "run": run_fingerprint(params, cell, "digest"),
        }
        for group, members, weight in groups
        for cell in members
    }
    (tmp_path / cpu_snapshot.PLAN).write_text(
        json.dumps({"commit": "abc1234", "date": "2026-12-07", "upstream_lock": {}, "cells": cells})
    )
    first, second, third = groups[0][1][:3]
    for cell, run, machine, seconds in (
        (first, cells[first.name]["run"], "avx512-bf16", 200.0),
        (second, cells[second.name]["run"], "avx2-fp32", 300.0),
        (third, "an-older-run", "avx2-fp32", 100.0),
    ):
        entry = tmp_path / cell.name / f"{run[:16]}-{machine}"
        entry.mkdir(parents=True)
        (entry / "stamp.json").write_text(
            json.dumps({"run": run, "cell": cell.name, "machine": machine, "seconds": seconds, "weight": 1.0})
        )
    lines = cpu_snapshot.ledger_status("fedcmc")
    table = len(groups[0][1])
    assert f"  Table 2: 2 of {table} cells (avx2-fp32: 1, avx512-bf16: 1)" in lines
    assert any(line.startswith(f"  missing: {len(cells) - 2} cells, about ") for line in lines), lines
    assert lines[-1].endswith(": 1")


def test_carry_finds_the_entries_behind_heads_runs_compares_them_but_the_hardware_and_re_keys_them(
    tmp_path, monkeypatch
):
    """The ledger's carry-forward: an entry of this machine class at an older run of its cell is behind (one at HEAD's
    run, or of another class, is not); two entries that differ only in the hardware that trained them are the same,
    one changed prediction is a difference; carried, the entry sits under HEAD's run and says where it came from."""
    monkeypatch.setattr(cpu_snapshot, "ledger_dir", lambda paper: tmp_path)

    def entry(cell, run, machine, predicted="rel0", cpu="EPYC"):
        folder = tmp_path / cell / f"{run[:16]}-{machine}"
        (folder / "outputs").mkdir(parents=True)
        (folder / "outputs" / "predictions.csv").write_text(f"sentence_id,predicted\ns1,{predicted}\n")
        (folder / "outputs" / "metrics.json").write_text(json.dumps({"f1": 0.5, "hardware": {"cpu": cpu}}))
        (folder / "stamp.json").write_text(json.dumps({"run": run, "cell": cell, "machine": machine}))
        return folder

    old_a = entry("a", "run-a-old", "avx2-fp32")
    entry("b", "run-b-head", "avx2-fp32")
    entry("c", "run-c-old", "avx512-bf16")
    planned = {"a": ("T", "run-a-head", 1.0), "b": ("T", "run-b-head", 1.0), "c": ("T", "run-c-head", 1.0)}
    behind = cpu_snapshot.entries_behind("fedcmc", planned, "avx2-fp32")
    assert behind == {"a": old_a.name}

    same = entry("copy", "run-a-old", "avx2-fp32", cpu="another EPYC")
    other = entry("moved", "run-a-old", "avx2-fp32", predicted="rel1")
    assert cpu_snapshot.entry_differences(old_a, same) == []
    assert cpu_snapshot.entry_differences(old_a, other) == ["outputs/predictions.csv differs"]

    (tmp_path / cpu_snapshot.PLAN).write_text(
        json.dumps({"commit": "old", "date": "2026-12-01", "cells": {name: {"run": "stale"} for name in planned}})
    )
    head_plan = {
        "commit": "abc1234",
        "date": "2026-12-07",
        "cells": {n: {"run": run} for n, (_, run, _) in planned.items()},
    }
    cpu_snapshot.carry_entries("fedcmc", behind, head_plan, "avx2-fp32", ["a"])
    assert not old_a.exists()
    stamp = json.loads((tmp_path / "a" / "run-a-head-avx2-fp32" / "stamp.json").read_text())
    assert stamp["run"] == "run-a-head" and stamp["carried_from"] == "run-a-old" and stamp["carried_by"] == "abc1234"
    assert json.loads((tmp_path / cpu_snapshot.PLAN).read_text())["cells"]["a"]["run"] == "run-a-head"


def test_a_dependency_restyled_or_redocumented_does_the_same_and_one_edited_does_not(tmp_path):
    """``same_behaviour``: DVC's deps compare bytes; a snapshot stays fresh through a change that moves no cell's
    fingerprint (layout, comments, docstrings) and goes stale with one that does (code, a data file, a new file)."""

    def commit(files: dict[str, str]) -> str:
        for name, text in files.items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
        subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"], cwd=tmp_path, check=True
        )
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    first = commit({"pkg/a.py": '"""A."""\nx = f(1, 2)  # one\n', "pkg/data.txt": "1\n"})
    restyled = commit({"pkg/a.py": '"""A, said otherwise."""\n\nx = f(\n    1,\n    2,\n)\n'})
    edited = commit({"pkg/a.py": '"""A."""\nx = f(1, 3)\n'})
    data = commit({"pkg/data.txt": "2\n"})
    added = commit({"pkg/b.py": "y = 1\n"})

    def same(path: str, since: str, now: str) -> bool:
        return cpu_snapshot.same_behaviour(path, since, now, root=tmp_path)

    assert same("pkg/a.py", first, restyled) and same("pkg", first, restyled)
    assert not same("pkg/a.py", first, edited) and not same("pkg", restyled, edited)
    assert same("pkg/a.py", edited, data) and not same("pkg", edited, data) and not same("pkg/data.txt", edited, data)
    assert not same("pkg", data, added)
