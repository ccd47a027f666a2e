"""FedCMC's report: the hierarchical bootstrap of micro-F1, rounds to a target, Observation 3's share, and the whole
report on a small fake grid of cell folders (no training)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import f1_score

from fedrepro.config import parse_params, read_raw_params
from fedrepro.errors import DataError
from fedrepro.fedcmc.cells import SWEEPS, sweep_cells, table_cells
from fedrepro.fedcmc.render import render_report
from fedrepro.fedcmc.claims import claims_table
from fedrepro.fedcmc.chance import chance_scores, identical_predictions
from fedrepro.fedcmc.observation3 import largest_holder_share
from fedrepro.fedcmc.report import summary_metrics, write_figures
from fedrepro.fedcmc.results import load_fedcmc
from fedrepro.fedcmc.selection import rounds_to_target
from fedrepro.fedcmc.tables import main_table, subsets_table
from fedrepro.report.statistics import VERDICTS, bootstrap_contrast, bootstrap_difference, micro_f1, verdict_from_p

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ["false", "rel0", "rel1", "rel2"]
POSITIVE = ["rel0", "rel1", "rel2"]
N_TEST = 120


def predictions(accuracy: float, shift: int = 0, n: int = N_TEST) -> pd.DataFrame:
    """A test set (gold cycles over the classes) predicted right on the first ``accuracy`` share of a fixed
    sentence order (rotated by ``shift``), wrong (the next class) elsewhere."""
    gold = [CLASSES[i % len(CLASSES)] for i in range(n)]
    order = np.random.default_rng(7).permutation(n)
    right = set(np.roll(order, shift)[: int(round(accuracy * n))].tolist())
    predicted = [g if i in right else CLASSES[(CLASSES.index(g) + 1) % len(CLASSES)] for i, g in enumerate(gold)]
    return pd.DataFrame(
        {
            "sentence_id": [f"s{i:04d}" for i in range(n)],
            "label": gold,
            "client": [f"client_{i % 3:02d}" for i in range(n)],
            "predicted": predicted,
        }
    )


# ----- the bootstrap --------------------------------------------------------------------------------------
def test_micro_f1_and_the_bootstrap_point_difference_match_sklearn():
    rng = np.random.default_rng(0)
    gold = rng.choice(CLASSES, 300)
    a = np.where(rng.random(300) < 0.6, gold, rng.choice(CLASSES, 300))
    b = np.where(rng.random(300) < 0.4, gold, rng.choice(CLASSES, 300))
    sk = lambda p: f1_score(gold, p, labels=POSITIVE, average="micro", zero_division=0)  # noqa: E731
    assert micro_f1(gold, a, POSITIVE) == pytest.approx(sk(a), abs=1e-12)
    frame = lambda p: pd.DataFrame({"sentence_id": [f"s{i}" for i in range(300)], "label": gold, "predicted": p})  # noqa: E731
    result = bootstrap_difference({0: frame(a)}, {0: frame(b)}, POSITIVE)
    assert result.difference == pytest.approx(sk(a) - sk(b), abs=1e-12)
    assert result.low < result.difference < result.high and result.items == 300 and result.seeds == 1
    # nothing positive to score (every gold and prediction negative) is 0, as sklearn's zero_division=0
    assert micro_f1(["false"] * 3, ["false"] * 3, POSITIVE) == 0.0
    # the bootstrap is seeded: the same call gives the same interval
    assert bootstrap_difference({0: frame(a)}, {0: frame(b)}, POSITIVE) == result


def test_identical_predictions_are_not_significant():
    same = predictions(0.6)
    result = bootstrap_difference({0: same, 1: same}, {0: same.copy(), 1: same.copy()}, POSITIVE)
    assert (result.difference, result.low, result.high, result.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert verdict_from_p(result.difference, result.p_value) == "not significant"


def test_a_clearly_better_method_holds_and_the_reverse_is_reversed():
    seeds = range(3)
    good, bad = {s: predictions(0.9, shift=s) for s in seeds}, {s: predictions(0.3, shift=s) for s in seeds}
    verdict = lambda result: verdict_from_p(result.difference, result.p_value)  # noqa: E731
    assert verdict(bootstrap_difference(good, bad, POSITIVE)) == "holds"
    assert verdict(bootstrap_difference(bad, good, POSITIVE)) == "reversed"
    close = bootstrap_difference(
        {s: predictions(0.51, shift=5 + s) for s in seeds}, {s: predictions(0.5, shift=s) for s in seeds}, POSITIVE
    )
    assert verdict(close) == "not significant"


def test_a_gain_that_flips_sign_across_seeds_is_not_significant():
    """Each seed's difference is large on 120 sentences, but seed 1 reverses it: the seed is the unit."""
    better = {0: predictions(0.9), 1: predictions(0.3, shift=1), 2: predictions(0.9, shift=2)}
    worse = {s: predictions(0.6, shift=s) for s in range(3)}
    result = bootstrap_difference(better, worse, POSITIVE)
    assert result.difference > 0.05 and result.paired_seeds and result.seeds == 3
    assert result.low < 0 < result.high and verdict_from_p(result.difference, result.p_value) == "not significant"


