"""SS-VFNAS's markdown report: the tables (``tables``, ``architecture``), claims and figures put in order with the
setup, the deviations from the paper and the caveats measured on the cells."""

from __future__ import annotations

import math

import pandas as pd

from fedrepro.config import Params
from fedrepro.fl.health import RULE
from fedrepro.report.health import LEGEND
from fedrepro.hardware import describe
from fedrepro.report.figures import curve_caption
from fedrepro.report.formatting import over_seeds
from fedrepro.report.claims import tests_explained, verdict_counts
from fedrepro.ssvfnas.cells import BASELINE, dp_name
from fedrepro.ssvfnas.claims import claims_table
from fedrepro.ssvfnas.architecture import (
    ALPHA_MOVED,
    alpha_moved,
    alpha_table,
    genotypes_table,
    rule_agreement,
    shown_cells,
)
from fedrepro.ssvfnas.results import SSVFNASResults, cell_hardware, partition_names
from fedrepro.ssvfnas.selection import (
    ALONE,
    CHANCE_MARGIN,
    MAJORITY,
    dp_level_text,
    method_label,
    noisy_levels,
    percent,
    select_cells,
)
from fedrepro.ssvfnas.tables import (
    health_table,
    main_table,
    messages_table,
    parameters_table,
    partitions_table,
    reliance_table,
    target_frame,
    target_table,
)

TRIVIAL_LINES = (
    f"black dash-dotted: '{MAJORITY}', grey dash-dot-dotted: '{ALONE}' (the main table's trivial rows, "
    "which send nothing: ε = 0), each where it exists"
)
"""What the accuracy figures' reference lines are (``report.trivial_references``, in ``REFERENCE_STYLES``' order)."""


def _reliance_lines(data: SSVFNASResults, params: Params) -> list[str]:
    lines = [
        "The retrained networks (every method and the baseline) evaluated once more on the test rows with every other "
        "party's embedding replaced by zeros (`test.accuracy_label_party_only`; the top network is linear, so this "
        "drops exactly their terms of the logits), and the share of the top network's weight norm on the other "
        "parties' embeddings (`retrain.top_weight_norms`). Under DP an embedding clipped to norm C1 = "
        f"{params.ssvfnas.dp.clip_forward:g} carries about C1 / √{params.ssvfnas.search.out_dim} = "
        f"{params.ssvfnas.dp.clip_forward / math.sqrt(params.ssvfnas.search.out_dim):.2f} per entry and arrives with "
        f"noise of std σ1 × C1 = {params.ssvfnas.dp.clip_forward:g} σ1 per entry: where the top network learns to turn "
        "such embeddings down, a DP cell decides from the label party's own features, and its accuracy approaches the "
        "label party's alone.",
        "",
        reliance_table(data, params).to_markdown(index=False, disable_numparse=True),
        "",
    ]
    clear = [lvl for lvl in params.ssvfnas.dp_levels if lvl[0] == 0 and lvl[1] == 0]
    notes = []
    for point in partition_names(params):
        if not clear:
            break
        base = select_cells(data, partition=point, dp=dp_name(clear[0]))
        for level in noisy_levels(params):
            noisy = select_cells(data, partition=point, dp=dp_name(level))
            if base.empty or noisy.empty or noisy["accuracy"].mean() < base["accuracy"].mean():
                continue
            n = int(noisy["test_samples"].iloc[0])
            errors = lambda f: (1 - f["accuracy"]).mean() * n  # noqa: E731
            notes.append(
                f"{point}, {dp_level_text(level)}: no lower than without DP ({percent(noisy['accuracy'].mean())}% vs "
                f"{percent(base['accuracy'].mean())}%, {errors(noisy):.2f} vs {errors(base):.2f} errors a cell on {n} "
                f"test rows). The label party alone scores {percent(noisy['label_only_accuracy'].mean())}% under DP "
                f"({percent(base['label_only_accuracy'].mean())}% without) and the top network's weight share on the "
                f"other parties falls from {base['top_share_others'].mean():.2f} to "
                f"{noisy['top_share_others'].mean():.2f}: "
                "DP here measures the label party's own features, which suffice on this test set, not a federation "
                "that gains from noise."
            )
    return lines + ["- " + n for n in notes] + ([""] if notes else [])


