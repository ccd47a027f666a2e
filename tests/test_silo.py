"""Silo-local data without Flower: the layout holds each client's rows alone, a client's task built from its own
directory is the whole task's share of that client, the server's view holds no rows, and FedCMC's scores summed from
the clients' per-class counts are the engine's on the union, bit for bit. (On Flower: test_flower.py.)"""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from fedrepro.errors import DataError, FederationError
from fedrepro.fl.engine import GLOBAL
from fedrepro.fl.silo import MANIFEST, read_manifest, read_silo
from fedrepro.tasks.relation import RelationTask
from toy import (
    relation_model,
    relation_parts,
    relation_server_view,
    relation_silo_task,
    relation_task,
    write_relation_silos,
)


@pytest.fixture(scope="module")
def negative_task():
    """The tiny relation cell with its first class as the no-relation class, which micro-F1 leaves out."""
    corpus, assignment, tokenizer = relation_parts()
    return RelationTask(
        corpus.table,
        assignment,
        corpus.classes,
        corpus.classes[:1],
        tokenizer,
        relation_model(tokenizer, corpus.classes),
        64,
        8,
    )


def predictions_of(task: RelationTask, split: str, draw: int) -> pd.DataFrame:
    """The split's sentences with seeded random predictions (draw 0: always the first class, so some classes are
    neither predicted nor, in a client's share, true: the 0/0 cases)."""
    rows = task.eval_sets[split][0].copy()
    rng = np.random.default_rng(draw)
    rows["predicted"] = task.classes[0] if draw == 0 else rng.choice(task.classes, size=len(rows))
    return rows


@pytest.mark.parametrize("draw", range(4))
@pytest.mark.parametrize("split", ["valid", "test"])
def test_scores_from_the_clients_summed_counts_equal_the_scores_on_the_union(negative_task, split, draw):
    predictions = predictions_of(negative_task, split, draw)
    shares = [negative_task.share(predictions, client_id) for client_id in negative_task.client_ids]
    assert sum(map(len, shares)) == len(predictions), "the clients' shares partition the global set"
    summed: dict[str, int] = {}
    for share in shares:
        for name, count in negative_task.class_counts(share).items():
            summed[name] = summed.get(name, 0) + count
    assert negative_task.scores_from_counts(summed) == negative_task.scores(predictions)  # ==: bit for bit


def test_counts_name_each_class_and_kind_and_a_missing_count_is_named(negative_task):
    counts = negative_task.class_counts(predictions_of(negative_task, "valid", 1))
    assert sorted(counts) == sorted(f"{kind}/{c}" for kind in ("tp", "fp", "fn") for c in negative_task.classes)
    del counts[f"fn/{negative_task.classes[1]}"]
    with pytest.raises(DataError, match=f"counts lack \\['fn/{negative_task.classes[1]}'\\]"):
        negative_task.scores_from_counts(counts)


def test_a_silo_holds_its_clients_rows_alone_and_its_task_is_the_whole_tasks_share(tmp_path):
    manifest = write_relation_silos(tmp_path / "silos")
    whole = relation_task()
    assert manifest.client_ids == whole.client_ids
    assert manifest.train_sizes == {c: whole.num_train_samples([c]) for c in whole.client_ids}
    assert read_manifest(tmp_path / "silos") == manifest
    client = whole.client_ids[1]
    alone = tmp_path / "alone"
    shutil.copytree(tmp_path / "silos" / client, alone)
    shutil.rmtree(tmp_path / "silos")  # nothing of the other clients is left anywhere
    silo = read_silo(alone)
    assert silo.client_id == client and set(silo.tables["sentences"]["client"]) == {client}
    own = relation_silo_task(alone)
    assert own.client_ids == [client]
    assert own.train[client][0] == whole.train[client][0]
    assert np.array_equal(own.train[client][1], whole.train[client][1])
    torch.manual_seed(0)
    model = whole.build_model().eval()
    for split in ("valid", "test"):
        mine = own.predict(model, split)
        assert mine["sentence_id"].tolist() == whole.share(whole.predict(model, split), client)["sentence_id"].tolist()
        assert own.evaluation_counts(model, client, split) == whole.class_counts(
            whole.share(whole.predict(model, split), client)
        )
    assert own.num_train_samples([client]) == manifest.train_sizes[client]


