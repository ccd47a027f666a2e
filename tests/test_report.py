"""Report helpers: untestable claims read alike, mean ± std tables, TREC round trips."""

import pandas as pd

from fedrepro.metrics.ranking import ranking_metrics, trec_files
from fedrepro.report.claims import COLUMNS, Claim, claims_frame
from fedrepro.report.formatting import over_seeds, sweep_not_run
from fedrepro.report.results import missed_clients, missed_clients_section, read_trec, summary_table


def results(values: dict[str, list[float]]) -> pd.DataFrame:
    rows = [
        (row, seed, client, "mrr", value)
        for row, series in values.items()
        for seed, value in enumerate(series)
        for client in ("a", "overall")
    ]
    return pd.DataFrame(rows, columns=["row", "seed", "client", "metric", "value"])


def test_summary_table_is_mean_and_sample_std_with_labels_and_chance():
    chance = {"clients": {"a": {"mrr": 0.25}}, "overall": {"mrr": 0.25}}
    table = summary_table(results({"fedavg": [0.2, 0.4]}), "mrr", ["fedavg"], {"fedavg": "FedAvg"}, chance)
    assert table.loc["FedAvg", "overall"] == "0.300 ± 0.141"
    assert table.loc["random ranking (chance)", "a"] == "0.250"


def test_trec_files_round_trip_to_the_same_metrics(tmp_path):
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}}
    run = {"q1": {"a": 0.1, "x": 0.9, "y": 0.5}, "q2": {"b": 0.3, "c": 0.3, "z": 0.4}}
    qrels_text, run_text = trec_files(qrels, run, "tag")
    (tmp_path / "c.qrels").write_text(qrels_text)
    (tmp_path / "c.run").write_text(run_text)
    assert run_text.splitlines()[0] == "q1 Q0 x 1 0.900000 tag"
    assert ranking_metrics(*read_trec(tmp_path / "c.qrels", tmp_path / "c.run")) == ranking_metrics(qrels, run)


def test_the_report_lists_each_client_a_round_went_on_without():
    history = [
        {"round": 1, "clients": ["a", "b"]},
        {"round": 2, "clients": ["a"], "missed": {"b": "no reply", "c": "rejected: unknown tensor 'x'"}},
    ]
    missed = missed_clients("cell_0", history)
    assert missed == [
        {"cell": "cell_0", "round": 2, "client": "b", "reason": "no reply"},
        {"cell": "cell_0", "round": 2, "client": "c", "reason": "rejected: unknown tensor 'x'"},
    ]
    text = "\n".join(missed_clients_section(missed))
    assert "2 client updates never reached the server" in text and "| cell_0 |" in text and "no reply" in text
    assert missed_clients_section(missed_clients("cell_0", history[:1])) == []


def test_every_paper_words_a_claim_it_does_not_test_alike():
    row = Claim.not_testable("F", "α=0.1 is not in fedcmc.alphas")
    frame = claims_frame([row, Claim("G", "1 vs 0", "holds (exact counts)", "counts")])
    assert list(frame.columns) == COLUMNS
    assert frame["verdict"].tolist() == ["not testable here (α=0.1 is not in fedcmc.alphas)", "holds (exact counts)"]


def test_seed_counts_and_empty_sweeps_read_the_same_in_every_report():
    assert (over_seeds(1), over_seeds(3)) == ("1 seed", "mean ± std over 3 seeds")
    assert sweep_not_run("fedcmc.sweeps.vectors") == ["Not run at this scale (`fedcmc.sweeps.vectors` is empty).", ""]
    assert sweep_not_run("fedmatch.sweeps.patch_size", " to fit the time budget")[0] == (
        "Not run at this scale (`fedmatch.sweeps.patch_size` is empty) to fit the time budget."
    )
