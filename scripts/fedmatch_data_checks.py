"""FedMatch's data checks (issue 17): truncation, gold answers among the negatives, label direction and ties.

At CPU scale the pooled reference ranks FiQA's candidates no better than a random order. This script measures,
on a checkout's mined data, the four things that could make a sound model look that way, and prints Markdown
tables of counts, lengths and metrics (never dataset text):

    python scripts/fedmatch_data_checks.py /tmp/fm --reference /tmp/fm/data/checkpoints/fedmatch-sanity/lr0.0001 \
        > reports/cpu/fedmatch/data-checks.md

1. Truncation: how much of each (question, answer) pair survives ``max_length`` tokens, and BM25's MAP when it
   sees only the answer prefix the model sees.
2. Gold among negatives: training negatives and non-relevant candidates that are a gold answer of their question
   (same id, same normalised text, nearly the same words, or the same model input after truncation).
3. Label direction: a score equal to the label, and its negation, through ``qrels_and_run`` and both metric
   libraries; the hinge loss's gradient on a real training batch; optionally a trained reference's own scores.
4. Ties: the metric's tie rule on a constant score against the exact random expectation, and the ties real
   scorers produce (equal BM25 scores, identical model inputs).
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file

from fedrepro.data.partition import same_text_gold
from fedrepro.data.schema import bm25_tokens
from fedrepro.fl.engine import PARAM, POOLED
from fedrepro.io import read_json, read_table
from fedrepro.metrics.ranking import cross_check_ranx, random_ranking_metrics, ranking_metrics
from fedrepro.models.backbone import build_encoder, load_tokenizer
from fedrepro.models.cross_encoder import CrossEncoder
from fedrepro.retrieval.bm25 import score_candidates
from fedrepro.tasks.qa import ClientQAData, QAMatchingTask, qrels_and_run

SPLIT = "valid"  # the split the sanity protocol chooses on (reports/cpu/fedmatch/sanity-fiqa-own-caps/sanity.md)
NEAR_DUPLICATE = 0.8  # word-set Jaccard at or above which two answers count as nearly the same text
RANDOM_DRAWS = 5000


def normalised(text: str) -> str:
    """Text compared up to whitespace and case: what makes two answers 'the same answer'."""
    return " ".join(str(text).lower().split())


def jaccard(first: str, second: str) -> float:
    a, b = set(normalised(first).split()), set(normalised(second).split())
    return len(a & b) / len(a | b) if a | b else 1.0


def kept_answers(tokenizer, questions: pd.Series, answers: pd.Series, max_length: int) -> pd.DataFrame:
    """Per pair, encoded as ``QAMatchingTask._encode`` does: answer and question tokens in full and kept, the kept
    answer prefix (its text up to the last kept token, from the offsets) and the model input ids."""
    encoded = tokenizer(
        list(questions),
        list(answers),
        truncation="longest_first",
        max_length=max_length,
        return_token_type_ids=True,
        return_offsets_mapping=True,
    )
    full_answer = [len(ids) for ids in tokenizer(list(answers), add_special_tokens=False)["input_ids"]]
    full_question = [len(ids) for ids in tokenizer(list(questions), add_special_tokens=False)["input_ids"]]
    rows = []
    for i, answer in enumerate(answers):
        sequence = encoded.sequence_ids(i)
        ends = [end for (_, end), part in zip(encoded["offset_mapping"][i], sequence) if part == 1]
        rows.append(
            {
                "answer_full": full_answer[i],
                "answer_kept": len(ends),
                "question_full": full_question[i],
                "question_kept": sequence.count(0),
                "prefix": str(answer)[: ends[-1]] if ends else "",
                "input": tuple(encoded["input_ids"][i]),
            }
        )
    return pd.DataFrame(rows)


class PoolBM25:
    """Lucene BM25 (``fedrepro.retrieval.bm25``'s formula) of any text against a fixed pool's idf and mean length,
    so an answer cut to its kept prefix is scored with the statistics of the pool it was mined from."""

    def __init__(self, pool: pd.DataFrame, k1: float, b: float) -> None:
        docs = [bm25_tokens(t) for t in pool["answer"]]
        self.df = Counter(term for doc in docs for term in set(doc))
        self.n, self.avgdl, self.k1, self.b = len(docs), sum(map(len, docs)) / len(docs), k1, b

    def score(self, question: str, answer: str) -> float:
        tokens = bm25_tokens(answer)
        tf, norm = Counter(tokens), self.k1 * (1 - self.b + self.b * len(tokens) / self.avgdl)
        return sum(
            math.log(1 + (self.n - self.df[t] + 0.5) / (self.df[t] + 0.5)) * tf[t] / (tf[t] + norm)
            for t in bm25_tokens(question)
            if tf[t]
        )


def mean_ap(scored: pd.DataFrame) -> float:
    return ranking_metrics(*qrels_and_run(scored))["map"]


def eval_asked_in_train(pairs: pd.DataFrame, collection: pd.DataFrame) -> int:
    """Kept valid/test questions whose text (up to case and whitespace) is a training question's anywhere in the
    collection, under another id: the question itself, with another gold answer, is learned from in training."""
    train_texts = set(collection.loc[collection["split"] == "train", "question"].map(normalised))
    evaluated = pairs[pairs["split"] != "train"].drop_duplicates("question_id")
    return int(evaluated["question"].map(normalised).isin(train_texts).sum())


def truncation_row(frame: pd.DataFrame) -> dict:
    share = frame["answer_kept"] / frame["answer_full"].clip(lower=1)
    return {
        "pairs": len(frame),
        "answer truncated": f"{(frame['answer_kept'] < frame['answer_full']).mean():.1%}",
        "question truncated": f"{(frame['question_kept'] < frame['question_full']).mean():.1%}",
        "answer tokens mean / median": f"{frame['answer_full'].mean():.1f} / {frame['answer_full'].median():.0f}",
        "kept mean / median": f"{frame['answer_kept'].mean():.1f} / {frame['answer_kept'].median():.0f}",
        "kept share, median": f"{share.median():.1%}",
    }


def matched_terms_kept(questions: pd.Series, answers: pd.Series, prefixes: pd.Series) -> float:
    """Share of the occurrences of question terms in the answers that lie in the kept prefix (what BM25 matches on)."""
    full = kept = 0
    for question, answer, prefix in zip(questions, answers, prefixes):
        terms = set(bm25_tokens(question))
        full += sum(t in terms for t in bm25_tokens(answer))
        kept += sum(t in terms for t in bm25_tokens(prefix))
    return kept / full if full else float("nan")


def worst_ap(candidates: int, relevant: int) -> float:
    """AP with every relevant answer ranked below every other candidate."""
    return sum(i / (candidates - relevant + i) for i in range(1, relevant + 1)) / relevant


def random_map_spread(scored: pd.DataFrame, seed: int = 0) -> tuple[float, float]:
    """5th and 95th percentiles of the MAP of uniformly random orders of the candidates: how far chance alone moves
    a MAP over this split's few questions."""
    rng, per_question = np.random.default_rng(seed), []
    for _, group in scored.groupby("question_id"):
        labels = (group["relevance"] > 0).to_numpy()
        ranked = labels[np.argsort(rng.random((RANDOM_DRAWS, len(labels))), axis=1)]
        hits = np.cumsum(ranked, axis=1)
        per_question.append((ranked * hits / np.arange(1, len(labels) + 1)).sum(axis=1) / labels.sum())
    draws = np.mean(per_question, axis=0)
    return float(np.percentile(draws, 5)), float(np.percentile(draws, 95))


def reversed_ids(scored: pd.DataFrame) -> pd.DataFrame:
    """``scored`` with answer ids renamed so that ascending order of the new ids is descending order of the old
    (trec_eval's own tie rule), to see whether the metric's tie rule moves a real scorer's MAP."""
    order = scored["answer_id"].astype(str).rank(method="dense", ascending=False).astype(int)
    return scored.assign(answer_id=order.map("{:09d}".format))


def gold_tied_with_non_gold(questions, keys, relevant) -> int:
    """Gold candidates sharing their key (a score, a model input) with a non-gold candidate of the same question:
    the only ties that move AP, and that the tie rule then decides."""
    frame = pd.DataFrame({"q": list(questions), "key": list(keys), "gold": list(relevant)})
    groups = frame.groupby(["q", "key"])["gold"].agg(["sum", "size"])
    return int(groups.loc[(groups["sum"] > 0) & (groups["sum"] < groups["size"]), "sum"].sum())


def hinge_gradient(tokenizer, data: ClientQAData, max_length: int) -> dict:
    """One real training batch through ``train_batches`` and ``forward``: does the batch hold the triples' positives
    first, and does the hinge loss's gradient raise the positives' scores and lower the negatives'?"""

    class ScoreByRow(torch.nn.Module):  # one free score per batch row, so the gradient is on the scores themselves
        def __init__(self, rows: int) -> None:
            super().__init__()
            self.scores = torch.nn.Parameter(torch.zeros(rows))

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.scores[: input_ids.shape[0]], None

    size = 8
    task = QAMatchingTask(
        {"c": ClientQAData(data.triples.head(size), data.candidates.head(1))},
        tokenizer,
        lambda: None,
        max_length,
        batch_size=size,
    )
    batch = next(task.train_batches(["c"], torch.Generator().manual_seed(0)))
    first_half = {
        tuple(ids[mask.bool()].tolist()) for ids, mask in zip(batch["input_ids"][:size], batch["attention_mask"][:size])
    }
    model = ScoreByRow(2 * size)
    task.forward(model, batch).loss.backward()
    return {
        "batch's first half = the triples' positives": first_half
        == {tuple(e["input_ids"]) for e in task.positives["c"]},
        "largest dLoss/dscore, positives": float(model.scores.grad[:size].max()),
        "smallest dLoss/dscore, negatives": float(model.scores.grad[size:].min()),
    }


def load_reference(
    checkpoint: Path, tokenizer, backbone: str, keep_layers: int, pooling: str, max_length: int
) -> CrossEncoder:
    """The pooled reference's last checkpoint (``fedrepro.fedmatch.sanity.pooled_reference``) as a scoring model."""
    model = CrossEncoder(
        build_encoder(backbone, len(tokenizer), max_length=max_length, keep_layers=keep_layers), pooling
    )
    tensors = {
        **load_file(str(checkpoint / "latest/global.safetensors")),
        **load_file(str(checkpoint / "latest/clients" / f"{POOLED}.safetensors")),
    }
    model.load_state_dict({k[len(PARAM) :]: v for k, v in tensors.items() if k.startswith(PARAM)}, strict=True)
    return model.eval()


def reference_rows(
    model: CrossEncoder, checkpoint: Path, clients: dict[str, ClientQAData], tokenizer, max_length: int
) -> list[dict]:
    """Per collection, the reference's own validation scores through ``QAMatchingTask.score``: MAP of the scores and of
    their negation, the MAP its run recorded, gold tied with a non-gold, and training triples ranked right."""
    recorded = read_json(checkpoint / "latest/state.json")["history"][-1]
    task = QAMatchingTask(clients, tokenizer, lambda: model, max_length, batch_size=16)
    rows = []
    with torch.no_grad():
        for client in task.client_ids:
            scored = task.score(model, client, SPLIT)
            right = []
            for batch in task.train_batches([client], torch.Generator().manual_seed(0)):
                scores, _ = model(**batch)
                right += (scores[: len(scores) // 2] > scores[len(scores) // 2 :]).tolist()
            rows.append(
                {
                    "collection": client,
                    f"recorded {SPLIT} MAP (round {recorded['round']})": recorded[SPLIT][client]["map"],
                    "MAP, its scores": mean_ap(scored),
                    "MAP, negated scores": mean_ap(scored.assign(score=-scored["score"])),
                    "gold tied with a non-gold": gold_tied_with_non_gold(
                        scored["question_id"], scored["score"], scored["relevance"] > 0
                    ),
                    "training triples with positive > negative": f"{np.mean(right):.1%}",
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "checkout",
        type=Path,
        help="a checkout whose prepare, fedmatch_partition and fedmatch_mine stages ran "
        "(data/prepared/qa, data/partition/qa, data/mined)",
    )
    parser.add_argument("--backbone", default="minilm", help="model.backbone of the checked scale")
    parser.add_argument("--max-length", type=int, default=64, help="model.max_length of the checked scale")
    parser.add_argument(
        "--longer", type=int, nargs="*", default=[128, 256, 512], help="other lengths to score BM25 prefixes at"
    )
    parser.add_argument("--k1", type=float, default=1.2, help="mine.k1")
    parser.add_argument("--b", type=float, default=0.75, help="mine.b")
    parser.add_argument("--backend", default="bm25s", help="mine.backend")
    parser.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="checkpoint directory of a pooled reference (data/checkpoints/fedmatch-sanity/lr<lr>) to score",
    )
    parser.add_argument("--keep-layers", type=int, default=2, help="model.keep_layers of the reference")
    parser.add_argument("--pooling", default="mean", help="fedmatch.settings.pooling of the reference")
    args = parser.parse_args()
    mined, partition, prepared = (args.checkout / f"data/{name}" for name in ("mined", "partition/qa", "prepared/qa"))
    tokenizer = load_tokenizer(args.backbone, args.checkout / "data/tokenizer")
    clients = {
        p.name: ClientQAData(read_table(p / "triples.parquet"), read_table(p / "candidates.parquet"))
        for p in sorted(mined.iterdir())
        if p.is_dir()
    }
    tables: dict[str, list[dict]] = {
        name: [] for name in ("size", "truncation", "bm25", "gold", "label", "hinge", "ties")
    }
    for client, data in clients.items():
        triples, candidates = data.triples, data.candidates
        pairs, pool = read_table(partition / client / "pairs.parquet"), read_table(partition / client / "pool.parquet")
        collection = read_table(prepared / client / "pairs.parquet")
        positives = kept_answers(tokenizer, triples["question"], triples["positive"], args.max_length)
        negatives = kept_answers(tokenizer, triples["question"], triples["negative"], args.max_length)
        evaluated = kept_answers(tokenizer, candidates["question"], candidates["answer"], args.max_length)
        gold = (candidates["relevance"] > 0).to_numpy()
        valid = (candidates["split"] == SPLIT).to_numpy()
        scored, valid_kept = candidates[valid], evaluated[valid]
        golds_per_question = pairs.groupby("question_id").size()
        tables["size"].append(
            {
                "collection": client,
                "training questions": triples["question_id"].nunique(),
                "training triples": len(triples),
                "distinct training positives": triples["positive_id"].nunique(),
                "gold answers per question (mean / max)": (
                    f"{golds_per_question.mean():.2f} / {golds_per_question.max()}"
                ),
                f"{SPLIT} questions": scored["question_id"].nunique(),
                f"{SPLIT} candidates": len(scored),
                "answer pool": len(pool),
                "duplicate texts in the pool": int(pool["answer"].map(normalised).duplicated().sum()),
                "eval questions asked in train (same text)": eval_asked_in_train(pairs, collection),
            }
        )

        # 1. truncation, and BM25 on what the model sees
        for name, frame in (
            ("train positives", positives),
            ("train negatives", negatives),
            ("eval gold", evaluated[gold]),
            ("eval non-gold", evaluated[~gold]),
        ):
            tables["truncation"].append({"collection": client, "pairs of": name, **truncation_row(frame)})
        bm25 = PoolBM25(pool, args.k1, args.b)
        library = score_candidates(scored, pool, args.backend, k1=args.k1, b=args.b)
        reimplemented = [bm25.score(q, a) for q, a in zip(scored["question"], scored["answer"])]
        assert np.allclose(reimplemented, library["score"], atol=1e-6), (
            f"{client}: the BM25 re-implementation differs from the library's"
        )
        row = {"collection": client, "BM25, full answers": mean_ap(library)}
        for length in [args.max_length, *args.longer]:
            prefixes = kept_answers(tokenizer, scored["question"], scored["answer"], length)["prefix"]
            prefix_scores = [bm25.score(q, p) for q, p in zip(scored["question"], prefixes)]
            row[f"BM25, prefix at {length}"] = mean_ap(scored.assign(score=prefix_scores))
        row["random order"] = random_ranking_metrics(*qrels_and_run(scored.assign(score=0.0)))["map"]
        for name, mask in (("gold", gold[valid]), ("non-gold", ~gold[valid])):
            row[f"question terms kept, {name}"] = matched_terms_kept(
                scored["question"][mask], scored["answer"][mask], valid_kept["prefix"][mask]
            )
        tables["bm25"].append(row)

        # 2. gold among negatives
        gold_ids = pairs.groupby("question_id")["answer_id"].agg(set).to_dict()
        gold_texts = pairs.groupby("question_id")["answer"].agg(list).to_dict()
        gold_inputs: dict[str, set] = {}
        gold_pairs = [
            *zip(triples["question_id"], positives["input"]),
            *zip(candidates["question_id"][gold], evaluated["input"][gold]),
        ]
        for qid, tokens in gold_pairs:
            gold_inputs.setdefault(qid, set()).add(tokens)
        twins = same_text_gold(pairs, collection)
        twin_gold = twins.groupby("question_id")["answer_id"].agg(set).to_dict()
        non_gold = candidates[~gold]
        for name, qids, aids, texts, inputs in (
            (
                "train negatives",
                triples["question_id"],
                triples["negative_id"],
                triples["negative"],
                negatives["input"],
            ),
            (
                "eval non-gold",
                non_gold["question_id"],
                non_gold["answer_id"],
                non_gold["answer"],
                evaluated["input"][~gold],
            ),
        ):
            rows = list(zip(qids, aids, texts, inputs))
            tables["gold"].append(
                {
                    "collection": client,
                    "rows": name,
                    "count": len(rows),
                    "id is gold": sum(a in gold_ids[q] for q, a, _, _ in rows),
                    "text = a gold text": sum(
                        normalised(t) in {normalised(g) for g in gold_texts[q]} for q, _, t, _ in rows
                    ),
                    f"words ~ a gold's (Jaccard >= {NEAR_DUPLICATE})": sum(
                        max(jaccard(t, g) for g in gold_texts[q]) >= NEAR_DUPLICATE for q, _, t, _ in rows
                    ),
                    "gold of a same-text question": sum(a in twin_gold.get(q, ()) for q, a, _, _ in rows),
                    f"model input = a gold's (at {args.max_length})": sum(
                        i in gold_inputs.get(q, ()) for q, _, _, i in rows
                    ),
                }
            )

        # 3. label direction
        labels = scored["relevance"].astype(float)
        sizes = scored.groupby("question_id").agg(
            candidates=("answer_id", "size"), relevant=("relevance", lambda r: int((r > 0).sum()))
        )
        tables["label"].append(
            {
                "collection": client,
                "MAP, score = label": mean_ap(scored.assign(score=labels)),
                "MAP (ranx), score = label": cross_check_ranx(*qrels_and_run(scored.assign(score=labels)))["map"],
                "MAP, score = -label": mean_ap(scored.assign(score=-labels)),
                "MAP (ranx), score = -label": cross_check_ranx(*qrels_and_run(scored.assign(score=-labels)))["map"],
                "worst possible MAP": float(
                    np.mean([worst_ap(n, r) for n, r in zip(sizes["candidates"], sizes["relevant"])])
                ),
            }
        )
        tables["hinge"].append({"collection": client, **hinge_gradient(tokenizer, data, args.max_length)})

        # 4. ties
        rank_in_question = scored.groupby("question_id")["answer_id"].rank(method="first") - 1
        position = rank_in_question / (scored.groupby("question_id")["answer_id"].transform("size") - 1)
        low, high = random_map_spread(scored)
        tables["ties"].append(
            {
                "collection": client,
                "MAP, constant score (tie rule)": mean_ap(scored.assign(score=0.0)),
                "MAP, random order (exact)": row["random order"],
                "random order, 5th-95th percentile": f"{low:.4f}-{high:.4f}",
                "gold's mean position in id order (0 first, 1 last)": float(position[gold[valid]].mean()),
                "gold tied with a non-gold, BM25": gold_tied_with_non_gold(
                    library["question_id"], library["score"], gold[valid]
                ),
                "BM25 MAP, ties by ascending / descending id": (
                    f"{mean_ap(library):.4f} / {mean_ap(reversed_ids(library)):.4f}"
                ),
                f"gold tied with a non-gold, model input at {args.max_length}": gold_tied_with_non_gold(
                    scored["question_id"], valid_kept["input"], gold[valid]
                ),
                "gold": int(gold[valid].sum()),
            }
        )

    reference = None
    if args.reference:
        model = load_reference(
            args.reference, tokenizer, args.backbone, args.keep_layers, args.pooling, args.max_length
        )
        reference = reference_rows(model, args.reference, clients, tokenizer, args.max_length)
    print(render(args, tables, reference))


def render(args, tables: dict[str, list[dict]], reference: list[dict] | None) -> str:
    table = lambda name: pd.DataFrame(tables[name]).to_markdown(index=False, floatfmt=".4f")  # noqa: E731
    lines = [
        "# FedMatch data checks (issue 17)",
        "",
        f"Written by `scripts/fedmatch_data_checks.py` on the CPU-scale mined data: backbone {args.backbone}, max "
        f"length {args.max_length}, BM25 ({args.backend}) k1 {args.k1}, b {args.b}. Metric tables are on the {SPLIT} "
        "split, the one the sanity protocol (sanity.md) chooses on. Only counts, lengths and metrics; no dataset text.",
        "",
        "## The data checked",
        "",
        table("size"),
        "",
        "## 1. Truncation",
        "",
        f"Pairs whose answer (or question) loses word pieces at {args.max_length} tokens of `[CLS] q [SEP] a [SEP]` "
        '(`truncation="longest_first"`, as `QAMatchingTask` encodes), answer length in word pieces without special '
        "tokens, and how much of it is kept (eval = valid + test candidates).",
        "",
        table("truncation"),
        "",
        "BM25's MAP when each candidate is cut to the answer prefix the model sees at each length (same pool "
        "statistics; full answers reproduce sanity.md's BM25 baseline), and the share of the question terms' "
        "occurrences in the answers that lie inside the prefix kept at the model's length.",
        "",
        table("bm25"),
        "",
        "## 2. Gold answers among the negatives",
        "",
        "Training negatives and non-relevant evaluation candidates that are a gold answer of their own question: by "
        "id, by text after whitespace and case normalisation, by nearly the same words, as a gold answer of another "
        "question of the whole collection with the same normalised text (`fedrepro.data.partition.same_text_gold`, "
        "which the mine stage now excludes), or with exactly the model input of one of the question's gold answers. "
        "Eval = valid + test.",
        "",
        table("gold"),
        "",
        "## 3. Label direction",
        "",
        "A score equal to the relevance label, and its negation, through `qrels_and_run` and pytrec_eval / ranx "
        "(worst possible MAP: every gold answer below every other candidate).",
        "",
        table("label"),
        "",
        "The hinge loss on one real training batch of 8 triples through `train_batches` and `forward`, one free score "
        "per row: a negative dLoss/dscore means gradient descent raises that score.",
        "",
        table("hinge"),
        "",
    ]
    if reference is not None:
        lines += [
            f"The pooled reference of `{args.reference.name}` (keep_layers {args.keep_layers}, {args.pooling} pooling, "
            "last round) rescored here through `QAMatchingTask.score`, against what its run recorded.",
            "",
            pd.DataFrame(reference).to_markdown(index=False, floatfmt=".4f"),
            "",
        ]
    lines += [
        "## 4. Ties",
        "",
        "A constant score ranked by the metric's tie rule (ascending answer id) against the exact expectation of a "
        f"random order, and the spread of random orders' MAP over these questions ({RANDOM_DRAWS} draws); where gold "
        "answers sit in ascending-id order; and the ties real scorers produce: gold answers whose BM25 score, or whose "
        "model input (hence score), equals a non-gold candidate's.",
        "",
        table("ties"),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
