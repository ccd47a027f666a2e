"""Stage partition: carve the clients out of the prepared collections, capped so the size skew stays real.

embedded source: one client per insurance domain of InsuranceQA; mirror/official: one client per collection.
"""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.data.embedded import COLLECTION
from fedrepro.data.partition import cap_client, skew_preserving_caps, training_pool
from fedrepro.errors import DataError
from fedrepro.io import atomic_dir, read_table, write_json, write_table

PREPARED, OUT = Path("data/prepared/qa"), Path("data/partition")


def client_tables(params):
    """(client id -> full pairs, answer pool) before any cap."""
    if params.data.source == "embedded":
        pairs, answers = read_table(PREPARED / COLLECTION / "pairs.parquet"), read_table(PREPARED / COLLECTION / "answers.parquet")
        clients = {}
        for domain in params.partition.embedded_domains:
            own = pairs[pairs["domain"] == domain]
            if own.empty:
                known = sorted(pairs["domain"].unique())
                raise DataError(f"params: partition.embedded_domains has {domain!r}, not a domain of InsuranceQA; allowed {known}")
            clients[domain] = (own, answers[answers["answer_id"].isin(set(own["answer_id"]))])
        return clients
    return {
        name: (read_table(PREPARED / name / "pairs.parquet"), read_table(PREPARED / name / "answers.parquet"))
        for name in params.partition.collections
        if (PREPARED / name / "pairs.parquet").exists()
    }


def main() -> None:
    params = load_params()
    clients = client_tables(params)
    train_sizes = {c: pairs.loc[pairs["split"] == "train", "question_id"].nunique() for c, (pairs, _) in clients.items()}
    caps = skew_preserving_caps(train_sizes, params.data.max_questions_per_client, params.data.min_questions_per_client)
    summary = {}
    with atomic_dir(OUT) as tmp:
        for client, (pairs, pool) in clients.items():
            capped = cap_client(pairs, caps[client], params.data.max_eval_questions_per_client, params.data.seed, client)
            folder = tmp / "qa" / client
            folder.mkdir(parents=True)
            write_table(folder / "pairs.parquet", capped)
            write_table(folder / "pool.parquet", pool.reset_index(drop=True))
            write_table(folder / "train_pool.parquet", training_pool(pairs, pool))
            summary[client] = {
                "train_questions_available": int(train_sizes[client]),
                "questions": capped.groupby("split")["question_id"].nunique().to_dict(),
                "answer_pool": len(pool),
            }
        write_json(tmp / "summary.json", {"caps": caps, "clients": summary})


if __name__ == "__main__":
    run_stage(main)