def test_the_servers_view_knows_clients_and_sizes_and_refuses_anything_needing_rows(tmp_path):
    manifest = write_relation_silos(tmp_path)
    for client_id in manifest.client_ids:
        shutil.rmtree(tmp_path / client_id)
    view = relation_server_view(tmp_path)
    assert view.client_ids == manifest.client_ids and view.evaluates_global_model
    assert view.num_train_samples(view.client_ids) == sum(manifest.train_sizes.values())
    with pytest.raises(FederationError, match="holds no client's data: it cannot train on clients"):
        next(iter(view.train_batches(view.client_ids, torch.Generator())))
    with pytest.raises(FederationError, match="holds no client's data"):
        view.evaluate(view.build_model(), GLOBAL, "test")


def test_a_missing_silo_or_manifest_is_named(tmp_path):
    with pytest.raises(DataError, match=f"{tmp_path / 'nobody'}/silo.json is missing"):
        read_silo(tmp_path / "nobody")
    with pytest.raises(DataError, match=f"{tmp_path / MANIFEST} is missing"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text('{"clients": ["a"], "train_sizes": {"a": 3, "b": 2}}')
    with pytest.raises(DataError, match="clients = \\['a'\\]: expected the clients of train_sizes"):
        read_manifest(tmp_path)


def test_a_fedmatch_silo_holds_its_clients_mined_data_and_its_task_is_the_whole_tasks_share(tmp_path):
    """FedMatch's silos: each client's own triples (its mined negatives) and candidates; its node's task, with the
    cell's data ratio applied by the client itself, trains and scores exactly the whole task's share of it."""
    from fedrepro.config import parse_params
    from fedrepro.fedmatch.cells import Cell
    from fedrepro.fedmatch.runs import cell_task, server_cell_task, silo_cell_task, write_cell_silos
    from test_config import with_change

    params = parse_params(with_change("scale", "cpu"))
    cell = Cell("fedmatch_h_lr", 0, "data_ratio", "0.5")
    mined, tokenizer_dir = tmp_path / "mined", tmp_path / "no-tokenizer"  # a packaged backbone: no tokenizer stage
    for index, client_id in enumerate(["bank", "clinic"]):
        rows = [
            (
                f"{client_id}{q}",
                f"how do i file claim {q} at the {client_id}",
                f"p{q}",
                f"file form {q} online",
                f"n{q}{j}",
                f"policy rider {j} of {client_id}",
            )
            for q in range(4 + 2 * index)
            for j in range(2)
        ]
        triples = pd.DataFrame(
            rows, columns=["question_id", "question", "positive_id", "positive", "negative_id", "negative"]
        )
        candidates = pd.DataFrame(
            [
                (split, f"{client_id}{q}", f"how do i file claim {q}", f"a{q}{k}", f"answer {k}", int(k == 0))
                for split in ("valid", "test")
                for q in range(3)
                for k in range(3)
            ],
            columns=["split", "question_id", "question", "answer_id", "answer", "relevance"],
        )
        (mined / client_id).mkdir(parents=True)
        triples.to_parquet(mined / client_id / "triples.parquet")
        candidates.to_parquet(mined / client_id / "candidates.parquet")
    manifest = write_cell_silos(params, cell, mined, tokenizer_dir, tmp_path / "silos")
    whole = cell_task(params, cell, mined, tokenizer_dir)
    assert manifest.train_sizes == {c: whole.num_train_samples([c]) for c in whole.client_ids}
    assert manifest.train_sizes == {"bank": 4, "clinic": 6}, "half of each client's questions, 2 triples each"
    shutil.copytree(tmp_path / "silos" / "clinic", tmp_path / "clinic")
    shutil.rmtree(tmp_path / "silos" / "clinic")
    shutil.rmtree(tmp_path / "silos" / "bank")
    shutil.rmtree(mined)
    own = silo_cell_task(params, cell, tokenizer_dir, tmp_path / "clinic")
    assert own.client_ids == ["clinic"]
    assert own.positives["clinic"] == whole.positives["clinic"] and own.negatives["clinic"] == whole.negatives["clinic"]
    assert own.candidate_encodings["clinic"] == whole.candidate_encodings["clinic"]
    view = server_cell_task(params, cell, tokenizer_dir, tmp_path / "silos")
    assert view.client_ids == ["bank", "clinic"] and not view.evaluates_global_model
    assert view.num_train_samples(["clinic"]) == 6


def test_fedcmc_silos_train_the_whole_tasks_share_and_the_server_scores_from_counts_with_no_row(tmp_path):
    """The stage-level FedCMC pieces: the partition laid out per client, a node's task from its directory alone (the
    corpus, the partition and the other silos gone), and a server that reads only the manifest and the partition's
    label space, whose scores from summed counts are the whole task's."""
    from fedrepro.config import parse_params
    from fedrepro.fedcmc.cells import Cell
    from fedrepro.fedcmc.runs import (
        build_relation_task,
        build_silo_relation_task,
        relation_server_view,
        write_cell_silos,
    )
    from fedrepro.io import write_json, write_table
    from test_config import with_change

    params = parse_params(with_change("scale", "embedded"))
    assert params.fedcmc.settings.backbone == "tiny"
    corpus, assignment, tokenizer = relation_parts()
    cell = Cell("fedavg", "synthetic", 0.5, 3, 1, 0)
    prepared, partitions, tokenizer_dir = tmp_path / "prepared", tmp_path / "partitions", tmp_path / "tokenizer"
    (prepared / cell.dataset).mkdir(parents=True)
    (partitions / cell.partition).mkdir(parents=True)
    write_table(prepared / cell.dataset / "table.parquet", corpus.table)
    write_table(partitions / cell.partition / "assignment.parquet", assignment)
    write_json(partitions / cell.partition / "partition.json", {"classes": corpus.classes})
    tokenizer.save_pretrained(tokenizer_dir)
    manifest = write_cell_silos(cell, prepared, partitions, tmp_path / "silos")
    whole = build_relation_task(params, cell, prepared, partitions, tokenizer_dir)
    assert manifest.client_ids == whole.client_ids
    assert manifest.train_sizes == {c: whole.num_train_samples([c]) for c in whole.client_ids}
    torch.manual_seed(0)
    model = whole.build_model().eval()
    test = whole.predict(model, "test")
    client = whole.client_ids[2]
    shutil.copytree(tmp_path / "silos" / client, tmp_path / "alone")
    for folder in [prepared, *(tmp_path / "silos" / c for c in manifest.client_ids)]:
        shutil.rmtree(folder)
    (partitions / cell.partition / "assignment.parquet").unlink()
    own = build_silo_relation_task(params, tokenizer_dir, tmp_path / "alone")
    assert own.client_ids == [client] and own.train[client][0] == whole.train[client][0]
    assert own.evaluation_counts(model, client, "test") == whole.class_counts(whole.share(test, client))
    view = relation_server_view(params, cell, partitions, tokenizer_dir, tmp_path / "silos")
    summed: dict[str, int] = {}
    for client_id in whole.client_ids:
        for name, count in whole.evaluation_counts(model, client_id, "test").items():
            summed[name] = summed.get(name, 0) + count
    assert view.scores_from_counts(summed) == whole.scores(test)
    assert view.diagnose_round([]) == {"clients": [], "local_similarity": []}
