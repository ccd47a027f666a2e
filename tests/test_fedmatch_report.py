"""FedMatch's report: health markers from each cell's history, no claim resting on a diverged or unconverged cell,
patch norms."""

import numpy as np
import pandas as pd
import pytest

from fedrepro.fedmatch.claims import _compare, _figure_claims, _individuals_beat_somewhere
from fedrepro.fedmatch.report import (
    FedMatchResults,
    bm25_levels,
    health_table,
    history_health,
    marked_labels,
    patch_table,
)
from fedrepro.report.claims import claims_frame
from fedrepro.report.statistics import VERDICTS

CLIENTS = ("a", "b")


def history(losses, valid_mrr=None):
    records = []
    for i, loss in enumerate(losses):
        record = {"round": i + 1, "train_loss": loss, "bytes_up": 0, "bytes_down": 0}
        if valid_mrr is not None:
            record["valid"] = {
                c: {"map": valid_mrr[i], "mrr": valid_mrr[i] + (0.1 if c == "a" else -0.1)} for c in CLIENTS
            }
        records.append(record)
    return records


def results(histories: dict[str, list[dict]], info: dict | None = None) -> FedMatchResults:
    rows, questions = [], []
    for index, row in enumerate(histories):
        for client in CLIENTS + ("overall",):
            rows += [
                {
                    "row": row,
                    "method": row,
                    "seed": 0,
                    "sweep": None,
                    "point": None,
                    "client": client,
                    "metric": m,
                    "value": 0.3 + 0.1 * index,
                }
                for m in ("map", "mrr")
            ]
        questions += [
            {
                "row": row,
                "seed": 0,
                "client": c,
                "question": f"q{q}",
                "map": 0.3 + 0.1 * index + 0.01 * q,
                "mrr": 0.3 + 0.1 * index + 0.01 * q,
            }
            for c in CLIENTS
            for q in range(4)
        ]
    health = {row: {0: history_health(h)} for row, h in histories.items()}
    return FedMatchResults(pd.DataFrame(rows), pd.DataFrame(questions), pd.DataFrame(), info or {}, [], health)


def test_health_from_the_history_uses_train_loss_and_the_clients_mean_validation_mrr():
    assert history_health(history([0.9, 0.95])).label == "diverged"
    assert history_health(history([0.9, float("nan")])).label == "diverged"
    assert history_health(history([0.9, 0.6, 0.5])).label == "unknown"  # no validation recorded (eval_every = 0)
    # the clients' mean MRR is the map value here: the last 2 of 0.3, 0.5, 0.7 gain 0.2 over the best before them
    # (still improving); the last 2 of 0.3, 0.5, 0.505, 0.5 gain 0.005 (stopped)
    assert history_health(history([0.9, 0.6, 0.5], [0.3, 0.5, 0.7])).label == "not converged"
    assert history_health(history([0.9, 0.6, 0.5, 0.5], [0.3, 0.5, 0.505, 0.5])).label == "converged"


def test_tables_mark_unsound_rows_and_no_claim_rests_on_a_diverged_cell():
    data = results(
        {
            "fedavg": history([0.9, 0.6, 0.5, 0.5], [0.3, 0.5, 0.505, 0.5]),
            "individual": history([0.9, 1.2, 1.4], [0.3, 0.2, 0.1]),
            "fedprox": history([0.9, 0.6, 0.5], [0.3, 0.5, 0.7]),
        }
    )
    labels = marked_labels(data)
    assert labels == {
        "fedavg": "FedAvg",
        "individual": "BERT (individual) [diverged]",
        "fedprox": "FedProx [not converged]",
    }
    claim = _compare(data, "FedAvg beats individual", ["fedavg"], ["individual"])
    assert claim.verdict == "inconclusive (rests on diverged: BERT (individual))"
    # an unconverged cell voids the test too: the claim would rest on where the budget stopped, not on the method
    assert (
        _compare(data, "FedAvg beats FedProx", ["fedavg"], ["fedprox"]).verdict
        == "inconclusive (rests on not converged: FedProx)"
    )
    assert (
        _compare(data, "FedAvg beats FedAvg", ["fedavg"], ["fedavg"]).verdict
        == "inconclusive (1 seed; a seed-level test needs 3)"
    )
    # a reference at chance voids the claim: beating it says little about the method
    at_chance = _compare(data, "FedProx beats FedAvg", ["fedprox"], ["fedavg"], chance={"overall": {"mrr": 0.28}})
    assert (
        at_chance.verdict == "inconclusive (rests on not converged: FedProx)"
    )  # an unsound cell is named first of all
    sound = results(
        {
            "fedavg": history([0.9, 0.6, 0.5, 0.5], [0.3, 0.5, 0.505, 0.5]),
            "fedper": history([0.9, 0.6, 0.5, 0.5], [0.3, 0.5, 0.505, 0.5]),
        }
    )
    assert _compare(
        sound, "FedPer beats FedAvg", ["fedper"], ["fedavg"], chance={"overall": {"mrr": 0.28}}
    ).verdict == ("inconclusive (the reference FedAvg is at chance: MRR 0.300 vs 0.280 (needs 0.05 above))")
    assert _compare(sound, "FedPer beats FedAvg", ["fedper"], ["fedavg"], chance={"overall": {"mrr": 0.2}}).verdict == (
        "inconclusive (1 seed; a seed-level test needs 3)"
    )
    table = health_table(data, ["fedavg", "individual"])
    assert table["health"].tolist() == ["converged", "diverged"]
    assert "rose from 0.9 (round 1) to 1.4 (round 3)" in table["why"].iloc[1]


