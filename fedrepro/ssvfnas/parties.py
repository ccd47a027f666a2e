"""One SS-VFNAS cell with every party on its own side (``train.runtime`` other than the engine): the label party drives
the search and the retraining over ``fedrepro.vfl.nodes``' node protocol, each other party holds only its own columns
and networks, and the cell's outputs equal the in-process run's (``runs.run_in_process``).

What each party does alone (``CellTasks``, asked by the label party through ``VerticalHub.local``): its MoCo
pre-search on its own training rows; the entropy and shift of its own alphas at each curve point; at the end of the
search its genotype, its alphas' summary and its supernet's size, which it reports and keeps (``genotype.json`` in its
directory) to build its derived network for the retraining. Those reports are the only things that cross besides the
protocol's activations and gradients, and the label party logs them on its ``report_channel``.

Each phase (search, retraining) is one run of the parties (``PartyRunner``): in this process over ``LocalTransport``
(``local_parties``, for tests), on Flower's simulation (``flower_parties``) or on a real deployment
(``deployment_parties``), each party a node.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from fedrepro.config import Params
from fedrepro.errors import ConfigError
from fedrepro.io import atomic_dir, read_json, read_table, write_json
from fedrepro.seeding import derive_seed
from fedrepro.ssvfnas.cells import Cell
from fedrepro.ssvfnas.phases import (
    EVAL_BATCH,
    HELD_OUT,
    PartitionData,
    PartyRunner,
    baseline_networks,
    baseline_targets,
    build_supernets,
    build_top,
    combine_alpha_summaries,
    curve_point,
    derived_network,
    load_party_columns,
    mechanisms,
    party_alpha_summary,
    presearch_party,
    retrain_metrics,
    run_steps,
    search_metrics,
    validation_point,
)
from fedrepro.vfl.nodes import LocalTransport, PartyWorker, VerticalHub, VerticalRecipe, party_directory
from fedrepro.vfl.protocol import Party, party_name
from fedrepro.vfl.search import rule_cost
from fedrepro.vfl.spaces import count_parameters

GENOTYPE, REPORTS = "genotype.json", "reports.json"

PRESEARCHED: dict[tuple, tuple[dict[str, torch.Tensor], list[float]]] = {}
"""This process's pre-searches, by (params, seed, dataset, party, rows): a party's pre-search depends on nothing else,
so the later cells of a partition and seed (DARTS and MiLeNAS, each DP level) load it, as the in-process run shares
one pre-search between a process's cells (``runs.run_presearch``'s cache)."""


def layout(partition: Path) -> PartitionData:
    """The partition's shape (summary.json) without any rows: what every party knows of the federation."""
    summary = read_json(Path(partition) / "summary.json")
    return PartitionData(summary["name"], summary, [], torch.zeros(0, dtype=torch.long), np.zeros(0), {})


@dataclass(frozen=True)
class CellParty:
    """Builds party ``index`` alone for one phase of a cell, from its own files (picklable: Flower ships it)."""

    params: Params
    cell: Cell
    partition: Path
    phase: str
    """"search" (its supernet) or "retrain" (its derived network, or the baseline's)."""
    genotypes: Path | None = None
    """Retraining a searched cell: the search phase's root, where each party left its ``genotype.json``."""

    def __call__(self, index: int) -> Party:
        """Party ``index`` on ``train.device``: its networks as the builders make them (drawn on the CPU, then moved),
        its rows (and the labels) beside them."""
        shape, device = layout(self.partition), self.params.train.device
        features = load_party_columns(self.partition, shape.summary, index).to(device)
        if self.phase == "search":
            bottom = build_supernets(self.params, shape, self.cell.seed)[index]
        elif self.cell.baseline:
            bottom = baseline_networks(self.params, shape, self.cell.seed)[0][index]
        else:
            genotype = read_json(party_directory(self.genotypes, index) / GENOTYPE)
            bottom = derived_network(self.params, shape, self.cell.seed, index, genotype)
        if index != shape.label_party:
            return Party(index, features, bottom)
        labels = torch.tensor(
            read_table(self.partition / "labels.parquet")["label"].to_numpy(), dtype=torch.long, device=device
        )
        return Party(index, features, bottom, labels, build_top(self.params, shape, self.cell.seed, self.phase))