def test_seeds_are_averaged_and_sentences_paired_across_terms():
    a, b = [predictions(0.8), predictions(0.6, shift=3)], [predictions(0.5), predictions(0.5, shift=9)]
    result = bootstrap_difference(dict(enumerate(a)), dict(enumerate(b)), POSITIVE)
    per_seed = [
        micro_f1(x.label, x.predicted, POSITIVE) - micro_f1(y.label, y.predicted, POSITIVE) for x, y in zip(a, b)
    ]
    assert result.difference == pytest.approx(np.mean(per_seed)) and result.seeds == 2 and result.paired_seeds
    assert not bootstrap_difference(dict(enumerate(a)), {5: b[0], 6: b[1]}, POSITIVE).paired_seeds
    # a difference of differences on one test set, and the same contrast over two test sets resampled apart
    did = bootstrap_contrast(
        [(1.0, "d", {0: a[0]}), (-1.0, "d", {0: b[0]}), (-1.0, "d", {0: a[1]}), (1.0, "d", {0: b[1]})], {"d": POSITIVE}
    )
    assert did.difference == pytest.approx(per_seed[0] - per_seed[1])
    two = bootstrap_contrast(
        [(0.5, "x", {0: a[0]}), (-0.5, "x", {0: b[0]}), (0.5, "y", {0: a[1]}), (-0.5, "y", {0: b[1]})],
        {"x": POSITIVE, "y": POSITIVE},
    )
    assert two.difference == pytest.approx(np.mean(per_seed)) and two.items == 2 * N_TEST


# ----- rounds and Observation 3 ---------------------------------------------------------------------------
def test_rounds_to_target_is_the_first_evaluated_round_at_or_above_it():
    curve = pd.Series([0.30, 0.44, np.nan, 0.45, 0.40, 0.60], index=[1, 2, 3, 4, 5, 6])
    assert rounds_to_target(curve, 0.45) == 4
    assert rounds_to_target(curve, 0.30) == 1
    assert rounds_to_target(curve, 0.61) is None
    assert rounds_to_target(pd.Series(dtype=float), 0.1) is None


def test_largest_holder_share_against_a_uniform_pick_among_holders():
    counts = pd.DataFrame(
        {"a": [10, 1, 0], "b": [0, 3, 3], "c": [2, 2, 9], "d": [0, 0, 0]},
        index=pd.Index(["k0", "k1", "k2"], name="client"),
    )
    # a: k0 holds most -> hit; b: k1 and k2 tie -> k2 is a hit; c: k2 holds most, k1 picked -> miss; d: nobody holds it
    share, chance, counted = largest_holder_share(["k0", "k2", "k1", "k0"], counts)
    assert counted == 3
    assert share == pytest.approx(2 / 3)
    assert chance == pytest.approx((1 / 2 + 2 / 2 + 1 / 3) / 3)


# ----- a small fake grid ------------------------------------------------------------------------------------
def small_params():
    raw = read_raw_params(ROOT / "params.yaml")
    raw["scale"] = "embedded"
    raw["fedcmc"].update(
        methods=["fedavg", "fedrs", "fedcmc"],
        datasets=["synthetic-re"],
        alphas=[0.05, 0.5],
        seeds=[0, 1, 2],
        target_f1=0.45,
    )
    raw["fedcmc"]["sweeps"].update(
        seeds=[0, 1, 2],
        dataset="synthetic-re",
        alpha=0.05,
        methods=["fedavg", "fedcmc"],
        clients=[4, 6],
        local_epochs=[1, 2],
        vectors=["major", "minor", "none"],
        subset_dataset="synthetic-re",
        subset_size=40,
        subset_modes=["balanced", "natural"],
        subset_methods=["fedrs", "fedcmc"],
    )
    raw["fedcmc"]["settings"].update(clients=4, rounds=3)
    return parse_params(raw)


QUALITY = {"fedavg": 0.45, "fedrs": 0.55, "fedcmc": 0.75}


