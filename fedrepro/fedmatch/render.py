"""FedMatch's markdown report: the tables, claims and figures of ``report`` put in order with the setup they need
to be read, from pipeline outputs only."""

from __future__ import annotations

import pandas as pd

from fedrepro.config import Params
from fedrepro.fedmatch.cells import SWEEPS, aggregation_epochs
from fedrepro.fedmatch.claims import claims_table
from fedrepro.fedmatch.report import (
    BM25_ONLY,
    LABELS,
    FedMatchResults,
    communication_table,
    health_table,
    marked_labels,
    patch_table,
    sweep_table,
    training_caveats,
)
from fedrepro.fl.health import RULE
from fedrepro.report.health import UNSOUND
from fedrepro.hardware import describe
from fedrepro.report.claims import tests_explained, verdict_counts
from fedrepro.report.formatting import over_seeds, sweep_not_run
from fedrepro.report.results import CHANCE, missed_clients_section, summary_table


INSERTION_TEXT = """\
| insertion | where the patch sits (code: `fedrepro/models/patches.py`) | paper's words | released code's option |
|---|---|---|---|
| inner (I) | in every encoder layer, parallel to the self-attention sub-layer: it reads the layer input x and is \
added inside the residual, `LayerNorm(attn(x) + x + patch(x))` | "inside" each layer | `mult` (PALs) |
| outer (O) | in every encoder layer, on the layer's output: `h + patch(h)` | on each layer's output \
| `houlsby` placement (one adapter after the layer) |
| vertical (V) | once, a side branch from the embedding output added to the last encoder output: `h_L + patch(e)` \
| at BERT level, beside the stack | `vertical` (its extra LayerNorm is omitted so the patched model starts as the \
unpatched one) |
| horizontal (H) | once, stacked on top of the encoder: `h_L + patch(h_L)` | at BERT level, on top of the stack \
| `top` |

PAL = down-projection to r, multi-head self-attention in that space (padding masked), up-projection, GELU;
LR = down-projection to r, GELU, up-projection. Every up-projection starts at zero, so each patched model
starts exactly as the unpatched one; patch parameters are private by name (`.patch.`) and never leave their client."""


def _results_for(data: FedMatchResults, rows: list[str]) -> pd.DataFrame:
    return data.results[data.results.row.isin(rows)]


def _named_caps(caps: dict[str, int], what: str) -> str:
    """'; fiqa: 1000 triples' for the clients whose cap is their own (none: '')."""
    return "".join(f"; {client}: {n or 'all'} {what}" for client, n in sorted(caps.items()))


def trivial_rows_text(bm25: dict | None, mined: dict) -> str:
    """What the two trivial rows under Tables 2-3 are, and what 'BM25 only' means for the clients' eval pools."""
    text = (
        "Trivial rows under each table rank the very test candidates the methods rank, scored by the same "
        "MAP/MRR code: 'random ranking (chance)' is the exact expectation of a uniformly random order per question"
    )
    if bm25 is None:
        return text + "; the BM25-only row is absent: the mining recorded no BM25 scores (`data/mined_bm25`)."
    official = sorted(client for client, info in mined.items() if info.get("eval_pool") == "official")
    text += (
        f"; '{BM25_ONLY}' orders them by their BM25 score over the client's answer pool, with the mining's index "
        "and settings (ties, e.g. candidates sharing no term with the question, fall by ascending answer id, the "
        "methods' own tie rule). Where BM25 mined the candidates, its negatives are BM25's own top non-gold hits, "
        "so this row can sit below chance"
    )
    if official:
        text += (
            f"; for {', '.join(official)} the candidates are the collection's official pool, which BM25 did not "
            "pick: there the row is BM25 re-ranking that pool"
        )
    return text + "."


