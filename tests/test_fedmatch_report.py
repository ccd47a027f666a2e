"""FedMatch's report: health markers from each cell's history, no claim resting on a diverged or unconverged cell,
patch norms."""

import pandas as pd

from fedrepro.fedmatch.report import FedMatchResults, _compare, bm25_levels, health_table, history_health, marked_labels, patch_table

CLIENTS = ("a", "b")


def history(losses, valid_mrr=None):
    records = []
    for i, loss in enumerate(losses):
        record = {"round": i + 1, "train_loss": loss, "bytes_up": 0, "bytes_down": 0}
        if valid_mrr is not None:
            record["valid"] = {c: {"map": valid_mrr[i], "mrr": valid_mrr[i] + (0.1 if c == "a" else -0.1)} for c in CLIENTS}
        records.append(record)
    return records


def results(histories: dict[str, list[dict]], info: dict | None = None) -> FedMatchResults:
    rows, questions = [], []
    for index, row in enumerate(histories):
        for client in CLIENTS + ("overall",):
            rows += [{"row": row, "method": row, "seed": 0, "sweep": None, "point": None, "client": client, "metric": m,
                      "value": 0.3 + 0.1 * index} for m in ("map", "mrr")]
        questions += [{"row": row, "seed": 0, "client": c, "question": f"q{q}", "map": 0.3 + 0.1 * index + 0.01 * q,
                       "mrr": 0.3 + 0.1 * index + 0.01 * q} for c in CLIENTS for q in range(4)]
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
    data = results({"fedavg": history([0.9, 0.6, 0.5, 0.5], [0.3, 0.5, 0.505, 0.5]),
                    "individual": history([0.9, 1.2, 1.4], [0.3, 0.2, 0.1]),
                    "fedprox": history([0.9, 0.6, 0.5], [0.3, 0.5, 0.7])})
    labels = marked_labels(data)
    assert labels == {"fedavg": "FedAvg", "individual": "BERT (individual) [diverged]",
                      "fedprox": "FedProx [not converged]"}
    claim = _compare(data, "FedAvg beats individual", ["fedavg"], ["individual"])
    assert claim.verdict == "inconclusive (rests on diverged BERT (individual))"
    # an unconverged cell voids the test too: the claim would rest on where the budget stopped, not on the method
    assert _compare(data, "FedAvg beats FedProx", ["fedavg"], ["fedprox"]).verdict == "inconclusive (rests on not converged FedProx)"
    assert _compare(data, "FedAvg beats FedAvg", ["fedavg"], ["fedavg"]).verdict == "inconclusive (1 seed; a seed-level test needs 3)"
    # a reference at chance voids the claim: beating it says little about the method
    at_chance = _compare(data, "FedProx beats FedAvg", ["fedprox"], ["fedavg"], chance={"overall": {"mrr": 0.28}})
    assert at_chance.verdict == "inconclusive (rests on not converged FedProx)"  # an unsound cell is named first of all
    sound = results({"fedavg": history([0.9, 0.6, 0.5, 0.5], [0.3, 0.5, 0.505, 0.5]),
                     "fedper": history([0.9, 0.6, 0.5, 0.5], [0.3, 0.5, 0.505, 0.5])})
    assert _compare(sound, "FedPer beats FedAvg", ["fedper"], ["fedavg"], chance={"overall": {"mrr": 0.28}}).verdict == (
        "inconclusive (the reference FedAvg is at chance: MRR 0.300 vs 0.280)")
    assert _compare(sound, "FedPer beats FedAvg", ["fedper"], ["fedavg"], chance={"overall": {"mrr": 0.2}}).verdict == (
        "inconclusive (1 seed; a seed-level test needs 3)")
    table = health_table(data, ["fedavg", "individual"])
    assert table["health"].tolist() == ["converged", "diverged"]
    assert "rose from 0.9 (round 1) to 1.4 (round 3)" in table["why"].iloc[1]