def _counts(clients: int) -> pd.DataFrame:
    """Each class mostly on one client; the last client empty (it sits out)."""
    table = pd.DataFrame(0, index=[f"client_{k:02d}" for k in range(clients)], columns=CLASSES)
    for j, c in enumerate(CLASSES):
        table.loc[f"client_{j % (clients - 1):02d}", c] = 30 + 5 * j
        table.loc[f"client_{(j + 1) % (clients - 1):02d}", c] += 4
    table.index.name = "client"
    return table


def write_fake_grid(root: Path, params, diverged: tuple = ()) -> None:
    """``diverged``: names of cells whose training loss rises over the rounds (a diverged cell by the health rule)."""
    settings = params.fedcmc.settings
    cells = [("tables/" + c.method, c) for c in table_cells(params)]
    cells += [("sweeps/" + s, c) for s in SWEEPS for c in sweep_cells(params, s)]
    for group, cell in cells:
        counts = _counts(cell.clients)
        part = root / "partitions" / cell.partition
        if not part.exists():
            part.mkdir(parents=True)
            table = counts.copy()
            table["total"] = table.sum(axis=1)
            table.to_csv(part / "counts.csv")
            (part / "partition.json").write_text(
                json.dumps(
                    {
                        "dataset": cell.dataset,
                        "alpha": cell.alpha,
                        "clients": cell.clients,
                        "subset": cell.subset,
                        "scheme": "dirichlet",
                        "balance": False,
                        "seed": 0,
                        "classes": CLASSES,
                        "sentences": {"train": int(counts.values.sum()), "valid": 40, "test": N_TEST},
                        "skew": 0.5,
                    }
                )
            )
            (part / "heatmap.png").write_bytes(b"\x89PNG fake " + cell.partition.encode())
        quality = QUALITY[cell.method] - (0.2 if cell.vectors == "minor" else 0.1 if cell.vectors == "none" else 0)
        quality -= 0.05 * (cell.alpha < 0.1) * (cell.method == "fedavg")
        frame = predictions(quality, shift=cell.seed)
        clients = [c for c in counts.index if counts.loc[c].sum() > 0]
        holders = counts.loc[clients].to_numpy(dtype=float)
        history = []
        for r in range(1, settings.rounds + 1):
            similarity = 0.5 - holders / holders.max() * 0.4 + 0.01 * r  # the largest holder has the smallest d
            loss = 1.5 * r if cell.name in diverged else 1.5 / r
            record = {
                "round": r,
                "clients": clients,
                "train_loss": loss,
                "bytes_up": 1000 * len(clients),
                "bytes_down": 1000 * len(clients) + (64 * len(clients) if cell.method == "fedcmc" and r > 1 else 0),
                "diagnostics": {"clients": clients, "local_similarity": similarity.round(6).tolist()},
                "test": {
                    "global": {
                        "micro_f1": quality * r / settings.rounds,
                        "macro_f1": 0.5 * quality * r / settings.rounds,
                        "accuracy": quality,
                    }
                },
            }
            if cell.method == "fedcmc" and cell.vectors != "none":
                record["vector_clients"] = [clients[i] for i in np.argmin(similarity, axis=0)]
            history.append(record)
        folder = root / group / cell.name
        folder.mkdir(parents=True)
        frame.to_csv(folder / "predictions.csv", index=False)
        scores = {
            "micro_f1": micro_f1(frame.label, frame.predicted, POSITIVE),
            "macro_f1": float(
                f1_score(frame.label, frame.predicted, labels=POSITIVE, average="macro", zero_division=0)
            ),
            "accuracy": float((frame.label == frame.predicted).mean()),
        }
        (folder / "metrics.json").write_text(
            json.dumps(
                {
                    "cell": {**cell.__dict__, "name": cell.name, "partition": cell.partition},
                    "test": scores,
                    "valid": scores,
                    "history": history,
                    "channel": {},
                    "parameters": {"total": 1000, "uploaded": 1000},
                    "memory_bytes": {
                        "model": 4000,
                        "server_shared": 4000,
                        "private_per_client_max": 0,
                        "private_all_clients": 0,
                    },
                    "truncated_train_sentences": 0,
                }
            )
        )


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedcmc")
    params = small_params()
    write_fake_grid(root, params)
    return params, load_fedcmc(root, params)