def _alpha_lines(data: SSVFNASResults, params: Params) -> list[str]:
    s = params.ssvfnas.search
    search = data.cells[data.cells.method != BASELINE]
    lines = [
        f"Entropy of softmax(α), mean over edges and parties, in nats (uniform = ln(ops)); α_start = α when the search "
        "begins (after the pre-search for the SS- methods); α shift = the largest absolute change of any α entry since "
        "α_start (the pre-search's: since the random initialisation). Every curve point records the entropy and the "
        "shift (`alpha_entropy`, `alpha_shift` in each cell's curve.csv). 'α moved': the entropy fell by more than "
        f"{100 * ALPHA_MOVED:g}% of the uniform value.",
        "",
        alpha_table(data, params).to_markdown(index=False, disable_numparse=True),
        "",
    ]
    if search.empty:
        return lines
    moved = alpha_moved(search)
    bound = s.steps * s.arch_lr
    notes = [
        f"Adam moves each α by about its learning rate a step whatever the gradient's size, so {s.steps} steps at arch "
        f"lr {s.arch_lr:g} move it by at most about {bound:.3g} (measured: at most "
        f"{search['alpha_max_shift'].max():.4f}); α moved in {int(moved.sum())} of {len(search)} search cells."
    ]
    if moved.mean() < 0.5:
        notes.append(
            f"Where α did not move, softmax weights stay within about {100 * (math.exp(2 * bound) - 1):.1f}% of "
            "uniform: the derived genotype is the ranking of these tiny shifts, i.e. of the sign of the early α "
            "gradients, not a choice the mixture has made."
        )
    same = int(search["alpha_genotype_as_at_start"].sum())
    notes.append(
        f"{same} of {len(search)} derived genotypes equal the genotype of the starting α alone (DARTS's 1e-3 random "
        "initialisation, or the pre-search's α)"
        + (
            ", so most are the initial ties"
            if same > len(search) / 2
            else ", so the search, not the initial ties, set them"
        )
        + f"; {100 * search['alpha_parameter_free_edges'].mean():.0f}% of the derived edges are parameter-free ops "
        "(pooling, skip, identity), the ops a supernet leans on while its parametric ops are still untrained."
    )
    for row in rule_agreement(data, params):
        one, two = row["pair"]
        still = not alpha_moved(search[search.method.isin([one, two])]).any()
        notes.append(
            f"{method_label(one)} vs {method_label(two)} over {row['pairs']} matched cells: supernet test accuracy "
            f"differs by {100 * row['mean_gap']:.2f} points on average over the curve points (at most "
            f"{100 * row['max_gap']:.2f}); {row['same_genotypes']} of {row['pairs']} derive identical genotypes."
            + (
                " α stayed near its start in every one of them, and the two rules differ only in how they update α: "
                "they train the same weights from the same initialisation on the same batches, so their curves "
                "coincide."
                if still
                else ""
            )
        )
    return lines + ["- " + n for n in notes] + [""]


def _figure_links(data: SSVFNASResults, params: Params) -> list[str]:
    lines = []
    for key in shown_cells(data, params):
        row = data.cells.set_index("key").loc[key]
        images = " ".join(f"![{key} party_{j}](figures/cells/{key}/party_{j}.png)" for j in range(int(row.parties)))
        lines += [f"**{method_label(row.method)}, {row.partition}** (`{key}`)", "", images, ""]
    return lines


