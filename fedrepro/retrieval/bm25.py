"""BM25 backends with one scoring rule, so negatives mined in-process match a user's Elasticsearch.

All backends use the paper's tokenisation (whitespace split + lower-case, no stemming or stopwords) and
Lucene's BM25 (idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf part tf / (tf + k1 * (1 - b + b * dl / avgdl))),
which is what Elasticsearch scores with. Hits are documents sharing at least one term with the query
(score > 0), best first, ties broken by ascending doc id so results are deterministic.
Known residual differences with Elasticsearch: Lucene stores document lengths lossily (one byte), so its
scores differ in the last digits and near-ties may swap; Java and Python disagree on a few exotic
whitespace/lower-case characters.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from fedrepro.data.schema import ANSWER_COLUMNS, bm25_tokens, check_columns
from fedrepro.errors import FedreproError

BACKENDS = ("bm25s", "rank-bm25", "elasticsearch")
Hits = list[tuple[str, float]]


class BM25Index:
    """Interface: ``build`` once over a document pool, then ``search`` batches of queries."""

    def build(self, doc_ids: list[str], texts: list[str]) -> None:
        raise NotImplementedError

    def search(self, queries: list[str], k: int) -> list[Hits]:
        raise NotImplementedError


def make_index(
    backend: str = "bm25s", k1: float = 1.5, b: float = 0.75, es_url: str | None = None, es_index: str = "fedrepro"
) -> BM25Index:
    """Pick a backend by its params.yaml name; fail on bad names and missing settings with the key to fix."""
    if backend == "bm25s":
        return _Bm25sIndex(k1, b)
    if backend == "rank-bm25":
        return _RankBm25Index(k1, b)
    if backend == "elasticsearch":
        if not es_url:
            raise FedreproError(
                "mine.es_url is required when mine.backend='elasticsearch' (e.g. http://localhost:9200)"
            )
        return _ElasticsearchIndex(k1, b, es_url, es_index)
    raise FedreproError(f"mine.backend={backend!r} is unknown; allowed: {list(BACKENDS)}")


def _check_pool(doc_ids: list[str], texts: list[str]) -> list[str]:
    doc_ids = [str(d) for d in doc_ids]
    if len(doc_ids) != len(texts):
        raise FedreproError(f"BM25 pool: {len(doc_ids)} doc ids but {len(texts)} texts")
    if not doc_ids:
        raise FedreproError("BM25 pool is empty: no answers to index")
    if len(set(doc_ids)) != len(doc_ids):
        dup = pd.Series(doc_ids)[pd.Series(doc_ids).duplicated()].iloc[0]
        raise FedreproError(f"BM25 pool: duplicate doc id {dup!r}")
    return doc_ids


def _check_k(k: int) -> None:
    if k < 1:
        raise FedreproError(f"BM25 search depth k={k}; must be >= 1")


class _InProcessIndex(BM25Index):
    """Shared top-k selection: the backends only differ in how they produce a full score vector."""

    def __init__(self, k1: float, b: float):
        self.k1, self.b = float(k1), float(b)

    def build(self, doc_ids: list[str], texts: list[str]) -> None:
        self.doc_ids = _check_pool(doc_ids, texts)
        # position of each doc in sorted-id order: an integer tie-break key for lexsort
        self.id_rank = np.empty(len(self.doc_ids), dtype=np.int64)
        self.id_rank[sorted(range(len(self.doc_ids)), key=self.doc_ids.__getitem__)] = np.arange(len(self.doc_ids))
        self._fit([bm25_tokens(t) for t in texts])

    def search(self, queries: list[str], k: int) -> list[Hits]:
        _check_k(k)
        return [self._top_k(self._scores(bm25_tokens(q)), k) for q in queries]

    def _top_k(self, scores: np.ndarray | None, k: int) -> Hits:
        if scores is None:
            return []
        cand = np.flatnonzero(scores > 0)
        if len(cand) > k:  # keep every doc tied with the k-th score so the id tie-break is exact
            kth = np.partition(scores[cand], len(cand) - k)[len(cand) - k]
            cand = cand[scores[cand] >= kth]
        cand = cand[np.lexsort((self.id_rank[cand], -scores[cand]))][:k]
        return [(self.doc_ids[i], float(scores[i])) for i in cand]

    def _fit(self, tokens: list[list[str]]) -> None:
        raise NotImplementedError

    def _scores(self, query_tokens: list[str]) -> np.ndarray | None:
        raise NotImplementedError


class _Bm25sIndex(_InProcessIndex):
    """bm25s: sparse precomputed scores, fast enough to mine every training question."""

    def _fit(self, tokens: list[list[str]]) -> None:
        import bm25s

        self.model = bm25s.BM25(k1=self.k1, b=self.b, method="lucene", dtype="float64")
        self.model.index(tokens, show_progress=False)

    def _scores(self, query_tokens: list[str]) -> np.ndarray | None:
        ids = self.model.get_tokens_ids(query_tokens)
        return self.model.get_scores_from_ids(ids) if ids else None


class _RankBm25Index(_InProcessIndex):
    """rank-bm25 with Lucene's idf, as an independent (slow) check of the bm25s scores."""

    def _fit(self, tokens: list[list[str]]) -> None:
        from rank_bm25 import BM25Okapi

        class LuceneOkapi(BM25Okapi):
            # BM25Okapi's idf is ln((N-df+.5)/(df+.5)) with an epsilon floor; Lucene adds 1 inside the log
            def _calc_idf(self, nd: dict[str, int]) -> None:
                for word, df in nd.items():
                    self.idf[word] = math.log(1 + (self.corpus_size - df + 0.5) / (df + 0.5))

        self.model = LuceneOkapi(tokens, k1=self.k1, b=self.b)

    def _scores(self, query_tokens: list[str]) -> np.ndarray | None:
        if not any(t in self.model.idf for t in query_tokens):
            return None
        # rank-bm25 keeps the classic (k1 + 1) factor; drop it to match Lucene's scale
        return self.model.get_scores(query_tokens) / (self.k1 + 1)


