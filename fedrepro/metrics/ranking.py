"""MAP and MRR as the paper reports them: trec_eval's ``map`` and ``recip_rank``, averaged over questions.

Conventions (kept identical in the ranx cross-check):
- Only questions in ``qrels`` with at least one relevant answer (relevance > 0) count; a judged question
  missing from the run scores 0. Run entries for other questions are ignored.
- Ties: trec_eval orders equal scores by descending doc id, ranx by its own sort. We remove ties first,
  ranking by score descending then doc id ascending (the retrieval tie rule), so both tools see one order.
"""

from __future__ import annotations

from fedrepro.errors import FedreproError

Qrels = dict[str, dict[str, int]]
Run = dict[str, dict[str, float]]


def _judged(qrels: Qrels) -> dict[str, dict[str, int]]:
    """Positive judgements of the questions that have any; fail if none has, since the mean is undefined."""
    judged = {str(q): {str(d): int(r) for d, r in docs.items() if r > 0} for q, docs in qrels.items()}
    judged = {q: docs for q, docs in judged.items() if docs}
    if not judged:
        raise FedreproError("qrels: no question has a relevant answer (relevance > 0); MAP/MRR are undefined")
    return judged


def _tie_free(run: Run, questions) -> Run:
    """Replace scores by strict rank-based scores (n, n-1, ..., 1), ties broken by ascending doc id."""
    out: Run = {}
    for q in questions:
        ordered = sorted(((str(d), float(s)) for d, s in run.get(q, {}).items()), key=lambda ds: (-ds[1], ds[0]))
        if ordered:
            out[q] = {d: float(len(ordered) - i) for i, (d, _) in enumerate(ordered)}
    return out


def per_question_metrics(qrels: Qrels, run: Run) -> dict[str, dict[str, float]]:
    """{question_id: {"map": AP, "mrr": reciprocal rank}} for every judged question (pytrec_eval)."""
    import pytrec_eval

    judged = _judged(qrels)
    run = {str(q): docs for q, docs in run.items()}
    evaluator = pytrec_eval.RelevanceEvaluator(judged, {"map", "recip_rank"})
    scores = evaluator.evaluate(_tie_free(run, judged))
    return {
        q: {"map": scores.get(q, {}).get("map", 0.0), "mrr": scores.get(q, {}).get("recip_rank", 0.0)}
        for q in sorted(judged)
    }


def ranking_metrics(qrels: Qrels, run: Run) -> dict[str, float]:
    """Mean MAP and MRR over judged questions (pytrec_eval)."""
    per_q = per_question_metrics(qrels, run)
    return {m: sum(v[m] for v in per_q.values()) / len(per_q) for m in ("map", "mrr")}


def cross_check_ranx(qrels: Qrels, run: Run) -> dict[str, float]:
    """The same means computed with ranx, to catch a convention slip in either tool."""
    from ranx import Qrels as RanxQrels, Run as RanxRun, evaluate

    judged = _judged(qrels)
    run_tf = _tie_free({str(q): docs for q, docs in run.items()}, judged)
    if not run_tf:
        return {"map": 0.0, "mrr": 0.0}
    result = evaluate(RanxQrels(judged), RanxRun(run_tf), ["map", "mrr"], make_comparable=True)
    return {"map": float(result["map"]), "mrr": float(result["mrr"])}


def expected_random_ap(candidates: int, relevant_retrieved: int, relevant_judged: int) -> float:
    """E[AP] when ``candidates`` documents, ``relevant_retrieved`` of them relevant, are put in a uniformly random
    order; relevant answers missing from the run (``relevant_judged`` counts all) add 0 to AP but count in its
    denominator, as in trec_eval.

    AP = (1/R) sum_d P@rank(d) over the retrieved relevant d. For one of them E[1/rank] = H_n/n, and each other
    relevant d' ranks above it with probability (k-1)/(n-1) given rank k, giving (n - H_n) / (n(n-1)) per pair.
    """
    n, r = candidates, relevant_retrieved
    if r == 0:
        return 0.0
    harmonic = sum(1.0 / k for k in range(1, n + 1))
    pair = (n - harmonic) / (n * (n - 1)) if n > 1 else 0.0
    return r * (harmonic / n + (r - 1) * pair) / relevant_judged


def expected_random_rr(candidates: int, relevant_retrieved: int) -> float:
    """E[1 / rank of the first relevant] under a uniformly random order:
    P(first relevant at k) = C(n-k, r-1) / C(n, r)."""
    from math import comb

    n, r = candidates, relevant_retrieved
    if r == 0:
        return 0.0
    return sum(comb(n - k, r - 1) / k for k in range(1, n - r + 2)) / comb(n, r)


def random_ranking_metrics(qrels: Qrels, run: Run) -> dict[str, float]:
    """Exact expected MAP and MRR of a uniformly random ordering of each question's candidates in ``run``.

    The chance level of a candidate set: a learned model is only worth its margin over this. It depends on the
    number of gold answers per question (PrivacyQA, about 20 gold among 40 candidates, sits near 0.5), so it is
    computed per question, not assumed. Same conventions as :func:`ranking_metrics`: judged questions only, a
    judged question missing from the run scores 0.
    """
    judged = _judged(qrels)
    run = {str(q): {str(d) for d in docs} for q, docs in run.items()}
    totals = {"map": 0.0, "mrr": 0.0}
    for q, relevant in judged.items():
        docs = run.get(q, set())
        retrieved = len(docs & set(relevant))
        totals["map"] += expected_random_ap(len(docs), retrieved, len(relevant))
        totals["mrr"] += expected_random_rr(len(docs), retrieved)
    return {name: value / len(judged) for name, value in totals.items()}


def trec_files(qrels: Qrels, run: Run, tag: str) -> tuple[str, str]:
    """Standard TREC qrels (``qid 0 docid rel``) and run (``qid Q0 docid rank score tag``) texts, so anyone can
    recompute MAP/MRR with trec_eval or another tool. Ranks follow the tie rule above."""
    qrels_lines = [f"{q} 0 {d} {r}" for q in sorted(qrels) for d, r in sorted(qrels[q].items())]
    run_lines = []
    for q in sorted(run):
        ordered = sorted(run[q].items(), key=lambda ds: (-ds[1], ds[0]))
        run_lines += [f"{q} Q0 {d} {rank} {score:.6f} {tag}" for rank, (d, score) in enumerate(ordered, start=1)]
    return "\n".join(qrels_lines) + "\n", "\n".join(run_lines) + "\n"