def _closing(data: SSVFNASResults, params: Params, claims: pd.DataFrame) -> list[str]:
    ss = params.ssvfnas
    lines = []
    if params.scale == "embedded":
        lines.append(
            f"This is the embedded scale: the digits only, {ss.search.steps} search steps, {ss.retrain.steps} "
            f"retraining steps, width {ss.search.width}, {ss.search.cells} cell(s) of {ss.search.nodes} nodes, "
            f"{len(ss.seeds)} seed(s). "
            "It checks that every table, figure and claim is produced from the cells and shows learning; its verdicts "
            "carry little weight."
        )
    weak = [
        f"`{row.key}` {percent(row.accuracy)}%"
        for row in data.cells.itertuples()
        if row.accuracy <= 1.5 / data.partitions[row.partition]["classes"]
    ]
    if weak:
        lines.append(
            f"{len(weak)} of {len(data.cells)} cells end at most 1.5x chance (1 / classes) in test accuracy, e.g. "
            + ", ".join(weak[:4])
            + ": their comparisons say more about the budget (or the noise) than about the method."
        )
    if len(ss.seeds) == 1:
        lines.append(
            "One seed per cell: the sign tests pair cells across dataset-K and DP levels only, and the bootstrap "
            "intervals cover the sampling of test samples, not the spread between training runs."
        )
    reached = target_frame(data, params)
    if not reached.empty:
        lines.append(
            f"The target accuracy {100 * ss.target_accuracy:g}% (`ssvfnas.target_accuracy`) was reached by "
            f"{int(reached.reached.sum())} of {len(reached)} searches."
        )
    lines.append(
        "The supernet curves measure the one-shot supernets while they are searched (the paper's accuracy vs "
        "communication); the main table's accuracy is the derived architecture retrained from scratch, a different "
        "network; both are on the same held-out test rows, on which nothing is selected."
    )
    unsound = data.cells[data.cells["health"].isin(["diverged", "not converged"])]
    if not unsound.empty:
        lines.append(
            f"{int((unsound['health'] == 'diverged').sum())} of {len(data.cells)} cells diverged and "
            f"{int((unsound['health'] == 'not converged').sum())} had not converged in their retraining (marked in "
            "the main table): a diverged cell's accuracy says nothing about its method, and an unconverged one's "
            "is where this budget stopped, not where the method settles."
        )
    lines.append(verdict_counts(claims))
    return [" ".join(lines), ""]


def _deviations(params: Params) -> list[str]:
    ss = params.ssvfnas
    released = ss.fidelity == "released_code"
    lines = [
        "- Deviations, unstated values and DP assumptions:",
        (
            "  - Data: ModelNet40's rendered views from `data.modelnet40_dir` (the publisher's test split kept, an "
            "object's views never in two splits)"
            if "modelnet40" in ss.datasets
            else "  - Data: the paper's ModelNet40 views and CheXpert are not available here"
        )
        + "; the digits (8x8 images cut into halves or quarters, one view per party) and FATE's vertically split "
        "tables stand in for what is missing. CheXpert (multi-label) has a loader but is not in the grid, which "
        "reports accuracy; FATE's regression sets (motor, student, dvisits) are left out for the same reason.",
        "  - Alignment: a plain intersection of sample ids (FATE offers a private set intersection; every party here "
        "would see the others' ids).",
        "  - Net_c, the label party's top network, is not specified in the paper: one linear layer on the concatenated "
        "embeddings here. Stride-2 reduction cells do not fit 8x4 / 4x4 images: normal cells only.",
        f"  - Retraining: the derived networks are trained from scratch on train (less the held-out rows) + "
        f"search-valid for {ss.retrain.steps} steps "
        f"(SGD, lr {ss.retrain.lr:g} cosine to {ss.retrain.lr_min:g}) under the cell's DP level, like the "
        "hand-designed baseline; its epsilon composes with the search's.",
        f"  - Hand-designed baseline: a plain stack of {ss.retrain.baseline_depth} layers per party (conv3x3-BN-ReLU "
        "or Linear-ReLU), its width chosen so that its parameter count is closest to that of a reference derived cell "
        "(every node fed by the two latest states through the space's main parametric op); the parameters table shows "
        "how close the searched networks come to that size.",
        f"  - Learning rates at this scale: search {ss.search.lr:g}, MoCo {ss.moco.lr:g}, retraining {ss.retrain.lr:g} "
        "(the released code: 0.025 over 50 epochs; short runs need larger steps).",
        "  - Test rows and the held-out validation rows cross the same forward mechanism at evaluation (the label "
        "party never sees an un-noised embedding); these evaluations are measurements on rows nothing trains on and "
        "are not counted in epsilon.",
        "  - ε, the headline, holds for what runs: no amplification by subsampling. In split learning every party "
        "knows the sample ids of each batch, and batches are fixed-size draws from seeded shuffles (`batch_at`), so a "
        "release is a Gaussian mechanism at rate 1 for each sample it holds and none for the others; the ledger counts "
        "each sample's releases over the search and the retraining and reports its most-released sample's ε (opacus' "
        "RDP accountant at sample rate 1). 'ε total, amplified (Poisson assumed)' is the paper's accounting beside it: "
        "Poisson subsampling at rate batch / split size hidden from the adversary, every step composed at that rate; "
        "neither assumption holds here, so it understates ε. Both treat a release as depending on a sample only "
        "through its own row, as the paper does; a party's weights are trained on its own un-noised rows, so later "
        "releases depend on earlier samples too, which neither covers.",
        "  - Per-sample clipping bounds a sample's influence only if its embedding depends on that sample alone: the "
        "conv space's BatchNorm (train mode) mixes the samples of a batch, which weakens the guarantee on the digits; "
        "the MLP space (FATE tables) uses LayerNorm and keeps it.",
        "  - The label party's epsilon composes its K-1 returned gradients per pass (they may collude); releases of "
        "one batch within a step are pooled as one Gaussian mechanism; the train and search-valid halves compose in "
        "parallel.",
    ]
    if ss.search.second_order:
        lines.append(
            "  - Second-order DARTS exchanges each party's squared gradient norm and the total, un-noised, outside "
            "the accounted mechanisms."
        )
    lines.append(
        f"  - Fidelity `{ss.fidelity}`: "
        + (
            "the released code's mechanism (batch-level clipping, σ used as the noise std whatever the clip, no "
            "accountant: epsilon is n/a), MoCo without augmentations and with the momentum update once per epoch, "
            "MiLeNAS's train and valid passes sent one after the other."
            if released
            else "the paper's mechanism (per-sample clipping to C1 / C2, noise σ·C, epsilon from opacus' RDP "
            "accountant); the released code's batch-level clip, its std-named 'variance' and its missing accountant "
            "are `fidelity: released_code`."
        )
    )
    return lines


