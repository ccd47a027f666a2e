"""One FedCMC-track cell from validated params: built (relation task + algorithm + runtime), run, and scored.

Shared by the train stage, the tests and the benchmarks, so they all build the very same run.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from torch import nn

from fedrepro.code_closure import cell_code, code_digest
from fedrepro.config import Params
from fedrepro.errors import ConfigError, DataError
from fedrepro.fedcmc.cells import Cell
from fedrepro.fl import algorithms
from fedrepro.fl.algorithm import Algorithm, CommonSettings
from fedrepro.fl.engine import GLOBAL, Engine, EngineSettings, scoring
from fedrepro.fl.recipe import CellRecipe, SiloRecipe, recipe_spec
from fedrepro.fl.runtime import build_runtime
from fedrepro.fl.silo import SILOS, Manifest, ServerTaskView, read_manifest, read_silo, write_silos
from fedrepro.grid import fingerprint
from fedrepro.hardware import machine_fingerprint
from fedrepro.io import read_json, read_table, write_json
from fedrepro.ledger import Gold, join_column
from fedrepro.models.backbone import build_encoder, load_tokenizer
from fedrepro.models.relation import RelationClassifier, add_entity_markers
from fedrepro.tasks.relation import (
    SENTENCES,
    RelationTask,
    positive_classes,
    scores_from_counts,
    silo_tables,
    similarity_diagnostics,
)


def run_fingerprint(params: Params, cell: Cell, inputs_digest: str) -> str:
    """Changes whenever anything that shapes the run changes; a checkpoint of another run is never resumed."""
    train = {
        k: getattr(params.train, k)
        for k in ("warmup_fraction", "max_grad_norm", "threads", "precision", "runtime", "silo_local")
    }
    code = code_digest(cell_code(__name__, params.train.runtime, algorithms.REGISTRY[cell.method].__module__))
    return fingerprint(
        asdict(cell),
        inputs_digest,
        {
            "settings": params.fedcmc.settings.model_dump(),
            "tiny": params.model.tiny.model_dump(),
            "train": train,
            "algorithm": algorithm_settings(params, cell).model_dump(mode="json"),
        },
        code,
    )


def relation_tokenizer(params: Params, tokenizer_dir: Path):
    """The backbone's tokenizer with the four entity markers as special tokens."""
    tokenizer = load_tokenizer(params.fedcmc.settings.backbone, tokenizer_dir, "fedcmc.settings.backbone")
    add_entity_markers(tokenizer)
    return tokenizer


def check_methods(params: Params) -> None:
    """FedCMC's rows are the engine's federated algorithms by their registry name (``fedrepro/fl/algorithms``), so a
    new algorithm joins the grid by being named in ``fedcmc.methods``. config cannot check the names (it does not
    import the algorithms), so the training stage does, before its first cell."""
    allowed = sorted(name for name, algorithm in algorithms.REGISTRY.items() if algorithm.federated)
    fc = params.fedcmc
    for key, names in (
        ("fedcmc.methods", fc.methods),
        ("fedcmc.sweeps.methods", fc.sweeps.methods),
        ("fedcmc.sweeps.subset_methods", fc.sweeps.subset_methods),
    ):
        for index, name in enumerate(names):
            if name not in allowed:
                raise ConfigError(f"params: {key}.{index} = {name!r} is no federated algorithm; allowed {allowed}")


def algorithm_settings(params: Params, cell: Cell) -> Algorithm.Settings:
    """The cell's algorithm knobs (params.yaml ``algorithms``); FedCMC's vectors are the cell's (Fig 4 sweeps them)."""
    per_cell = {"vectors": cell.vectors} if cell.method == "fedcmc" else {}
    return algorithms.algorithm_settings(cell.method, params.algorithms, **per_cell)


def build_relation_task(
    params: Params, cell: Cell, prepared_dir: Path, partitions_dir: Path, tokenizer_dir: Path
) -> RelationTask:
    settings = params.fedcmc.settings
    folder = Path(partitions_dir) / cell.partition
    if not (folder / "assignment.parquet").exists():
        raise DataError(f"{folder}/assignment.parquet is missing: run the fedcmc_partition stage")
    corpus = read_table(Path(prepared_dir) / cell.dataset / "table.parquet")
    classes = read_json(folder / "partition.json")["classes"]
    tokenizer = relation_tokenizer(params, tokenizer_dir)
    return RelationTask(
        corpus,
        read_table(folder / "assignment.parquet"),
        classes,
        settings.negative_labels,
        tokenizer,
        relation_model_factory(params, tokenizer, classes),
        settings.max_length,
        settings.batch_size,
    )


