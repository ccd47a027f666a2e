"""Stage fedmatch_partition: carve the QA clients out of the prepared collections, capped so the size skew stays real.

embedded source: one client per insurance domain of InsuranceQA; mirror/official: one client per collection.
"""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.data.embedded import COLLECTION
from fedrepro.data.partition import clients_by_collection, clients_by_domain, write_clients
from fedrepro.io import atomic_dir, write_json

PREPARED, OUT = Path("data/prepared/qa"), Path("data/partition")


def main() -> None:
    params = load_params()
    data, partition = params.data, params.partition
    if data.source == "embedded":
        clients = clients_by_domain(PREPARED, COLLECTION, partition.embedded_domains)
    else:
        clients = clients_by_collection(PREPARED, partition.collections)
    with atomic_dir(OUT) as tmp:
        summary = write_clients(
            clients,
            tmp,
            data.max_questions_per_client,
            data.min_questions_per_client,
            data.max_eval_questions_per_client,
            data.seed,
            data.client_train_questions,
        )
        write_json(tmp / "summary.json", summary)


if __name__ == "__main__":
    run_stage(main)