def test_report_has_every_table_and_the_claims_and_is_byte_identical_twice(grid):
    params, data = grid
    text = render_report(params, data)
    assert text == render_report(params, data)
    for heading in (
        "## Setup",
        "## Table 2",
        "## The clients table",
        "## Table 3",
        "## Fig 1",
        "## Fig 3a",
        "## Fig 3b",
        "## Fig 4",
        "## Partitions",
        "## Communication and memory",
        "## Claims checked at this scale",
        "## What this run can and cannot say",
    ):
        assert heading in text
    assert "| FedCMC " in text and "trivial: stratified random" in text
    assert "mu = 1, temperature = 0.5" in text and "round 1 is FedAvg" in text
    claims = claims_table(data, params)
    table2 = claims[claims["finding (paper)"].str.startswith("Table 2: FedCMC beats FedAvg")]
    assert table2["verdict"].tolist() == ["holds", "holds"]  # α 0.05 and 0.5, one dataset
    rs = claims[claims["finding (paper)"] == "Table 2: FedRS is significantly better than MOON"]
    assert rs["verdict"].tolist() == ["not testable here (FedRS or MOON is not in fedcmc.methods)"]
    assert all(v.split(" (")[0] in VERDICTS for v in claims["verdict"]), claims["verdict"].tolist()
    assert "Holm's correction runs over all" in text
    minor = claims[claims["finding (paper)"].str.startswith("Fig 4: minor vectors are worse than none")]
    assert minor["verdict"].tolist() == ["holds"]
    obs = claims[claims["finding (paper)"].str.startswith("Observation 3")]
    assert (
        obs["verdict"].iloc[0].startswith("inconclusive (direction as claimed, direction only")
        and "100% of 4 classes" in obs["measured"].iloc[0]
    )
    assert "FedCMC 2, FedAvg not reached in 3 rounds" in text  # rounds to 45%: FedCMC 0.25, 0.5, 0.75
    assert "64 bytes more than FedAvg per client" in text
    assert "| client_" not in text  # the counts are drawn, not printed


def test_a_diverged_cell_is_marked_and_no_claim_rests_on_it(tmp_path):
    params = small_params()
    bad = next(c for c in table_cells(params) if c.method == "fedavg" and c.alpha == 0.05 and c.seed == 1)
    write_fake_grid(tmp_path, params, diverged=(bad.name,))
    data = load_fedcmc(tmp_path, params)
    assert set(data.cells.loc[data.cells.name == bad.name, "health"]) == {"diverged"}  # its table cell and sweep twins
    table = main_table(data, params, "micro_f1")
    assert table.loc["FedAvg", "synthetic-re α=0.05"].endswith(" †")
    assert not table.loc["FedAvg", "synthetic-re α=0.5"].endswith(" †")
    claims = claims_table(data, params).set_index("finding (paper)")
    at_005 = claims.loc[
        [f for f in claims.index if f.startswith("Table 2: FedCMC beats FedAvg") and "α=0.05" in f], "verdict"
    ]
    assert at_005.tolist() == [f"inconclusive (rests on diverged: {bad.name})"]
    at_05 = claims.loc[
        [f for f in claims.index if f.startswith("Table 2: FedCMC beats FedAvg") and "α=0.5" in f], "verdict"
    ]
    assert at_05.tolist() == ["holds"]
    assert f"| {bad.name} | diverged" in render_report(params, data)


def test_methods_that_predict_every_sentence_alike_are_named(grid):
    params, data = grid
    assert identical_predictions(data, params) == []  # the fake grid's methods differ
    first = data.cells[(data.cells.group == "table") & (data.cells.method == "fedavg")]["key"].iloc[0]
    twin = data.cells.set_index("key").loc[first]
    rs = data.cells[
        (data.cells.group == "table")
        & (data.cells.method == "fedrs")
        & (data.cells.alpha == twin.alpha)
        & (data.cells.seed == twin.seed)
    ]["key"].iloc[0]
    saved = data.predictions[rs]
    data.predictions[rs] = data.predictions[first]
    try:
        assert identical_predictions(data, params) == [f"synthetic-re α={twin.alpha:g} seed {twin.seed}: FedAvg, FedRS"]
    finally:
        data.predictions[rs] = saved


