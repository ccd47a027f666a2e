"""Stage fedmatch_mine: BM25 negatives for training (top-k non-gold, k=5 in the paper) and evaluation candidates;
beside them (data/mined_bm25, outside what the cells read) the candidates' BM25 scores, for the BM25-only row."""

from pathlib import Path

from tqdm import tqdm

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.io import atomic_dir, read_table, write_json, write_table
from fedrepro.retrieval.mining import (
    bm25_ranking,
    cap_triples,
    evaluation_candidates,
    official_candidates,
    training_triples,
)

PARTITION, OUT, BM25_OUT = Path("data/partition/qa"), Path("data/mined"), Path("data/mined_bm25")


def main() -> None:
    params = load_params().mine
    options = {"k1": params.k1, "b": params.b, "es_url": params.es_url}
    summary = {}
    with atomic_dir(OUT) as tmp, atomic_dir(BM25_OUT) as bm25_tmp:
        for folder in tqdm(sorted(PARTITION.iterdir()), desc="mining clients"):
            pairs, same_text_gold = read_table(folder / "pairs.parquet"), read_table(folder / "same_text_gold.parquet")
            triples = training_triples(
                pairs,
                read_table(folder / "train_pool.parquet"),
                params.negatives_per_question,
                params.backend,
                same_text_gold,
                **options,
            )
            cap = params.client_max_triples.get(folder.name, params.max_triples_per_client)
            triples = cap_triples(triples, cap, folder.name)
            official = params.eval_pool == "official" and (folder / "official_pools.parquet").exists()
            if official:
                candidates = official_candidates(pairs, read_table(folder / "official_pools.parquet"), same_text_gold)
            else:
                candidates = evaluation_candidates(
                    pairs,
                    read_table(folder / "pool.parquet"),
                    params.eval_negatives,
                    params.backend,
                    same_text_gold,
                    **options,
                )
            out = tmp / folder.name
            out.mkdir()
            write_table(out / "triples.parquet", triples)
            write_table(out / "candidates.parquet", candidates)
            write_table(
                bm25_tmp / f"{folder.name}.parquet",
                bm25_ranking(candidates, read_table(folder / "pool.parquet"), params.backend, **options),
            )
            summary[folder.name] = {
                "triples": len(triples),
                "distinct_positives": int(triples["positive_id"].nunique()),
                "candidates": candidates.groupby("split").size().to_dict(),
                "negatives": {
                    "train": len(triples),
                    **candidates[candidates.relevance == 0].groupby("split").size().to_dict(),
                },
                "eval_pool": "official" if official else "bm25",
            }
        write_json(tmp / "summary.json", summary)


if __name__ == "__main__":
    run_stage(main)