class _ElasticsearchIndex(BM25Index):
    """A user's cluster: same analyzer and similarity, one shard so df/avgdl are global like in-process."""

    BULK_DOCS = 2000
    MSEARCH_QUERIES = 200

    def __init__(self, k1: float, b: float, es_url: str, es_index: str):
        from elasticsearch import Elasticsearch

        self.k1, self.b, self.url, self.name = float(k1), float(b), es_url, es_index
        self.client = Elasticsearch(es_url, request_timeout=120)

    def body(self) -> dict[str, Any]:
        """Index settings and mappings: whitespace + lowercase analyzer and BM25(k1, b) on ``text``."""
        return {
            "settings": {
                "number_of_shards": 1,
                "number_of_replicas": 0,
                "similarity": {"fedrepro_bm25": {"type": "BM25", "k1": self.k1, "b": self.b}},
                "analysis": {
                    "analyzer": {
                        "fedrepro_ws_lower": {"type": "custom", "tokenizer": "whitespace", "filter": ["lowercase"]}
                    }
                },
            },
            "mappings": {
                "properties": {
                    "text": {"type": "text", "analyzer": "fedrepro_ws_lower", "similarity": "fedrepro_bm25"},
                    "doc_id": {"type": "keyword"},  # sort key for the deterministic tie-break
                }
            },
        }

    def _call(self, what: str, fn, *args, **kwargs):
        from elasticsearch import ApiError, TransportError

        try:
            return fn(*args, **kwargs)
        except (ApiError, TransportError) as err:
            raise FedreproError(f"Elasticsearch at mine.es_url={self.url!r} failed to {what}: {err}") from err

    def build(self, doc_ids: list[str], texts: list[str]) -> None:
        """Recreate index ``es_index`` (an existing one of that name is deleted) and bulk-load the pool."""
        doc_ids = _check_pool(doc_ids, texts)
        self._call("delete the old index", self.client.options(ignore_status=404).indices.delete, index=self.name)
        self._call("create the index", self.client.indices.create, index=self.name, **self.body())
        for start in range(0, len(doc_ids), self.BULK_DOCS):
            ops: list[dict[str, Any]] = []
            for doc_id, text in zip(doc_ids[start : start + self.BULK_DOCS], texts[start : start + self.BULK_DOCS]):
                ops += [{"index": {"_index": self.name, "_id": doc_id}}, {"doc_id": doc_id, "text": str(text)}]
            resp = self._call("bulk-index documents", self.client.bulk, operations=ops)
            if resp.get("errors"):
                first = next(i for i in resp["items"] if "error" in next(iter(i.values())))
                raise FedreproError(f"Elasticsearch at mine.es_url={self.url!r} rejected a document: {first}")
        self._call("refresh the index", self.client.indices.refresh, index=self.name)

    def search(self, queries: list[str], k: int) -> list[Hits]:
        _check_k(k)
        out: list[Hits] = []
        for start in range(0, len(queries), self.MSEARCH_QUERIES):
            searches: list[dict[str, Any]] = []
            for q in queries[start : start + self.MSEARCH_QUERIES]:
                searches += [
                    {"index": self.name},
                    {
                        "size": k,
                        "query": {"match": {"text": str(q)}},
                        "track_scores": True,
                        "_source": False,
                        "sort": [{"_score": "desc"}, {"doc_id": "asc"}],
                    },
                ]
            resp = self._call("search", self.client.msearch, searches=searches)
            for r in resp["responses"]:
                if "error" in r:
                    raise FedreproError(f"Elasticsearch at mine.es_url={self.url!r} failed a search: {r['error']}")
                out.append([(h["_id"], float(h["_score"])) for h in r["hits"]["hits"]])
        return out