def test_patch_table_shows_each_clients_up_norm_down_change_and_down_norm():
    norms = {
        "a": {
            "down": 11.3,
            "down_change": 0.0451,
            "up": 0.125,
            "up_change": 0.125,
            "feature_change": 0.0123,
            "score_change": 0.4,
        },
        "b": {"down": 11.2, "down_change": 0.05, "up": 0.2, "up_change": 0.2},
    }
    data = results(
        {"fedavg": history([0.9, 0.5]), "fedmatch_h_lr": history([0.9, 0.5])},
        info={"fedavg": {}, "fedmatch_h_lr": {"patch_norms": norms}},
    )
    table = patch_table(data, ["fedavg", "fedmatch_h_lr"])
    assert list(table.index) == ["FedMatch H+LR"]
    assert table.loc["FedMatch H+LR", "a"] == "0.125 / 0.0451 / 11.3; 1.23%, 0.40 sd"
    assert table.loc["FedMatch H+LR", "b"] == "0.2 / 0.05 / 11.2"


def test_the_rendered_report_marks_unsound_rows_states_the_rule_and_shows_patch_norms():
    from fedrepro.config import parse_params
    from fedrepro.fl.health import RULE
    from fedrepro.fedmatch.render import render_report
    from test_config import with_change

    raw = with_change("fedmatch.methods", ["fedavg", "fedmatch_h_lr"])
    for key, value in (("table2", ["fedmatch_h_lr"]), ("table3", ["fedavg", "fedmatch_h_lr"])):
        raw["fedmatch"][key] = value
    raw["fedmatch"]["sweeps"].update({k: [] for k in ("shared_layers", "patch_size", "aggregate_every", "data_ratio")})
    params = parse_params(raw)
    norms = {c: {"down": 3.3, "down_change": 0.2, "up": 0.25, "up_change": 0.25} for c in CLIENTS}
    info = {
        row: {
            "channel": {"a->server": {"bytes": 10}},
            "parameters": {"total": 5, "trainable": 5, "private": 0, "uploaded": 5},
            "memory_bytes": {"private_per_client_max": 0},
            **({"patch_norms": norms} if row == "fedmatch_h_lr" else {}),
        }
        for row in ("fedavg", "fedmatch_h_lr")
    }
    histories = {"fedavg": history([0.9, 1.1, 1.3]), "fedmatch_h_lr": history([0.9, 0.6, 0.5], [0.3, 0.5, 0.7])}
    data = results(histories, info)
    data.histories = pd.DataFrame(
        [
            {"row": row, "method": row, "seed": 0, "sweep": None, "point": None, **r}
            for row, h in histories.items()
            for r in h
        ]
    ).drop(columns="valid", errors="ignore")
    chance = {"clients": {c: {"map": 0.2, "mrr": 0.25} for c in CLIENTS}, "overall": {"map": 0.2, "mrr": 0.25}}
    partition = {
        "clients": {
            c: {"train_questions_available": 10, "questions": {"train": 5, "valid": 4, "test": 4}, "answer_pool": 30}
            for c in CLIENTS
        }
    }
    mined = {c: {"triples": 20, "candidates": {"test": 40}} for c in CLIENTS}
    bm25 = {"clients": {c: {"map": 0.125, "mrr": 0.375} for c in CLIENTS}, "overall": {"map": 0.125, "mrr": 0.375}}
    report = render_report(params, data, chance, bm25, partition, mined)
    assert report.count("| BM25 only ") == 4 and "| 0.125 |" in report and "ascending answer id" in report
    assert "BM25-only row is absent" in render_report(params, data, chance, None, partition, mined)
    assert RULE in report
    assert "| FedAvg [diverged]" in report and "| FedMatch H+LR [not converged]" in report
    assert "## Do the private patches learn?" in report and "0.25 / 0.2 / 3.3" in report
    assert "inconclusive (rests on diverged: FedAvg; not converged: FedMatch H+LR)" in report
    # its one tested claim has 1 seed, inconclusive whatever its p, yet in Holm's family: the family is every p computed
    assert "Holm's correction runs over all 1 of this report's claims with a p-value" in report
    assert "Holm-adjusted over 1 claims with a p-value" in report
    assert "| Fig 7 (3): on PrivacyQA, aggregating every 2 epochs drops clearly below every epoch" in report
    assert report.count("not testable here (the sweep fedmatch.sweeps.aggregate_every is empty at this scale)") == 4


