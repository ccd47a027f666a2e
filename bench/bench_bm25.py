"""Benchmark BM25 mining on InsuranceQA V2 (shipped in the insuranceqa_data package, offline).

With ``--mirror DIR`` it first prints the time to mine the top-5 training negatives of all five FedQA
collections at full mirror size (every training question, each collection's whole training pool), as the
pipeline's fedmatch_mine stage does. Then it prints (a) the time to mine top-5 negatives for every training question
against the whole answer pool,
(b) bm25s vs rank-bm25 per-query speed on the same queries (rank-bm25 is slow, so it is timed on a subset
and scaled per query) and their top-10 overlap. Medians of repeats; timing is noisy, nothing is asserted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from importlib.resources import files

import pandas as pd

from fedrepro.data.partition import training_pool
from fedrepro.data.qa_collections import LOADERS, load_collection
from fedrepro.data.schema import normalise_space
from fedrepro.retrieval.bm25 import make_index, top_non_gold
from fedrepro.retrieval.mining import training_triples


def _load(name: str) -> dict:
    with gzip.open(files("insuranceqa_data").joinpath(name).open("rb")) as fh:
        return json.load(fh)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--answers", type=int, default=25_000, help="answer pool size for the speed ratio")
    ap.add_argument("--queries", type=int, default=2_000, help="queries timed with bm25s")
    ap.add_argument("--slow-queries", type=int, default=200, help="subset of those timed with rank-bm25")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mirror", help="raw-data mirror (e.g. ../shared/data/raw): also mine all five QA collections")
    args = ap.parse_args()

    if args.mirror:
        total = 0.0
        for name in sorted(LOADERS):
            collection = load_collection(name, args.mirror)
            pool = training_pool(collection.pairs, collection.answers)
            seconds, triples = _timed(lambda: training_triples(collection.pairs, pool, 5, "bm25s"))
            total += seconds
            questions = collection.pairs.loc[collection.pairs["split"] == "train", "question_id"].nunique()
            print(
                f"mirror {name}: {questions:,} train questions x {len(pool):,} answers -> "
                f"{len(triples):,} triples in {seconds:.2f} s"
            )
        print(f"mirror: all five collections mined (top-5 BM25 negatives, full size) in {total:.1f} s")

    answers_raw, train = _load("answers.json.gz"), _load("train.json.gz")
    answers = pd.DataFrame({"answer_id": list(answers_raw), "answer": [a["en"] for a in answers_raw.values()]})
    qids = sorted(train, key=int)
    questions = {q: normalise_space(train[q]["en"]) for q in qids}
    gold = {q: {str(a) for a in train[q]["answers"]} for q in qids}

    # (a) mining, as the pipeline does it: build the index over all answers, top-5 non-gold per question
    times = []
    for _ in range(args.repeats):
        sec, neg = _timed(lambda: top_non_gold(questions, gold, answers, k=5))
        times.append(sec)
    print(
        f"(a) mine top-5 negatives: {len(questions):,} train questions x {len(answers):,} answers, bm25s: "
        f"median {statistics.median(times):.2f} s over {args.repeats} runs (index build included); "
        f"{len(neg):,} rows, {(neg.groupby('question_id').size() < 5).sum()} question(s) with < 5"
    )

    # (b) speed ratio and agreement on the same pool and queries
    pool = answers.sort_values("answer_id", key=lambda s: s.astype(int)).head(args.answers)
    ids, texts = pool["answer_id"].tolist(), pool["answer"].tolist()
    queries = [questions[q] for q in qids[: args.queries]]
    slow_q = queries[: args.slow_queries]
    fast, slow = make_index("bm25s"), make_index("rank-bm25")
    build_fast, _ = _timed(lambda: fast.build(ids, texts))
    build_slow, _ = _timed(lambda: slow.build(ids, texts))
    fast_runs = [_timed(lambda: fast.search(queries, 10)) for _ in range(args.repeats)]
    fast_per_q = statistics.median(sec for sec, _ in fast_runs) / len(queries)
    chunk = max(1, len(slow_q) // 4)
    slow_hits, slow_chunk_per_q = [], []
    for start in range(0, len(slow_q), chunk):
        sec, hits = _timed(lambda: slow.search(slow_q[start : start + chunk], 10))
        slow_hits += hits
        slow_chunk_per_q.append(sec / len(hits))
    slow_per_q = statistics.median(slow_chunk_per_q)
    fast_hits = fast_runs[0][1][: len(slow_q)]
    overlap = statistics.mean(
        len({d for d, _ in a} & {d for d, _ in b}) / max(len(a), len(b), 1) for a, b in zip(fast_hits, slow_hits)
    )
    same_order = sum([d for d, _ in a] == [d for d, _ in b] for a, b in zip(fast_hits, slow_hits))
    print(f"(b) pool {len(ids):,} answers, top-10, Lucene BM25 k1=1.5 b=0.75, whitespace+lowercase tokens")
    print(f"    index build: bm25s {build_fast:.2f} s, rank-bm25 {build_slow:.2f} s")
    print(f"    bm25s: {len(queries):,} queries, median {fast_per_q * 1e3:.3f} ms/query over {args.repeats} runs")
    print(
        f"    rank-bm25: timed on the first {len(slow_q)} of those queries only (too slow for all), "
        f"median of {len(slow_chunk_per_q)} chunks {slow_per_q * 1e3:.1f} ms/query "
        f"(~{slow_per_q * len(queries):.0f} s scaled to {len(queries):,} queries)"
    )
    print(f"    speed ratio (rank-bm25 ms/query / bm25s ms/query): {slow_per_q / fast_per_q:.0f}x (target >= 50x)")
    print(
        f"    top-10 overlap on those {len(slow_q)} queries: {overlap:.1%}; identical ordered lists: "
        f"{same_order}/{len(slow_q)}"
    )


if __name__ == "__main__":
    main()