@dataclass(frozen=True)
class CellTasks:
    """A party's own work in a cell (``VerticalRecipe.local``); it keeps its alphas at build and at the search's
    start in this process, by party."""

    params: Params
    seed: int
    dataset: str
    alphas: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, compare=False)

    def __call__(self, task: str, party: Party, directory: Path | None, command: dict[str, Any]) -> Any:
        bottom, k = party.bottom, party.index
        if task == "begin":
            init = bottom.alphas.detach().clone()
            losses = self._presearch(party, directory, command["rows"]) if command["presearch"] else None
            self.alphas[k] = (init, bottom.alphas.detach().clone())
            return {"losses": losses}
        if task == "alphas":
            start = self.alphas[k][1]
            return {"entropy": bottom.arch_entropy(), "shift": float((bottom.alphas.detach() - start).abs().max())}
        if task == "finish":
            genotype = bottom.genotype()
            write_json(Path(directory) / GENOTYPE, genotype)
            return {
                "genotype": genotype,
                "alpha": party_alpha_summary(bottom, *self.alphas[k]),
                "parameters": count_parameters(bottom),
            }
        if task == "parameters":
            return {"parameters": count_parameters(bottom)}
        raise ValueError(f"{party.name}: unknown task {task!r} (allowed begin, alphas, finish, parameters)")

    def _presearch(self, party: Party, directory: Path | None, rows: list[int]) -> list[float]:
        """Its MoCo pre-search (``phases.presearch_party``) on its own rows, kept in its directory once done, so a
        resumed cell loads it, and in ``PRESEARCHED``, so a later cell of this process does."""
        folder = Path(directory) / "presearch"
        if (folder / "presearch.json").exists():
            party.bottom.load_state_dict(load_file(str(folder / f"{party.name}.safetensors")))
            return read_json(folder / "presearch.json")["losses"]
        key = (self.params.model_dump_json(), self.seed, self.dataset, party.index, tuple(rows))
        if key in PRESEARCHED:
            state, losses = PRESEARCHED[key]
            party.bottom.load_state_dict(state)
        else:
            losses = presearch_party(
                self.params,
                self.seed,
                self.dataset,
                party.index,
                party.bottom,
                party.features[torch.tensor(rows, dtype=torch.long)],
            )
            state = {n: t.detach().clone() for n, t in party.bottom.state_dict().items()}
            PRESEARCHED[key] = (state, losses)
        with atomic_dir(folder) as tmp:
            save_file({n: t.cpu().contiguous() for n, t in state.items()}, str(tmp / f"{party.name}.safetensors"))
            write_json(tmp / "presearch.json", {"losses": losses})
        return losses


def cell_recipe(
    params: Params,
    cell: Cell,
    data: PartitionData,
    partition: Path,
    phase: str,
    fingerprint: str,
    genotypes: Path | None = None,
) -> VerticalRecipe:
    """What every party needs to rebuild its side of one phase: the settings ``phases.make_protocol`` and
    ``phases.make_search`` give the in-process run."""
    ss = params.ssvfnas
    s, search = ss.search, phase == "search"
    forward, backward = mechanisms(params, cell)
    sizes = (
        (("train", len(data.splits["train"])), ("val", len(data.splits["valid"])))
        if search
        else (("train", len(data.training_rows)),)
    )
    return VerticalRecipe(
        CellParty(params, cell, Path(partition), phase, genotypes),
        cell.parties,
        data.label_party,
        cell.rule if search else "train",
        cell.seed if search else derive_seed(cell.seed, "retrain"),
        f"{fingerprint}-{phase}",
        threads=ss.threads,
        optimizers={
            "lr": s.lr if search else ss.retrain.lr,
            "momentum": s.momentum,
            "weight_decay": s.weight_decay,
            "arch_lr": s.arch_lr,
            "arch_weight_decay": s.arch_weight_decay,
        },
        grad_clip=s.grad_clip,
        lam=s.milenas_lambda,
        bundle=ss.fidelity == "paper",
        second_order=s.second_order,
        xi=s.lr,
        forward_mechanism=forward,
        backward_mechanism=backward,
        split_sizes=sizes,
        local=CellTasks(params, cell.seed, data.name),
        device=params.train.device,
    )