def test_table2_is_mean_std_in_percent_with_the_trivial_baselines(grid):
    params, data = grid
    table = main_table(data, params, "micro_f1")
    mean = np.mean([micro_f1(p.label, p.predicted, POSITIVE) for p in (predictions(0.75, s) for s in range(3))])
    assert table.loc["FedCMC", "synthetic-re α=0.05"].startswith(f"{100 * mean:.2f} ± ")
    chance = chance_scores(data, "synthetic-re", "synthetic-re-a0.05-k4")
    gold = predictions(0.5).label
    # the most frequent training class is rel2 (45 + 4 sentences), a positive class
    expected = f1_score(gold, ["rel2"] * len(gold), labels=POSITIVE, average="micro")
    assert chance["always rel2"]["micro_f1"] == pytest.approx(expected)
    assert table.loc["trivial: always rel2", "synthetic-re α=0.5"] == f"{100 * expected:.2f}"
    assert 0 < chance["stratified random"]["micro_f1"] < 1
    assert "trivial: stratified random" in table.index
    assert summary_metrics(data, params)["f1"]["fedcmc"] == round(mean, 4)


def test_figures_are_written_and_identical_twice(grid, tmp_path):
    params, data = grid
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_figures(data, params, tmp_path / name)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert {"fig1_similarity.png", "fig3a_convergence.csv", "fig3b_local_epochs.png", "fig4_vectors.csv"} <= {
        str(f) for f in files
    }
    assert Path("partitions/synthetic-re-a0.05-k4.png") in files
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    curves = pd.read_csv(tmp_path / "a" / "fig3a_convergence.csv")
    assert list(curves.columns) == ["round", "fedavg", "fedrs", "fedcmc"] and len(curves) == 3


def test_a_missing_cell_names_its_folder_and_stage(tmp_path):
    params = small_params()
    write_fake_grid(tmp_path, params)
    victim = tmp_path / "sweeps" / "vectors" / sweep_cells(params, "vectors")[1].name
    (victim / "metrics.json").unlink()
    with pytest.raises(DataError, match=r"vectors/.*-minor-s0 is missing.*run `dvc repro fedcmc_sweeps`"):
        load_fedcmc(tmp_path, params)


def test_the_stage_fails_in_one_line_without_cells(tmp_path):
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    shutil.copytree(ROOT / "scales", tmp_path / "scales")
    done = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "fedcmc_report.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is missing" in lines[0] and "dvc repro fedcmc_table" in lines[0]


def test_claims_whose_cells_the_grid_lacks_say_not_testable_and_why(grid):
    params, data = grid
    fewer = params.model_copy(update={"fedcmc": params.fedcmc.model_copy(update={"alphas": [0.05]})})
    claims = claims_table(data, fewer).set_index("finding (paper)")
    assert (
        claims.loc[
            "Table 2: FedCMC beats FedAvg on synthetic-re at α=0.5 (the paper reports no number for this dataset)",
            "verdict",
        ]
        == "not testable here (α=0.5 is not in fedcmc.alphas)"
    )
    assert claims.loc["FedAvg loses more F1 than FedCMC from α=0.5 to α=0.05 on synthetic-re", "verdict"] == (
        "not testable here (needs α 0.05 and 0.5 and both methods in the main table)"
    )


def test_a_stale_cell_is_refused(tmp_path):
    params = small_params()
    write_fake_grid(tmp_path, params)
    cell = next(c for c in table_cells(params) if c.method == "fedrs")
    metrics = tmp_path / "tables" / "fedrs" / cell.name / "metrics.json"
    record = json.loads(metrics.read_text())
    json.dump({**record, "history": record["history"][:-1]}, metrics.open("w"))
    with pytest.raises(
        DataError, match=r"has 2 rounds, params fedcmc.settings.rounds = 3: rerun `dvc repro fedcmc_table`"
    ):
        load_fedcmc(tmp_path, params)
    json.dump(
        {**record, "history": [{**r, "clients": r["clients"][:-1]} for r in record["history"]]}, metrics.open("w")
    )
    with pytest.raises(DataError, match="changed since the cell ran"):
        load_fedcmc(tmp_path, params)


# ----- the claims added for every stated finding, and ChemProt's one reading -------------------------------------
def test_every_new_claim_has_a_verdict_and_i2b2_is_not_testable(grid):
    params, data = grid
    claims = claims_table(data, params).set_index("finding (paper)")
    new = [
        f
        for f in claims.index
        if f.startswith(("Observation 1", "Observation 2", "Fig 3b: FedAvg's F1 varies", "Table 2: FedAvg is worse"))
    ]
    assert len(new) == 5, new
    assert all(claims.loc[f, "verdict"].split(" (")[0] in VERDICTS for f in new)
    assert claims.loc["Table 2: FedAvg is worse on 8-class i2b2 than on binary PGR", "verdict"].startswith(
        "not testable here (i2b2 2010 is not public"
    )
    # the fake grid's d_{k,c} falls with each client's own counts in every round: Observation 1 holds
    obs1 = next(f for f in new if f.startswith("Observation 1"))
    assert claims.loc[obs1, "verdict"] == "holds" and "mean tau -1.00" in claims.loc[obs1, "measured"]