def _health_lines(data: SSVFNASResults, params: Params) -> list[str]:
    """The marks' legend, the shared rule quoted, what a round and a score are here, and the flagged cells."""
    counts = pd.concat([data.cells["health"], data.label_alone["health"]]).value_counts()
    lines = [
        f"{LEGEND}: {RULE}. A round is a validation point of the cell's "
        f"retraining (every {params.ssvfnas.retrain.eval_every} steps, its mean training loss since the previous one) "
        "and the validation score its accuracy on the held-out rows. The rule judges the retraining, whose accuracy "
        "the tables report; the claims on steps and ε to the target rest on the searches' supernet curves, and the "
        f"messages claim on the channel's counts, which it does not judge. Of "
        f"{len(data.cells) + len(data.label_alone)} cells: "
        + ", ".join(f"{n} {label}" for label, n in counts.items())
        + ".",
        "",
    ]
    flagged = health_table(data)
    if not flagged.empty:
        lines += [
            "Cells flagged by that rule (no accuracy claim rests on a diverged one):",
            "",
            flagged.to_markdown(index=False),
            "",
        ]
    return lines


def _skipped_lines(data: SSVFNASResults) -> list[str]:
    if not data.skipped:
        return []
    parts = [f"{x['dataset']} at K={x['parties']} (the data allows K in {x['allowed']})" for x in data.skipped]
    return ["- Not run: " + ", ".join(parts) + "."]