def top_non_gold(
    questions: dict[str, str],
    gold: dict[str, set[str]],
    answers: pd.DataFrame,
    k: int,
    backend: str = "bm25s",
    **index_opts,
) -> pd.DataFrame:
    """Top-k BM25 answers per question that are not gold for it: FedMatch's hard negatives / candidates.

    Searches k + |gold| deep so k non-gold remain when the pool has enough matching answers (fewer otherwise).
    Ids are compared as strings. Rows are ordered by question id, then rank.
    """
    _check_k(k)
    answers = check_columns(answers, ANSWER_COLUMNS, "answers")
    index = make_index(backend, **index_opts)
    index.build(answers["answer_id"].astype(str).tolist(), answers["answer"].astype(str).tolist())
    qids = sorted(questions, key=str)
    gold_str = {str(q): {str(a) for a in gold.get(q, ())} for q in qids}
    depth = k + max((len(g) for g in gold_str.values()), default=0)
    hits = index.search([questions[q] for q in qids], depth)
    rows = []
    for qid, q_hits in zip(qids, hits):
        kept = [(a, s) for a, s in q_hits if a not in gold_str[str(qid)]][:k]
        rows += [(qid, a, rank, s) for rank, (a, s) in enumerate(kept, start=1)]
    frame = pd.DataFrame(rows, columns=["question_id", "answer_id", "rank", "score"])
    return frame.astype({"rank": "int64", "score": "float64"})


def score_candidates(
    candidates: pd.DataFrame, answers: pd.DataFrame, backend: str = "bm25s", **index_opts
) -> pd.DataFrame:
    """``candidates`` (question_id, question, answer_id, ...) with a ``score`` column: each candidate's BM25 score
    for its question over the index of ``answers`` (the pool the candidates were mined from, so the statistics
    are the mining's); 0 for a candidate sharing no term with its question. A BM25-only ranking of the very
    candidates a model ranks: the trivial baseline a trained matcher must beat.
    """
    answers = check_columns(answers, ANSWER_COLUMNS, "answers")
    index = make_index(backend, **index_opts)
    index.build(answers["answer_id"].astype(str).tolist(), answers["answer"].astype(str).tolist())
    questions = candidates.drop_duplicates("question_id").set_index("question_id")["question"]
    hits = index.search([str(q) for q in questions], len(answers))
    scores = {(str(qid), doc): score for qid, q_hits in zip(questions.index, hits) for doc, score in q_hits}
    keys = zip(candidates["question_id"].astype(str), candidates["answer_id"].astype(str))
    return candidates.assign(score=[scores.get(key, 0.0) for key in keys])
