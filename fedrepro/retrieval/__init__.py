"""BM25 retrieval behind one interface (bm25s in-process, rank-bm25 cross-check, a user's Elasticsearch),
used to mine FedMatch's hard negatives and evaluation candidates."""
