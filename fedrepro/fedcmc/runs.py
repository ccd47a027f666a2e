"""Assembling one FedCMC-track cell (relation task + algorithm + runtime) from validated params.

Shared by the cell stage, the tests and the benchmarks, so they all build the very same run.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from fedrepro.config import Params
from fedrepro.errors import DataError
from fedrepro.fedcmc.cells import Cell
from fedrepro.fl import algorithms
from fedrepro.fl.algorithm import Algorithm, CommonSettings
from fedrepro.fl.engine import Engine, EngineSettings
from fedrepro.fl.runtime import CellRecipe, build_runtime
from fedrepro.io import code_digest, read_json, read_table
from fedrepro.models.backbone import build_encoder, load_tokenizer
from fedrepro.models.relation import RelationClassifier, add_entity_markers
from fedrepro.tasks.relation import RelationTask


def run_fingerprint(params: Params, cell: Cell, inputs_digest: str) -> str:
    """Changes whenever anything that shapes the run changes; a checkpoint of another run is never resumed."""
    payload = {"cell": asdict(cell), "settings": params.fedcmc.settings.model_dump(), "tiny": params.model.tiny.model_dump(),
               "train": {k: getattr(params.train, k) for k in ("warmup_fraction", "max_grad_norm", "threads", "precision", "runtime")},
               "inputs": inputs_digest, "code": code_digest(),
               "algorithm": algorithm_settings(params, cell).model_dump(mode="json")}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def relation_tokenizer(params: Params, tokenizer_dir: Path):
    """The backbone's tokenizer with the four entity markers as special tokens."""
    tokenizer = load_tokenizer(params.fedcmc.settings.backbone, tokenizer_dir, "fedcmc.settings.backbone")
    add_entity_markers(tokenizer)
    return tokenizer


def algorithm_settings(params: Params, cell: Cell) -> Algorithm.Settings:
    """The cell's algorithm knobs (params.yaml ``algorithms``); FedCMC's vectors are the cell's (Fig 4 sweeps them)."""
    per_cell = {"vectors": cell.vectors} if cell.method == "fedcmc" else {}
    return algorithms.algorithm_settings(cell.method, params.algorithms, **per_cell)


def build_relation_task(params: Params, cell: Cell, prepared_dir: Path, partitions_dir: Path, tokenizer_dir: Path) -> RelationTask:
    settings = params.fedcmc.settings
    folder = Path(partitions_dir) / cell.partition
    if not (folder / "assignment.parquet").exists():
        raise DataError(f"{folder}/assignment.parquet is missing: run the fedcmc_partition stage")
    corpus = read_table(Path(prepared_dir) / cell.dataset / "table.parquet")
    classes = read_json(folder / "partition.json")["classes"]
    tokenizer = relation_tokenizer(params, tokenizer_dir)

    def build_model() -> RelationClassifier:
        encoder = build_encoder(settings.backbone, len(tokenizer), params.model.tiny.model_dump(), settings.max_length,
                                settings.keep_layers, "fedcmc.settings.backbone")
        return RelationClassifier(encoder, len(classes))

    return RelationTask(corpus, read_table(folder / "assignment.parquet"), classes, settings.negative_labels, tokenizer,
                        build_model, settings.max_length, settings.batch_size)


def cell_recipe(params: Params, cell: Cell, prepared_dir: Path, partitions_dir: Path, tokenizer_dir: Path,
                inputs_digest: str) -> CellRecipe:
    """Everything that shapes one cell's run, rebuildable in another process (a Flower node)."""
    settings, train = params.fedcmc.settings, params.train
    engine_settings = EngineSettings(
        rounds=settings.rounds, local_epochs=cell.local_epochs, steps_per_epoch=settings.steps_per_epoch,
        clients_per_round=0, lr=settings.lr,
        batch_size=settings.batch_size, warmup_fraction=train.warmup_fraction, max_grad_norm=train.max_grad_norm,
        seed=cell.seed, eval_every=settings.eval_every, precision=train.precision, eval_splits=("valid", "test"),
    )
    folders = (Path(prepared_dir).resolve(), Path(partitions_dir).resolve(), Path(tokenizer_dir).resolve())
    spec = {"factory": "fedrepro.fedcmc.runs:spec_recipe", "kwargs": {
        "params": params.model_dump(mode="json"), "cell": asdict(cell), "folders": [str(f) for f in folders],
        "inputs_digest": inputs_digest}}
    return CellRecipe(
        build_task=functools.partial(build_relation_task, params, cell, *folders), algorithm=cell.method,
        algorithm_settings=algorithm_settings(params, cell), common=CommonSettings(weighting="size", seed=cell.seed),
        settings=engine_settings,
        fingerprint=run_fingerprint(params, cell, inputs_digest), threads=train.threads, spec=spec,
    )


def spec_recipe(params: dict, cell: dict, folders: list[str], inputs_digest: str) -> CellRecipe:
    """A recipe from its JSON spec (``CellRecipe.spec``): how a deployment's ServerApp and ClientApps rebuild a cell."""
    return cell_recipe(Params.model_validate(params), Cell(**cell), *map(Path, folders), inputs_digest)


def build_cell(params: Params, cell: Cell, prepared_dir: Path, partitions_dir: Path, tokenizer_dir: Path,
               inputs_digest: str, checkpoint_dir: Path, progress: bool = True) -> Engine:
    """The runtime (``train.runtime``) for one cell; it resumes from ``checkpoint_dir`` when that holds this very run."""
    recipe = cell_recipe(params, cell, prepared_dir, partitions_dir, tokenizer_dir, inputs_digest)
    return build_runtime(recipe, params.train.runtime, checkpoint_dir, progress)