def test_patch_table_shows_each_clients_up_norm_down_change_and_down_norm():
    norms = {"a": {"down": 11.3, "down_change": 0.0451, "up": 0.125, "up_change": 0.125, "feature_change": 0.0123,
                   "score_change": 0.4},
             "b": {"down": 11.2, "down_change": 0.05, "up": 0.2, "up_change": 0.2}}
    data = results({"fedavg": history([0.9, 0.5]), "fedmatch_h_lr": history([0.9, 0.5])},
                   info={"fedavg": {}, "fedmatch_h_lr": {"patch_norms": norms}})
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
    info = {row: {"channel": {"a->server": {"bytes": 10}}, "parameters": {"total": 5, "trainable": 5, "private": 0, "uploaded": 5},
                  "memory_bytes": {"private_per_client_max": 0}, **({"patch_norms": norms} if row == "fedmatch_h_lr" else {})}
            for row in ("fedavg", "fedmatch_h_lr")}
    histories = {"fedavg": history([0.9, 1.1, 1.3]), "fedmatch_h_lr": history([0.9, 0.6, 0.5], [0.3, 0.5, 0.7])}
    data = results(histories, info)
    data.histories = pd.DataFrame([{"row": row, "method": row, "seed": 0, "sweep": None, "point": None, **r}
                                   for row, h in histories.items() for r in h]).drop(columns="valid", errors="ignore")
    chance = {"clients": {c: {"map": 0.2, "mrr": 0.25} for c in CLIENTS}, "overall": {"map": 0.2, "mrr": 0.25}}
    partition = {"clients": {c: {"train_questions_available": 10, "questions": {"train": 5, "valid": 4, "test": 4},
                                 "answer_pool": 30} for c in CLIENTS}}
    mined = {c: {"triples": 20, "candidates": {"test": 40}} for c in CLIENTS}
    bm25 = {"clients": {c: {"map": 0.125, "mrr": 0.375} for c in CLIENTS}, "overall": {"map": 0.125, "mrr": 0.375}}
    report = render_report(params, data, chance, bm25, partition, mined)
    assert report.count("| BM25 only ") == 4 and "| 0.125 |" in report and "ascending answer id" in report
    assert "BM25-only row is absent" in render_report(params, data, chance, None, partition, mined)
    assert RULE in report
    assert "| FedAvg [diverged]" in report and "| FedMatch H+LR [not converged]" in report
    assert "## Do the private patches learn?" in report and "0.25 / 0.2 / 3.3" in report
    assert "inconclusive (rests on not converged FedMatch H+LR, diverged FedAvg)" in report
    assert "Holm's correction runs over this report's 1 tested claims" in report


def test_bm25_only_row_is_map_and_mrr_of_the_recorded_scores_with_ties_by_answer_id(tmp_path):
    """q1: order a2 (3) a1* (2) a3 (1) a4* (0): AP (1/2 + 2/4) / 2, RR 1/2; q2: gold b1 ties b2 at 1.0 and ranks first
    by answer id: AP = RR = 1 (reversed tie rule: 1/2); client b's q3: gold c1 (0) below c2 (1): AP = RR = 1/2.
    The valid question would lift client a to AP 1 if it counted."""
    rows = [("test", "q1", "a1", 1, 2.0), ("test", "q1", "a2", 0, 3.0), ("test", "q1", "a3", 0, 1.0), ("test", "q1", "a4", 1, 0.0),
            ("test", "q2", "b1", 1, 1.0), ("test", "q2", "b2", 0, 1.0), ("valid", "v1", "z1", 1, 9.0), ("valid", "v1", "z2", 0, 0.0)]
    columns = ["split", "question_id", "answer_id", "relevance", "score"]
    pd.DataFrame(rows, columns=columns).to_parquet(tmp_path / "a.parquet")
    pd.DataFrame([("test", "q3", "c1", 1, 0.0), ("test", "q3", "c2", 0, 1.0)], columns=columns).to_parquet(tmp_path / "b.parquet")
    levels = bm25_levels(tmp_path)
    assert levels["clients"] == {"a": {"map": 0.75, "mrr": 0.75}, "b": {"map": 0.5, "mrr": 0.5}}
    assert levels["overall"] == {"map": 0.625, "mrr": 0.625}
    assert bm25_levels(tmp_path / "absent") is None
