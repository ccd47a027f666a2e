"""One end-to-end `dvc repro` of the embedded default in a fresh copy, then no-op, kill-and-resume and
`dvc exp run -S`."""

import json
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from pipeline_copy import ENV, ROOT, fresh_copy, run

MIRROR = ROOT.parent / "shared" / "data" / "raw"

# The module's first test waits for the whole embedded default (15-25 min in CI beside the Flower drills).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2700)]
NOT_TRAINED = ("finished run from the cell store", "outputs as scored before")
"""How a stage's progress line says a cell was not trained: restored from the store, or finished in its checkpoint
and its outputs copied (``fedrepro.grid``)."""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = fresh_copy(tmp_path_factory.mktemp("fedrepro"))
    result = run(["dvc", "repro"], root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root


def test_committed_lock_matches_the_code_and_params(tmp_path):
    """A clone must not retrain what the committed dvc.lock already describes: every code and params dependency of
    every stage hashes as the lock says (outputs are absent in a clone, so only the dependencies are compared), and
    the lock holds no stage of an older dvc.yaml (DVC leaves those behind)."""
    root = fresh_copy(tmp_path)
    result = run(["dvc", "status", "--json"], root)
    assert result.returncode == 0, result.stderr[-3000:]
    stale = {}
    for stage, changes in json.loads(result.stdout).items():
        for change in changes:
            if change in ("changed command", "changed checksum"):
                stale.setdefault(stage, []).append(change)
            elif isinstance(change, dict) and "changed deps" in change:
                # An upstream stage's output is "deleted" in a clone; anything else means the lock is out of date.
                edited = {dep: state for dep, state in change["changed deps"].items() if state != "deleted"}
                if edited:
                    stale.setdefault(stage, []).append(edited)
    assert not stale, f"dvc.lock is out of date (run `dvc repro` and commit dvc.lock): {stale}"
    listed = run(["dvc", "stage", "list", "--name-only"], root)
    assert listed.returncode == 0, listed.stderr[-3000:]
    listed = listed.stdout.split()
    locked = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    assert not set(locked) - set(listed), (
        f"dvc.lock keeps stages dvc.yaml no longer has: {sorted(set(locked) - set(listed))}"
    )


def test_repro_writes_fedmatch_tables_figures_and_claims(project):
    params = yaml.safe_load((project / "params.yaml").read_text())["fedmatch"]
    metrics = json.loads((project / "reports" / "fedmatch" / "metrics.json").read_text())
    assert set(metrics["mrr"]) == set(params["methods"]) == set(metrics["map"])
    assert all(0.0 < value <= 1.0 for value in metrics["mrr"].values())
    report = (project / "reports" / "fedmatch" / "report.md").read_text()
    for heading in (
        "## Table 2",
        "## Table 3",
        "## Claims checked at this scale",
        "## Training, parameters, communication and memory",
    ):
        assert heading in report
    assert "FedMatch H+LR" in report and "CoverQuery" in report and "random ranking (chance)" in report
    for figure in (
        "convergence.png",
        "fig5_shared_layers.png",
        "fig6_patch_size.png",
        "fig7_aggregate_every.png",
        "fig8_data_ratio.png",
    ):
        assert (project / "reports" / "fedmatch" / "figures" / figure).stat().st_size > 10_000
    cell = project / "data" / "fedmatch" / "tables" / "fedmatch_h_lr" / "fedmatch_h_lr-0"
    assert {p.suffix for p in (cell / "trec").iterdir()} == {".qrels", ".run"}
    assert (project / "README.md").read_text() == (ROOT / "README.md").read_text(), "a stage wrote README.md"


def test_repro_writes_fedcmc_tables_figures_and_claims(project):
    params = yaml.safe_load((project / "params.yaml").read_text())["fedcmc"]
    metrics = json.loads((project / "reports" / "fedcmc" / "metrics.json").read_text())
    assert set(metrics["f1"]) == set(params["methods"])
    assert all(0.0 < value <= 1.0 for value in metrics["f1"].values())
    report = (project / "reports" / "fedcmc" / "report.md").read_text()
    for heading in (
        "## Table 2",
        "## The clients table",
        "## Table 3",
        "## Fig 1",
        "## Fig 3a",
        "## Fig 3b",
        "## Fig 4",
        "## Communication and memory",
        "## Claims checked at this scale",
    ):
        assert heading in report
    assert "FedCMC" in report and "SCAFFOLD" in report and "trivial: stratified random" in report
    figures = project / "reports" / "fedcmc" / "figures"
    assert len(list((figures / "partitions").glob("*.png"))) == len(
        list((project / "data" / "fedcmc" / "partitions").iterdir())
    )
    assert all(p.stat().st_size > 10_000 for p in figures.glob("*.png"))


def test_repro_writes_ssvfnas_tables_figures_and_claims(project):
    params = yaml.safe_load((project / "params.yaml").read_text())["ssvfnas"]
    metrics = json.loads((project / "reports" / "ssvfnas" / "metrics.json").read_text())
    assert set(metrics["accuracy"]) == set(params["methods"]) | {"hand_designed"}
    assert all(0.0 < value <= 1.0 for value in metrics["accuracy"].values())
    report = (project / "reports" / "ssvfnas" / "report.md").read_text()
    for heading in (
        "## Main table",
        "## Steps, bytes and ε to the target accuracy",
        "## Accuracy vs bytes",
        "## Accuracy vs ε",
        "## Messages per step: DARTS vs MiLeNAS",
        "## The searched cells",
        "## The hand-designed baseline",
        "## Claims checked at this scale",
    ):
        assert heading in report
    figures = project / "reports" / "ssvfnas" / "figures"
    for name in (
        "accuracy_vs_bytes_digits-k2.png",
        "accuracy_vs_bytes_digits-k4.png",
        "accuracy_vs_epsilon_digits-k2.png",
        "messages_per_step.png",
    ):
        assert (figures / name).stat().st_size > 10_000, name
    assert len(list((figures / "cells").glob("*/party_*.png"))) == 4 * (2 + 4)  # each method at K = 2 and K = 4


def test_second_repro_reruns_nothing(project):
    started = time.perf_counter()
    result = run(["dvc", "repro"], project)
    assert result.returncode == 0
    assert "Running stage" not in result.stdout
    assert time.perf_counter() - started < 120


def test_a_killed_fedmatch_cell_resumes_to_identical_metrics(project):
    method = "fedmatch_h_lr"
    outputs = project / "data" / "fedmatch" / "tables" / method
    reference = {p.name: (p / "metrics.json").read_bytes() for p in outputs.iterdir()}
    checkpoints = project / "data" / "checkpoints" / "fedmatch" / "tables" / method
    state = checkpoints / f"{method}-0" / "latest" / "state.json"
    subprocess.run(["rm", "-rf", str(checkpoints)], check=True)
    command = [sys.executable, "stages/fedmatch_train.py", "--method", method]
    own_checkpoints_only = {**ENV, "FEDREPRO_CELL_STORE": "off"}  # the store holds this cell finished
    process = subprocess.Popen(
        command, cwd=project, env=own_checkpoints_only, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if state.exists() and json.loads(state.read_text())["next_round"] >= 2:
            break
        time.sleep(0.1)
    assert process.poll() is None, "training finished before it could be killed"
    time.sleep(0.3)  # land somewhere inside round 3
    process.send_signal(signal.SIGKILL)
    process.wait()
    resumed = subprocess.run(command, cwd=project, env=own_checkpoints_only, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert {p.name: (p / "metrics.json").read_bytes() for p in outputs.iterdir()} == reference
    # Retrained outside DVC, the stage's outputs are the bytes DVC recorded, its checkpoints' markers included (a
    # cell's training time goes only into the cell store's copy): nothing is left for `dvc repro` to redo.
    status = run(["dvc", "status", "fedmatch_table"], project)
    assert status.returncode == 0 and "up to date" in status.stdout, status.stdout[-2000:]


def test_exp_run_with_a_changed_param_retrains_only_the_cells_it_adds(project):
    """`dvc exp run -S` on one figure's list: only the check, the sweeps' stage and the report rerun, and of the
    figures' cells only the new point trains; the point equal to a table cell (patch 32, the table's size) is the
    table's run and every other figure's cells are restored, none trained again. `dvc exp show` has the experiment."""
    result = run(["dvc", "exp", "run", "-S", "fedmatch.sweeps.patch_size=[16,32]"], project)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = re.findall(r"Running stage '([^']+)'", result.stdout)
    assert ran == ["check", "fedmatch_sweeps", "fedmatch_report"], ran  # check reads every param; its output stays
    finished = [line for line in (result.stdout + result.stderr).splitlines() if re.match(r"\[\d+/\d+\] ", line)]
    trained = [line for line in finished if not any(came in line for came in NOT_TRAINED)]
    assert len(trained) == 1 and re.match(r"\[\d+/\d+\] patch_size-16-", trained[0]), finished
    assert any(re.match(r"\[\d+/\d+\] patch_size-32-", line) for line in finished), finished
    assert any(re.match(r"\[\d+/\d+\] data_ratio-", line) for line in finished), "the other figures' cells are kept"
    figure = (project / "reports" / "fedmatch" / "figures" / "fig6_patch_size.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in figure[1:]] == ["16", "32"], figure
    shown = run(["dvc", "exp", "show", "--json"], project)
    assert shown.returncode == 0 and "fedmatch_h_lr" in shown.stdout
    assert "patch_size" in shown.stdout and "16" in shown.stdout
    # fewer points of FedCMC's Fig 4: the stages reading fedcmc.sweeps rerun and train nothing, the report follows
    result = run(["dvc", "exp", "run", "-S", "fedcmc.sweeps.vectors=[major,none]"], project)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = re.findall(r"Running stage '([^']+)'", result.stdout)
    assert "fedcmc_sweeps" in ran and ran[-1] == "fedcmc_report" and "fedcmc_table" not in ran
    assert ran[0] == "check" and all(stage.startswith("fedcmc_") for stage in ran[1:]), ran  # check reads every param
    finished = [line for line in (result.stdout + result.stderr).splitlines() if re.match(r"\[\d+/\d+\] ", line)]
    assert finished and all(any(came in line for came in NOT_TRAINED) for line in finished), finished
    figure = (project / "reports" / "fedcmc" / "figures" / "fig4_vectors.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in figure[1:]] == ["major", "none"], figure


@pytest.mark.mirror
def test_mirror_source_at_cpu_scale_through_mining(project):
    """Issue 3's run: real collections from the mirror, acquire -> prepare -> partition -> mine -> statistics."""
    if not MIRROR.is_dir():
        pytest.skip(f"raw-data mirror not found at {MIRROR}")
    result = run(
        [
            "dvc",
            "exp",
            "run",
            "-S",
            "data.source=mirror",
            "-S",
            f"data.mirror={MIRROR}",
            "-S",
            "scale=cpu",
            "data_statistics",
        ],
        project,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    statistics = (project / "reports" / "statistics.md").read_text()
    for collection in (
        "privacyqa",
        "bioasq",
        "fiqa",
        "insuranceqa",
        "medquad",
        "chemprot_cpr5",
        "chemprot_cpr_groups",
        "pgr",
        "motor",
    ):
        assert f"| {collection}" in statistics
    assert "i2b2: data.i2b2_dir is not set" in statistics


def test_a_users_own_vertical_table_runs_through_ssvfnas_from_params_alone(tmp_path):
    """A FATE-style table the package has never seen: the user writes it beside the mirror and declares it in params
    (data.own_files with its sha256, data.vertical_sets, ssvfnas.datasets); nothing inside the package is edited."""
    import hashlib

    import numpy as np
    import pandas as pd

    (tmp_path / "project").mkdir()
    root, mirror = fresh_copy(tmp_path / "project"), tmp_path / "my-mirror"
    rng = np.random.default_rng(0)
    ids, features = np.arange(300) + 1000, rng.normal(size=(300, 8))
    label = (features[:, :4].sum(axis=1) + features[:, 4:].sum(axis=1) > 0).astype(int)  # needs both parties
    tables = {
        "fate_vfl/clinic_hetero_guest.csv": pd.DataFrame(
            {"id": ids, "y": label, **{f"x{i}": features[:, i] for i in range(4)}}
        ),
        "fate_vfl/clinic_hetero_host.csv": pd.DataFrame({"id": ids, **{f"x{i}": features[:, i] for i in range(4, 8)}}),
    }
    own = {}
    for rel, table in tables.items():
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(mirror / rel, index=False)
        own[rel] = hashlib.sha256((mirror / rel).read_bytes()).hexdigest()
    # `++` and `+`: Hydra's override grammar (which -S uses) adds keys that params.yaml lacks only when told to
    variation = [
        "-S",
        f"data.mirror={mirror}",
        "-S",
        "++data.own_files={" + ", ".join(f"{rel}: {sha}" for rel, sha in own.items()) + "}",
        "-S",
        "+data.vertical_sets.clinic=[host]",
        "-S",
        "ssvfnas.datasets=[clinic]",
        "-S",
        "ssvfnas.parties=[2]",
        "-S",
        "ssvfnas.dp_levels=[[0, 0]]",
    ]
    undeclared = run(["dvc", "exp", "run", *variation[:2], *variation[4:], "ssvfnas_report"], root)
    assert undeclared.returncode != 0
    assert (
        "data.vertical_sets.clinic needs fate_vfl/clinic_hetero_guest.csv, which has no checksum: declare it in "
        "data.own_files"
    ) in undeclared.stdout + undeclared.stderr
    result = run(["dvc", "exp", "run", *variation, "ssvfnas_report"], root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    statistics = json.loads((root / "data" / "prepared" / "statistics.json").read_text())
    assert "clinic" in statistics["vertical"]
    metrics = json.loads((root / "reports" / "ssvfnas" / "metrics.json").read_text())
    assert all(0.5 < value <= 1.0 for value in metrics["accuracy"].values()), metrics["accuracy"]
    assert "clinic" in (root / "reports" / "ssvfnas" / "report.md").read_text()


def _fiqa_layout(folder, topic: str, rng) -> None:
    """A small QA collection in FiQA's file layout: questions, question-to-answer ids, answer texts."""
    words = [f"{topic}{i}" for i in range(40)]
    questions, qrels, answers = [], [], []
    for q in range(80):
        terms = rng.choice(words, size=4, replace=False)
        questions.append({"qid": f"{q}", "question": f"how does {' '.join(terms)} work"})
        qrels.append({"qid": f"{q}", "docid": f"{q}"})
        answers.append(f"{q}\t{' '.join(terms)} works by {' '.join(rng.choice(words, size=6))}")
    folder.mkdir(parents=True)
    import pandas as pd

    pd.DataFrame(questions).to_csv(folder / "FiQA_train_question_final.tsv", sep="\t")
    pd.DataFrame(qrels).to_csv(folder / "FiQA_train_question_doc_final.tsv", sep="\t")
    (folder / "FinBERT-QA_test_answers.csv").write_text("\n".join(answers) + "\n")


def _pgr_layout(folder, rng) -> None:
    """A small relation corpus in PGR's layout: gene-phenotype sentences, related ("true") or not ("false")."""
    header = [
        "SENTENCE",
        "GENE",
        "GENE_START_POSITION",
        "GENE_END_POSITION",
        "PHENOTYPE",
        "PHENOTYPE_START_POSITION",
        "PHENOTYPE_END_POSITION",
        "RELATION",
        "FILE_ID",
    ]
    (folder / "10_12_2018_corpus").mkdir(parents=True)
    for split, count in (("train", 400), ("test", 120)):
        lines = ["\t".join(header)]
        for i in range(count):
            related = bool(rng.integers(2))
            gene, phenotype = f"GEN{rng.integers(50)}", f"syndrome{rng.integers(50)}"
            text = f"{gene} {'causes' if related else 'is unrelated to'} {phenotype} in patients"
            start = text.index(phenotype)
            lines.append(
                "\t".join(
                    map(
                        str,
                        [
                            text,
                            gene,
                            0,
                            len(gene),
                            phenotype,
                            start,
                            start + len(phenotype),
                            str(related).lower(),
                            f"{split}-{i // 4}",
                        ],
                    )
                )
            )
        (folder / "10_12_2018_corpus" / f"{split}.tsv").write_text("\n".join(lines) + "\n")


def test_a_users_own_qa_collections_and_relation_corpus_run_from_params_alone(tmp_path):
    """Two QA collections in FiQA's layout as FedMatch's clients and a corpus in PGR's layout as FedCMC's dataset,
    declared in the user's params.yaml (files, sha256s, layouts); nothing inside the package is edited. FedCMC's
    backbone is a local directory of saved weights, as a user without the hub would give it."""
    import hashlib

    import numpy as np

    (tmp_path / "project").mkdir()
    root, mirror, rng = fresh_copy(tmp_path / "project"), tmp_path / "my-mirror", np.random.default_rng(0)
    _fiqa_layout(mirror / "bank_faq", "loan", rng)
    _fiqa_layout(mirror / "bank_help", "card", rng)
    _pgr_layout(mirror / "my_genes", rng)
    params = yaml.safe_load((root / "params.yaml").read_text())
    data = params["data"]
    data.update(
        source="mirror",
        mirror=str(mirror),
        re_corpora=["my_genes"],
        vertical_sets={},
        qa_layouts={"bank_faq": "fiqa", "bank_help": "fiqa"},
        re_layouts={"my_genes": "pgr"},
        own_files={
            str(path.relative_to(mirror)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(mirror.rglob("*"))
            if path.is_file()
        },
    )
    params["partition"]["collections"] = ["bank_faq", "bank_help"]
    params["train"]["rounds"] = 2
    params["fedmatch"].update(
        methods=["fedavg", "fedmatch_h_lr"], table2=["fedmatch_h_lr"], table3=["fedavg", "fedmatch_h_lr"]
    )
    params["fedcmc"].update(methods=["fedavg"], datasets=["my_genes"], alphas=[0.5])
    params["fedcmc"]["settings"]["rounds"] = 2
    # the paper scale's route without the hub: the backbone as a directory the user saved (the packaged MiniLM here)
    from fedrepro.models.backbone import minilm_path

    shutil.copytree(minilm_path(), tmp_path / "my-weights")
    params["fedcmc"]["settings"].update(backbone=str(tmp_path / "my-weights"), keep_layers=1, max_length=32, lr=2e-4)
    params["fedcmc"]["sweeps"].update(
        dataset="my_genes",
        alpha=0.5,
        clients=[],
        local_epochs=[],
        vectors=[],
        subset_modes=[],
        subset_dataset="my_genes",
    )
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run(["dvc", "repro", "fedmatch_table", "fedcmc_table"], root)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    statistics = json.loads((root / "data" / "prepared" / "statistics.json").read_text())
    assert {"bank_faq", "bank_help"} <= set(statistics["qa"]) and "my_genes" in statistics["re"]
    cell = json.loads((root / "data" / "fedmatch" / "tables" / "fedavg" / "fedavg-0" / "metrics.json").read_text())
    assert set(cell["test"]["clients"]) == {"bank_faq", "bank_help"} and cell["test"]["overall"]["map"] > 0
    cells = list((root / "data" / "fedcmc" / "tables" / "fedavg").glob("my_genes-*/metrics.json"))
    assert (
        len(cells) == 1 and json.loads(cells[0].read_text())["test"]["micro_f1"] > 0.5
    )  # "causes" vs "is unrelated to"
