"""FedCMC's markdown report: the tables (``tables``, ``observation3``), claims and figures put in order with the setup,
the caveats measured on the cells and the paper's numbers they are read against."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from fedrepro.config import Params
from fedrepro.fedcmc.cells import Cell
from fedrepro.fedcmc.methods import PAPER_METHODS
from fedrepro.fedcmc.claims import claims_table
from fedrepro.fedcmc.chance import CHANCE_MARGIN, chance_level, identical_predictions
from fedrepro.fedcmc.observation3 import figure1_cells, observation3_table
from fedrepro.fedcmc.paper import CHEMPROT_READING, DATASET_LABELS, PAPER_ROUNDS
from fedrepro.fedcmc.results import TABLE, FedCMCResults
from fedrepro.fedcmc.selection import (
    dataset_label,
    figure_point,
    health_mark,
    main_points,
    mean_of,
    mean_std_percent,
    method_label,
    percent,
    point_name,
    values_of,
)
from fedrepro.fedcmc.tables import (
    clients_table,
    communication_table,
    convergence_table,
    fedcmc_extra_download,
    health_table,
    local_epochs_tables,
    main_table,
    partitions_table,
    subsets_table,
)
from fedrepro.fl.health import RULE
from fedrepro.report.health import LEGEND
from fedrepro.hardware import describe
from fedrepro.report.formatting import over_seeds, sweep_not_run
from fedrepro.report.results import missed_clients_section
from fedrepro.report.claims import tests_explained, verdict_counts


CURVE_MARKS = (
    "The black and grey dash-dotted lines are the trivial baselines of the curves' partition (Table 2's "
    "rows: always its commonest positive training class, stratified random) on their test set; †, ~ or ° after "
    "a name marks a diverged, oscillating or unconverged cell as in the tables, and a cross ends the curve of one that "
    "diverged (its last rounds are no result)."
)
"""How Figs 3a and 3b mark the trivial baselines and the cells' health (``report._curves_figure``)."""


def _backbone_text(params: Params) -> str:
    settings = params.fedcmc.settings
    if settings.backbone == "tiny":
        tiny = params.model.tiny
        return (
            f"`tiny` (a BERT initialised at random: {tiny.layers} layers, hidden {tiny.hidden}, {tiny.heads} heads, "
            f"WordPiece vocabulary trained on the corpora's training text)"
        )
    if settings.backbone == "minilm":
        text = "`minilm` (the packaged pretrained all-MiniLM-L6-v2)"
    else:
        text = f"`{settings.backbone}`"
    return text + (f", lowest {settings.keep_layers} encoder layers kept" if settings.keep_layers else "")


def _empty_clients(data: FedCMCResults) -> str:
    parts = []
    for name, part in sorted(data.partitions.items()):
        totals = part.counts.sum(axis=1)
        parts.append(f"{name}: {int((totals == 0).sum())} of {len(totals)}")
    return "; ".join(parts)


def _dataset_lines(data: FedCMCResults, params: Params) -> list[str]:
    negative = params.fedcmc.settings.negative_labels
    lines = []
    for dataset in sorted(data.classes):
        classes = data.classes[dataset]
        present = [c for c in classes if c in set(negative)]
        part = next(
            p for _, p in sorted(data.partitions.items()) if p.info["dataset"] == dataset and not p.info.get("subset")
        )
        sentences = part.info.get("sentences", {})
        lines.append(
            f"  - `{dataset}`"
            + (f" ({DATASET_LABELS[dataset]})" if dataset in DATASET_LABELS else " (not one of the paper's corpora)")
            + f": {len(classes)} classes ({', '.join(classes)}); {sentences.get('train', 0)} train / "
            f"{sentences.get('valid', 0)} valid / {sentences.get('test', 0)} test sentences after the caps; "
            + (
                f"negative label(s) {', '.join(present)} left out of F1."
                if present
                else "none of the negative labels occurs, so every class counts and micro-F1 = accuracy."
            )
        )
    return lines