def _set_curves(root: Path, params, epochs: int, curve) -> None:
    """Give FedAvg's Fig 3b cells at ``epochs`` local epochs the per-round test micro-F1 ``curve(seed)`` (every copy
    of the cell: a sweep point equal to a main-table cell is read from the table's folder)."""
    for cell in sweep_cells(params, "local_epochs"):
        if cell.method != "fedavg" or cell.local_epochs != epochs:
            continue
        for path in root.rglob(f"{cell.name}/metrics.json"):
            record = json.loads(path.read_text())
            for entry, value in zip(record["history"], curve(cell.seed)):
                entry["test"]["global"]["micro_f1"] = value
            path.write_text(json.dumps(record))


@pytest.mark.parametrize("zigzag, verdict", [(2, "holds"), (1, "reversed")])
def test_fedavgs_fluctuation_over_local_epochs_holds_or_reverses_as_built(tmp_path, zigzag, verdict):
    """Three seeds; the local-epoch point ``zigzag`` jumps 40 points between rounds, the other rises by 5 a round,
    nearly alike at every seed, so the contrast clears Holm's correction over every claim of the report with a p."""
    params = small_params()
    write_fake_grid(tmp_path, params)
    for epochs in (1, 2):
        jumpy = epochs == zigzag
        _set_curves(
            tmp_path,
            params,
            epochs,
            lambda seed, jumpy=jumpy: [0.2, 0.6 + 0.005 * seed, 0.2] if jumpy else [0.3, 0.35 + 0.0025 * seed, 0.4],
        )
    claims = claims_table(load_fedcmc(tmp_path, params), params).set_index("finding (paper)")
    row = claims.loc["Fig 3b: FedAvg's F1 varies more with more local epochs (FedCMC relatively robust)"]
    assert row["verdict"] == verdict, row.to_dict()


def test_one_class_set_per_corpus_or_the_report_refuses(tmp_path):
    """Table 3's subset reading ChemProt another way (the no-relation class dropped) than the main table is refused."""
    params = small_params()
    write_fake_grid(tmp_path, params)
    subset = next(c for c in sweep_cells(params, "subsets")).partition
    info_path = tmp_path / "partitions" / subset / "partition.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "classes": [c for c in info["classes"] if c != "false"]}))
    with pytest.raises(DataError, match="one class set"):
        load_fedcmc(tmp_path, params)


def test_table3s_subset_keeps_the_main_tables_classes():
    """The subset is drawn from the main table's corpus as is: a negative class the main table has stays in it."""
    from fedrepro.fedcmc.partition import build_partition

    params = small_params()
    labels = ["NA", "rel0", "rel1", "rel2"]
    corpus = pd.DataFrame(
        [
            (f"{split}-{i}", f"<e1>a</e1> b <e2>c</e2> {i}", labels[i % 4], split)
            for split, n in (("train", 200), ("valid", 40), ("test", 40))
            for i in range(n)
        ],
        columns=["sentence_id", "text", "label", "split"],
    )
    main = next(c for c in table_cells(params))
    subset = next(c for c in sweep_cells(params, "subsets") if c.subset == "balanced")
    classes = [sorted(build_partition(params, cell, corpus)[0]["label"].unique()) for cell in (main, subset)]
    assert classes[0] == classes[1] == labels


def test_a_subset_size_the_corpus_cannot_give_names_its_param():
    """subsample_train speaks of its arguments; the user set fedcmc.sweeps.subset_size, so the stage's line names it."""
    from fedrepro.errors import DataError
    from fedrepro.fedcmc.partition import build_partition

    params = small_params()
    corpus = pd.DataFrame(
        [
            (f"{split}-{i}", f"<e1>a</e1> b <e2>c</e2> {i}", f"rel{i % 2}", split)
            for split, n in (("train", 30), ("valid", 10), ("test", 10))
            for i in range(n)
        ],
        columns=["sentence_id", "text", "label", "split"],
    )
    subset = next(c for c in sweep_cells(params, "subsets") if c.subset == "natural")
    sweeps = params.fedcmc.sweeps.model_copy(update={"subset_size": 500})
    too_many = params.model_copy(update={"fedcmc": params.fedcmc.model_copy(update={"sweeps": sweeps})})
    with pytest.raises(
        DataError,
        match=r"^params: fedcmc.sweeps.subset_size = 500 with subset mode 'natural' on "
        r"synthetic-re: size=500; must be an integer in 1..30 \(the train rows\)$",
    ):
        build_partition(too_many, subset, corpus)


