"""Did a cell train soundly? One rule for every paper, so no verdict rests on a diverged or unfinished model.

diverged:  a non-finite training loss in any round, or a last round's training loss that gave back more than half
           of what training had gained: above lowest + GIVE_BACK x (first - lowest). A last loss above the first is
           the case where nothing was gained; a cell that fell and then climbed most of the way back (PGR's FedAvg at
           alpha 0.05, CPU scale: 2.15 -> 0.74 at round 2 -> 2.09 at round 8, valid F1 0.51 -> 0.22) is drifting even
           though its last loss is below its first, which overshot. The training loss is the evaluated model's
           loss on its own training data after each evaluated round (the engine's ``fit_loss``: for a federated
           cell the aggregate, not the clients' mean local loss, which under label skew rises while the aggregate
           improves; see ``fedrepro.fl.engine.FIT``); a cell that recorded none is judged on its mean local loss.
oscillating: not diverged, but the validation metric fell by more than ``SWING`` (absolute) from one evaluation to the
           next at least ``FALLS`` times: its last value is where a swing happened to stop, not where training settled
           (FedCMC's embedded FedDyn at alpha 0.05: test micro-F1 55 -> 16 -> 56 -> 13 -> 56 -> 36 -> 70 -> 70, its last
           value the best of its column; SCAFFOLD beside it fell twice to 10 and ended at 19, below the trivial row).
converged: the validation metric's best over the last ``window`` points beats the best before them by at most
           ``tolerance`` (it stopped improving); None when there are fewer than ``window + 1`` points to judge by.

The rule is stated once here and quoted by every report (``RULE``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

WINDOW = 2
TOLERANCE = 0.01
GIVE_BACK = 0.5
SWING = 0.10
FALLS = 2
RULE = (
    f"diverged = a non-finite training loss, or the last evaluated round's training loss (the evaluated model on "
    f"its own training data) above lowest + {GIVE_BACK} x (first - lowest), i.e. it gave back more than half of "
    f"the fall from the first round to the lowest (a last loss above the first gave back all of it); "
    f"oscillating = not diverged, but the validation score fell by more than {SWING:g} (absolute) from one "
    f"evaluation to the next at least {FALLS} times; "
    f"converged = the best validation score of the last {WINDOW} evaluations beats the best before them by at "
    f"most {TOLERANCE} (absolute), i.e. it stopped improving; unknown with fewer than {WINDOW + 1} evaluations"
)


@dataclass(frozen=True)
class Health:
    diverged: bool
    converged: bool | None
    why: str
    oscillating: bool = False

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        """One word for a table cell."""
        if self.diverged:
            return "diverged"
        if self.oscillating:
            return "oscillating"
        return {True: "converged", False: "not converged", None: "unknown"}[self.converged]


def training_losses(history: Sequence[dict]) -> list[float | None]:
    """The per-round training losses the rule reads from an engine history: ``fit_loss`` where the cell recorded
    it, else each round's mean local loss (``train_loss``)."""
    fit = [record["fit_loss"] for record in history if "fit_loss" in record]
    return fit if fit else [record.get("train_loss") for record in history]


def cell_health(
    train_losses: Sequence[float],
    valid_scores: Sequence[float] = (),
    window: int = WINDOW,
    tolerance: float = TOLERANCE,
) -> Health:
    """Judge one cell from its per-round training losses and its validation scores (higher is better). A round's
    loss is None when none of its clients had a training batch (nothing trained): it is skipped, not counted."""
    losses = [float(x) for x in train_losses if x is not None]
    bad = [i + 1 for i, x in enumerate(losses) if not math.isfinite(x)]
    if bad:
        return Health(True, None, f"non-finite training loss in round(s) {bad}")
    if len(losses) >= 2:
        first, last = losses[0], losses[-1]
        lowest = min(losses)
        if last > lowest + GIVE_BACK * (first - lowest):
            low_round, end = losses.index(lowest) + 1, f"{last:.4g} (round {len(losses)})"
            if low_round == 1:
                return Health(True, None, f"training loss rose from {first:.4g} (round 1) to {end}")
            return Health(
                True,
                None,
                f"training loss fell from {first:.4g} (round 1) to {lowest:.4g} (round "
                f"{low_round}), then rose to {end}, more than {GIVE_BACK:.0%} of the way back",
            )
    scores = [float(x) for x in valid_scores if x is not None]
    falls = [(i, scores[i - 1], scores[i]) for i in range(1, len(scores)) if scores[i - 1] - scores[i] > SWING]
    if len(falls) >= FALLS:
        return Health(
            False,
            None,
            f"validation score fell by more than {SWING:g} {len(falls)} times: "
            + ", ".join(f"{a:.3g} -> {b:.3g} (evaluation {i + 1})" for i, a, b in falls),
            oscillating=True,
        )
    if len(scores) < window + 1:
        return Health(False, None, f"{len(scores)} validation point(s), fewer than {window + 1}")
    before, last = max(scores[:-window]), max(scores[-window:])
    gain = last - before
    if gain <= tolerance:
        return Health(
            False, True, f"last {window} evaluations gained {gain:+.4f} over the best before (<= {tolerance})"
        )
    return Health(False, False, f"still improving: last {window} evaluations gained {gain:+.4f} (> {tolerance})")
