"""One FedMatch-track cell from validated params: built (task + algorithm + runtime), run, and scored.

Shared by the train stage, the tests and the benchmarks, so they all build the very same run.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

from fedrepro.code_closure import cell_code, code_digest
from fedrepro.config import Params
from fedrepro.errors import ConfigError
from fedrepro.fedmatch.cells import Cell, cell_params, history_health
from fedrepro.fedmatch.methods import METHODS
from fedrepro.fl import algorithms
from fedrepro.fl.algorithm import Algorithm, CommonSettings
from fedrepro.fl.engine import Engine, EngineSettings, scoring
from fedrepro.fl.recipe import CellRecipe, SiloRecipe, recipe_spec
from fedrepro.fl.runtime import build_runtime
from fedrepro.fl.silo import SILOS, Manifest, ServerTaskView, read_manifest, read_silo, write_silos
from fedrepro.grid import fingerprint
from fedrepro.hardware import machine_fingerprint
from fedrepro.io import write_json
from fedrepro.ledger import Gold
from fedrepro.metrics.ranking import ranking_metrics, trec_files
from fedrepro.metrics.summary import overall
from fedrepro.models.backbone import build_encoder, encoder_layers, load_tokenizer
from fedrepro.models.cross_encoder import CrossEncoder
from fedrepro.models.patches import patch_effect, patch_norms
from fedrepro.tasks.qa import ClientQAData, QAMatchingTask, load_client_data, qrels_and_run

PATCH_EFFECT_BATCHES = 2
"""Valid batches (of the task's evaluation batch size, 128 candidates) a client's ``patch_effect`` is measured on: it
scores them twice (with and without the patches): over every valid candidate, that was two more valid passes per
client at the end of every patched cell, for a diagnostic that a fixed few hundred candidates estimate."""


def run_fingerprint(params: Params, cell: Cell, inputs_digest: str) -> str:
    """Changes whenever anything that shapes the run changes (params, inputs, code); a checkpoint from
    another run is never resumed. ``params`` as the grid has them: the cell's sweep point is applied here."""
    params = cell_params(params, cell)
    settings = params.fedmatch.settings
    if settings.shared_layers is not None and settings.shared_layers >= encoder_layers(
        params.model.backbone, params.model.tiny.model_dump(), params.model.keep_layers
    ):
        # sharing at least every encoder layer is sharing all of them (null): Fig 5's top point is the table cell
        settings = settings.model_copy(update={"shared_layers": None})
        params = params.model_copy(update={"fedmatch": params.fedmatch.model_copy(update={"settings": settings})})
    # the timeouts only say how long a deployment waits, and silo-local data only where each node reads its client's
    # rows from: a run whose every client answers in time is the same, number for number (tests/test_flower.py)
    train = params.train.model_dump(exclude={"reply_timeout", "run_timeout", "silo_local"})
    method = METHODS[cell.method]
    identity = {"method": cell.method, "seed": cell.seed, "data_ratio": data_ratio(cell)}
    code = code_digest(cell_code(__name__, params.train.runtime, algorithms.REGISTRY[method.algorithm].__module__))
    return fingerprint(
        identity,
        inputs_digest,
        {
            "model": params.model.model_dump(),
            "train": train,
            "fedmatch": params.fedmatch.settings.model_dump(),
            "algorithm": algorithm_settings(params, cell.method).model_dump(mode="json"),
        },
        code,
    )


def build_model_factory(params: Params, tokenizer, model: str):
    """A zero-argument builder of the matching model: the cross-encoder, or a non-BERT matcher (RE2, ESIM)."""
    model_params, pooling = params.model, params.fedmatch.settings.pooling
    if model == "bert":

        def build() -> CrossEncoder:
            encoder = build_encoder(
                model_params.backbone,
                len(tokenizer),
                model_params.tiny.model_dump(),
                model_params.max_length,
                model_params.keep_layers,
            )
            return CrossEncoder(encoder, pooling)

        return build
    from fedrepro.models.matchers import MatcherSpec, build_matcher

    dim = params.fedmatch.settings.matcher_dim
    spec = MatcherSpec(
        vocab_size=len(tokenizer),
        pad_id=tokenizer.pad_token_id,
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
        embedding_dim=dim,
        hidden=dim,
    )
    return lambda: build_matcher(model, spec)


def build_qa_task(params: Params, mined_dir: Path, tokenizer_dir: Path, model: str = "bert") -> QAMatchingTask:
    """The clients' mined data, tokenised once."""
    clients = load_client_data(mined_dir, sorted(p.name for p in Path(mined_dir).iterdir() if p.is_dir()))
    return qa_task(params, clients, tokenizer_dir, model)


def qa_task(params: Params, clients: dict[str, ClientQAData], tokenizer_dir: Path, model: str) -> QAMatchingTask:
    tokenizer = load_tokenizer(params.model.backbone, tokenizer_dir)
    loss = "cross_entropy" if params.fedmatch.settings.fidelity == "released_code" else "hinge"
    return QAMatchingTask(
        clients,
        tokenizer,
        build_model_factory(params, tokenizer, model),
        params.model.max_length,
        params.train.batch_size,
        loss=loss,
    )


def algorithm_settings(params: Params, method: str) -> Algorithm.Settings:
    """The method's algorithm knobs (params.yaml ``algorithms``); FedMatch's patch, shared layers and fidelity come
    from fedmatch.settings, where Figs 5-6 sweep them."""
    from fedrepro.models.patches import PatchSpec

    recipe, settings = METHODS[method], params.fedmatch.settings
    per_cell = {}
    if recipe.insertion is not None:
        try:
            patch = PatchSpec(recipe.insertion, recipe.structure, settings.patch_size, settings.patch_heads)
        except ValueError as error:  # size and heads are the params' patch_size and patch_heads
            raise ConfigError(f"params: fedmatch.settings.patch_{error} (for {method})") from None
        per_cell = {"patch": patch, "shared_layers": settings.shared_layers, "fidelity": settings.fidelity}
    return algorithms.algorithm_settings(recipe.algorithm, params.algorithms, **per_cell)


def cell_task(params: Params, cell: Cell, mined_dir: Path, tokenizer_dir: Path) -> QAMatchingTask:
    """The cell's task; module-level, so a Flower node can build it again from the cell's recipe."""
    return with_cell_sweep(params, cell, build_qa_task(params, mined_dir, tokenizer_dir, METHODS[cell.method].model))


def data_ratio(cell: Cell) -> float:
    """The share of each client's training questions the cell trains on: Fig 8's point, else all of them."""
    return float(cell.value) if cell.sweep == "data_ratio" else 1.0


def with_cell_sweep(params: Params, cell: Cell, task: QAMatchingTask) -> QAMatchingTask:
    """Fig 8's data ratio, which each client applies to its own questions (seeded by its id). At 1.0 the task is
    the table's, untouched: the cell is the table cell (the same fingerprint), trained once."""
    ratio = data_ratio(cell)
    return task if ratio == 1.0 else task.with_train_fraction(ratio, params.data.seed)


def write_cell_silos(params: Params, cell: Cell, mined_dir: Path, tokenizer_dir: Path, root: Path) -> Manifest:
    """The mined data laid out as the silos would receive it (``fedrepro.fl.silo``): each client's own training
    triples (its mined negatives included) and evaluation candidates; the server's manifest of the training sizes
    the cell's clients train on (after its data ratio)."""
    params = cell_params(params, cell)
    clients = load_client_data(mined_dir, sorted(p.name for p in Path(mined_dir).iterdir() if p.is_dir()))
    task = with_cell_sweep(params, cell, qa_task(params, clients, tokenizer_dir, METHODS[cell.method].model))
    tables = {c: {"triples": data.triples, "candidates": data.candidates} for c, data in clients.items()}
    return write_silos(root, tables, {c: task.num_train_samples([c]) for c in task.client_ids})


def silo_cell_task(params: Params, cell: Cell, tokenizer_dir: Path, data_dir: Path) -> QAMatchingTask:
    """One client's task from its silo directory alone (a node of a silo-local run)."""
    silo = read_silo(data_dir)
    clients = {silo.client_id: ClientQAData(silo.tables["triples"], silo.tables["candidates"])}
    return with_cell_sweep(params, cell, qa_task(params, clients, tokenizer_dir, METHODS[cell.method].model))


def server_cell_task(params: Params, cell: Cell, tokenizer_dir: Path, silos_dir: Path) -> ServerTaskView:
    """The server's task of a silo-local run: the manifest's clients and sizes and the model (each client scores
    its own model on its node, so the server scores nothing)."""
    tokenizer = load_tokenizer(params.model.backbone, tokenizer_dir)
    return ServerTaskView(read_manifest(silos_dir), build_model_factory(params, tokenizer, METHODS[cell.method].model))


def cell_recipe(
    params: Params, cell: Cell, mined_dir: Path, tokenizer_dir: Path, inputs_digest: str, silos_dir: Path | None = None
) -> CellRecipe:
    """Everything that shapes one cell's run, rebuildable in another process (a Flower node). With ``silos_dir``
    (laid out by ``write_cell_silos``) it runs on Flower silo-local: each node reads its own client's directory only,
    the server the manifest only; every number of the run is the same, and so is its fingerprint."""
    mined_dir, tokenizer_dir = Path(mined_dir).resolve(), Path(tokenizer_dir).resolve()
    spec = recipe_spec("fedrepro.fedmatch.runs:spec_recipe", params, cell, [mined_dir, tokenizer_dir], inputs_digest)
    run = run_fingerprint(params, cell, inputs_digest)
    params = cell_params(params, cell)
    silo = None
    if silos_dir is not None:
        silos_dir = Path(silos_dir).resolve()
        spec["kwargs"]["silos_dir"] = str(silos_dir)
        silo = SiloRecipe(
            silos_dir,
            functools.partial(silo_cell_task, params, cell, tokenizer_dir),
            functools.partial(server_cell_task, params, cell, tokenizer_dir, silos_dir),
        )
    recipe, train = METHODS[cell.method], params.train
    settings = EngineSettings(
        rounds=train.rounds,
        local_epochs=train.local_epochs,
        clients_per_round=params.fedmatch.settings.clients_sampled
        if recipe.client_sampling
        else train.clients_per_round,
        lr=train.lr if recipe.model == "bert" else params.fedmatch.settings.matcher_lr,
        batch_size=train.batch_size,
        warmup_fraction=train.warmup_fraction,
        max_grad_norm=train.max_grad_norm,
        seed=cell.seed,
        eval_every=train.eval_every,
        precision=train.precision,
        fit_samples=train.fit_samples,
        device=train.device,
    )
    return CellRecipe(
        build_task=functools.partial(cell_task, params, cell, mined_dir, tokenizer_dir),
        algorithm=recipe.algorithm,
        algorithm_settings=algorithm_settings(params, cell.method),
        common=CommonSettings(weighting=train.weighting),
        settings=settings,
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
    mined_dir: Path,
    tokenizer_dir: Path,
    inputs_digest: str,
    checkpoint_dir: Path,
    progress: bool = True,
) -> Engine:
    """The runtime (``train.runtime``) for one cell; it resumes from ``checkpoint_dir`` when that holds this very run.
    With ``train.silo_local`` the cell's data is first laid out one directory per client in ``<checkpoint_dir>/silos``
    (``write_cell_silos``), where its nodes read it."""
    train = cell_params(params, cell).train
    silos_dir = None
    if train.silo_local:
        silos_dir = Path(checkpoint_dir) / SILOS
        write_cell_silos(params, cell, mined_dir, tokenizer_dir, silos_dir)
    recipe = cell_recipe(params, cell, mined_dir, tokenizer_dir, inputs_digest, silos_dir)
    return build_runtime(
        recipe,
        train.runtime,
        checkpoint_dir,
        progress,
        reply_timeout=train.reply_timeout,
        run_timeout=train.run_timeout,
    )


def cell_inputs(cell: Cell, mined_dir: Path, tokenizer_dir: Path) -> tuple[Path, ...]:
    """The folders a cell reads, which its fingerprint digests: every cell reads every client's mined data."""
    return mined_dir, tokenizer_dir


def parameter_counts(engine: Engine) -> dict[str, int]:
    """Total, trainable, private (never sent) and uploaded (sent by a client each round it trains) parameters."""
    params = engine.params
    return {
        "total": sum(p.numel() for p in params.values()),
        "trainable": sum(p.numel() for p in params.values() if p.requires_grad),
        "private": sum(params[n].numel() for n in engine.private_names),
        "uploaded": sum(params[n].numel() for n in engine.shared_names) if engine.algorithm.federated else 0,
    }


def run_cell(
    params: Params,
    cell: Cell,
    mined_dir: Path,
    tokenizer_dir: Path,
    out: Path,
    checkpoint_dir: Path,
    inputs_digest: str,
) -> dict:
    """Train (or resume) one cell, then score each client's own model on its test candidates and measure how far
    its private patch (if any) moved from its initial weights; write metrics.json and the TREC files into ``out``
    (created). Returns the metrics."""
    engine = build_cell(params, cell, mined_dir, tokenizer_dir, inputs_digest, checkpoint_dir)
    state = engine.run()
    (out / "trec").mkdir(parents=True)
    per_client, norms = {}, {}
    own_task = functools.partial(silo_cell_task, cell_params(params, cell), cell, Path(tokenizer_dir).resolve())
    with scoring(engine.settings.precision, engine.settings.device):
        for client_id, model in engine.client_models():
            silo_local = isinstance(engine.task, ServerTaskView)  # the server holds no rows: each client scores its own
            task = own_task(Path(checkpoint_dir) / SILOS / client_id) if silo_local else engine.task
            norms[client_id] = patch_norms(model.named_parameters(), engine.initial_private)
            if norms[client_id]:
                valid = itertools.islice(task.candidate_batches(client_id, "valid"), PATCH_EFFECT_BATCHES)
                norms[client_id].update(patch_effect(model, valid))
            qrels, run = qrels_and_run(task.score(model, client_id, "test"))
            per_client[client_id] = ranking_metrics(qrels, run)
            qrels_text, run_text = trec_files(qrels, run, cell.name)
            (out / "trec" / f"{client_id}.qrels").write_text(qrels_text)
            (out / "trec" / f"{client_id}.run").write_text(run_text)
    metrics = {
        "cell": {"method": cell.method, "seed": cell.seed, "sweep": cell.sweep, "value": cell.value},
        "history": state.history,
        "health": history_health(state.history).as_dict(),
        "test": {"clients": per_client, "overall": overall(per_client)},
        "channel": engine.channel.summary(),
        "memory_bytes": engine.memory_bytes(),
        "parameters": parameter_counts(engine),
        **({"patch_norms": norms} if any(norms.values()) else {}),
        "hardware": machine_fingerprint(engine.settings.device),
    }
    write_json(out / "metrics.json", metrics)
    return metrics


def ledger_gold(mined_dir: Path) -> Gold:
    """A cell as the results ledger keeps it (``fedrepro.ledger``): its metrics and TREC runs; the qrels (which answers
    are relevant) come back from the mined candidates."""
    return Gold(
        keep=("metrics.json", "trec/*"),
        dropped_files=("trec/*.qrels",),
        join=functools.partial(join_qrels, Path(mined_dir)),
    )


def join_qrels(mined_dir: Path, cell: Cell, out: Path) -> None:
    """Each scored client's test qrels, from its mined candidates, as the cell's scoring wrote them."""
    for run_file in sorted((out / "trec").glob("*.run")):
        client_id = run_file.stem
        candidates = load_client_data(mined_dir, [client_id])[client_id].candidates
        test = candidates.loc[(candidates["split"] == "test").to_numpy(), ["question_id", "answer_id", "relevance"]]
        qrels, _ = qrels_and_run(test.assign(score=0.0))
        (out / "trec" / f"{client_id}.qrels").write_text(trec_files(qrels, {}, cell.name)[0])


def headline(metrics: dict) -> str:
    """A finished cell in a few words, for the stage's progress lines."""
    return f"overall test MAP {metrics['test']['overall']['map']:.3f}, MRR {metrics['test']['overall']['mrr']:.3f}"