def render_report(params: Params, data: SSVFNASResults) -> str:
    """reports/ssvfnas/report.md: setup and deviations, the tables, the claims, figures."""
    ss = params.ssvfnas
    s, m, r, dp = ss.search, ss.moco, ss.retrain, ss.dp
    claims = claims_table(data, params)
    lines = [
        f"# SS-VFNAS — reproduction at scale `{params.scale}`",
        "",
        f"Written by the `ssvfnas_report` stage at scale `{params.scale}` from the cells' own outputs; nothing is "
        "typed in by hand. Paper: Self-supervised Cross-silo Federated Neural Architecture Search (SS-VFNAS, arXiv "
        "2101.11896); authors' code in FederatedAI/research (publications/ss_vfnas). Its absolute numbers (ModelNet40, "
        "CheXpert) are not comparable with these; the claims table checks its stated relative findings.",
        "",
        "## Setup",
        "",
        f"- Grid: methods {', '.join(method_label(x) for x in ss.methods)} (1 = DARTS bi-level, first order"
        + (" with the second-order option on" if s.second_order else "")
        + "; 2 = MiLeNAS mixed-level, λ = "
        f"{s.milenas_lambda:g}; SS- = MoCo v2 pre-search at every party first) x dataset-K "
        f"{', '.join(partition_names(params))} x DP levels {', '.join(dp_level_text(lvl) for lvl in ss.dp_levels)} x "
        f"seeds {', '.join(map(str, ss.seeds))}; the hand-designed "
        "baseline once per dataset-K x DP level x seed.",
        *_skipped_lines(data),
        f"- Rows: a stratified {100 * r.held_out_fraction:g}% of each partition's train split (seeded by data.seed; "
        "the rows the sanity protocol holds out) is held out of every phase: no pre-search, search or retraining step "
        "trains on it, and 'train' below is the rest. The retraining is validated on it; nothing is chosen on it or on "
        "test.",
        f"- Parties: party K (the label party) holds the labels and Net_c; every other party sends its embedding N_j "
        f"({s.out_dim} floats a sample) and gets dL/dN_j back, through the channel that counts every message "
        "(`fedrepro/vfl/protocol.py`).",
        f"- Search: each party's supernet of {s.cells} cell(s), {s.nodes} intermediate nodes, width {s.width} (conv "
        f"space for image views, MLP space for tables); {s.steps} collaborative steps, batch {s.batch_size} from train "
        f"(w) and search-valid (α); SGD lr {s.lr:g} cosine to {s.lr_min:g}, momentum {s.momentum:g}, weight decay "
        f"{s.weight_decay:g}, each party's gradient clipped at {s.grad_clip:g}; Adam on α, lr {s.arch_lr:g}, weight "
        f"decay {s.arch_weight_decay:g}. Test accuracy of the supernets every {s.eval_every} steps.",
        f"- Pre-search (SS- methods): MoCo v2 on each party's own train + search-valid rows, {m.steps} steps, batch "
        f"{m.batch_size}, SGD lr {m.lr:g}, projection {m.projection_dim}, queue {m.queue_size}, momentum "
        f"{m.momentum:g}, temperature {m.temperature:g}; augmentations: shifts, noise and erasing for images, feature "
        "resampling and noise for tables (`fedrepro/vfl/moco.py`). No message crosses; the search starts from the "
        "pre-searched weights and α.",
        f"- Retraining: derived architectures (DARTS discretisation: two strongest inputs per node) trained from "
        f"scratch, {r.steps} steps, batch {r.batch_size}"
        + (f", width {r.width}" if r.width else "")
        + (f", {r.cells} cells" if r.cells else "")
        + f"; the main table's accuracy is theirs. Every {r.eval_every} steps, its mean training loss since the "
        "previous point and its accuracy on the held-out rows (`retrain.curve` of each cell's metrics.json), which the "
        "health rule judges.",
        f"- DP: Gaussian mechanism on sent embeddings (clip C1 = {dp.clip_forward:g}, noise multiplier σ1) and "
        f"returned gradients (C2 = {dp.clip_backward:g}, σ2); ε at δ = {dp.delta:g}, worst party, from opacus' RDP "
        "accountant over every release a sample took part in, without amplification by subsampling (the headline; the "
        "amplified figure the paper's accounting gives is beside it, see below); a side with σ = 0 has no mechanism "
        "(ε = ∞).",
        *_deviations(params),
        f"- Hardware the cells ran on: {describe(cell_hardware(data))}. "
        "The same seed gives the same bits on the same machine type; another instruction set moves the numbers a "
        "little.",
        "",
        "## Partitions",
        "",
        "Made once by `ssvfnas_partition` (stratified, seeded by the dataset, so a dataset's K values share the same "
        "rows and splits); each party scales only its own features from its own training rows.",
        "",
        partitions_table(data).to_markdown(disable_numparse=True),
        "",
        "## Main table",
        "",
        f"Retrained test accuracy ({over_seeds(len(ss.seeds))}; † / ~ / ° mark a diverged / oscillating / unconverged "
        "cell, see below), the retrained networks' accuracy on the held-out validation rows at their last point (not "
        "test), the supernets' last test accuracy, collaborative steps and "
        "messages (search + retraining), megabytes exchanged, and ε (worst party) of the search and in total: the "
        "headline without amplification, and the Poisson-amplified figure of the paper's accounting beside it. Two "
        "trivial rows close each dataset-K; both send nothing, so no DP level applies. 'Majority class': always "
        "answering the most frequent class of the rows every cell trains on (train + search-valid, less the held-out "
        "share; a tie goes to the lowest class id), scored on the same test rows, with no training. 'Label party "
        "alone': the label party's own hand-designed network and a linear top trained on its own features only, with "
        "the baseline's retraining (rows, steps, schedule, held-out validation), one cell per seed: what it reaches "
        "with no partner, so a federated row is worth its margin over it (`not run` where the pipeline has not run "
        "these cells yet).",
        "",
        main_table(data, params).to_markdown(index=False, disable_numparse=True),
        "",
        *_health_lines(data, params),
        "## Steps, bytes and ε to the target accuracy",
        "",
        f"The first curve point at which the supernets' test accuracy reaches {100 * ss.target_accuracy:g}% "
        "(`ssvfnas.target_accuracy`), mean over the seeds that reached it. The paper: pre-search cuts the "
        "collaborative steps, hence bytes and ε.",
        "",
        target_table(data, params).to_markdown(index=False, disable_numparse=True),
        "",
        "## Accuracy vs bytes",
        "",
        f"The supernets' test accuracy against the megabytes exchanged so far ({curve_caption(len(ss.seeds))}); "
        "dashed lines are the SS- methods; " + TRIVIAL_LINES + ".",
        "",
        *[f"![accuracy vs bytes, {p}](figures/accuracy_vs_bytes_{p}.png)\n" for p in partition_names(params)],
        "## Accuracy vs ε",
        "",
        "Left: retrained test accuracy against the total ε of each DP level with noise on both sides; dotted: each "
        "method without DP. Right: the supernets' test accuracy against the ε spent so far in the search. Both: "
        f"{curve_caption(len(ss.seeds))}; " + TRIVIAL_LINES + ".",
        "",
        *[f"![accuracy vs epsilon, {p}](figures/accuracy_vs_epsilon_{p}.png)\n" for p in partition_names(params)],
        "## Messages per step: DARTS vs MiLeNAS",
        "",
        "Counted by the channel in one search cell per method and K. A pass is K-1 embeddings up and K-1 gradients "
        "down; DARTS first order needs two dependent passes a step (α on search-valid, then w on train), MiLeNAS one "
        "(train and search-valid batches travel together)"
        + ("; the released-code fidelity sends them one after the other" if ss.fidelity == "released_code" else "")
        + ".",
        "",
        messages_table(data, params).to_markdown(disable_numparse=True),
        "",
        "![messages per step](figures/messages_per_step.png)",
        "",
        "## The searched cells",
        "",
        f"Each party's derived cell, at {dp_level_text(ss.dp_levels[0])}, seed {ss.seeds[0]}.",
        "",
        genotypes_table(data, params).to_markdown(index=False, disable_numparse=True),
        "",
        *_figure_links(data, params),
        "## Architecture weights: did α move?",
        "",
        *_alpha_lines(data, params),
        "## What the label party carries alone",
        "",
        *_reliance_lines(data, params),
        "## The hand-designed baseline",
        "",
        "Its rows are in the main table (`hand-designed`); parameters of the bottom networks, summed over parties:",
        "",
        parameters_table(data, params).to_markdown(disable_numparse=True),
        "",
        "## Claims checked at this scale",
        "",
        "Each SS-VFNAS finding (ANCHORS.md) and the issue's own checks, with the measured numbers and the test used; a "
        "verdict follows the numbers whatever they are. Steps and ε to the target: an exact sign test over matched "
        "cells (same dataset-K, DP level, seed). Accuracy: the retrained accuracy difference, matched cells grouped by "
        "dataset-K and DP level with their seeds resampled. Reference at chance: an accuracy claim compares only "
        "conditions (dataset-K and DP levels) where the compared cells' seed-mean test accuracy is at least "
        f"{100 * CHANCE_MARGIN:g} point(s) above their dataset-K's majority class (for DP's cost, the no-DP side "
        "only: a noisy side at chance is the cost); the rest are left out and named in the test column, and a claim "
        "with none left is inconclusive (reference at chance). A target claim does not count a dataset-K where the "
        "target is not that far above the majority rate (answering the majority class would reach it) or where the "
        "label party alone reaches it (it needs no other party), and is not testable here where none is left. A claim "
        "about the searched architecture (searched vs hand-designed, the parties' heterogeneous cells) counts only "
        f"searches that moved α (its entropy fell by more than {ALPHA_MOVED:.0%} of the uniform value: see "
        "'Architecture weights') and is not testable here where none did. " + tests_explained(claims),
        "",
        claims.to_markdown(index=False, disable_numparse=True),
        "",
        "## What this run can and cannot say",
        "",
        *_closing(data, params, claims),
    ]
    return "\n".join(lines)