def relation_model_factory(params: Params, tokenizer, classes: list[str]):
    """A zero-argument builder of the cell's relation classifier (the same on the server, every node and the engine)."""
    settings = params.fedcmc.settings

    def build_model() -> RelationClassifier:
        encoder = build_encoder(
            settings.backbone,
            len(tokenizer),
            params.model.tiny.model_dump(),
            settings.max_length,
            settings.keep_layers,
            "fedcmc.settings.backbone",
        )
        return RelationClassifier(encoder, len(classes))

    return build_model


def write_cell_silos(cell: Cell, prepared_dir: Path, partitions_dir: Path, root: Path) -> Manifest:
    """The cell's partition laid out as its silos would receive it (``fedrepro.fl.silo``): each client's sentences of
    every split, with their text, told the label space; the server's manifest of the clients' training sizes."""
    folder = Path(partitions_dir) / cell.partition
    if not (folder / "assignment.parquet").exists():
        raise DataError(f"{folder}/assignment.parquet is missing: run the fedcmc_partition stage")
    assignment = read_table(folder / "assignment.parquet")
    tables = silo_tables(read_table(Path(prepared_dir) / cell.dataset / "table.parquet"), assignment)
    sizes = {c: int(((assignment["client"] == c) & (assignment["split"] == "train")).sum()) for c in tables}
    return write_silos(root, tables, sizes, told={"classes": read_json(folder / "partition.json")["classes"]})


def build_silo_relation_task(params: Params, tokenizer_dir: Path, data_dir: Path) -> RelationTask:
    """One client's task from its silo directory alone (a node of a silo-local run)."""
    settings, silo = params.fedcmc.settings, read_silo(data_dir)
    rows, classes = silo.tables[SENTENCES], silo.told["classes"]
    tokenizer = relation_tokenizer(params, tokenizer_dir)
    return RelationTask(
        rows[["sentence_id", "text"]],
        rows.drop(columns="text"),
        classes,
        settings.negative_labels,
        tokenizer,
        relation_model_factory(params, tokenizer, classes),
        settings.max_length,
        settings.batch_size,
    )


def relation_server_view(
    params: Params, cell: Cell, partitions_dir: Path, tokenizer_dir: Path, silos_dir: Path
) -> ServerTaskView:
    """The server's task of a silo-local run: the manifest's clients and sizes, the model, the Fig 1 diagnostics read
    off the uploads and micro-F1 from the clients' summed counts; the label space from the partition's summary."""
    classes = read_json(Path(partitions_dir) / cell.partition / "partition.json")["classes"]
    tokenizer = relation_tokenizer(params, tokenizer_dir)
    positive = [classes[i] for i in positive_classes(classes, params.fedcmc.settings.negative_labels)]
    return ServerTaskView(
        read_manifest(silos_dir),
        relation_model_factory(params, tokenizer, classes),
        diagnose=similarity_diagnostics,
        score_counts=functools.partial(scores_from_counts, classes=classes, positive=positive),
    )