def test_bm25_only_row_is_map_and_mrr_of_the_recorded_scores_with_ties_by_answer_id(tmp_path):
    """q1: order a2 (3) a1* (2) a3 (1) a4* (0): AP (1/2 + 2/4) / 2, RR 1/2; q2: gold b1 ties b2 at 1.0 and ranks first
    by answer id: AP = RR = 1 (reversed tie rule: 1/2); client b's q3: gold c1 (0) below c2 (1): AP = RR = 1/2.
    The valid question would lift client a to AP 1 if it counted."""
    rows = [
        ("test", "q1", "a1", 1, 2.0),
        ("test", "q1", "a2", 0, 3.0),
        ("test", "q1", "a3", 0, 1.0),
        ("test", "q1", "a4", 1, 0.0),
        ("test", "q2", "b1", 1, 1.0),
        ("test", "q2", "b2", 0, 1.0),
        ("valid", "v1", "z1", 1, 9.0),
        ("valid", "v1", "z2", 0, 0.0),
    ]
    columns = ["split", "question_id", "answer_id", "relevance", "score"]
    pd.DataFrame(rows, columns=columns).to_parquet(tmp_path / "a.parquet")
    pd.DataFrame([("test", "q3", "c1", 1, 0.0), ("test", "q3", "c2", 0, 1.0)], columns=columns).to_parquet(
        tmp_path / "b.parquet"
    )
    levels = bm25_levels(tmp_path)
    assert levels["clients"] == {"a": {"map": 0.75, "mrr": 0.75}, "b": {"map": 0.5, "mrr": 0.5}}
    assert levels["overall"] == {"map": 0.625, "mrr": 0.625}
    assert bm25_levels(tmp_path / "absent") is None


# ----- the claims of Figs 5, 7, 8 and Table 3's "individual models beat LG-FedAvg and FedPer on some domains" --------
PAPER_CLIENTS = ("bioasq", "fiqa", "insuranceqa", "medquad", "privacyqa")
CONVERGED = history([0.9, 0.6, 0.5, 0.5], [0.3, 0.5, 0.505, 0.5])
LOW_CHANCE = {"clients": {c: {"map": 0.1, "mrr": 0.1} for c in PAPER_CLIENTS}, "overall": {"map": 0.1, "mrr": 0.1}}