def _closing(data: FedCMCResults, params: Params, claims: pd.DataFrame) -> list[str]:
    fc = params.fedcmc
    part = lambda d, a: Cell("fedavg", d, a, fc.settings.clients, fc.settings.local_epochs, 0).partition  # noqa: E731
    lines = []
    synthetic = [d for d in fc.datasets if d not in DATASET_LABELS]
    if synthetic:
        lines.append(
            f"The main table runs on {', '.join(f'`{d}`' for d in synthetic)}, which is not one of the paper's "
            "corpora: these numbers test the pipeline and the direction of the effects, not the paper's values."
        )
    near = []
    for dataset, alpha in main_points(params):
        chance = chance_level(data, dataset, part(dataset, alpha))
        for method in fc.methods:
            value = mean_of(data, TABLE, method=method, dataset=dataset, alpha=alpha)
            if value - chance < CHANCE_MARGIN:
                near.append(
                    f"{method_label(method)} at {point_name(dataset, alpha)} ({percent(value)} vs {percent(chance)})"
                )
    if near:
        lines.append(
            "These main-table cells score less than 1 point above the better trivial baseline (always the commonest "
            "positive class, or stratified random; or below it), so training learned little beyond the prior there and "
            "comparisons involving them say "
            "little about the methods: " + "; ".join(near) + "."
        )
    else:
        lines.append("Every main-table cell scores more than 1 point above the better trivial baseline.")
    widths = [
        float(high) - float(low)
        for low, high in re.findall(r"95% CI \[([+-][0-9.]+), ([+-][0-9.]+)\]", "\n".join(claims["test"]))
    ]
    if widths:
        lines.append(
            f"The 95% bootstrap intervals of the tested claims are {np.median(widths):.2f} points wide (median): "
            "a smaller difference cannot be told from the sampling of test sentences and seeds here."
        )
    single = [name for name, seeds in (("main-table", fc.seeds), ("sweep", fc.sweeps.seeds)) if len(seeds) == 1]
    if single:
        lines.append(
            f"The {' and '.join(single)} cells have one training seed each: their intervals cover the sampling of test "
            "sentences only, not the spread between training runs, which in small federated runs is often as large "
            "as the differences between methods."
        )
    lines.append(verdict_counts(claims))
    if fc.settings.rounds < max(PAPER_ROUNDS.values()):
        lines.append(
            f"The run has {fc.settings.rounds} rounds; the paper's Fig 3a numbers reach {max(PAPER_ROUNDS.values())} "
            "rounds, so the convergence claims are checked on a much shorter horizon and a method 'not reached' here "
            "may still reach the target later."
        )
    return [" ".join(lines), ""]


