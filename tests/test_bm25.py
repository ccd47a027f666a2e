"""BM25 backends agree, top_non_gold excludes gold, ordering is deterministic, errors name the parameter.

Elasticsearch is exercised against a fake server on 127.0.0.1 that records the REST calls and answers
searches with a tiny independent Lucene-BM25 scorer, so the whole client path up to HTTP is checked.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from fedrepro.errors import FedreproError
from fedrepro.retrieval.bm25 import make_index, score_candidates, top_non_gold

DOCS = {
    "a01": "Term life insurance pays a death benefit if you die during the term",
    "a02": "Whole life insurance builds cash value over time",
    "a03": "Your car insurance covers collision damage after the deductible",
    "a04": "Health insurance premiums depend on age and the plan you choose",
    "a05": "A deductible is the amount you pay before insurance pays",
    "a06": "Renters insurance protects your belongings from theft and fire",
    "a07": "You can borrow against the cash value of a whole life policy",
    "a08": "Disability insurance replaces income if you cannot work",
    "a09": "Home insurance covers fire damage to the house",
    "a10": "Annuities pay an income for life after retirement",
    "a11": "Long term care insurance pays for a nursing home",
    "a12": "The premium of term life insurance is lower than whole life",
}
QUERIES = [
    "What is whole life insurance cash value",
    "does car insurance cover collision",
    "How does a deductible work",
    "Can I get income if I cannot work",
    "FIRE damage to the house",
    "term life vs whole life premium",
]


def _index(backend: str, **opts):
    index = make_index(backend, **opts)
    index.build(list(DOCS), list(DOCS.values()))
    return index


def test_bm25s_and_rank_bm25_agree():
    fast, slow = _index("bm25s", k1=1.2, b=0.6), _index("rank-bm25", k1=1.2, b=0.6)
    for a, b in zip(fast.search(QUERIES, 5), slow.search(QUERIES, 5)):
        assert [d for d, _ in a] == [d for d, _ in b]
        assert [s for _, s in a] == pytest.approx([s for _, s in b], rel=1e-9)


def test_scores_are_lucene_bm25():
    hits = _index("bm25s").search(["cash value"], 2)[0]
    assert [d for d, _ in hits] == ["a02", "a07"]  # shorter doc wins
    assert hits[0][1] == pytest.approx(_lucene_bm25(DOCS, "cash value", 1.5, 0.75)["a02"])


def test_ties_broken_by_doc_id_and_no_zero_score_hits():
    index = make_index("bm25s")
    index.build(["d3", "d1", "d2", "d0"], ["same words", "same words", "same words", "unrelated"])
    assert [d for d, _ in index.search(["SAME"], 2)[0]] == ["d1", "d2"]
    assert [d for d, _ in index.search(["same"], 10)[0]] == ["d1", "d2", "d3"]
    assert index.search(["nothing matches"], 3) == [[]]


# --- top_non_gold -----------------------------------------------------------------------------------

ANSWERS = pd.DataFrame({"answer_id": list(DOCS), "answer": list(DOCS.values())})
QUESTIONS = {f"q{i}": q for i, q in enumerate(QUERIES)}
GOLD = {"q0": {"a02", "a07"}, "q1": {"a03"}, "q2": {"a05"}, "q3": {"a08"}, "q4": {"a09"}, "q5": {"a12", "a01"}}


def test_top_non_gold_excludes_gold_and_fills_k():
    neg = top_non_gold(QUESTIONS, GOLD, ANSWERS, k=3)
    assert list(neg.columns) == ["question_id", "answer_id", "rank", "score"]
    for qid, group in neg.groupby("question_id"):
        assert not set(group["answer_id"]) & GOLD[qid]
        assert list(group["rank"]) == list(range(1, len(group) + 1))
        assert group["score"].is_monotonic_decreasing
    # q0's gold answers are its top two hits; searching k + |gold| deep still yields 3 negatives
    assert neg.groupby("question_id").size().to_dict() == {q: 3 for q in QUESTIONS}


def test_top_non_gold_small_pool_and_determinism():
    pool = ANSWERS[ANSWERS["answer_id"].isin(["a02", "a07", "a12"])]
    neg = top_non_gold({"q0": QUERIES[0]}, GOLD, pool, k=5)
    assert neg["answer_id"].tolist() == ["a12"]  # only non-gold answer left
    first = top_non_gold(QUESTIONS, GOLD, ANSWERS, k=4)
    again = top_non_gold(dict(reversed(QUESTIONS.items())), GOLD, ANSWERS.iloc[::-1], k=4)
    pd.testing.assert_frame_equal(first, again)


def test_errors_name_the_parameter():
    with pytest.raises(FedreproError, match=r"mine\.backend='solr'.*bm25s.*rank-bm25.*elasticsearch"):
        make_index("solr")
    with pytest.raises(FedreproError, match=r"mine\.es_url"):
        make_index("elasticsearch")
    with pytest.raises(FedreproError, match="duplicate doc id 'x'"):
        make_index("bm25s").build(["x", "x"], ["a", "b"])
    with pytest.raises(FedreproError, match="missing column"):
        top_non_gold(QUESTIONS, GOLD, ANSWERS.rename(columns={"answer": "text"}), k=2)


# --- Elasticsearch through a fake server ---------------------------------------------------------------


def _lucene_bm25(docs: dict[str, str], query: str, k1: float, b: float) -> dict[str, float]:
    """Reference scorer, written from the Lucene formula independently of the library code."""
    toks = {d: t.lower().split() for d, t in docs.items()}
    n, avgdl = len(toks), sum(map(len, toks.values())) / len(toks)
    scores: dict[str, float] = {}
    for term in query.lower().split():
        df = sum(term in t for t in toks.values())
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for d, t in toks.items():
            tf = t.count(term)
            if tf:
                scores[d] = scores.get(d, 0.0) + idf * tf / (tf + k1 * (1 - b + b * len(t) / avgdl))
    return scores


class FakeES(BaseHTTPRequestHandler):
    requests: list[tuple[str, str, str]] = []
    index_body: dict = {}
    docs: dict[str, str] = {}

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _reply(self, status: int, payload: dict):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("X-Elastic-Product", "Elasticsearch")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        path = self.path.split("?")[0]
        FakeES.requests.append((self.command, path, body))
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if self.command == "DELETE":
            return self._reply(404, {"error": {"type": "index_not_found_exception"}, "status": 404})
        if self.command == "PUT" and path == "/fedrepro":
            FakeES.index_body = json.loads(body)
            return self._reply(200, {"acknowledged": True, "shards_acknowledged": True, "index": "fedrepro"})
        if path == "/_bulk":
            for action, source in zip(lines[::2], lines[1::2]):
                FakeES.docs[action["index"]["_id"]] = source["text"]
            items = [{"index": {"_id": a["index"]["_id"], "status": 201}} for a in lines[::2]]
            return self._reply(200, {"took": 1, "errors": False, "items": items})
        if path == "/fedrepro/_refresh":
            return self._reply(200, {"_shards": {"total": 1, "successful": 1, "failed": 0}})
        if path == "/_msearch":
            sim = FakeES.index_body["settings"]["similarity"]["fedrepro_bm25"]
            responses = []
            for search in lines[1::2]:
                scores = _lucene_bm25(FakeES.docs, search["query"]["match"]["text"], sim["k1"], sim["b"])
                ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[: search["size"]]
                hits = [{"_index": "fedrepro", "_id": d, "_score": s, "sort": [s, d]} for d, s in ranked]
                responses.append({"status": 200, "hits": {"total": {"value": len(scores)}, "hits": hits}})
            return self._reply(200, {"took": 1, "responses": responses})
        return self._reply(400, {"error": f"fake server: unexpected {self.command} {path}", "status": 400})

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


@pytest.fixture
def fake_es():
    FakeES.requests, FakeES.index_body, FakeES.docs = [], {}, {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeES)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_elasticsearch_requests_and_agreement(fake_es, monkeypatch):
    monkeypatch.setattr("fedrepro.retrieval.bm25._ElasticsearchIndex.MSEARCH_QUERIES", 4)  # two msearch calls
    es = _index("elasticsearch", k1=1.2, b=0.6, es_url=fake_es)
    es_hits = es.search(QUERIES, 5)
    calls = [(m, p) for m, p, _ in FakeES.requests]
    assert calls == [
        ("DELETE", "/fedrepro"),
        ("PUT", "/fedrepro"),
        ("PUT", "/_bulk"),
        ("POST", "/fedrepro/_refresh"),
        ("POST", "/_msearch"),
        ("POST", "/_msearch"),
    ]
    settings = FakeES.index_body["settings"]
    assert settings["similarity"]["fedrepro_bm25"] == {"type": "BM25", "k1": 1.2, "b": 0.6}
    assert settings["analysis"]["analyzer"]["fedrepro_ws_lower"] == {
        "type": "custom",
        "tokenizer": "whitespace",
        "filter": ["lowercase"],
    }
    assert settings["number_of_shards"] == 1
    text_field = FakeES.index_body["mappings"]["properties"]["text"]
    assert text_field == {"type": "text", "analyzer": "fedrepro_ws_lower", "similarity": "fedrepro_bm25"}
    bulk = [json.loads(line) for line in FakeES.requests[2][2].splitlines()]
    assert bulk[:2] == [{"index": {"_index": "fedrepro", "_id": "a01"}}, {"doc_id": "a01", "text": DOCS["a01"]}]
    assert len(bulk) == 2 * len(DOCS)
    search = [json.loads(line) for line in FakeES.requests[4][2].splitlines()]
    assert search[0] == {"index": "fedrepro"}
    assert search[1]["query"] == {"match": {"text": QUERIES[0]}} and search[1]["size"] == 5
    assert search[1]["sort"] == [{"_score": "desc"}, {"doc_id": "asc"}]
    in_process = _index("bm25s", k1=1.2, b=0.6).search(QUERIES, 5)
    assert len(es_hits) == len(QUERIES)
    for a, b in zip(es_hits, in_process):
        assert [d for d, _ in a] == [d for d, _ in b]
        assert [s for _, s in a] == pytest.approx([s for _, s in b], rel=1e-9)


def test_top_non_gold_through_elasticsearch(fake_es):
    via_es = top_non_gold(QUESTIONS, GOLD, ANSWERS, k=3, backend="elasticsearch", es_url=fake_es)
    pd.testing.assert_frame_equal(via_es, top_non_gold(QUESTIONS, GOLD, ANSWERS, k=3), rtol=1e-9)
    searches = [json.loads(line) for line in FakeES.requests[-1][2].splitlines()]
    assert {s["size"] for s in searches[1::2]} == {3 + 2}  # k + largest gold set


def test_elasticsearch_unreachable_names_es_url():
    with socket.socket() as sock:  # a free loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    index = make_index("elasticsearch", es_url=f"http://127.0.0.1:{port}")
    with pytest.raises(FedreproError, match=r"mine\.es_url='http://127\.0\.0\.1:\d+' failed to delete"):
        index.build(["a"], ["text"])


def test_score_candidates_gives_each_candidate_its_bm25_score_for_its_question():
    answers = pd.DataFrame({"answer_id": list(DOCS), "answer": list(DOCS.values())})
    # q3 ("Can I get income if I cannot work") shares no term with a02: score 0
    candidates = pd.DataFrame(
        {
            "question_id": ["q0", "q0", "q3", "q1"],
            "question": [QUERIES[0]] * 2 + [QUERIES[3], QUERIES[1]],
            "answer_id": ["a02", "a07", "a02", "a03"],
        }
    )
    scored = score_candidates(candidates, answers, k1=1.2, b=0.75)
    index = make_index("bm25s", k1=1.2, b=0.75)
    index.build(list(DOCS), list(DOCS.values()))
    expected = {
        (q, d): s for q, text in (("q0", QUERIES[0]), ("q1", QUERIES[1])) for d, s in index.search([text], 100)[0]
    }
    assert scored["score"].tolist() == pytest.approx(
        [expected[("q0", "a02")], expected[("q0", "a07")], 0.0, expected[("q1", "a03")]]
    )
    assert scored["score"].iloc[0] > scored["score"].iloc[1] > 0  # a02 matches more of the question than a07
