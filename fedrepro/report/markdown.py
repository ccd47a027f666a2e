"""The markdown report and the README results block, rendered from pipeline outputs only."""

from __future__ import annotations

import pandas as pd

from fedrepro.config import Params
from fedrepro.metrics.summary import mean_std
from fedrepro.report.results import OVERALL, summary_table

README_START, README_END = "<!-- results:start (written by stages/report.py) -->", "<!-- results:end -->"


def compare(results: pd.DataFrame, better: str, worse: str, metric: str) -> str:
    """A plain verdict on 'better > worse' for the overall metric, with the measured means and spreads."""
    def values(algorithm: str) -> list[float]:
        rows = results[(results.algorithm == algorithm) & (results.client == OVERALL) & (results.metric == metric)]
        return rows.sort_values("seed")["value"].tolist()

    (mean_a, std_a), (mean_b, std_b) = mean_std(values(better)), mean_std(values(worse))
    gap = mean_a - mean_b
    if gap > std_a + std_b:
        verdict = "holds here (the gap exceeds the seed spread)"
    elif gap > 0:
        verdict = "not confirmed here (same direction, but within the seed spread)"
    else:
        verdict = "does not hold here"
    return (f"{better} {metric.upper()} {mean_a:.3f} ± {std_a:.3f} vs {worse} {mean_b:.3f} ± {std_b:.3f} "
            f"(gap {gap:+.3f}): {verdict}")


def _markdown(frame: pd.DataFrame) -> str:
    return frame.to_markdown()


def fit_diagnostics(histories: pd.DataFrame, mined: dict) -> list[str]:
    """Last-round training loss against the validation MRR gain: a loss near zero with no MRR gain means the
    model fits the few positive answers it sees rather than learning to match."""
    lines = []
    positives = sum(client["distinct_positives"] for client in mined.values())
    for algorithm, frame in histories.groupby("algorithm", sort=False):
        by_round = frame.groupby("round")[["train_loss", "valid_mrr"]].mean()
        first, last = by_round.iloc[0], by_round.iloc[-1]
        gain = last["valid_mrr"] - first["valid_mrr"]
        line = (f"{algorithm}: training loss {first['train_loss']:.3f} -> {last['train_loss']:.3f}, validation MRR "
                f"{first['valid_mrr']:.3f} -> {last['valid_mrr']:.3f} (round 1 -> {int(by_round.index[-1])}, mean over seeds)")
        if last["train_loss"] < 0.1 and gain < 0.02:
            line += (f"; the loss is near zero while validation MRR does not improve: with only {positives} distinct "
                     "positive answers in all clients' training data, the model fits them instead of learning to match")
        lines.append(line)
    return lines


def chance_margins(results: pd.DataFrame, chance: dict, algorithms: list[str]) -> str:
    """Each method's overall MRR over the random-ranking level of the same candidates."""
    level = chance["overall"]["mrr"]
    margins = []
    for algorithm in algorithms:
        rows = results[(results.algorithm == algorithm) & (results.client == OVERALL) & (results.metric == "mrr")]
        mean, std = mean_std(rows["value"].tolist())
        margins.append(f"{algorithm} {mean - level:+.3f} (± {std:.3f})")
    return f"Margin over chance (random ranking of the same test candidates, overall MRR {level:.3f}): " + ", ".join(margins) + "."