def grid(rows: dict[str, dict[str, float]], seeds=(0, 1, 2), questions=10, clients=PAPER_CLIENTS) -> FedMatchResults:
    """A sound synthetic grid: rows (table methods, or '<sweep>=<point>:<method>' sweep points) -> client -> level
    ('*' for the other clients). Each question's MAP and MRR is its level plus a fixed per-question offset and a little
    seed noise, so a 0.1 gap holds over 3 seeds and a level tie does not."""
    rng = np.random.default_rng(0)
    offsets = rng.normal(0, 0.05, size=(len(clients), questions))
    results, questions_frame, health = [], [], {}
    for row, levels in rows.items():
        sweep, point, method = (None, None, row)
        if ":" in row:
            (sweep, point), method = row.split(":")[0].split("="), row.split(":")[1]
        base = {"row": row, "method": method, "sweep": sweep, "point": point}
        for seed in seeds:
            values = (
                offsets + rng.normal(0, 0.01, size=offsets.shape) + [[levels.get(c, levels.get("*"))] for c in clients]
            )
            means = dict(zip(clients, values.mean(axis=1)))
            for client, value in {**means, "overall": float(np.mean(list(means.values())))}.items():
                results += [
                    {**base, "seed": seed, "client": client, "metric": m, "value": value} for m in ("map", "mrr")
                ]
            questions_frame += [
                {"row": row, "seed": seed, "client": c, "question": f"q{q}", "map": values[i, q], "mrr": values[i, q]}
                for i, c in enumerate(clients)
                for q in range(questions)
            ]
        health[row] = {seed: history_health(CONVERGED) for seed in seeds}
    return FedMatchResults(pd.DataFrame(results), pd.DataFrame(questions_frame), pd.DataFrame(), {}, [], health)


def sweep(name: str, points, level, method="fedmatch_h_lr") -> dict[str, dict[str, float]]:
    """One sweep's rows, each point's levels from ``level(point)``."""
    return {f"{name}={p}:{method}": level(p) for p in points}


def verdicts(claims: list) -> dict[str, str]:
    return claims_frame(claims).set_index("finding (paper)")["verdict"].to_dict()


NEW_FINDINGS = (
    "Fig 5 (2)",
    "Fig 5 (3)",
    "Fig 7 (1): aggregating",
    "Fig 7 (1): BioASQ",
    "Fig 7 (2)",
    "Fig 7 (3)",
    "Fig 8 (1)",
    "Table 3: individual models beat LG-FedAvg",
    "Table 3: individual models beat FedPer",
)


def full_grid(seeds=(0, 1, 2)) -> FedMatchResults:
    rows = {
        "individual": {"*": 0.4},
        "individual_re2": {"*": 0.35, "fiqa": 0.6},
        "lg_fedavg": {"*": 0.5},
        "fedper": {"*": 0.5},
    }
    rows |= sweep(
        "shared_layers", (2, 1, 0), lambda n: {"*": 0.4 + 0.05 * n, "fiqa": 0.5, "bioasq": 0.6 - 0.1 * (n == 2)}
    )
    rows |= sweep(
        "aggregate_every",
        (1, 2, 3),
        lambda e: {"*": 0.6 - 0.1 * e, "fiqa": 0.5 + 0.05 * (e == 2), "bioasq": 0.5 + 0.05 * (e == 2)},
    )
    rows |= sweep("data_ratio", (0.2, 0.6, 1.0), lambda r: {"*": 0.5})
    rows |= sweep("data_ratio", (0.2, 0.6, 1.0), lambda r: {"*": 0.3}, method="individual")
    return grid(rows, seeds)


def new_claims(data: FedMatchResults, chance=LOW_CHANCE) -> dict[str, str]:
    individuals = [m for m in ("individual", "individual_re2") if m in data.health]
    claims = _figure_claims(data, chance) + [
        _individuals_beat_somewhere(data, f, individuals, chance) for f in ("lg_fedavg", "fedper")
    ]
    return {finding: verdict for finding, verdict in verdicts(claims).items() if finding.startswith(NEW_FINDINGS)}


def test_every_new_claim_gets_a_verdict_from_the_vocabulary_and_holds_where_the_grid_is_built_to_hold():
    claims = new_claims(full_grid())
    assert len(claims) == len(NEW_FINDINGS)
    assert all(verdict.split(" (")[0] in VERDICTS for verdict in claims.values())
    by_start = {start: next(v for f, v in claims.items() if f.startswith(start)) for start in NEW_FINDINGS}
    assert by_start["Fig 7 (1): aggregating"] == "holds"  # E = 1 ahead by 0.1 on three of five collections
    assert by_start["Fig 7 (1): BioASQ"] == "holds"
    assert by_start["Fig 7 (3)"] == "holds"  # PrivacyQA: E = 1 0.5, E = 2 0.4
    assert by_start["Fig 7 (2)"].startswith("holds (direction only")  # FiQA and BioASQ move 0.05, the others 0.2
    assert by_start["Fig 5 (2)"].startswith("holds (direction only")  # FiQA flat
    assert by_start["Fig 5 (3)"] == "holds"  # BioASQ 0.6 below all shared, 0.5 at all shared; FiQA flat
    assert by_start["Fig 8 (1)"] == "holds"  # 0.5 against 0.3 at every ratio
    # RE2 beats both federated methods on FiQA (0.6 vs 0.5) and loses everywhere else: some domains, and which
    assert by_start["Table 3: individual models beat LG-FedAvg"] == "holds"
    assert by_start["Table 3: individual models beat FedPer"] == "holds"