class HubSteps:
    """The label party's hub as ``phases.run_steps``' stepper."""

    def __init__(self, hub: VerticalHub) -> None:
        self.hub = hub

    @property
    def step(self) -> int:
        return self.hub.step

    @property
    def seed(self) -> int:
        return self.hub.recipe.seed

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.hub.history

    def run_step(self, train_batch: torch.Tensor, val_batch: torch.Tensor | None, lr: float) -> None:
        self.hub.run_step(train_batch, val_batch, lr)

    def save(self, folder: Path) -> None:
        self.hub.save_state(folder)

    def load(self, folder: Path) -> None:
        self.hub.load_state(folder)


def _cost(recipe: VerticalRecipe) -> tuple[int, int]:
    return rule_cost(
        recipe.rule,
        len(recipe.others),
        second_order=recipe.second_order,
        global_norm=recipe.global_norm,
        bundle=recipe.bundle,
    )


def _every_party(cell: Cell, command: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    return {k: dict(command or {}) for k in range(cell.parties)}


@dataclass(frozen=True)
class SearchPhase:
    """The label party's search (``PartyRunner``'s ``drive``): the parties' pre-search, the steps with a curve point
    each ``eval_every``, and each party's genotype, alphas' summary and size. Returns (the search's metrics, its
    ledger, the supernets' sizes). Picklable: a deployment's ServerApp process loads it."""

    params: Params
    cell: Cell
    data: PartitionData
    root: Path
    cost: tuple[int, int]

    def __call__(self, hub: VerticalHub) -> tuple[dict[str, Any], Any, list[int]]:
        ss, cell, data = self.params.ssvfnas, self.cell, self.data
        begin = hub.local(
            "begin", _every_party(cell, {"presearch": cell.presearch, "rows": data.training_rows.tolist()})
        )
        losses = {party_name(k): begin[k]["losses"] for k in range(cell.parties)} if cell.presearch else None
        alphas = lambda: [r for _, r in sorted(hub.local("alphas", _every_party(cell)).items())]  # noqa: E731
        run_steps(
            HubSteps(hub),
            data.splits["train"],
            data.splits["valid"],
            ss.search.batch_size,
            ss.search.steps,
            ss.search.lr,
            ss.search.lr_min,
            ss.search.eval_every,
            ss.search.checkpoint_every,
            self.root / "label",
            curve_point(hub, data.splits["test"], ss.dp.delta, alphas),
        )
        finish = [r for _, r in sorted(hub.local("finish", _every_party(cell)).items())]
        found = search_metrics(
            self.params,
            cell,
            hub,
            hub.history,
            self.cost,
            losses,
            combine_alpha_summaries([r["alpha"] for r in finish]),
            [r["genotype"] for r in finish],
        )
        _log_reports(hub, self.root)
        return found, hub.ledger, [r["parameters"] for r in finish]


@dataclass(frozen=True)
class RetrainPhase:
    """The label party's retraining: the steps with a held-out point each ``eval_every``, the test evaluation and the
    parties' sizes. Returns (the retraining's metrics, the test predictions). Picklable, like ``SearchPhase``."""

    params: Params
    data: PartitionData
    search_ledger: Any
    root: Path
    cost: tuple[int, int]
    parameters: dict[str, Any]
    """What the search (the supernets' sizes) or the baseline (its target sizes) measured."""

    def __call__(self, hub: VerticalHub) -> tuple[dict[str, Any], torch.Tensor]:
        ss, data, test = self.params.ssvfnas, self.data, self.data.splits["test"]
        run_steps(
            HubSteps(hub),
            data.training_rows,
            None,
            ss.retrain.batch_size,
            ss.retrain.steps,
            ss.retrain.lr,
            ss.retrain.lr_min,
            ss.retrain.eval_every,
            ss.search.checkpoint_every,
            self.root / "label",
            validation_point(hub, data.splits[HELD_OUT]),
        )
        result = hub.evaluate(test, batch_size=EVAL_BATCH, split="test", account=False, predictions=True)
        sizes = hub.local("parameters", {k: {} for k in range(data.parties)})
        parameters = {
            **self.parameters,
            "bottom": [sizes[k]["parameters"] for k in range(data.parties)],
            "top": count_parameters(hub.party.top),
        }
        _log_reports(hub, self.root)
        return retrain_metrics(
            self.params,
            data,
            self.search_ledger,
            hub,
            hub.history,
            self.cost,
            hub.party.top,
            result,
            hub.evaluate_label_party_alone(test, EVAL_BATCH),
            parameters,
        ), result["predicted"]


def run_on_parties(
    params: Params,
    cell: Cell,
    data: PartitionData,
    partition: Path,
    checkpoints: Path,
    fingerprint: str,
    parties: PartyRunner,
) -> tuple[dict[str, Any], torch.Tensor]:
    """``runs.run_in_process`` with the parties on their own sides; this process is the label party. Each phase keeps
    its checkpoints under ``checkpoints/parties/<phase>`` (the label party's in ``label``, each party's in its own
    directory), so a killed cell resumes to the same outputs; ``fingerprint`` (``runs.run_fingerprint``) names the run
    every party's checkpoints belong to."""
    root = Path(checkpoints).resolve() / "parties"
    measured: dict[str, Any] = {}
    search_ledger = None
    if not cell.baseline:
        recipe = cell_recipe(params, cell, data, partition, "search", fingerprint)
        found, search_ledger, sizes = parties(
            recipe, SearchPhase(params, cell, data, root / "search", _cost(recipe)), root / "search"
        )
        measured |= found
        parameters: dict[str, Any] = {"supernet": sizes}
    else:
        parameters = {"baseline_target": baseline_targets(params, data)}
    recipe = cell_recipe(params, cell, data, partition, "retrain", fingerprint, root / "search")
    trained, predicted = parties(
        recipe, RetrainPhase(params, data, search_ledger, root / "retrain", _cost(recipe), parameters), root / "retrain"
    )
    return measured | trained, predicted


def _log_reports(hub: VerticalHub, folder: Path) -> None:
    """What the parties reported of their local work, as logged on the label party's ``report_channel``: sender,
    receiver, names and bytes (``REPORTS`` in the phase's folder)."""
    write_json(Path(folder) / REPORTS, [m.to_record() for m in hub.report_channel.scalars])


def local_parties(recipe: VerticalRecipe, drive: Callable[[VerticalHub], Any], root: Path) -> Any:
    """A ``PartyRunner`` in this process: each party a ``PartyWorker`` with its own directory, over
    ``LocalTransport`` (the node protocol without a network)."""
    workers = {j: PartyWorker(recipe, recipe.build_party(j), party_directory(root, j)) for j in recipe.others}
    hub = VerticalHub(
        recipe, recipe.build_party(recipe.label), LocalTransport(workers), party_directory(root, recipe.label)
    )
    result = drive(hub)
    hub.save_parties()
    return result


def flower_parties(recipe: VerticalRecipe, drive: Callable[[VerticalHub], Any], root: Path) -> Any:
    """A ``PartyRunner`` on Flower's simulation: the label party in the ServerApp, every other party a node."""
    from fedrepro.fl.flower.vertical import VerticalSimulation

    return VerticalSimulation(recipe, root, drive).run()[1]


def deployment_parties(
    recipe: VerticalRecipe,
    drive: Callable[[VerticalHub], Any],
    root: Path,
    timeout: float = 86400,
    reply_timeout: float | None = None,
) -> Any:
    """A ``PartyRunner`` on a real Flower deployment on this machine: the label party in the ServerApp, every other
    party a SuperNode with its own service process (``fedrepro.fl.flower.vertical_deployment``)."""
    from fedrepro.fl.flower.vertical_deployment import VerticalDeployment

    return VerticalDeployment(recipe, root, drive, timeout, reply_timeout).run()


def runtime_parties(train: Any) -> PartyRunner:
    """The ``PartyRunner`` of ``train.runtime`` (flower-simulation or flower-deployment; the deployment with
    ``train.run_timeout`` and ``train.reply_timeout``)."""
    if train.runtime == "flower-simulation":
        return flower_parties
    if train.runtime == "flower-deployment":
        return functools.partial(deployment_parties, timeout=train.run_timeout, reply_timeout=train.reply_timeout)
    raise ConfigError(
        f"train.runtime = {train.runtime!r}: the parties on their own sides need flower-simulation or flower-deployment"
    )