# ----- trivial rows and lines where a reader needs them ------------------------------------------------------------
def test_table3_scores_each_subsets_trivial_baselines_in_every_column(tmp_path):
    """The balanced subset's flat prior names its first class (rel0); the natural prior's commonest class (rel2, 49
    training sentences) is scored beside the balanced cells too, on the test set they are scored on."""
    params = small_params()
    write_fake_grid(tmp_path, params)
    balanced = next(c for c in sweep_cells(params, "subsets") if c.subset == "balanced").partition
    flat = _counts(params.fedcmc.settings.clients)
    flat.loc[flat.sum(axis=1) > 0] = 10  # every class alike, on the same non-empty clients
    flat.assign(total=flat.sum(axis=1)).to_csv(tmp_path / "partitions" / balanced / "counts.csv")
    data = load_fedcmc(tmp_path, params)
    table = subsets_table(data, params)
    gold = predictions(0.5).label
    always = lambda c: f"{100 * f1_score(gold, [c] * len(gold), labels=POSITIVE, average='micro'):.2f}"  # noqa: E731
    assert list(table.columns) == ["balanced", "natural"] and table.index[:2].tolist() == ["FedRS", "FedCMC"]
    for prior, answer in (("balanced", "rel0"), ("natural", "rel2")):
        assert table.loc[f"trivial: always {answer} ({prior} prior)"].tolist() == [always(answer)] * 2
    stratified = table.loc[
        ["trivial: stratified random (balanced prior)", "trivial: stratified random (natural prior)"]
    ]
    assert stratified["balanced"].tolist() == stratified["natural"].tolist() and stratified["balanced"].nunique() == 2
    section = render_report(params, data).split("## Table 3")[1].split("## Fig 1")[0]
    row = next(text for text in section.splitlines() if text.startswith("| trivial: always rel2 (natural prior) "))
    assert [cell.strip() for cell in row.split("|")[2:4]] == [always("rel2")] * 2


def test_the_clients_table_ends_with_each_partitions_trivial_rows(tmp_path):
    """Every count's partition holds the same training pool, so its commonest positive class (rel2) is the same in
    each column, scored on the test set its cells are scored on."""
    from fedrepro.fedcmc.tables import clients_table

    params = small_params()
    write_fake_grid(tmp_path, params)
    data = load_fedcmc(tmp_path, params)
    table = clients_table(data, params)
    gold = predictions(0.5).label
    always = f"{100 * f1_score(gold, ['rel2'] * len(gold), labels=POSITIVE, average='micro'):.2f}"
    assert list(table.columns) == ["4", "6"]
    assert table.index.tolist() == ["FedAvg", "FedCMC", "trivial: always rel2", "trivial: stratified random"]
    assert table.loc["trivial: always rel2"].tolist() == [always, always]
    section = render_report(params, data).split("## The clients table")[1].split("## Table 3")[0]
    assert "| trivial: always rel2" in section and always in section


def test_figs_3a_and_3b_draw_the_trivial_baselines_and_cross_a_diverged_curve(tmp_path, monkeypatch):
    from drawn import catch_figures, labels, line
    from fedrepro.report.figures import REFERENCE_STYLES

    params = small_params()
    bad = next(c for c in table_cells(params) if c.method == "fedcmc" and c.alpha == 0.05 and c.seed == 1)
    write_fake_grid(tmp_path / "grid", params, diverged=(bad.name,))
    data = load_fedcmc(tmp_path / "grid", params)
    caught = catch_figures(monkeypatch)
    write_figures(data, params, tmp_path)
    chance = chance_scores(data, "synthetic-re", "synthetic-re-a0.05-k4")
    ax = caught["fig3a_convergence.png"].axes[0]
    for (name, scores), style in zip(chance.items(), REFERENCE_STYLES):
        trivial = line(ax, f"trivial: {name}")
        assert (
            trivial.get_ydata()[0] == pytest.approx(100 * scores["micro_f1"]) and trivial.get_color() == style["color"]
        )
    assert {"FedAvg", "FedRS", "FedCMC †", "X: the curve's cell(s) diverged"} <= set(labels(ax))
    curve = line(ax, "FedCMC †")
    crosses = [drawn for drawn in ax.get_lines() if drawn.get_marker() == "X" and len(drawn.get_xdata())]
    assert [(c.get_xdata()[0], c.get_ydata()[0]) for c in crosses] == [(curve.get_xdata()[-1], curve.get_ydata()[-1])]
    local_epochs = caught["fig3b_local_epochs.png"].axes[0]
    assert {"trivial: stratified random", "FedCMC, E=1 †", "FedAvg, E=2"} <= set(labels(local_epochs))