def render_report(params: Params, results: pd.DataFrame, chance: dict, histories: pd.DataFrame, partition: dict,
                  mined: dict, communication: pd.DataFrame) -> str:
    train, model, seeds = params.train, params.model, params.train.seeds
    algorithms = train.algorithms
    clients = pd.DataFrame({
        client: {
            "train questions available": info["train_questions_available"],
            "train questions used": info["questions"].get("train", 0),
            "valid questions": info["questions"].get("valid", 0),
            "test questions": info["questions"].get("test", 0),
            "answer pool": info["answer_pool"],
            "training triples": mined[client]["triples"],
            "distinct positive answers": mined[client]["distinct_positives"],
            "test candidates": mined[client]["candidates"].get("test", 0),
        }
        for client, info in partition["clients"].items()
    }).T
    clients.index.name = "client"
    lines = [
        f"# {params.report.title}",
        "",
        f"Written by the `report` stage of `dvc repro` at scale `{params.scale}`. Every number below was computed by "
        "the pipeline from its own outputs; nothing is typed in by hand.",
        "",
        "## Setup",
        "",
        f"- Data source: `{params.data.source}`"
        + (" — InsuranceQA V2 in English from the PyPI package `insuranceqa-data` 1.0 (GPL-3.0 package; research use "
           "only per the data's authors); one client per insurance domain." if params.data.source == "embedded" else "."),
        f"- Caps (scale `{params.scale}`): the largest client keeps {params.data.max_questions_per_client or 'all'} training "
        f"questions and the others are scaled down in proportion (at least {params.data.min_questions_per_client}); "
        f"{params.data.max_eval_questions_per_client or 'all'} valid and test questions per client.",
        f"- Negatives: top-{params.mine.negatives_per_question} non-gold BM25 ({params.mine.backend}, k1={params.mine.k1}, "
        f"b={params.mine.b}) answers from the client's training answer pool; test candidates are the gold answers plus "
        f"the top-{params.mine.eval_negatives} non-gold BM25 answers from the client's whole pool.",
        f"- Model: cross-encoder on `{model.backbone}`"
        + (f" (random init, {model.tiny.layers} layers, hidden {model.tiny.hidden}, WordPiece vocabulary of "
           f"{model.tiny.vocab_size} trained on the clients' training text)" if model.backbone == "tiny" else "")
        + f", max length {model.max_length}, pairwise hinge loss, Adam lr {train.lr} with {train.warmup_fraction:.0%} warm-up "
        f"then linear decay, batch {train.batch_size}.",
        f"- Federation: {train.rounds} rounds x {train.local_epochs} local epoch(s), "
        f"{'all' if train.clients_per_round == 0 else train.clients_per_round} clients per round, {train.weighting} "
        f"averaging; FedProx mu = {train.fedprox_mu}; FedPer keeps the scoring head private.",
        f"- Seeds: {', '.join(map(str, seeds))}. MAP and MRR with pytrec_eval; 'overall' is the unweighted mean over clients.",
        "",
        _markdown(clients),
        "",
    ]
    for metric in ("map", "mrr"):
        lines += [f"## Test {metric.upper()} (mean ± std over {len(seeds)} seeds)", "", _markdown(summary_table(results, metric, algorithms, chance)), ""]
    lines += ["## Communication per round and memory held (bytes)", "",
              "Upload and download are counted by the channel; memory is what the engine keeps besides its one model.", "",
              _markdown(communication), ""]
    claims = [chance_margins(results, chance, algorithms)]
    if {"fedavg", "individual"} <= set(algorithms):
        claims.append("FedMatch Table 3: FedAvg beats individual training overall. " + compare(results, "fedavg", "individual", "mrr"))
    if {"centralised", "fedavg"} <= set(algorithms):
        claims.append("Pooling the data (not private) as an upper bound of FedAvg. " + compare(results, "centralised", "fedavg", "mrr"))
    if {"fedper", "fedavg"} <= set(algorithms):
        claims.append("A private head (FedPer) versus FedAvg. " + compare(results, "fedper", "fedavg", "mrr"))
    if claims:
        lines += ["## Claims checked at this scale", ""] + [f"- {claim}" for claim in claims] + [""]
    lines += ["## Fit diagnostics", ""] + [f"- {line}" for line in fit_diagnostics(histories, mined)] + [""]
    lines += [
        "## Figures",
        "",
        "![convergence](figures/convergence.png)",
        "",
        "![test MRR per client](figures/test_mrr.png)",
        "",
        "![test MAP per client](figures/test_map.png)",
        "",
    ]
    if params.scale == "embedded":
        lines += [
            "## What this run is and is not",
            "",
            "The embedded scale is a fast, offline check of the whole pipeline on real InsuranceQA text with a tiny "
            "randomly initialised BERT. It is not the paper's setting (pretrained BERT-base, the five FedQA "
            "collections): its absolute numbers are not comparable with the paper's tables.",
            "",
        ]
    return "\n".join(lines)


def readme_block(results: pd.DataFrame, chance: dict, params: Params) -> str:
    """The results table and figure shown in the README, framed by markers the report stage rewrites."""
    table = summary_table(results, "mrr", params.train.algorithms, chance)
    return "\n".join([
        README_START,
        f"Test MRR at scale `{params.scale}` (mean ± std over {len(params.train.seeds)} seeds; full report: "
        "[reports/report.md](reports/report.md)):",
        "",
        table.to_markdown(),
        "",
        chance_margins(results, chance, params.train.algorithms),
        "",
        "![convergence](reports/figures/convergence.png)",
        README_END,
    ])


def replace_readme_block(readme: str, block: str) -> str:
    if README_START not in readme or README_END not in readme:
        return readme
    head, rest = readme.split(README_START, 1)
    return head + block + rest.split(README_END, 1)[1]
