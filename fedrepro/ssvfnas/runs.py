"""Running one SS-VFNAS cell from validated params: shared by the cell stage, the tests and the benchmarks.

Rows: a stratified, seeded share of the partition's train split is held out of every phase (``hold_out``: the
sanity protocol's held-out rows); "train" below is the rest of it. The retraining is validated on the held-out rows,
so a cell's health (``fedrepro.fl.health``) is judged without touching test.

A search cell (``Cell.method`` in vfnas1 / vfnas2 / ss_vfnas1 / ss_vfnas2):

1. pre-search (ss_ methods only): MoCo v2 at every party on its own training rows (train + search-valid, no
   labels, no message); the party's supernet keeps the pre-searched weights AND alphas;
2. collaborative search over the ``VerticalProtocol``: DARTS first order (VFNAS-1; second order with
   ``search.second_order``) or MiLeNAS (VFNAS-2), SGD with a cosine learning rate on the weights, Adam on the
   alphas; every ``eval_every`` steps the supernets' test accuracy, the cumulative messages and bytes and each
   party's epsilon so far are recorded (the accuracy-vs-bytes and accuracy-vs-epsilon curves); a checkpoint every
   ``checkpoint_every`` steps (``save_state``), so a killed cell resumes to identical results;
3. each party's genotype (DARTS's discretisation of its own alphas) and its drawing;
4. retraining from scratch: the derived networks and a fresh top network trained by split learning on train +
   search-valid, under the same DP mechanisms, with the same checkpointing; every ``retrain.eval_every`` steps the mean
   training loss since the previous point and the held-out accuracy (``retrain.curve``, and the cell's ``health``);
   test accuracy and predictions.

A baseline cell (``hand_designed``) runs step 4 only, on a plain stack per party whose width makes its parameter
count closest to the expected size of a derived network of the same skeleton (``reference_parameters``).

The building blocks (data, networks, mechanisms, the step loop, what a phase measures, epsilon) are in
``fedrepro.ssvfnas.phases``, which the party processes (``fedrepro.ssvfnas.parties``) share.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from fedrepro.code_closure import cell_code, code_digest
from fedrepro.config import Params
from fedrepro.device import configure
from fedrepro.errors import DataError
from fedrepro.hardware import machine_fingerprint
from fedrepro.grid import fingerprint
from fedrepro.io import atomic_dir, read_json, read_table, write_json
from fedrepro.ledger import Gold, join_column
from fedrepro.seeding import derive_seed, seed_everything
from fedrepro.ssvfnas.cells import Cell, retrain_health
from fedrepro.ssvfnas.parties import run_on_parties, runtime_parties
from fedrepro.ssvfnas.phases import (
    EVAL_BATCH,
    HELD_OUT,
    PartitionData,
    PartyRunner,
    alpha_stats,
    alpha_summary,
    baseline_networks,
    build_supernets,
    build_top,
    curve_point,
    derived_networks,
    hold_out,
    load_partition,
    make_protocol,
    make_search,
    one_party,
    phase_losses,
    presearch_party,
    retrain_metrics,
    run_steps,
    search_metrics,
    validation_curve,
    validation_point,
)
from fedrepro.vfl.protocol import party_name
from fedrepro.vfl.spaces import count_parameters, draw_genotype


# ----- one cell, phase by phase ---------------------------------------------------------------------------------
def run_fingerprint(params: Params, cell: Cell, inputs_digest: str) -> str:
    """Changes whenever anything that shapes the cell changes (not the grid's lists); a checkpoint of another run
    is never resumed."""
    ss = params.ssvfnas
    return fingerprint(
        asdict(cell),
        inputs_digest,
        {
            "fidelity": ss.fidelity,
            "split": ss.split.model_dump(),
            "search": ss.search.model_dump(),
            "moco": ss.moco.model_dump(),
            "retrain": ss.retrain.model_dump(),
            "dp": ss.dp.model_dump(),
            "held_out_seed": params.data.seed,
            "threads": ss.threads,
            "runtime": params.train.runtime,
        },
        code_digest(cell_code(__name__, params.train.runtime)),
    )


def prepare_checkpoints(folder: Path, fingerprint: str) -> None:
    """Keep ``folder`` only if it holds this very run; otherwise start it afresh."""
    folder = Path(folder)
    marker = folder / "fingerprint.json"
    if marker.exists() and read_json(marker).get("fingerprint") == fingerprint:
        return
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    write_json(marker, {"fingerprint": fingerprint})


def run_presearch(
    params: Params, cell: Cell, data: PartitionData, bottoms: list[nn.Module], folder: Path, cache: dict | None = None
) -> dict[str, list[float]]:
    """MoCo v2 at every party on its own training rows; the supernets end with the pre-searched weights and alphas.
    Saved to ``folder`` once done (a killed pre-search reruns from the start, to the same result). It depends only
    on the partition, the seed and the MoCo settings, so ``cache`` may share it between the cells of one process."""
    key = (data.name, cell.seed)
    if (folder / "presearch.json").exists():
        states = [load_file(str(folder / f"{party_name(k)}.safetensors")) for k in range(len(bottoms))]
        losses = read_json(folder / "presearch.json")["losses"]
    elif cache is not None and key in cache:
        states, losses = cache[key]
    else:
        rows = data.training_rows
        losses = {
            party_name(k): presearch_party(params, cell.seed, data.name, k, bottom, data.features[k][rows])
            for k, bottom in enumerate(bottoms)
        }
        states = [{n: t.detach().clone() for n, t in b.state_dict().items()} for b in bottoms]
    for bottom, state in zip(bottoms, states):
        bottom.load_state_dict(state)
    if not (folder / "presearch.json").exists():
        with atomic_dir(folder) as tmp:
            for k, state in enumerate(states):
                save_file(
                    {n: t.cpu().contiguous() for n, t in state.items()}, str(tmp / f"{party_name(k)}.safetensors")
                )
            write_json(tmp / "presearch.json", {"losses": losses})
    if cache is not None:
        cache[key] = (states, losses)
    return losses


def cell_inputs(cell: Cell, partitions_dir: Path) -> tuple[Path, ...]:
    """The folders a cell reads, which its fingerprint digests: its partition only."""
    return (Path(partitions_dir) / cell.partition,)


def run_cell(
    params: Params,
    cell: Cell,
    partitions_dir: Path,
    out: Path,
    checkpoints: Path,
    inputs_digest: str,
    presearch_cache: dict | None = None,
    parties: PartyRunner | None = None,
) -> dict[str, Any]:
    """Run (or resume) one cell and write its outputs into ``out`` (created): metrics.json, predictions.csv,
    curve.csv (search cells), genotypes.json and cells/party_<j>.png (search cells). Returns the metrics.

    In process (``train.runtime: engine``) every party lives in this process (``VerticalProtocol``). Otherwise this
    process is the label party, holding only its own columns and the labels, and each other party runs on its own
    side (``fedrepro.ssvfnas.parties``): ``parties`` runs them (default: per ``train.runtime``). Both write the same
    outputs.

    It computes on ``train.device``: the networks are built on the CPU under their seeds and then moved there, the
    partition's rows go there when a protocol takes them, and every random draw (batches, DP noise, augmentations)
    stays on a CPU generator, so the CPU's bits do not depend on the setting; the device is recorded with the machine
    (``hardware``), not in the run's fingerprint."""
    ss = params.ssvfnas
    partition = Path(partitions_dir) / cell.partition
    configure(params.train.device)
    seed_everything(cell.seed, ss.threads)
    if parties is None and params.train.runtime != "engine" and not cell.label_alone:
        parties = runtime_parties(params.train)
    data = hold_out(
        load_partition(partition, label_only=parties is not None), ss.retrain.held_out_fraction, params.data.seed
    )
    if data.parties != cell.parties:
        raise DataError(
            f"{partition} has {data.parties} parties, cell {cell.name} wants {cell.parties}: rerun ssvfnas_partition"
        )
    checkpoints = Path(checkpoints)
    run = run_fingerprint(params, cell, inputs_digest)
    prepare_checkpoints(checkpoints, run)
    metrics: dict[str, Any] = {"cell": {**asdict(cell), "name": cell.name, "partition": cell.partition, "dp": cell.dp}}
    if cell.label_alone:  # nothing crosses: in process on every runtime
        return run_label_alone(params, cell, data, out, checkpoints, metrics)
    if parties is None:
        measured, predicted = run_in_process(params, cell, data, checkpoints, presearch_cache)
    else:
        measured, predicted = run_on_parties(params, cell, data, partition, checkpoints, run, parties)
    metrics |= measured
    metrics["hardware"] = machine_fingerprint(params.train.device)
    write_outputs(Path(out), cell, data, metrics, predicted)
    return metrics


def run_in_process(
    params: Params, cell: Cell, data: PartitionData, checkpoints: Path, presearch_cache: dict | None = None
) -> tuple[dict[str, Any], torch.Tensor]:
    """A search or baseline cell with every party in this process: its measured metrics and test predictions."""
    ss = params.ssvfnas
    train, valid, test = data.splits["train"], data.splits["valid"], data.splits["test"]
    measured: dict[str, Any] = {}
    search_ledger = None
    parameters: dict[str, Any] = {}
    if not cell.baseline:
        bottoms = build_supernets(params, data, cell.seed)
        alpha_init = [b.alphas.detach().clone() for b in bottoms]
        top = build_top(params, data, cell.seed, "search")
        protocol = make_protocol(params, cell, data, bottoms, top, cell.seed, {"train": len(train), "val": len(valid)})
        search = make_search(params, cell.rule, protocol, ss.search.lr)
        # a finished pre-search only loads its saved weights here, so a resumed cell knows the alphas its search
        # began at
        losses = (
            run_presearch(params, cell, data, bottoms, checkpoints / "presearch", presearch_cache)
            if cell.presearch
            else None
        )
        alpha_start = [b.alphas.detach().clone() for b in bottoms]
        run_steps(
            search,
            train,
            valid,
            ss.search.batch_size,
            ss.search.steps,
            ss.search.lr,
            ss.search.lr_min,
            ss.search.eval_every,
            ss.search.checkpoint_every,
            checkpoints / "search",
            curve_point(protocol, test, ss.dp.delta, lambda: alpha_stats(bottoms, alpha_start)),
        )
        genotypes = [b.genotype() for b in bottoms]
        measured |= search_metrics(
            params,
            cell,
            protocol,
            search.history,
            (search.messages_per_step(), search.exchanges_per_step()),
            losses,
            alpha_summary(bottoms, alpha_init, alpha_start),
            genotypes,
        )
        search_ledger = protocol.ledger
        parameters["supernet"] = [count_parameters(b) for b in bottoms]
        nets = derived_networks(params, data, cell.seed, genotypes)
    else:
        nets, targets = baseline_networks(params, data, cell.seed)
        parameters["baseline_target"] = targets
    # retraining: derived networks or the baseline, from scratch, on train + search-valid, validated on the
    # held-out rows
    rows, held_out = data.training_rows, data.splits[HELD_OUT]
    top = build_top(params, data, cell.seed, "retrain")
    retrain = make_protocol(params, cell, data, nets, top, derive_seed(cell.seed, "retrain"), {"train": len(rows)})
    training = make_search(params, None, retrain, ss.retrain.lr)
    run_steps(
        training,
        rows,
        None,
        ss.retrain.batch_size,
        ss.retrain.steps,
        ss.retrain.lr,
        ss.retrain.lr_min,
        ss.retrain.eval_every,
        ss.search.checkpoint_every,
        checkpoints / "retrain",
        validation_point(retrain, held_out),
    )
    result = retrain.evaluate(test, batch_size=EVAL_BATCH, split="test", account=False, predictions=True)
    parameters["bottom"] = [count_parameters(n) for n in nets]
    parameters["top"] = count_parameters(top)
    measured |= retrain_metrics(
        params,
        data,
        search_ledger,
        retrain,
        training.history,
        (training.messages_per_step(), training.exchanges_per_step()),
        top,
        result,
        retrain.evaluate_label_party_alone(test, EVAL_BATCH),
        parameters,
    )
    return measured, result["predicted"]


def run_label_alone(
    params: Params, cell: Cell, data: PartitionData, out: Path, checkpoints: Path, metrics: dict[str, Any]
) -> dict[str, Any]:
    """The label party's own network and a linear top on its own features only, retrained like the baseline (same rows,
    steps, schedule and held-out validation) and scored on the test rows: what the label party reaches with no
    partner."""
    ss = params.ssvfnas
    rows, held_out, test = data.training_rows, data.splits[HELD_OUT], data.splits["test"]
    alone = one_party(params, data, [data.label_party], cell.seed)
    training = make_search(params, None, alone, ss.retrain.lr)
    run_steps(
        training,
        rows,
        None,
        ss.retrain.batch_size,
        ss.retrain.steps,
        ss.retrain.lr,
        ss.retrain.lr_min,
        ss.retrain.eval_every,
        ss.search.checkpoint_every,
        checkpoints / "retrain",
        validation_point(alone, held_out),
    )
    curve = validation_curve(training.history)
    result = alone.evaluate(test, batch_size=EVAL_BATCH, split="test", account=False, predictions=True)
    party = alone.parties[0]
    metrics["retrain"] = {
        "steps": ss.retrain.steps,
        "loss_train": phase_losses(training.history, "loss_train"),
        "held_out_samples": len(held_out),
        "curve": curve,
        "valid_accuracy": curve[-1]["valid_accuracy"],
    }
    metrics["health"] = retrain_health(curve).as_dict()
    metrics["test"] = {"accuracy": result["accuracy"], "loss": result["loss"], "samples": len(test)}
    metrics["parameters"] = {"bottom": [count_parameters(party.bottom)], "top": count_parameters(party.top)}
    metrics["label_party"] = data.label_party
    metrics["hardware"] = machine_fingerprint(params.train.device)
    write_outputs(Path(out), cell, data, metrics, result["predicted"])
    return metrics


def headline(metrics: dict[str, Any]) -> str:
    """A finished cell in a few words, for the stage's progress lines."""
    if "epsilon_total_max" not in metrics:
        return f"test accuracy {metrics['test']['accuracy']:.3f}, nothing sent"
    eps = metrics["epsilon_total_max"]
    return f"test accuracy {metrics['test']['accuracy']:.3f}, epsilon {'-' if eps is None else f'{eps:.2f}'}"


def write_outputs(out: Path, cell: Cell, data: PartitionData, metrics: dict[str, Any], predicted: torch.Tensor) -> None:
    out.mkdir(parents=True)
    test = data.splits["test"]
    pd.DataFrame(
        {"sample_id": data.sample_ids[test.numpy()], "label": data.labels[test].numpy(), "predicted": predicted.numpy()}
    ).to_csv(out / "predictions.csv", index=False)
    write_json(out / "metrics.json", metrics)
    if cell.rule is None:
        return
    pd.DataFrame(metrics["search"]["curve"]).to_csv(out / "curve.csv", index=False, float_format="%.6g")
    write_json(out / "genotypes.json", {party_name(k): g for k, g in enumerate(metrics["genotypes"])})
    draw_cells(out, cell, metrics)


def draw_cells(out: Path, cell: Cell, metrics: dict[str, Any]) -> None:
    """Each party's searched cell as a picture (``cells/party_<k>.png``), from the genotypes in ``metrics``."""
    for k, genotype in enumerate(metrics["genotypes"]):
        role = " (labels)" if k == metrics["label_party"] else ""
        draw_genotype(
            genotype,
            f"{cell.method} {party_name(k)}{role}: {cell.partition}, {cell.dp}, seed {cell.seed}",
            out / "cells" / f"{party_name(k)}.png",
        )


def ledger_gold(partitions_dir: Path) -> Gold:
    """A cell as the results ledger keeps it (``fedrepro.ledger``): metrics, search curve, genotypes and test
    predictions, less each sample's label (from the partition's labels when the cell comes back) and the pictures
    of its cells (drawn again from the genotypes)."""
    return Gold(
        keep=("metrics.json", "predictions.csv", "curve.csv", "genotypes.json"),
        dropped_columns={"predictions.csv": ("label",)},
        join=functools.partial(join_gold, Path(partitions_dir)),
    )


def join_gold(partitions_dir: Path, cell: Cell, out: Path) -> None:
    """Each test sample's label back beside its prediction, and a searched cell's pictures drawn again."""
    labels = read_table(partitions_dir / cell.partition / "labels.parquet")
    join_column(
        out, "predictions.csv", "sample_id", "label", labels.set_index(labels["sample_id"].astype(str))["label"], 1
    )
    if cell.rule is not None:
        draw_cells(out, cell, read_json(out / "metrics.json"))