def test_a_partial_table2_says_how_many_seeds_each_entry_has_and_gives_no_verdict(tmp_path):
    """While the ledger is being built: each entry with its seeds in, its health mark, 'missing' where none is, and
    the partition's trivial rows on its test sentences (scripts/cpu_snapshot.py partial)."""
    from fedrepro.fedcmc.partial import partial_table2, render_partial
    from fedrepro.io import write_json, write_table

    params = small_params()
    cells = table_cells(params)
    for partition in {c.partition for c in cells}:
        folder = tmp_path / partition
        folder.mkdir()
        labels = ["false", "rel0", "rel0", "rel1"] * 10
        write_table(
            folder / "assignment.parquet",
            pd.DataFrame(
                {
                    "sentence_id": [f"s{i}" for i in range(40)],
                    "label": labels,
                    "split": ["train"] * 20 + ["test"] * 20,
                    "client": "client_00",
                }
            ),
        )
        pd.DataFrame(
            {"false": [5], "rel0": [10], "rel1": [5], "total": [20]}, index=pd.Index(["client_00"], name="client")
        ).to_csv(folder / "counts.csv")
        write_json(folder / "partition.json", {"classes": ["false", "rel0", "rel1"]})
    sound = [{"round": r, "fit_loss": 1.0 / r, "valid": {"global": {"micro_f1": 0.5}}} for r in range(1, 5)]
    rising = [{"round": r, "fit_loss": float(r), "valid": {"global": {"micro_f1": 0.5}}} for r in range(1, 5)]
    fedavg = [c for c in cells if c.method == "fedavg" and c.alpha == 0.05]
    held = {
        fedavg[0].name: {"test": {"micro_f1": 0.60}, "history": sound},
        fedavg[1].name: {"test": {"micro_f1": 0.70}, "history": rising},
    }
    table = partial_table2(params, held, tmp_path)
    assert table.loc["FedAvg", "synthetic-re α=0.05"] == "65.00 ± 7.07 † (2 of 3 seeds)"
    assert table.loc["FedCMC", "synthetic-re α=0.5"] == "missing (0 of 3 seeds)"
    precision, recall = 10 / 20, 10 / 15  # test: rel0 10, rel1 5, false 5; always rel0 on all 20
    assert (
        table.loc["trivial: always rel0"].tolist() == [f"{100 * 2 * precision * recall / (precision + recall):.2f}"] * 2
    )
    text = render_partial(params, held, tmp_path, "abc1234")
    assert "**2 of 18 Table 2 cells** (seed 0: 1 of 6, seed 1: 1 of 6, seed 2: 0 of 6)" in text
    assert "no verdict" in text and "holds" not in text and "inconclusive" not in text


def test_a_corpus_the_partition_stage_cannot_find_names_every_key_that_may_name_it(tmp_path):
    from fedrepro.errors import DataError
    from fedrepro.fedcmc.partition import load_corpus

    (tmp_path / "pgr").mkdir()
    with pytest.raises(
        DataError,
        match=r"'my_corpus'.*prepared corpora: \['pgr'\]; change whichever of fedcmc.datasets, "
        r"fedcmc.sweeps.dataset and fedcmc.sweeps.subset_dataset names it",
    ):
        load_corpus(tmp_path, "my_corpus")


def test_fig4_draws_the_partitions_trivial_baselines_and_marks_each_rules_health(tmp_path, monkeypatch):
    """Fig 4's bars sat at 57-58% beside a 56% always-rel0 baseline the figure did not draw, two of them diverged."""
    from drawn import catch_figures, labels, line

    params = small_params()
    bad = next(c for c in sweep_cells(params, "vectors") if c.vectors == "minor" and c.seed == 0)
    write_fake_grid(tmp_path / "grid", params, diverged=(bad.name,))
    data = load_fedcmc(tmp_path / "grid", params)
    caught = catch_figures(monkeypatch)
    write_figures(data, params, tmp_path)
    ax = caught["fig4_vectors.png"].axes[0]
    partition = bad.partition
    for name, scores in chance_scores(data, "synthetic-re", partition).items():
        assert line(ax, f"trivial: {name}").get_ydata()[0] == pytest.approx(100 * scores["micro_f1"])
    assert {"trivial: stratified random"} <= set(labels(ax))
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["major", "minor †", "none"]
