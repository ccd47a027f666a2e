"""Report helpers: verdicts and diagnostics follow the measured numbers, mean±std tables, the README block."""

import pandas as pd

from fedrepro.report.markdown import README_END, README_START, compare, fit_diagnostics, replace_readme_block
from fedrepro.report.results import summary_table


def results(values: dict[str, list[float]]) -> pd.DataFrame:
    rows = [(algorithm, seed, client, "mrr", value + offset)
            for algorithm, series in values.items() for seed, value in enumerate(series)
            for client, offset in (("a", 0.0), ("overall", 0.0))]
    return pd.DataFrame(rows, columns=["algorithm", "seed", "client", "metric", "value"])


def test_compare_says_whether_a_claim_holds():
    clear = results({"fedavg": [0.50, 0.52, 0.51], "individual": [0.30, 0.31, 0.29]})
    assert "holds here" in compare(clear, "fedavg", "individual", "mrr")
    noisy = results({"fedavg": [0.50, 0.30, 0.41], "individual": [0.40, 0.38, 0.39]})
    assert "within the seed spread" in compare(noisy, "fedavg", "individual", "mrr")
    reversed_ = results({"fedavg": [0.30, 0.31, 0.29], "individual": [0.50, 0.52, 0.51]})
    assert "does not hold" in compare(reversed_, "fedavg", "individual", "mrr")


def test_summary_table_is_mean_and_sample_std():
    table = summary_table(results({"fedavg": [0.2, 0.4]}), "mrr", ["fedavg"])
    assert table.loc["fedavg", "overall"] == "0.300 ± 0.141"


def test_fit_diagnostics_flag_memorising_only_when_measured():
    histories = pd.DataFrame({
        "algorithm": ["x", "x", "y", "y"], "seed": [0] * 4, "round": [1, 2, 1, 2],
        "train_loss": [0.9, 0.01, 0.9, 0.5], "valid_mrr": [0.30, 0.30, 0.30, 0.40],
    })
    lines = fit_diagnostics(histories, {"c": {"distinct_positives": 7}})
    assert "7 distinct positive answers" in lines[0]
    assert "distinct" not in lines[1]


def test_readme_block_is_replaced_between_markers_only():
    readme = f"intro\n{README_START}\nold\n{README_END}\noutro\n"
    updated = replace_readme_block(readme, f"{README_START}\nnew\n{README_END}")
    assert updated == f"intro\n{README_START}\nnew\n{README_END}\noutro\n"