def cell_recipe(
    params: Params,
    cell: Cell,
    prepared_dir: Path,
    partitions_dir: Path,
    tokenizer_dir: Path,
    inputs_digest: str,
    silos_dir: Path | None = None,
) -> CellRecipe:
    """Everything that shapes one cell's run, rebuildable in another process (a Flower node). With ``silos_dir``
    (laid out by ``write_cell_silos``) it runs on Flower silo-local: each node reads its own client's directory only,
    the server none, and the global model is scored from the clients' counts (its FIT loss is their weighted mean,
    so the run's fingerprint differs)."""
    settings, train = params.fedcmc.settings, params.train
    engine_settings = EngineSettings(
        rounds=settings.rounds,
        local_epochs=cell.local_epochs,
        steps_per_epoch=settings.steps_per_epoch,
        clients_per_round=0,
        lr=settings.lr,
        batch_size=settings.batch_size,
        warmup_fraction=train.warmup_fraction,
        max_grad_norm=train.max_grad_norm,
        seed=cell.seed,
        eval_every=settings.eval_every,
        precision=train.precision,
        fit_samples=train.fit_samples,
        eval_splits=("valid", "test"),
        device=train.device,
    )
    folders = (Path(prepared_dir).resolve(), Path(partitions_dir).resolve(), Path(tokenizer_dir).resolve())
    spec = recipe_spec("fedrepro.fedcmc.runs:spec_recipe", params, cell, list(folders), inputs_digest)
    run, silo = run_fingerprint(params, cell, inputs_digest), None
    if silos_dir is not None:
        silos_dir = Path(silos_dir).resolve()
        spec["kwargs"]["silos_dir"] = str(silos_dir)
        run = hashlib.sha256(f"{run} silo-local".encode()).hexdigest()
        silo = SiloRecipe(
            silos_dir,
            functools.partial(build_silo_relation_task, params, folders[2]),
            functools.partial(relation_server_view, params, cell, *folders[1:], silos_dir),
        )
    return CellRecipe(
        build_task=functools.partial(build_relation_task, params, cell, *folders),
        algorithm=cell.method,
        algorithm_settings=algorithm_settings(params, cell),
        common=CommonSettings(weighting="size", seed=cell.seed),
        settings=engine_settings,
        fingerprint=run,
        threads=train.threads,
        spec=spec,
        silo=silo,
    )


def spec_recipe(
    params: dict, cell: dict, folders: list[str], inputs_digest: str, silos_dir: str | None = None
) -> CellRecipe:
    """A recipe from its JSON spec (``CellRecipe.spec``): how a deployment's ServerApp and ClientApps rebuild a cell."""
    return cell_recipe(
        Params.model_validate(params),
        Cell(**cell),
        *map(Path, folders),
        inputs_digest,
        None if silos_dir is None else Path(silos_dir),
    )


def build_cell(
    params: Params,
    cell: Cell,
    prepared_dir: Path,
    partitions_dir: Path,
    tokenizer_dir: Path,
    inputs_digest: str,
    checkpoint_dir: Path,
    progress: bool = True,
) -> Engine:
    """The runtime (``train.runtime``) for one cell; it resumes from ``checkpoint_dir`` when that holds this very run.
    With ``train.silo_local`` the cell's data is first laid out one directory per client in ``<checkpoint_dir>/silos``
    (``write_cell_silos``), where its nodes read it."""
    train, silos_dir = params.train, None
    if train.silo_local:
        silos_dir = Path(checkpoint_dir) / SILOS
        write_cell_silos(cell, prepared_dir, partitions_dir, silos_dir)
    recipe = cell_recipe(params, cell, prepared_dir, partitions_dir, tokenizer_dir, inputs_digest, silos_dir)
    return build_runtime(
        recipe,
        train.runtime,
        checkpoint_dir,
        progress,
        reply_timeout=train.reply_timeout,
        run_timeout=train.run_timeout,
    )


def cell_inputs(cell: Cell, prepared_dir: Path, partitions_dir: Path, tokenizer_dir: Path) -> tuple[Path, ...]:
    """The folders a cell reads, which its fingerprint digests: its corpus, its partition and the tokenizer only."""
    return Path(prepared_dir) / cell.dataset, Path(partitions_dir) / cell.partition, Path(tokenizer_dir)


def parameter_counts(engine: Engine) -> dict[str, int]:
    """Total and uploaded (the shared ones a client sends each round it trains) parameters, kept in a cell's
    metrics.json for the communication table (``report.communication_table``), which sets them beside the bytes sent."""
    params = engine.params
    return {
        "total": sum(p.numel() for p in params.values()),
        "uploaded": sum(params[n].numel() for n in engine.shared_names),
    }