def test_new_claims_are_reversed_where_built_reversed_and_inconclusive_with_two_seeds():
    rows = {"individual": {"*": 0.3}, "lg_fedavg": {"*": 0.5}, "fedper": {"*": 0.5}}
    rows |= sweep("aggregate_every", (1, 2), lambda e: {"*": 0.3 + 0.1 * e})
    rows |= sweep("data_ratio", (0.2, 1.0), lambda r: {"*": 0.5 - 0.2 * (r == 0.2)})
    rows |= sweep("data_ratio", (0.2, 1.0), lambda r: {"*": 0.4}, method="individual")
    claims = new_claims(grid(rows))
    verdict = lambda start: next(v for f, v in claims.items() if f.startswith(start))  # noqa: E731
    assert verdict("Fig 7 (1): aggregating") == verdict("Fig 7 (3)") == "reversed"
    assert verdict("Fig 7 (1): BioASQ") == "holds"  # its mirror
    assert verdict("Fig 8 (1)") == "reversed"  # BERT ahead at 20%: one ratio against 'at every ratio'
    # federated ahead on every domain: reversed, not merely unsupported
    assert (
        verdict("Table 3: individual models beat LG-FedAvg")
        == verdict("Table 3: individual models beat FedPer")
        == "reversed"
    )
    tested = [
        v
        for v in new_claims(grid(rows, seeds=(0, 1))).values()
        if not v.startswith("not testable") and "direction only" not in v
    ]
    assert len(tested) == 6 and set(tested) == {"inconclusive (2 seeds; a seed-level test needs 3)"}


def test_an_empty_sweep_or_a_missing_collection_is_not_testable_and_a_claim_names_its_domains():
    data = grid({"individual": {"*": 0.4, "medquad": 0.6}, "lg_fedavg": {"*": 0.5}})
    claims = verdicts(_figure_claims(data, LOW_CHANCE))
    assert claims["Fig 7 (3): on PrivacyQA, aggregating every 2 epochs drops clearly below every epoch"] == (
        "not testable here (the sweep fedmatch.sweeps.aggregate_every is empty at this scale)"
    )
    assert claims["Fig 5 (3): on BioASQ and FiQA, sharing all the layers is not optimal"] == (
        "not testable here (the sweep fedmatch.sweeps.shared_layers is empty at this scale)"
    )
    assert claims["Fig 8 (1): FedMatch H+LR beats individual BERT at every data ratio (InsuranceQA)"] == (
        "not testable here (the sweep fedmatch.sweeps.data_ratio is empty at this scale)"
    )
    claim = _individuals_beat_somewhere(data, "lg_fedavg", ["individual"], LOW_CHANCE)
    assert "significant after Bonferroni over the 5: BERT (individual) on medquad" in claim.measured
    assert (
        "5 contrasts combined into one claim, which holds if" in claim.test
        and "deciding contrast: BERT (individual) on medquad" in claim.test
    )
    at_chance = _individuals_beat_somewhere(data, "lg_fedavg", ["individual"], {"overall": {"map": 0.48, "mrr": 0.48}})
    assert at_chance.verdict.startswith("inconclusive (the reference LG-FedAvg is at chance")
    insurance = grid(
        sweep("aggregate_every", (1, 2), lambda e: {"*": 0.5}), clients=("auto-insurance", "life-insurance")
    )
    fig7 = verdicts(_figure_claims(insurance, LOW_CHANCE))
    assert fig7["Fig 7 (3): on PrivacyQA, aggregating every 2 epochs drops clearly below every epoch"] == (
        "not testable here (no PrivacyQA client at this scale)"
    )
    assert fig7["Fig 7 (2): the large collections (FiQA, BioASQ) are the most robust to the aggregation period"] == (
        "not testable here (no FiQA or BioASQ client at this scale)"
    )


