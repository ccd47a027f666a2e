"""One FedCMC-track cell from validated params: built (relation task + algorithm + runtime), run, and scored.

Shared by the train stage, the tests and the benchmarks, so they all build the very same run.
"""

from __future__ import annotations

import functools
from pathlib import Path

from fedrepro.config import Params
from fedrepro.errors import ConfigError, DataError
from fedrepro.fedcmc.cells import Cell
from fedrepro.fl import algorithms
from fedrepro.fl.algorithm import Algorithm, CommonSettings
from fedrepro.fl.engine import Engine, EngineSettings
from fedrepro.fl.recipe import CellRecipe, recipe_spec
from fedrepro.fl.runtime import build_runtime
from fedrepro.grid import fingerprint
from fedrepro.hardware import machine_fingerprint
from fedrepro.io import read_json, read_table, write_json
from fedrepro.models.backbone import build_encoder, load_tokenizer
from fedrepro.models.relation import RelationClassifier, add_entity_markers
from fedrepro.tasks.relation import RelationTask


def run_fingerprint(params: Params, cell: Cell, inputs_digest: str) -> str:
    """Changes whenever anything that shapes the run changes; a checkpoint of another run is never resumed."""
    train = {k: getattr(params.train, k) for k in ("warmup_fraction", "max_grad_norm", "threads", "precision", "runtime")}
    return fingerprint(cell, inputs_digest, {"settings": params.fedcmc.settings.model_dump(),
                                             "tiny": params.model.tiny.model_dump(), "train": train,
                                             "algorithm": algorithm_settings(params, cell).model_dump(mode="json")})


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
    for key, names in (("fedcmc.methods", fc.methods), ("fedcmc.sweeps.methods", fc.sweeps.methods),
                       ("fedcmc.sweeps.subset_methods", fc.sweeps.subset_methods)):
        for index, name in enumerate(names):
            if name not in allowed:
                raise ConfigError(f"params: {key}.{index} = {name!r} is no federated algorithm; allowed {allowed}")


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
    spec = recipe_spec("fedrepro.fedcmc.runs:spec_recipe", params, cell, list(folders), inputs_digest)
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
    train = params.train
    return build_runtime(recipe, train.runtime, checkpoint_dir, progress, reply_timeout=train.reply_timeout)


def cell_inputs(cell: Cell, prepared_dir: Path, partitions_dir: Path, tokenizer_dir: Path) -> tuple[Path, ...]:
    """The folders a cell reads, which its fingerprint digests: its corpus, its partition and the tokenizer only."""
    return Path(prepared_dir) / cell.dataset, Path(partitions_dir) / cell.partition, Path(tokenizer_dir)


def parameter_counts(engine: Engine) -> dict[str, int]:
    """Total and uploaded (the shared ones a client sends each round it trains) parameters, kept in a cell's
    metrics.json for the communication table (``report.communication_table``), which sets them beside the bytes sent."""
    params = engine.params
    return {"total": sum(p.numel() for p in params.values()),
            "uploaded": sum(params[n].numel() for n in engine.shared_names)}


def run_cell(params: Params, cell: Cell, prepared_dir: Path, partitions_dir: Path, tokenizer_dir: Path, out: Path,
             checkpoint_dir: Path, inputs_digest: str) -> dict:
    """Train (or resume) one cell, then score the global model on the global valid and test sets; write metrics.json
    and the test predictions into ``out`` (created). Returns the metrics."""
    engine = build_cell(params, cell, prepared_dir, partitions_dir, tokenizer_dir, inputs_digest, checkpoint_dir)
    state = engine.run()
    out.mkdir(parents=True)
    model = engine.global_model()
    predictions = engine.task.predict(model, "test")
    predictions.to_csv(out / "predictions.csv", index=False)
    metrics = {
        "cell": {**cell.__dict__, "name": cell.name, "partition": cell.partition},
        "test": engine.task.scores(predictions),
        "valid": engine.task.evaluate(model, "global", "valid"),
        "history": state.history,
        "channel": engine.channel.summary(),
        "memory_bytes": engine.memory_bytes(),
        "parameters": parameter_counts(engine),
        "truncated_train_sentences": engine.task.truncated,
        "hardware": machine_fingerprint(),
    }
    write_json(out / "metrics.json", metrics)
    return metrics


def headline(metrics: dict) -> str:
    """A finished cell in a few words, for the stage's progress lines."""
    return f"test micro-F1 {metrics['test']['micro_f1']:.3f}"
