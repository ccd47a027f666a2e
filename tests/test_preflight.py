"""The first stage's check: every mistake in params.yaml at once, each in one line naming its key, before any work."""

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fedrepro.config import parse_params, read_raw_params
from fedrepro.errors import ConfigError, DataError
from fedrepro.io import read_csv
from fedrepro.preflight import check_params, problems

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def raw():
    return read_raw_params(ROOT / "params.yaml")


def test_the_embedded_default_passes_and_writes_the_same_output_for_any_valid_params(raw, tmp_path):
    assert problems(raw) == []
    check_params(ROOT / "params.yaml", tmp_path / "a.json")
    changed = copy.deepcopy(raw)
    changed["fedcmc"]["alphas"] = [0.1]
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({k: v for k, v in changed.items() if k != "scales"}))
    (tmp_path / "scales").mkdir()
    for scale, preset in raw["scales"].items():
        (tmp_path / "scales" / f"{scale}.yaml").write_text(yaml.safe_dump(preset))
    check_params(params, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()  # downstream stages stay put


def test_every_mistake_is_listed_at_once_each_naming_its_key(raw, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bad = copy.deepcopy(raw)
    bad["train"]["lr"] = -1
    bad["fedcmc"]["alphas"] = [-0.1]
    bad["fedcmc"]["methods"] = ["fedavg", "fedavgg"]
    bad["fedcmc"]["sweeps"]["subset_dataset"] = "my_corpus"
    bad["ssvfnas"]["methods"] = ["vfnas3"]
    bad["fedmatch"]["sweeps"]["data_ratio_methods"] = ["bert"]
    bad["algorithms"]["fedprox"] = {"muu": 1}
    bad["model"]["backbone"] = "no-such-org/no-such-model"
    bad["data"]["own_files"] = {"mine/guest.csv": "a" * 64}
    bad["fedmatch"]["settings"]["patch_heads"] = 3
    found = problems(bad)
    starts = [
        "params: train.lr = -1: ",
        "params: fedcmc.alphas.0 = -0.1: a Dirichlet concentration must be > 0",
        "params: fedcmc.methods.1 = 'fedavgg' is no federated algorithm; allowed [",
        "params: fedcmc.sweeps.subset_dataset = 'my_corpus' (the embedded source prepares only the synthetic corpus)",
        "params: ssvfnas.methods.0 = 'vfnas3'; allowed [",
        "params: fedmatch.sweeps.data_ratio_methods.0 = 'bert'; allowed [",
        "params: algorithms.fedprox.mu is missing; algorithms.fedprox.muu is not a known key",
        "params: model.backbone = 'no-such-org/no-such-model' is no local directory, HF_HUB_OFFLINE is set",
        "params: data.own_files names 'mine/guest.csv', but ",
        "params: fedmatch.settings.patch_heads = 3: a PAL patch of size ",
    ]
    for start in starts:
        assert sum(line.startswith(start) for line in found) == 1, (start, found)
    assert len(found) == len(starts) and all("\n" not in line and len(line) < 400 for line in found)


def test_a_group_check_names_its_key_and_does_not_print_the_whole_group(raw):
    bad = copy.deepcopy(raw)
    bad["fedcmc"]["alphas"] = [0.1, -0.5]
    with pytest.raises(ConfigError) as caught:
        parse_params(bad)
    assert str(caught.value) == "params: fedcmc.alphas.1 = -0.5: a Dirichlet concentration must be > 0"


def test_an_unknown_collection_is_named_before_the_client_counts_it_decides(raw):
    bad = copy.deepcopy(raw)
    bad["data"]["source"] = "mirror"
    bad["partition"]["collections"] = ["insurance-qa"]
    with pytest.raises(ConfigError, match=r"^params: partition.collections.0 = 'insurance-qa': allowed \["):
        parse_params(bad)
    assert any(line.startswith("params: partition.collections.0 = 'insurance-qa'") for line in problems(bad))


def test_the_check_stage_stops_a_paper_scale_run_offline_at_once_naming_the_backbone_and_writing_nothing(raw, tmp_path):
    """A fresh clone with scale=paper and no internet: the check stage, which every other stage waits for, stops
    within seconds with the backbone's line (it once surfaced after 7 minutes and 446 MB of data)."""
    paper = {k: v for k, v in raw.items() if k != "scales"} | {"scale": "paper"}
    paper["data"] = {**paper["data"], "source": "official"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(paper))
    (tmp_path / "scales").mkdir()
    for scale, preset in raw["scales"].items():
        (tmp_path / "scales" / f"{scale}.yaml").write_text(yaml.safe_dump(preset))
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "check.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
    )
    assert time.perf_counter() - started < 30
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: 2 problem(s) in params.yaml")
    assert "params: model.backbone = 'bert-base-uncased' is no local directory" in result.stderr
    assert "params: fedcmc.settings.backbone = 'distilbert-base-uncased' is no local directory" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "scales"]
    pipeline = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert "data/check.json" in pipeline["acquire"]["deps"]  # every stage runs after the check


def test_an_empty_or_header_only_table_of_ones_own_names_its_file(tmp_path):
    from fedrepro.data.vertical import _read

    empty = tmp_path / "guest.csv"
    empty.write_text("")
    with pytest.raises(DataError, match=f"^{empty}: the file is empty; expected a header row"):
        read_csv(empty)
    with pytest.raises(DataError, match=f"^{empty}: the file is empty"):
        _read(empty)
    header = tmp_path / "host.csv"
    header.write_text("id,x0,x1\n")
    with pytest.raises(DataError, match=f"^{header}: a header row and no data rows"):
        _read(header)
    assert read_csv(header, dtype=str).columns.tolist() == ["id", "x0", "x1"]
    assert isinstance(read_csv(header), pd.DataFrame)


def test_the_fedrepro_check_command_lists_the_problems_and_writes_nothing(raw, tmp_path, capsys):
    from fedrepro.commands import main

    bad = {k: v for k, v in raw.items() if k != "scales"}
    bad["fedcmc"] = {**bad["fedcmc"], "methods": ["fedavg", "fedsgd"]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(bad))
    (tmp_path / "scales").mkdir()
    for scale, preset in raw["scales"].items():
        (tmp_path / "scales" / f"{scale}.yaml").write_text(yaml.safe_dump(preset))
    with pytest.raises(SystemExit) as stopped:
        main(["check", str(tmp_path / "params.yaml")])
    assert stopped.value.code == 2
    assert "params: fedcmc.methods.1 = 'fedsgd' is no federated algorithm" in capsys.readouterr().err
    main(["check", str(ROOT / "params.yaml")])
    assert capsys.readouterr().out.startswith(f"{ROOT / 'params.yaml'}: no problem found")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "scales"]


def test_fedrepro_plan_finds_the_stages_a_train_stage_waits_for():
    from fedrepro.commands import _upstream

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(_upstream(stages, "fedcmc_table")) == {"check", "acquire", "prepare", "fedcmc_partition"}
    assert "fedmatch_mine" in _upstream(stages, "fedmatch_sweeps") and "fedcmc_partition" not in _upstream(
        stages, "ssvfnas_table"
    )