def test_the_sweep_figures_draw_chance_overall_and_per_client_and_fig8_each_metrics_own(tmp_path, monkeypatch):
    """A client's point below its own chance shows: its level is dotted in its colour, overall's a reference line."""
    from drawn import catch_figures, labels, line
    from fedrepro.report.figures import data_ratio_figure, sweep_figure
    from fedrepro.report.results import CHANCE

    caught = catch_figures(monkeypatch)
    table = pd.DataFrame({"a": [0.5, 0.6], "b": [0.2, 0.3], "overall": [0.35, 0.45]}, index=[1, 2])
    sweep_figure(table, {"a": 0.25, "b": 0.3, "overall": 0.275}, "aggregate every", "Fig 7", tmp_path / "fig7.png")
    ax = caught["fig7.png"].axes[0]
    overall = line(ax, f"{CHANCE}, overall")
    assert overall.get_ydata()[0] == 0.275 and overall.get_color() == "black" and overall.get_linestyle() == "-."
    dotted = {drawn.get_ydata()[0]: drawn.get_color() for drawn in ax.get_lines() if drawn.get_linestyle() == ":"}
    assert dotted == {0.25: line(ax, "a").get_color(), 0.3: line(ax, "b").get_color()}
    assert labels(ax).count(f"{CHANCE}, per client (dotted, its colour)") == 1
    ours = pd.DataFrame({"map": [0.2, 0.3], "mrr": [0.3, 0.4]}, index=[0.5, 1.0])
    data_ratio_figure(
        ours, ours - 0.1, ("FedMatch H+LR", "BERT (individual)"), "a", {"map": 0.15, "mrr": 0.22}, tmp_path / "fig8.png"
    )
    assert [line(ax, CHANCE).get_ydata()[0] for ax in caught["fig8.png"].axes] == [0.15, 0.22]


def test_the_sweep_figures_draw_the_chance_levels_of_the_mined_test_candidates(tmp_path, monkeypatch):
    """Fig 7 on two clients: client a's test question has 1 gold of 2 candidates (chance MRR 0.75), b's 1 of 4
    (chance MRR (1 + 1/2 + 1/3 + 1/4) / 4); valid candidates do not count."""
    from drawn import catch_figures, line
    from fedrepro.config import parse_params
    from fedrepro.fedmatch.methods import FIGURE_METHOD
    from fedrepro.fedmatch.report import chance_levels, write_figures
    from fedrepro.report.results import CHANCE
    from test_config import with_change

    raw = with_change("fedmatch.methods", ["fedavg", FIGURE_METHOD])
    raw["fedmatch"]["table2"], raw["fedmatch"]["table3"] = [FIGURE_METHOD], ["fedavg", FIGURE_METHOD]
    raw["fedmatch"]["sweeps"].update(shared_layers=[], patch_size=[], aggregate_every=[1, 2], data_ratio=[])
    params = parse_params(raw)
    rows = [
        {
            "row": f"aggregate_every={point}:{FIGURE_METHOD}",
            "method": FIGURE_METHOD,
            "seed": 0,
            "sweep": "aggregate_every",
            "point": str(point),
            "client": client,
            "metric": metric,
            "value": 0.5 + 0.1 * point,
        }
        for point in (1, 2)
        for client in CLIENTS + ("overall",)
        for metric in ("map", "mrr")
    ]
    histories = pd.DataFrame(
        [
            {
                "row": m,
                "method": m,
                "seed": 0,
                "sweep": None,
                "point": None,
                "round": r,
                "train_loss": 1.0 / r,
                "bytes_up": 0,
                "bytes_down": 0,
            }
            for m in ("fedavg", FIGURE_METHOD)
            for r in (1, 2)
        ]
    )
    data = FedMatchResults(pd.DataFrame(rows), pd.DataFrame(), histories)
    mined = tmp_path / "mined"
    for client, candidates in (("a", 2), ("b", 4)):
        (mined / client).mkdir(parents=True)
        pd.DataFrame(
            {
                "split": ["test"] * candidates + ["valid", "valid"],
                "question_id": ["q"] * candidates + ["v", "v"],
                "answer_id": [f"x{i}" for i in range(candidates + 2)],
                "relevance": [1] + [0] * (candidates - 1) + [1, 1],
            }
        ).to_parquet(mined / client / "candidates.parquet")
    caught = catch_figures(monkeypatch)
    write_figures(data, params, tmp_path, chance_levels(mined))
    expected = (0.75 + (1 + 1 / 2 + 1 / 3 + 1 / 4) / 4) / 2
    ax = caught["fig7_aggregate_every.png"].axes[0]
    assert line(ax, f"{CHANCE}, overall").get_ydata()[0] == pytest.approx(expected)