def render_report(params: Params, data: FedCMCResults) -> str:
    """reports/fedcmc/report.md: setup, the tables, the claims and what to read them with, figures."""
    fc, settings, sw, train, knobs = (
        params.fedcmc,
        params.fedcmc.settings,
        params.fedcmc.sweeps,
        params.train,
        params.algorithms,
    )
    truncated = max(int(i.get("truncated_train_sentences", 0)) for i in data.info.values())
    scheme = {
        "dirichlet": "Dirichlet per class (each class's training sentences split among the clients by p_c ~ Dir_K(α))",
        "iid": "IID (uniform)",
        "quantity": "quantity skew",
    }[settings.partition]
    lines = [
        f"# FedCMC — reproduction at scale `{params.scale}`",
        "",
        f"Written by the `fedcmc_report` stage at scale `{params.scale}` from the cells' own outputs; nothing is typed "
        "in by hand. Paper: FedCMC (Zhang et al., federated contrastive learning with major classifier vectors for "
        "medical relation extraction; arXiv 2301.05376, Applied Intelligence 2023; no public code). Its absolute "
        "numbers are not comparable with these (other data sizes, backbone and budget); the claims table checks its "
        "stated relative findings.",
        "",
        "## Setup",
        "",
        "- Datasets:",
        *_dataset_lines(data, params),
        f"- Caps: at most {settings.max_train_sentences or 'all'} training and {settings.max_eval_sentences or 'all'} "
        f"valid/test sentences per corpus (a seeded sample keeping the label mix); {truncated} training sentences were "
        f"longer than {settings.max_length} tokens and were cut (the most in any one cell).",
        f"- Grid: α in {', '.join(f'{a:g}' for a in fc.alphas)}; {settings.clients} clients; {settings.rounds} rounds; "
        f"{settings.local_work()}; every client trains every round. Seeds: main table {', '.join(map(str, fc.seeds))}; "
        f"sweeps {', '.join(map(str, sw.seeds))}. The paper: 10 clients, 1 local epoch, 3 seeds, lr 5e-5, batch 8, "
        "DistilBERT.",
        f"- Model: relation classifier on {_backbone_text(params)}, max length {settings.max_length}; entity markers "
        "`<e1>..</e1>`, `<e2>..</e2>` as added tokens, each entity the sum of its word-piece outputs, the relation "
        f"feature [h_e1; h_e2] (2d), a linear classifier C x 2d. Adam, lr {settings.lr:g}, {train.warmup_fraction:.0%} "
        f"warm-up then linear decay, batch {settings.batch_size}, gradient norm clipped at {train.max_grad_norm:g}, "
        f"{train.precision} steps; aggregation weights p_k = N_k / N.",
        f"- Partition: {scheme}; NIID-Bench's balance trick {'on' if settings.balance else 'off'}; minimum client size "
        + (
            f"{settings.min_client_size} (bounded redraws)"
            if settings.min_client_size
            else "none (a client the draw leaves empty sits out every round)"
        )
        + f". Clients with no training sentence, per partition: {_empty_clients(data)}.",
        "- F1: the headline is micro-F1 over the positive classes (every class but the negative labels "
        f"{', '.join(f'`{n}`' for n in settings.negative_labels)}; every class when a corpus has none of them), "
        "macro-F1 beside it; percentages with 2 decimals as in the paper.",
        f"- ChemProt, one reading everywhere: {CHEMPROT_READING}; the main table, Table 3 and every figure use it, and "
        "the report refuses partitions of one corpus with different class sets.",
        "- Evaluation: the global (aggregated) model on the global test set, the union of the clients' test shares, "
        "because the paper evaluates the aggregated model on each dataset's test set. Nothing is selected on the test "
        "set; the per-round test F1 (Figs 3a, 3b) is only reported.",
        "- Deviations and unstated values:",
        f"  - FedCMC's mu and temperature are not given in the paper: mu = {knobs['fedcmc']['mu']:g}, temperature = "
        f"{knobs['fedcmc']['temperature']:g} here.",
        "  - FedCMC's round 1 is FedAvg: no classifier vectors exist before the first aggregation.",
        "  - SCAFFOLD runs under Adam like every method here; its variates are the clients' mean raw local gradients "
        "(under plain SGD the same quantity as its option II), and the correction is added before Adam rescales the "
        "gradient; SCAFFOLD's analysis assumes SGD (`fedrepro/fl/algorithms/scaffold.py`).",
        f"  - MOON (mu {knobs['moon']['mu']:g}, temperature {knobs['moon']['temperature']:g}, projection "
        f"{knobs['moon']['projection_dim']}): its classifier stays on the relation features as in every other method, "
        "not on top of the projection (`moon.py`), so only the contrastive term differs.",
        f"  - FedRS (a = {knobs['fedrs']['alpha']:g}): "
        + (
            "the paper's binary present/absent mask, a different method from its author's code"
            if knobs["fedrs"]["mask"]
            else "its author's count-scaled logits n_c / max n * (1 − a) + a, not the binary mask"
        )
        + " (`fedrs.py`).",
        f"  - FedLC's tau is not given in its paper: tau = {knobs['fedlc']['tau']:g} (`fedlc.py`).",
        f"  - FedProx mu = {knobs['fedprox']['mu']:g} (not given for this paper).",
        *[
            f"  - {method_label(method)} "
            f"({', '.join(f'{k} {v}' for k, v in knobs.get(method, {}).items()) or 'no knobs'}; `{method}.py`) is not "
            "one of the paper's methods: an extra row, left out of 'FedCMC is the best method'."
            for method in fc.methods
            if method not in PAPER_METHODS
        ],
        f"- Hardware the cells ran on: {describe([i.get('hardware') for i in data.info.values()])}. The same seed "
        "gives the same bits on the same machine type; another instruction set moves the numbers a little (README, "
        "Reproducibility).",
        "",
    ]
    # Table 2
    lines += [
        "## Table 2: methods x dataset x α",
        "",
        "The paper reports FedCMC's F1 gain over FedAvg: +12.99 (i2b2), +8.39 (ChemProt), +4.04 (PGR) at α = 0.05 and "
        "+9.08, +7.81, +2.12 at α = 0.5 (the paper writes '%'; read here as F1 points), and FedRS and FedLC well "
        "above FedAvg and MOON. The trivial rows need no model: always the partition's most frequent positive "
        "training class, and stratified random guessing from its training prior (expected score).",
        "",
    ]
    for metric, name in (("micro_f1", "micro-F1"), ("macro_f1", "macro-F1")):
        lines += [
            f"Test {name} in % ({over_seeds(len(fc.seeds))})",
            "",
            main_table(data, params, metric).to_markdown(disable_numparse=True),
            "",
        ]
    counts = data.cells["health"].value_counts()
    lines += [
        f"{LEGEND}: {RULE}. Of {len(data.cells)} cells: "
        + ", ".join(f"{n} {label}" for label, n in counts.items())
        + ".",
        "",
    ]
    flagged = health_table(data)
    if not flagged.empty:
        lines += [
            "Cells flagged by that rule (no verdict rests on any of them: a claim that needs one is inconclusive):",
            "",
            flagged.to_markdown(index=False),
            "",
        ]
    alike = identical_predictions(data, params)
    if alike:
        lines += [
            "Methods whose cells predicted every test sentence alike (different algorithms agree sentence for "
            "sentence only when their models collapsed onto the same few answers; their rows are equal, not "
            "close): " + "; ".join(alike) + ".",
            "",
        ]
    # clients table
    lines += ["## The clients table (more clients)", ""]
    if sw.clients:
        lines += [
            f"{dataset_label(sw.dataset)}, α = {sw.alpha:g}, test micro-F1 in % ({over_seeds(len(sw.seeds))}), columns "
            "= clients. The paper reports FedCMC best at 10, 20 and 50 clients on i2b2 with its gap over the others "
            "growing with the clients (ANCHORS.md gives no numbers).",
            "",
            clients_table(data, params).to_markdown(disable_numparse=True),
            "",
        ]
    else:
        lines += sweep_not_run("fedcmc.sweeps.clients")
    # Table 3
    lines += ["## Table 3: balanced vs natural training subset", ""]
    if sw.subset_modes:
        tested = (
            f"at most {settings.max_eval_sentences} test sentences"
            if settings.max_eval_sentences
            else "the whole test set"
        )
        lines += [
            f"{sw.subset_size} training sentences of {dataset_label(sw.subset_dataset)} (balanced: {sw.subset_size} / "
            f"C per class; natural: the corpus's label mix), α = {sw.alpha:g}, {settings.clients} clients, {tested}; "
            f"drawn from the same corpus and classes as the main table ({CHEMPROT_READING}); test micro-F1 in % "
            f"({over_seeds(len(sw.seeds))}). The paper (500 ChemProt sentences, 100 per class): FedRS and FedLC about "
            "as good as FedCMC on the balanced subset, FedCMC ahead on the natural one. The trivial rows are Table 2's "
            "for each subset's training prior, scored on the test set of each column's cells: the balanced prior is "
            "flat, so its 'commonest' class is merely the first, and the natural prior's constant answer is the one "
            "the balanced cells must beat on a test set with the corpus's label mix.",
            "",
            subsets_table(data, params).to_markdown(disable_numparse=True),
            "",
        ]
    else:
        lines += sweep_not_run("fedcmc.sweeps.subset_modes")
    # Fig 1
    lines += ["## Fig 1 and Observation 3: local average similarity d_{k,c}", ""]
    fedavg, _, which = figure1_cells(data, params)
    if fedavg is not None and data.diagnostics[fedavg]:
        lines += [
            "d_{k,c} is the mean cosine similarity of class c's classifier vector to the other classes' vectors in "
            "client k's classifier after its local training (uploading clients only). The paper's Observation 3: "
            "the client holding most of class c has the smallest d_{k,c} in every round, which is why FedCMC "
            "takes class c's vector from argmin_k d_{k,c}. " + which,
            "",
            "![fig 1](figures/fig1_similarity.png)",
            "",
            "Share of classes whose smallest-d client (FedAvg) or picked client (FedCMC; its picks in round r feed "
            "round r + 1) is the class's largest holder, against a uniform pick among the clients holding the "
            "class:",
            "",
            observation3_table(data, params).to_markdown(disable_numparse=True),
            "",
        ]
    else:
        lines += [which if fedavg is None else "The FedAvg cell recorded no per-round diagnostics.", ""]
    # Fig 3a / 3b
    lines += ["## Fig 3a: convergence", ""]
    point = figure_point(params)
    if point is None:
        lines += [
            f"The sweeps' point {point_name(sw.dataset, sw.alpha)} is not in the main table, so Fig 3a is not drawn.",
            "",
        ]
    elif not settings.eval_every:
        lines += ["`fedcmc.settings.eval_every` is 0: no per-round test F1 was recorded.", ""]
    else:
        lines += [
            f"{point_name(*point)}: the global model's test micro-F1 after each round ({over_seeds(len(fc.seeds))}), "
            f"and the rounds each method needs to reach the target {100 * fc.target_f1:g}% (`fedcmc.target_f1`). The "
            "paper (i2b2, α = 0.05): "
            "FedCMC 5 rounds, FedRS 15, FedAvg 20. " + CURVE_MARKS,
            "",
            "![fig 3a](figures/fig3a_convergence.png)",
            "",
            convergence_table(data, params).to_markdown(disable_numparse=True),
            "",
        ]
        chance = chance_level(
            data, point[0], Cell("fedavg", *point, settings.clients, settings.local_epochs, 0).partition
        )
        if fc.target_f1 <= chance:
            lines += [
                f"The target {100 * fc.target_f1:g}% is at or below the better trivial baseline on this test set "
                f"({percent(chance)}%), so reaching it says nothing about learning here.",
                "",
            ]
    lines += ["## Fig 3b: local epochs", ""]
    if sw.local_epochs:
        final, speed = local_epochs_tables(data, params)
        lines += [
            f"{point_name(sw.dataset, sw.alpha)}, {settings.clients} clients, E local epochs between aggregations. The "
            "paper: "
            "more local epochs speed up FedCMC but not FedAvg or FedRS, and FedAvg's F1 varies more. " + CURVE_MARKS,
            "",
            "![fig 3b](figures/fig3b_local_epochs.png)",
            "",
            f"Final test micro-F1 in % ({over_seeds(len(sw.seeds))})",
            "",
            final.to_markdown(disable_numparse=True),
            "",
            f"Rounds to {100 * fc.target_f1:g}% micro-F1 (seed-mean curve)",
            "",
            speed.to_markdown(disable_numparse=True),
            "",
        ]
    else:
        lines += sweep_not_run("fedcmc.sweeps.local_epochs")
    # Fig 4
    lines += ["## Fig 4: which classifier vectors", ""]
    if sw.vectors:
        shown = pd.DataFrame(
            {
                "test micro-F1 (%)": [
                    mean_std_percent(values_of(data, "vectors", method="fedcmc", vectors=v))
                    + health_mark(data, "vectors", method="fedcmc", vectors=v)
                    for v in sw.vectors
                ]
            },
            index=pd.Index(sw.vectors, name="vectors"),
        )
        lines += [
            f"FedCMC at {point_name(sw.dataset, sw.vectors_alpha)} with class c's vector taken from the smallest-d "
            "client (major), a seeded random client (random), the largest-d client (minor), or no vectors and no "
            f"contrastive term (none = FedAvg); {over_seeds(len(sw.seeds))}. The paper (i2b2 and CPR, α = 0.01): major "
            "clearly best, minor worst, below none. The dash-dotted lines are the partition's trivial baselines (as in "
            "Table 2); †, ~ or ° after a rule marks a diverged, oscillating or unconverged cell.",
            "",
            "![fig 4](figures/fig4_vectors.png)",
            "",
            shown.to_markdown(disable_numparse=True),
            "",
        ]
    else:
        lines += sweep_not_run("fedcmc.sweeps.vectors")
    # partitions
    lines += [
        "## Partitions",
        "",
        "Every client split the grid trains on (`data/fedcmc/partitions/`); skew is the sample-weighted Jensen-Shannon "
        "distance of the clients' label distributions to the pooled one (0 = IID, 1 = disjoint).",
        "",
        partitions_table(data, params).to_markdown(disable_numparse=True),
        "",
    ]
    for name in sorted(data.partitions):
        lines += [f"![{name}](figures/partitions/{name}.png)", ""]
    # communication and memory
    comm = communication_table(data, params)
    where = (
        f"{point_name(*point)}, seed {fc.seeds[0]}"
        if point is not None
        else f"the first main-table cell of each method, seed {fc.seeds[0]}"
    )
    lines += [
        "## Communication and memory",
        "",
        f"One main-table cell per method ({where}). Bytes are counted by the channel (`fedrepro/channel.py`) and "
        "summed over the clients of a round. FedCMC downloads the C major vectors (C x 2d floats) with the model from "
        "round 2 on; SCAFFOLD's control variates travel with the weights both ways, about doubling each direction; "
        "MOON keeps each client's previous model and SCAFFOLD each client's variate as private state.",
        "",
        comm.to_markdown(disable_numparse=True),
        "",
    ]
    extra = fedcmc_extra_download(data, params)
    if extra:
        lines += [extra, ""]
    lines += missed_clients_section(data.missed)
    # claims
    claims = claims_table(data, params)
    lines += [
        "## Claims checked at this scale",
        "",
        "Each finding the paper states (ANCHORS.md), with the measured numbers and the test used; a verdict follows "
        "the numbers whatever they are. Tested claims contrast test micro-F1, the test items being the test "
        "sentences. " + tests_explained(claims) + " Claims on rounds or on Observation 3 are direction only.",
        "",
        claims.to_markdown(index=False, disable_numparse=True),
        "",
    ]
    lines += ["## What this run can and cannot say", ""] + _closing(data, params, claims)
    return "\n".join(lines)