def run_cell(
    params: Params,
    cell: Cell,
    prepared_dir: Path,
    partitions_dir: Path,
    tokenizer_dir: Path,
    out: Path,
    checkpoint_dir: Path,
    inputs_digest: str,
) -> dict:
    """Train (or resume) one cell, then score the global model on the global valid and test sets (valid as its last
    round scored it, when that round was evaluated); write metrics.json and the test predictions into ``out``
    (created). Returns the metrics."""
    engine = build_cell(params, cell, prepared_dir, partitions_dir, tokenizer_dir, inputs_digest, checkpoint_dir)
    state = engine.run()
    out.mkdir(parents=True)
    model = engine.global_model()
    with scoring(engine.settings.precision, engine.settings.device):
        if isinstance(engine.task, ServerTaskView):  # silo-local: the server holds no sentence
            predictions, test, valid, truncated = silo_evaluation(
                params, cell, partitions_dir, tokenizer_dir, Path(checkpoint_dir) / SILOS, engine.task, model
            )
        else:
            predictions = engine.task.predict(model, "test")
            test, truncated = engine.task.scores(predictions), engine.task.truncated
            # the last round scored this very model on valid already, unless it was not an evaluated round
            valid = state.history[-1].get("valid", {}).get(GLOBAL) or engine.task.evaluate(model, GLOBAL, "valid")
    predictions.to_csv(out / "predictions.csv", index=False)
    metrics = {
        "cell": {**cell.__dict__, "name": cell.name, "partition": cell.partition},
        "test": test,
        "valid": valid,
        "history": state.history,
        "channel": engine.channel.summary(),
        "memory_bytes": engine.memory_bytes(),
        "parameters": parameter_counts(engine),
        "truncated_train_sentences": truncated,
        "hardware": machine_fingerprint(engine.settings.device),
    }
    write_json(out / "metrics.json", metrics)
    return metrics


def silo_evaluation(
    params: Params,
    cell: Cell,
    partitions_dir: Path,
    tokenizer_dir: Path,
    silos_dir: Path,
    server: ServerTaskView,
    model: nn.Module,
) -> tuple[pd.DataFrame, dict, dict, int]:
    """The global model scored as a silo-local federation scores it: each client predicts its own share of the test
    and valid sets on a task built from its directory alone, and the scores come from the clients' summed per-class
    counts. The harness, which owns every silo's directory on this machine, also gathers the test predictions (the
    report's bootstrap resamples them) in the partition's order, so the file is the engine's. Returns predictions,
    test and valid scores, and the truncated training sentences."""
    order = read_table(Path(partitions_dir) / cell.partition / "assignment.parquet")["sentence_id"]
    counts: dict[str, dict[str, int]] = {"test": {}, "valid": {}}
    shares, truncated = [], 0
    for client_id in server.client_ids:
        task = build_silo_relation_task(params, Path(tokenizer_dir).resolve(), silos_dir / client_id)
        truncated += task.truncated
        for split, summed in counts.items():
            predicted = task.predict(model, split)
            for name, count in task.class_counts(predicted).items():
                summed[name] = summed.get(name, 0) + count
            if split == "test":
                shares.append(predicted)
    position = pd.Series(range(len(order)), index=order.to_numpy())
    predictions = pd.concat(shares, ignore_index=True)
    predictions = predictions.iloc[position[predictions["sentence_id"]].to_numpy().argsort()].reset_index(drop=True)
    return predictions, server.scores_from_counts(counts["test"]), server.scores_from_counts(counts["valid"]), truncated


def ledger_gold(partitions_dir: Path) -> Gold:
    """A cell as the results ledger keeps it (``fedrepro.ledger``): its metrics and test predictions, less each
    sentence's gold label, which comes back from the partition's assignment."""
    return Gold(
        keep=("metrics.json", "predictions.csv"),
        dropped_columns={"predictions.csv": ("label",)},
        join=functools.partial(join_gold_labels, Path(partitions_dir)),
    )


def join_gold_labels(partitions_dir: Path, cell: Cell, out: Path) -> None:
    """Each prediction's gold label, from the assignment of the cell's partition, in the column ``predict`` writes."""
    assignment = read_table(partitions_dir / cell.partition / "assignment.parquet")
    join_column(out, "predictions.csv", "sentence_id", "label", assignment.set_index("sentence_id")["label"], 1)


def headline(metrics: dict) -> str:
    """A finished cell in a few words, for the stage's progress lines."""
    return f"test micro-F1 {metrics['test']['micro_f1']:.3f}"