def test_a_sweep_table_ends_with_each_columns_chance_row():
    """Figs 5-8 draw chance; their tables show it too, so a point at or below it is seen in the numbers."""
    from fedrepro.fedmatch.report import sweep_table
    from fedrepro.report.results import CHANCE

    data = full_grid(seeds=(0,))
    chance = {
        "clients": {c: {"map": 0.2, "mrr": 0.1 + 0.01 * i} for i, c in enumerate(sorted(PAPER_CLIENTS))},
        "overall": {"map": 0.2, "mrr": 0.3},
    }
    table = sweep_table(data, "shared_layers", chance)
    assert table.index.tolist() == [0, 1, 2, CHANCE]
    assert table.loc[CHANCE].tolist() == pytest.approx([0.1 + 0.01 * i for i in range(len(PAPER_CLIENTS))] + [0.3])
    assert table.loc[2, "overall"] > table.loc[0, "overall"] > table.loc[CHANCE, "overall"]
    assert CHANCE not in sweep_table(data, "shared_layers").index


def test_a_partial_table2_says_how_many_seeds_each_entry_has_and_gives_no_verdict(tmp_path):
    """While the ledger is being built (scripts/cpu_snapshot.py partial fedmatch): each entry with its seeds in, its
    health mark, 'missing' where none is, and the trivial rows of the same test candidates (every client: one test
    question, its gold answer of two; BM25 scores the gold higher, so MAP 1; a random ordering's MAP is 0.75)."""
    from fedrepro.config import parse_params
    from fedrepro.fedmatch.cells import table_cells
    from fedrepro.fedmatch.methods import FIGURE_METHOD
    from fedrepro.fedmatch.partial import partial_table2, render_partial
    from fedrepro.fedmatch.report import BM25_ONLY, LABELS
    from fedrepro.report.results import CHANCE
    from test_config import with_change

    raw = with_change("fedmatch.methods", ["fedavg", FIGURE_METHOD])
    raw["fedmatch"]["table2"], raw["fedmatch"]["table3"] = [FIGURE_METHOD], ["fedavg", FIGURE_METHOD]
    raw["fedmatch"]["seeds"] = [0, 1, 2]
    params = parse_params(raw)
    mined, bm25 = tmp_path / "mined", tmp_path / "mined_bm25"
    bm25.mkdir()
    candidates = pd.DataFrame(
        {"split": ["test", "test"], "question_id": ["q", "q"], "answer_id": ["a0", "a1"], "relevance": [1, 0]}
    )
    for client in params.qa_clients:
        (mined / client).mkdir(parents=True)
        candidates.to_parquet(mined / client / "candidates.parquet")
        candidates.assign(score=[1.0, 0.0]).to_parquet(bm25 / f"{client}.parquet")

    def metrics(level: float, losses: list[float]) -> dict:
        scores = {"map": level, "mrr": level}
        valid = {client: {"mrr": 0.5} for client in params.qa_clients}
        return {
            "test": {"clients": {client: scores for client in params.qa_clients}, "overall": scores},
            "history": [{"round": r + 1, "fit_loss": loss, "valid": valid} for r, loss in enumerate(losses)],
        }

    fedavg = [c for c in table_cells(params) if c.method == "fedavg"]
    held = {fedavg[0].name: metrics(0.6, [1.0, 0.5, 0.34, 0.33]), fedavg[2].name: metrics(0.7, [1.0, 2.0, 3.0, 4.0])}
    table = partial_table2(params, held, mined, bm25, "map")
    assert table.loc[LABELS["fedavg"], "overall"] == "0.650 ± 0.071 † (2 of 3 seeds)"
    assert table.loc[LABELS[FIGURE_METHOD], "overall"] == "missing (0 of 3 seeds)"
    assert set(table.loc[BM25_ONLY]) == {"1.000"} and set(table.loc[CHANCE]) == {"0.750"}
    text = render_partial(params, held, mined, bm25, "abc1234")
    assert "**2 of 6 Table 2 cells** (seed 0: 1 of 2, seed 1: 0 of 2, seed 2: 1 of 2)" in text
    assert "## Test MAP" in text and "## Test MRR" in text
    assert "no verdict" in text and "holds" not in text and "inconclusive" not in text
    assert "the widest range of overall test MAP is 0.100 (FedAvg)" in text.replace(LABELS["fedavg"], "FedAvg")
