"""The shared health rule, its marks and flagged-cells table, and the sanity table: diverged / converged cells, and the
choice on validation."""

import math

import pandas as pd

from fedrepro.fl.health import RULE, SWING, cell_health, training_losses
from fedrepro.report.health import UNSOUND, flagged_cells, mark_of
from fedrepro.report.sanity import SanityResult, render_sanity, write_sanity


def test_non_finite_or_rising_loss_is_diverged():
    assert cell_health([1.0, math.nan, 0.5]).diverged
    assert cell_health([1.16, 3.0, 9.7]).diverged
    assert not cell_health([1.16, 0.9, 0.8]).diverged
    assert not cell_health([1.16, None, 0.8]).diverged  # a round in which no client had a batch trained nothing


def test_a_loss_that_falls_and_climbs_most_of_the_way_back_is_diverged():
    """PGR's FedAvg reference at alpha 0.05 (CPU scale, lr 5e-4): round 1 overshoots, round 2 is the lowest, and the
    aggregate then drifts back up while valid F1 falls 0.51 -> 0.22. Its last loss is below its first, which a
    first-versus-last rule called sound."""
    drifting = [2.15, 0.738, 1.57, 1.23, 0.925, 1.19, 1.90, 2.09]
    health = cell_health(drifting)
    assert health.diverged
    assert health.why == (
        "training loss fell from 2.15 (round 1) to 0.738 (round 2), then rose to 2.09 (round 8), "
        "more than 50% of the way back"
    )
    assert not cell_health([2.15, 0.738, 0.9, 1.4]).diverged  # gave back 0.66 of a 1.41 fall: under half
    assert not cell_health([1.0, 0.01, 0.02]).diverged  # a small wobble near zero is not a drift
    assert not cell_health([0.5, 0.5]).diverged


def test_a_validation_curve_that_swings_is_oscillating_and_marked():
    """FedCMC's embedded FedDyn at alpha 0.05 (test micro-F1 55 -> 16 -> 56 -> 13 -> ... -> 70): two falls of more than
    SWING, though its loss never gave back half its fall and its last points stopped improving."""
    swinging = cell_health([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.44], [0.55, 0.16, 0.56, 0.13, 0.56, 0.36, 0.70, 0.70])
    assert (swinging.diverged, swinging.oscillating, swinging.label) == (False, True, "oscillating")
    assert swinging.why.startswith(f"validation score fell by more than {SWING:g} 3 times: 0.55 -> 0.16 (evaluation 2)")
    one_fall = cell_health([1.0, 0.9, 0.8, 0.7, 0.6, 0.5], [0.5, 0.3, 0.6, 0.61, 0.60, 0.605])
    assert not one_fall.oscillating and one_fall.label == "converged"
    small_wobbles = cell_health([1.0, 0.9, 0.8, 0.7, 0.6], [0.50, 0.45, 0.52, 0.47, 0.53])
    assert not small_wobbles.oscillating
    assert cell_health([1.0, 3.0, 9.0], [0.9, 0.2, 0.9, 0.1]).label == "diverged"  # the worse label wins
    assert mark_of(["converged", "oscillating", "not converged"]) == " ~"
    assert UNSOUND == ("diverged", "oscillating", "not converged") and "oscillating = " in RULE


def test_converged_when_the_last_points_stop_improving():
    assert cell_health([1, 0.9, 0.8, 0.7], [0.50, 0.60, 0.605, 0.60]).converged is True
    assert cell_health([1, 0.9, 0.8, 0.7], [0.40, 0.50, 0.60, 0.70]).converged is False
    assert cell_health([1, 0.9], [0.4, 0.5]).converged is None


def test_marks_and_the_flagged_table_list_each_unsound_cell_once():
    assert mark_of(["converged", "not converged", "diverged"]) == " †" and mark_of(["unknown", "not converged"]) == " °"
    assert mark_of(["converged", "unknown"]) == ""
    cells = pd.DataFrame(
        {
            "name": ["b", "a", "a", "c"],
            "health": ["not converged", "diverged", "diverged", "converged"],
            "health_why": ["still improving", "loss rose", "loss rose", "stopped"],
        }
    )  # a: in two tables
    flagged = flagged_cells(cells)
    assert flagged.to_dict("records") == [
        {"name": "a", "health": "diverged", "why": "loss rose"},
        {"name": "b", "health": "not converged", "why": "still improving"},
    ]


def _result(margin):
    rows = []
    for lr, losses, scores in (
        (1e-4, [1.0, 0.8, 0.7], [0.5, 0.6, 0.62]),
        (1e-3, [1.0, 3.0, 9.0], [0.9, 0.2, 0.1]),
        (5e-5, [1.0, 0.9, 0.85], [0.4, 0.5, 0.55]),
    ):
        rows += [
            {"lr": lr, "round": r + 1, "train_loss": loss, "valid": score}
            for r, (loss, score) in enumerate(zip(losses, scores))
        ]
    return SanityResult("toy", "F1", margin, pd.DataFrame(rows), ["lr"], {"majority": 0.3, "random": 0.2})


def test_choice_skips_diverged_settings_and_checks_the_margin(tmp_path):
    # the diverged lr 1e-3 has the best single point (0.9) but may not be chosen
    verdict = write_sanity(_result(0.1), tmp_path)
    assert verdict["choice"]["lr"] == 1e-4 and verdict["choice"]["round"] == 3
    assert verdict["passed"] and abs(verdict["margin"] - 0.32) < 1e-9
    assert not _result(0.5).verdict()["passed"]
    text = render_sanity(_result(0.5))
    assert "FAILED" in text and "diverged" in text


def test_a_sweep_with_no_sound_setting_chooses_nothing_and_fails(tmp_path):
    rows = [{"lr": 1e-2, "round": r + 1, "train_loss": loss, "valid": 0.1} for r, loss in enumerate([1.0, 5.0])]
    result = SanityResult("toy", "F1", 0.1, pd.DataFrame(rows), ["lr"], {"majority": 0.3})
    verdict = write_sanity(result, tmp_path)
    assert verdict["choice"] == {} and verdict["margin"] is None and not verdict["passed"]
    assert "nothing chosen" in (tmp_path / "sanity.md").read_text()


def test_the_rule_reads_the_evaluated_models_training_loss_not_the_clients_mean_local_loss():
    """Under label skew the clients' mean local loss rises (round 1 fits each client's own classes from scratch)
    while the aggregate's loss on the same data falls: that cell trained, it did not diverge."""
    history = [
        {"round": r + 1, "train_loss": local, "fit_loss": fit}
        for r, (local, fit) in enumerate([(1.09, 3.50), (2.25, 3.19), (1.61, 1.46)])
    ]
    assert training_losses(history) == [3.50, 3.19, 1.46]
    assert not cell_health(training_losses(history)).diverged
    assert cell_health([r["train_loss"] for r in history]).diverged
    rising = [{"round": 1, "train_loss": 1.0, "fit_loss": 1.2}, {"round": 2, "train_loss": 0.5, "fit_loss": 8.3}]
    assert cell_health(training_losses(rising)).diverged
    assert training_losses([{"round": 1, "train_loss": 0.7}]) == [0.7]  # not evaluated: the local loss stands in