def render_report(
    params: Params, data: FedMatchResults, chance: dict, bm25: dict | None, partition: dict, mined: dict
) -> str:
    """reports/fedmatch/report.md: setup, Tables 2-3, claims, health, communication and figures."""
    fm, train, model, mine = params.fedmatch, params.train, params.model, params.data
    trivial = {BM25_ONLY: bm25} if bm25 else None
    settings, labels = fm.settings, {**LABELS, **marked_labels(data)}
    clients = pd.DataFrame(
        {
            client: {
                "train questions available": info["train_questions_available"],
                "train questions used": info["questions"].get("train", 0),
                "valid questions": info["questions"].get("valid", 0),
                "test questions": info["questions"].get("test", 0),
                "answer pool": info["answer_pool"],
                "training triples": mined[client]["triples"],
                "test candidates": mined[client]["candidates"].get("test", 0),
            }
            for client, info in partition["clients"].items()
        }
    ).T
    clients.index.name = "client"
    seeds, sweep_seeds = fm.seeds, fm.sweeps.seeds
    backbone = f"`{model.backbone}`" + (
        f", lowest {model.keep_layers} encoder layers kept" if model.keep_layers else ""
    )
    if model.backbone == "tiny":
        backbone += (
            f" (random init, {model.tiny.layers} layers, hidden {model.tiny.hidden}, WordPiece vocabulary trained on "
            "the clients' text)"
        )
    lines = [
        f"# {params.report.title}",
        "",
        f"Written by the `fedmatch_report` stage at scale `{params.scale}` from the cells' own outputs; nothing is "
        "typed in by hand. Paper: FedMatch (Chen et al., CIKM'21). Its absolute numbers are not comparable with these "
        "(other data sizes, backbone and budget); the claims table below checks its stated relative findings.",
        "",
        "## Setup",
        "",
        f"- Hardware the cells ran on: {describe([i.get('hardware') for i in data.info.values()])}. The same seed "
        "gives the same bits on the same machine type; another instruction set moves the numbers a little (README, "
        "Reproducibility).",
        f"- Data source `{params.data.source}`; caps: the largest client keeps "
        f"{mine.max_questions_per_client or 'all'} training questions, the others in proportion (at least "
        f"{mine.min_questions_per_client}); {mine.max_eval_questions_per_client or 'all'} valid and test questions per "
        f"client; at most {params.mine.max_triples_per_client or 'all'} training triples per client"
        f"{_named_caps(mine.client_train_questions, 'training questions')}"
        f"{_named_caps(params.mine.client_max_triples, 'triples')}.",
        f"- Negatives: the top-{params.mine.negatives_per_question} non-gold BM25 answers ({params.mine.backend}, k1 = "
        f"{params.mine.k1}, b = {params.mine.b}: Elasticsearch's defaults, as the paper mined with Elasticsearch) from "
        "the client's training pool. "
        + (
            "Test candidates: the gold answers plus the top-"
            + str(params.mine.eval_negatives)
            + " non-gold BM25 answers."
            if params.mine.eval_pool == "bm25"
            else "Test candidates: the collection's official pools where it has them."
        ),
        f"- Model: cross-encoder `[CLS] q [SEP] a [SEP]` on {backbone}, max length {model.max_length}, scored from "
        + (
            "the [CLS] state; "
            if settings.pooling == "cls"
            else "the mean of the token states (this backbone's [CLS] "
            "is untrained: see `fedrepro/models/cross_encoder.py`); "
        )
        + f"{'pairwise hinge loss' if settings.fidelity == 'paper' else 'binary cross-entropy (the released code)'}; "
        f"Adam, lr {train.lr}, {train.warmup_fraction:.0%} warm-up then linear decay, batch {train.batch_size} pairs, "
        f"{train.precision} training steps.",
        f"- Federation: {train.rounds} rounds x {train.local_epochs} local epoch, all clients each round "
        f"({settings.clients_sampled} of {len(clients)} for the _CS rows), {train.weighting} averaging; FedProx mu = "
        f"{params.algorithms['fedprox']['mu']}.",
        f"- Fidelity `{settings.fidelity}`: "
        + (
            "hinge loss; the patch is private, the scoring head shared."
            if settings.fidelity == "paper"
            else "the released code's 2-class cross-entropy; patch and every LayerNorm private."
        ),
        f"- Patch size r = {settings.patch_size}, PAL heads {settings.patch_heads}; shared layers: "
        f"{settings.shared_layers if settings.shared_layers is not None else 'all'}.",
        f"- Seeds: tables {', '.join(map(str, seeds))}; figures {', '.join(map(str, sweep_seeds))}. MAP and MRR per "
        "question with pytrec_eval; a client's score is the mean over its test questions, 'overall' the unweighted "
        "mean over clients. Every cell's TREC qrels and run files are in `data/fedmatch/**/trec/`.",
        "",
        clients.to_markdown(),
        "",
        f"Training health (every cell, shared rule): {RULE}. A row marked [diverged], [oscillating] or [not converged] "
        "is such a cell (the section 'Training health' lists each with its numbers); no verdict below rests on such a "
        "cell. "
        + (
            ""
            if train.eval_every
            else "`train.eval_every` is 0 at this scale, so no validation MRR was recorded and "
            "convergence is unknown; only divergence is judged."
        ),
        "",
        trivial_rows_text(bm25, mined),
        "",
        "## Table 2: the eight FedMatch variants",
        "",
        INSERTION_TEXT,
        "",
    ]
    for metric in ("map", "mrr"):
        lines += [
            f"Test {metric.upper()} ({over_seeds(len(seeds))})",
            "",
            summary_table(_results_for(data, fm.table2), metric, fm.table2, labels, chance, trivial).to_markdown(),
            "",
        ]
    lines += [
        "## Table 3: FedMatch against the baselines",
        "",
        "RE2 and ESIM are trained per client from scratch on random word embeddings (no pretrained vectors can be "
        "loaded offline), over the backbone's WordPiece tokens. CoverQuery hides each real question among "
        f"{params.algorithms['coverquery']['cover_queries']} generated cover questions before a central trainer sees "
        "it (`fedrepro/fl/algorithms/coverquery.py` says what it is based on). LG-FedAvg keeps the embeddings and the "
        "bottom half of the encoder local. Centralised (pooled data, not private) is an extra reference row: one round "
        "is one sequential pass over every client's triples (sum of N_k / B steps), while a FedAvg round averages the "
        "clients' own shorter passes (N_k / B steps each), so at the same rounds it fits its training triples much "
        "further (see the training losses below) and on capped data it can overfit; the health section shows its "
        "validation curve.",
        "",
    ]
    for metric in ("map", "mrr"):
        lines += [
            f"Test {metric.upper()} ({over_seeds(len(seeds))})",
            "",
            summary_table(_results_for(data, fm.table3), metric, fm.table3, labels, chance, trivial).to_markdown(),
            "",
        ]
    claims = claims_table(data, params, chance)
    lines += [
        "## Claims checked at this scale",
        "",
        "Each finding the paper states (ANCHORS.md), with the measured numbers and the test used; a verdict "
        "follows the numbers whatever they are. Tested claims contrast per-question MAP or MRR, the test items being "
        "the (client, question) pairs. " + tests_explained(claims) + " " + verdict_counts(claims),
        "",
        claims.to_markdown(index=False),
        "",
    ]
    caveats = training_caveats(data, chance, list(dict.fromkeys(fm.table3 + fm.table2)))
    if caveats:
        lines += (
            [
                "**Read the verdicts with these measured caveats.** These methods barely trained within this "
                f"scale's budget ({train.rounds} rounds) or sit close to chance, so a verdict involving them says more "
                "about the budget than about the method:",
                "",
            ]
            + [f"- {line}" for line in caveats]
            + [""]
        )
    rows = list(dict.fromkeys(fm.table3 + fm.table2))
    lines += [
        "## Training, parameters, communication and memory",
        "",
        "The training loss is the mean over clients and seeds of each round's local hinge (or cross-entropy) loss. "
        "Bytes are counted by the channel (`fedrepro/channel.py`); uploads happen once per round per sampled client; "
        "'data bytes sent once' is CoverQuery's upload of (obfuscated) training text; private state is what the engine "
        "keeps per client between rounds.",
        "",
        communication_table(data, rows).to_markdown(),
        "",
    ]
    lines += [
        "## Training health",
        "",
        f"Rule: {RULE}. Validation MRR is the mean over clients of each evaluated "
        f"round (every {train.eval_every} rounds)."
        if train.eval_every
        else f"Rule: {RULE}. No validation MRR at this scale (`train.eval_every` = 0): convergence is unknown.",
        "",
        health_table(data, rows).to_markdown(index=False),
        "",
    ]
    sweep_health = health_table(data, [r for r in data.health if r not in rows])
    unsound = sweep_health[sweep_health["health"].isin(UNSOUND)]
    lines += [
        f"Figure (sweep) cells: {len(sweep_health)}, of which {len(unsound)} diverged, oscillated or not converged"
        + (":" if len(unsound) else "."),
        "",
    ] + ([unsound.to_markdown(index=False), ""] if len(unsound) else [])
    patches = patch_table(data, list(dict.fromkeys(fm.table2 + fm.table3)))
    if not patches.empty:
        lines += [
            "## Do the private patches learn?",
            "",
            "Each client's patch after training (first seed): Frobenius norm of its up-projection (zero-initialised, "
            "so this is how far it moved), of its down-projection's change from the initial weights, and of the "
            "down-projection itself, over all of a model's patches (inner/outer: one per layer); then, on the client's "
            "validation candidates, the mean relative change the patch makes to the features the head reads and the "
            "mean absolute change of the scores in units of their standard deviation (the same model with every "
            "patch's output zeroed is the reference). A zero-initialised up-projection grows with the client's local "
            "steps, so a client with few triples keeps a patch that barely matters.",
            "",
            patches.to_markdown(),
            "",
        ]
    lines += missed_clients_section(data.missed)
    lines += [
        "## Figures",
        "",
        "![convergence](figures/convergence.png)",
        "",
        f"Figs 5-8 draw the '{CHANCE}' level of the tables (the same test candidates): Figs 5-7 overall as "
        "a black dash-dotted line and each client's dotted in its colour, Fig 8 its client's, MAP and MRR each "
        "in its own panel; a point at or below its line learned nothing a random order would not give.",
        "",
    ]
    for number, sweep in zip((5, 6, 7, 8), SWEEPS):
        lines += [
            f"**{SWEEPS[sweep]}**"
            + (" (FedMatch H+LR vs individual BERT; the same ratio for every client)" if sweep == "data_ratio" else ""),
            "",
        ]
        if sweep == "aggregate_every" and fm.sweeps.aggregate_every:
            lines += [
                f"Every period E trains {aggregation_epochs(params)} local epochs in all (E x rounds), so the "
                "figure varies how often the clients aggregate, not how long they train.",
                "",
            ]
        if not getattr(fm.sweeps, sweep):
            lines += sweep_not_run(f"fedmatch.sweeps.{sweep}", " to fit the time budget")
            continue
        if sweep != "data_ratio":
            lines += [sweep_table(data, sweep, chance).to_markdown(floatfmt=".3f"), ""]
        lines += [f"![fig {number}](figures/fig{number}_{sweep}.png)", ""]
    if params.scale == "embedded":
        lines += [
            "## What this run is and is not",
            "",
            "The embedded scale is a fast, offline run of every table and figure in miniature: real InsuranceQA text "
            "(five insurance domains as five clients) with a tiny randomly initialised BERT, few rounds and seeds. It "
            "checks the pipeline and shows learning above chance; it is not the paper's setting, and its verdicts "
            "carry little weight. A CPU-scale snapshot on the five real collections grows in `reports/cpu/fedmatch/` "
            "(`reports/README.md` says how far it is).",
            "",
        ]
    return "\n".join(lines)
