"""SS-VFNAS's claims table: each finding the paper states, with the measured numbers, the test used and its verdict.

Contrasts of methods pair cells of one dataset-K and DP level and test the accuracy over the test samples with the
seed-level bootstrap; claims against a target or chance leave out the conditions where the target cannot discriminate
(the majority class or the label party alone reaches it: ``_target_pairs``) or a side sits at chance
(``_above_chance``), and claims about the searched architecture leave out searches that did not move α (``_searched``);
with nothing left a claim is not testable here. Exact counts from the channel's log are facts of every seed. No claim
rests on an unsound cell (``_guard``, the shared rule). ``claims_table`` corrects every p for their
number (Holm, ``fedrepro.report.claims``). It reads the tidy results of ``results.load_ssvfnas``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.report.claims import Claim, claims_frame
from fedrepro.report.statistics import (
    ALPHA,
    INCONCLUSIVE,
    NOT_TESTABLE,
    RESAMPLES,
    Bootstrap,
    bootstrap_contrast,
    direction_verdict,
    exact_verdict,
    sign_test,
    sign_test_pairs_needed,
    worded,
)
from fedrepro.ssvfnas.cells import BASELINE, METHODS, Cell
from fedrepro.ssvfnas.architecture import ALPHA_MOVED, PAIRS, RULES, alpha_moved, kept_edges, matched_pairs
from fedrepro.ssvfnas.results import SSVFNASResults
from fedrepro.ssvfnas.selection import (
    CHANCE_MARGIN,
    label_alone_accuracy,
    megabytes,
    method_label,
    noisy_levels,
    percent,
    select_cells,
)
from fedrepro.ssvfnas.tables import target_frame


def _guard(row: Claim, pairs: list[tuple[pd.Series, pd.Series]]) -> Claim:
    """The shared rule on sound cells (``Claim.rests_on``) over both cells of every pair."""
    return row.rests_on((cell.key, cell.health) for pair in pairs for cell in pair)


def _seeds(pairs: list[tuple[pd.Series, pd.Series]]) -> int:
    return len({int(a.seed) for a, _ in pairs})


def _accuracy_terms(
    data: SSVFNASResults, pairs: list[tuple[pd.Series, pd.Series]]
) -> list[tuple[float, str, dict[int, pd.DataFrame]]]:
    """Bootstrap terms of 'mean accuracy of ours minus theirs': the pairs grouped by condition (dataset-K and both
    sides' methods and DP levels), each condition weighing 1 / conditions with its seeds as the bootstrap's seeds; the
    test samples of a dataset are resampled together (its K values share the same test rows)."""
    conditions: dict[tuple, tuple[dict, dict]] = {}
    for a, b in pairs:
        key = (
            a.dataset,
            a.parties,
            a.method,
            a.sigma_forward,
            a.sigma_backward,
            b.method,
            b.sigma_forward,
            b.sigma_backward,
        )
        ours, theirs = conditions.setdefault(key, ({}, {}))
        ours[int(a.seed)] = _as_frame(data.predictions[a.key])
        theirs[int(b.seed)] = _as_frame(data.predictions[b.key])
    terms = []
    for (dataset, *_), (ours, theirs) in conditions.items():
        terms += [(1.0 / len(conditions), dataset, ours), (-1.0 / len(conditions), dataset, theirs)]
    return terms


def _as_frame(predictions: pd.DataFrame) -> pd.DataFrame:
    """The bootstrap's columns: accuracy is micro-F1 over every class of a single-label task."""
    return pd.DataFrame(
        {
            "sentence_id": predictions["sample_id"].astype(str),
            "label": predictions["label"].astype(str),
            "predicted": predictions["predicted"].astype(str),
        }
    )


def accuracy_contrast(data: SSVFNASResults, pairs: list[tuple[pd.Series, pd.Series]]) -> Bootstrap:
    """Hierarchical bootstrap of the mean test-accuracy difference over matched (ours, theirs) cells."""
    terms = _accuracy_terms(data, pairs)
    positive = {}
    for _, group, frames in terms:
        labels = set(positive.get(group, []))
        for f in frames.values():
            labels |= set(f["label"]) | set(f["predicted"])
        positive[group] = sorted(labels)
    return bootstrap_contrast(terms, positive)


def _bootstrap_text(result: Bootstrap, pairs: int) -> str:
    pairing = "paired by seed" if result.paired_seeds else "seeds drawn apart"
    return (
        f"hierarchical bootstrap over {result.seeds} seed(s) x {result.items} test samples ({RESAMPLES} resamples, "
        f"{pairing}; {pairs} matched cell pair(s) averaged within each resample): {100 * result.difference:+.2f} "
        f"points, 95% CI [{100 * result.low:+.2f}, {100 * result.high:+.2f}]"
    )


def _chance_text(point: str, level: float) -> str:
    return f"{point} majority {percent(level)}%"


def _above_chance(
    data: SSVFNASResults, pairs: list[tuple[pd.Series, pd.Series]], screened: tuple[int, ...] = (0, 1)
) -> tuple[list[tuple[pd.Series, pd.Series]], list[str], list[str]]:
    """The pairs whose condition (dataset-K, both sides' methods and DP levels) has every ``screened`` side's seed-mean
    accuracy at least ``CHANCE_MARGIN`` above its dataset-K's majority rate; the conditions left out (why); the
    dataset-Ks with no majority rate to screen against (no partition data)."""
    conditions: dict[tuple, list[tuple[pd.Series, pd.Series]]] = {}
    for a, b in pairs:
        conditions.setdefault((a.partition, a.dp, a.method, b.dp, b.method), []).append((a, b))
    kept, dropped, unscreened = [], [], set()
    for (point, *_), members in conditions.items():
        level = data.majority.get(point)
        if level is None:
            unscreened.add(point)
            kept += members
            continue
        low = []
        for side in screened:
            mean = float(np.mean([pair[side].accuracy for pair in members]))
            if mean < level + CHANCE_MARGIN:
                low.append(f"{method_label(members[0][side].method)} {members[0][side].dp} {percent(mean)}%")
        if low:
            dropped.append(f"{', '.join(low)} vs {_chance_text(point, level)}")
        else:
            kept += members
    return kept, sorted(set(dropped)), sorted(unscreened)


def _chance_note(dropped: list[str], unscreened: list[str]) -> str:
    """The test column's account of the chance screen: what it left out and what it could not screen."""
    notes = []
    if dropped:
        notes.append(f"left out, not {100 * CHANCE_MARGIN:g} point(s) above the majority class: {'; '.join(dropped)}")
    if unscreened:
        notes.append(f"not screened against the majority class (no partition data): {', '.join(unscreened)}")
    return "".join(f"; {note}" for note in notes)


def _target_pairs(
    data: SSVFNASResults, params: Params, pairs: list[tuple[pd.Series, pd.Series]]
) -> tuple[list[tuple[pd.Series, pd.Series]], str]:
    """The pairs on dataset-Ks where reaching the target accuracy says something of the collaboration: the target is
    ``CHANCE_MARGIN`` above the majority rate (elsewhere the majority class alone reaches it) and above what the label
    party reaches alone (elsewhere it needs no other party); and the test column's note of the dataset-Ks not
    counted."""
    target = params.ssvfnas.target_accuracy
    below = sorted(
        {
            a.partition
            for a, _ in pairs
            if a.partition in data.majority and target < data.majority[a.partition] + CHANCE_MARGIN
        }
    )
    alone = {a.partition: label_alone_accuracy(data, params, a.partition) for a, _ in pairs}
    alone = {p: float(cells["accuracy"].mean()) for p, cells in alone.items() if cells is not None}
    solo = sorted(p for p, level in alone.items() if level >= target and p not in below)
    unscreened = sorted({a.partition for a, _ in pairs if a.partition not in data.majority})
    kept = [(a, b) for a, b in pairs if a.partition not in below and a.partition not in solo]
    notes = []
    if below:
        notes.append(
            f"not counted, the target {100 * target:g}% is not {100 * CHANCE_MARGIN:g} point(s) above the majority "
            f"class: {', '.join(_chance_text(p, data.majority[p]) for p in below)}"
        )
    if solo:
        notes.append(
            f"not counted, the label party alone reaches the target {100 * target:g}%: "
            + ", ".join(f"{p} ({percent(alone[p])}%)" for p in solo)
        )
    if unscreened:
        notes.append(f"target not checked against the majority class (no partition data): {', '.join(unscreened)}")
    return kept, "".join(f"; {note}" for note in notes)


def _target_at_chance(finding: str, params: Params, note: str) -> Claim:
    """A target claim with no dataset-K left where the target discriminates (``_target_pairs``): the grid cannot test
    it."""
    return Claim(
        finding,
        "-",
        worded(
            NOT_TESTABLE,
            f"the target {100 * params.ssvfnas.target_accuracy:g}% is reached by the "
            "majority class or the label party alone on every dataset-K",
        ),
        note.lstrip("; "),
    )


def _searched(
    data: SSVFNASResults, pairs: list[tuple[pd.Series, pd.Series]]
) -> tuple[list[tuple[pd.Series, pd.Series]], str]:
    """The pairs whose search cell(s) moved α (``report.alpha_moved``), and the test column's note of those left out: a
    search that left α where it started derived the architecture the initial α give, so comparing it says nothing of
    architecture search."""
    index = data.cells.set_index("key")
    moved = alpha_moved(index[index.method != BASELINE])
    keep = lambda cell: cell.method == BASELINE or bool(moved.get(cell.key, False))  # noqa: E731
    kept = [pair for pair in pairs if all(keep(cell) for cell in pair)]
    still = len(pairs) - len(kept)
    return kept, (f"; not counted, α did not move in the search cell: {still} of {len(pairs)} pairs" if still else "")


def _not_searched(finding: str, cells: str) -> Claim:
    """An architecture claim none of whose ``cells`` (say which and how many) moved α: the grid cannot test it."""
    return Claim.not_testable(
        finding,
        f"α did not move in any of its {cells} (the entropy of "
        f"softmax(α) fell by at most {ALPHA_MOVED:.0%} of the uniform value), so the derived "
        "architecture is the one the initial α give",
    )


def _steps_claim(data: SSVFNASResults, params: Params, ours: str, theirs: str) -> Claim:
    finding = (
        f"SS-VFNAS needs fewer collaborative steps (and bytes) to reach the target accuracy: {method_label(ours)} vs "
        f"{method_label(theirs)} ({RULES[METHODS[ours][0]]})"
    )
    if not {ours, theirs} <= set(params.ssvfnas.methods):
        return Claim.not_testable(finding, f"{ours} or {theirs} is not in ssvfnas.methods")
    pairs, note = _target_pairs(data, params, matched_pairs(data, ours, theirs, params.ssvfnas.dp_levels))
    if not pairs:
        return _target_at_chance(finding, params, note)
    targets = target_frame(data, params).set_index("key")
    censored = params.ssvfnas.search.steps + 1  # not reached: later than any step of the search
    a = [targets.loc[x.key, "target_step"] if targets.loc[x.key, "reached"] else censored for x, _ in pairs]
    b = [targets.loc[y.key, "target_step"] if targets.loc[y.key, "reached"] else censored for _, y in pairs]
    wins, losses, ties, p = sign_test(a, b)
    bytes_a = [targets.loc[x.key, "target_bytes"] for x, _ in pairs if targets.loc[x.key, "reached"]]
    bytes_b = [targets.loc[y.key, "target_bytes"] for _, y in pairs if targets.loc[y.key, "reached"]]
    mean = lambda v: f"{np.mean([s for s in v if s != censored]):.1f}" if any(s != censored for s in v) else "-"  # noqa: E731
    return _sign_tested(
        Claim.tested(
            finding=finding,
            measured=(
                f"target {100 * params.ssvfnas.target_accuracy:g}% reached in {sum(s != censored for s in a)} of "
                f"{len(a)} {method_label(ours)} cells (mean {mean(a)} steps, "
                f"{megabytes(np.mean(bytes_a)) if bytes_a else '-'} MB) and {sum(s != censored for s in b)} of "
                f"{len(b)} {method_label(theirs)} cells (mean {mean(b)} steps, "
                f"{megabytes(np.mean(bytes_b)) if bytes_b else '-'} MB); earlier in {wins} pairs, later in {losses}, "
                f"tied in {ties}"
            ),
            test=(
                f"exact two-sided sign test over {wins + losses} untied matched pairs (same dataset-K, DP level, seed; "
                f"not reached = after the last step); bytes per step are equal within a pair, so bytes follow "
                f"steps{note}"
            ),
            difference=wins - losses,
            p_value=p,
            seeds=_seeds(pairs),
        ),
        wins + losses,
    )


def _sign_tested(claim: Claim, untied: int) -> Claim:
    """A sign test over fewer untied pairs than can reach significance (``sign_test_pairs_needed``) decides nothing:
    the claim is inconclusive, its p stays in Holm's family."""
    needed = sign_test_pairs_needed()
    if untied < needed:
        claim.inconclusive(f"{untied} untied pair(s): a two-sided sign test needs {needed} to reach p <= {ALPHA:g}")
    return claim


def _epsilon_claim(data: SSVFNASResults, params: Params, ours: str, theirs: str) -> Claim:
    finding = (
        f"Privacy is amplified by less communication: {method_label(ours)} reaches the target at a smaller epsilon "
        f"than {method_label(theirs)}"
    )
    levels = noisy_levels(params)
    if not levels:
        return Claim.not_testable(finding, "no DP level with noise on both sides in ssvfnas.dp_levels")
    if params.ssvfnas.fidelity == "released_code":
        return Claim.not_testable(finding, "fidelity released_code has no accountant")
    if not {ours, theirs} <= set(params.ssvfnas.methods):
        return Claim.not_testable(finding, f"{ours} or {theirs} is not in ssvfnas.methods")
    pairs, note = _target_pairs(data, params, matched_pairs(data, ours, theirs, levels))
    if not pairs:
        return _target_at_chance(finding, params, note)
    targets = target_frame(data, params).set_index("key")
    a, b = [], []
    for x, y in pairs:
        ex, ey = (targets.loc[z.key, "target_epsilon"] if targets.loc[z.key, "reached"] else math.inf for z in (x, y))
        if math.isinf(ex) and math.isinf(ey):
            continue
        a.append(ex)
        b.append(ey)
    wins, losses, ties, p = sign_test(a, b)

    def mean(values):
        return f"{np.mean([v for v in values if math.isfinite(v)]):.2f}" if any(map(math.isfinite, values)) else "-"

    return _sign_tested(
        Claim.tested(
            finding=finding,
            measured=(
                f"{len(a)} of {len(pairs)} matched pairs with DP reach the target on at least one side; mean ε at the "
                f"target {mean(a)} vs {mean(b)}; smaller in {wins}, larger in {losses}, tied in {ties}"
            ),
            test=(
                f"exact two-sided sign test over {wins + losses} untied pairs (a side that never reaches the target "
                f"counts as ε = ∞){note}"
            ),
            difference=wins - losses,
            p_value=p,
            seeds=_seeds(pairs),
        ),
        wins + losses,
    )


def _accuracy_claim(
    data: SSVFNASResults,
    params: Params,
    finding: str,
    ours: str,
    theirs: str,
    levels: list[list[float]],
    why_empty: str,
    budget: bool = False,
) -> Claim:
    if not levels:
        return Claim.not_testable(finding, why_empty)
    methods = set(params.ssvfnas.methods) | {BASELINE}
    if not {ours, theirs} <= methods:
        return Claim.not_testable(finding, f"{ours} or {theirs} is not in ssvfnas.methods")
    return _contrast_claim(
        data, finding, matched_pairs(data, ours, theirs, levels), budget=budget, architecture=theirs == BASELINE
    )


def _contrast_claim(
    data: SSVFNASResults,
    finding: str,
    pairs: list[tuple[pd.Series, pd.Series]],
    budget: bool = False,
    screened: tuple[int, ...] = (0, 1),
    architecture: bool = False,
) -> Claim:
    """'Ours is more accurate than theirs' over matched pairs, tested on the conditions whose ``screened`` sides clearly
    beat the majority class (``_above_chance``); with none left, inconclusive (reference at chance). A claim about the
    searched ``architecture`` counts only pairs whose search moved α (``_searched``)."""
    if not pairs:
        return Claim.not_testable(finding, "no matched cells")
    searched_note = ""
    if architecture:
        searched, searched_note = _searched(data, pairs)
        if not searched:
            return _not_searched(finding, f"{len(pairs)} pairs' search cells")
        pairs = searched
    kept, dropped, unscreened = _above_chance(data, pairs, screened)
    note = searched_note + _chance_note(dropped, unscreened)
    shown = kept or pairs
    mean_a = float(np.mean([x.accuracy for x, _ in shown]))
    mean_b = float(np.mean([y.accuracy for _, y in shown]))
    eps = sorted({round(x.epsilon_total, 2) for x, _ in shown if math.isfinite(x.epsilon_total)})
    at = f" at ε (total) {', '.join(f'{e:g}' for e in eps)}" if eps and budget else ""
    measured = f"test accuracy {percent(mean_a)} vs {percent(mean_b)} (%){at}, over {len(shown)} matched pair(s)"
    if not kept:
        return Claim(
            finding,
            measured,
            worded(INCONCLUSIVE, f"reference at chance: {'; '.join(dropped)}"),
            f"no condition {100 * CHANCE_MARGIN:g} point(s) above the majority class on the compared sides",
        )
    result = accuracy_contrast(data, kept)
    return _guard(
        Claim.from_bootstrap(
            finding=finding, measured=measured, test=_bootstrap_text(result, len(kept)) + note, result=result
        ),
        kept,
    )


def _messages_claim(data: SSVFNASResults, params: Params) -> Claim:
    finding = "VFNAS-2 (MiLeNAS) needs fewer messages per collaborative step than VFNAS-1 (DARTS)"
    pairs = [
        (m2, m1)
        for m2, m1 in (("vfnas2", "vfnas1"), ("ss_vfnas2", "ss_vfnas1"))
        if {m1, m2} <= set(params.ssvfnas.methods)
    ]
    if not pairs:
        return Claim.not_testable(finding, "VFNAS-1 and VFNAS-2 are not both in ssvfnas.methods")
    parts, holds, tied = [], True, True
    for k in sorted(set(data.cells.parties)):
        for m2, m1 in pairs:
            a, b = select_cells(data, method=m2, parties=k), select_cells(data, method=m1, parties=k)
            if a.empty or b.empty:
                continue
            ma, mb = int(a.messages_per_step.iloc[0]), int(b.messages_per_step.iloc[0])
            xa, xb = int(a.exchanges_per_step.iloc[0]), int(b.exchanges_per_step.iloc[0])
            holds &= ma < mb and xa < xb
            tied &= ma == mb
            parts.append(f"K={k}: {method_label(m2)} {ma} messages / {xa} exchanges vs {method_label(m1)} {mb} / {xb}")
            break
    return Claim(
        finding=finding,
        measured="; ".join(parts),
        verdict=exact_verdict(holds, "exact counts" + ("; equal" if tied and not holds else "")),
        test="exact counts from the channel's log of every step (deterministic; no sampling involved)",
    )


def claims_table(data: SSVFNASResults, params: Params) -> pd.DataFrame:
    """Every finding the paper states, each a Claim with its measurement, verdict and test."""
    ss = params.ssvfnas
    rows = [_messages_claim(data, params)]
    for ours, theirs in PAIRS:
        rows.append(_steps_claim(data, params, ours, theirs))
    for ours, theirs in PAIRS:
        rows.append(_epsilon_claim(data, params, ours, theirs))
    noisy, clear = noisy_levels(params), [lvl for lvl in ss.dp_levels if lvl[0] == 0 and lvl[1] == 0]
    for ours, theirs in PAIRS:
        rows.append(
            _accuracy_claim(
                data,
                params,
                f"At the same privacy budget (same DP level and steps), {method_label(ours)} is more "
                f"accurate than {method_label(theirs)}",
                ours,
                theirs,
                noisy,
                "no DP level with noise on both sides in ssvfnas.dp_levels",
                budget=True,
            )
        )
    for ours, theirs in PAIRS:
        rows.append(
            _accuracy_claim(
                data,
                params,
                f"Without DP, {method_label(ours)} is at least as accurate as {method_label(theirs)} "
                "(the paper's SS-VFNAS results sit at or above VFNAS's)",
                ours,
                theirs,
                clear,
                "no DP level [0, 0] in ssvfnas.dp_levels",
            )
        )
    rows += [_federated_nas_claim(data, params), _heterogeneity_claim(data), _overlap_claim(), _transfer_claim()]
    for method in ss.methods:
        rows.append(
            _accuracy_claim(
                data,
                params,
                f"Issue 8 check: the architecture {method_label(method)} searched beats the hand-designed "
                "network of similar size trained the same way",
                method,
                BASELINE,
                list(ss.dp_levels),
                "no DP level",
            )
        )
    if noisy and clear:
        for method in ss.methods:
            rows.append(_dp_cost_claim(data, method, noisy))
    return claims_frame(rows)


def _dp_cost_claim(data: SSVFNASResults, method: str, noisy: list[list[float]]) -> Claim:
    """No DP vs each noisy level on matched cells; only the no-DP side is screened against the majority class, as a
    noisy side at chance is the very cost the claim measures."""
    pairs = []
    index = data.cells.set_index("key", drop=False)
    for _, a in select_cells(data, method=method, dp="nodp").iterrows():
        for lvl in noisy:
            name = Cell(method, a.dataset, a.parties, float(lvl[0]), float(lvl[1]), a.seed).name
            if name in index.index:
                pairs.append((a, index.loc[name]))
    finding = f"Issue 8 check: DP costs {method_label(method)} accuracy (no DP vs each noisy level)"
    if not pairs:
        return Claim.not_testable(finding, "no matched cells without and with DP")
    return _contrast_claim(data, finding, pairs, screened=(0,))


def _federated_nas_claim(data: SSVFNASResults, params: Params) -> Claim:
    """The paper's case for federated NAS over manual design, every search method's cells pooled against the
    hand-designed network's on matched cells (the Issue 8 rows split it by method)."""
    finding = (
        "Federated NAS: parties collaboratively search for an optimal architecture, releasing the burden of designing "
        "networks manually; the searched architectures (every method pooled) beat the hand-designed network of similar "
        "size trained the same way"
    )
    pairs = [
        pair
        for method in params.ssvfnas.methods
        for pair in matched_pairs(data, method, BASELINE, params.ssvfnas.dp_levels)
    ]
    return _contrast_claim(data, finding, pairs, architecture=True)


def _heterogeneity_claim(data: SSVFNASResults) -> Claim:
    """Counts, per search cell, whether its parties derived different cells: the paper's 'heterogeneous networks with no
    consensus architecture' (a fact of each cell, so no test)."""
    finding = (
        "VFNAS generates multiple heterogeneous networks with no consensus architecture from different participants"
    )
    search = data.cells[data.cells.method != BASELINE]
    if search.empty:
        return Claim.not_testable(finding, "no search cell")
    moved = search[alpha_moved(search)]
    if moved.empty:
        return _not_searched(finding, f"{len(search)} search cells")
    differ = sum(len({str(kept_edges(g)) for g in data.genotypes[key]}) > 1 for key in moved.key)
    return Claim(
        finding,
        f"the parties' derived cells differ in {differ} of the {len(moved)} search cells that moved α "
        f"(of {len(search)})",
        direction_verdict(differ > 0, "direction only: counts of derived genotypes", moved.seed.nunique()),
        "count over every search cell of the derived genotypes' edges (op and input) per party; 'capable of' holds "
        "when any cell's parties differ",
    )


def _overlap_claim() -> Claim:
    return Claim.not_testable(
        "SS-VFNAS generates high-performance, transferable architectures even with insufficient overlapping (aligned) "
        "samples (abstract)",
        "every partition keeps only the samples all parties hold (plain intersection), so the pre-search and the "
        "search see the same fully overlapping rows; testing it needs partitions whose parties share a varied fraction "
        "of rows, each party's non-overlapping rows used by its self-supervised pre-search, and SS-VFNAS vs VFNAS at "
        "each fraction",
    )


def _transfer_claim() -> Claim:
    return Claim.not_testable(
        "The self-supervised pre-training steps of SS-VFNAS allow parties to obtain a neural network that is "
        "generalized well across tasks",
        "the grid has one task per dataset and runs no transfer at any scale; testing it needs a second labelled task "
        "on the same parties' features, the architecture searched on one task retrained on the other beside one "
        "searched on that task and the hand-designed network",
    )
