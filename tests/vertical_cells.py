"""Tiny SS-VFNAS runs of the in-process protocol and of the node protocol (each party a Flower node), for
test_vfl_nodes.py; as a script, the Flower runs, in a subprocess the test starts inside a loopback-only namespace.

Every party is built alone (``tiny_party``: its own seeded columns and network), as a node builds it; the in-process
reference builds all of them the same way, so both start from identical parties.

Usage: python tests/vertical_cells.py --out results.json --work DIR [--only CASE ...]
       [--ssvfnas-cell METHOD [--runtime flower-simulation|flower-deployment]]
(``--ssvfnas-cell``: instead, one tiny SS-VFNAS cell of the toy partition in process and on Flower, each output file's
digest and the parties' reports).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fedrepro.seeding import derive_seed  # noqa: E402
from fedrepro.vfl.nodes import LocalTransport, PartyWorker, VerticalHub, VerticalRecipe, party_state  # noqa: E402
from fedrepro.vfl.privacy import GaussianMechanism  # noqa: E402
from fedrepro.vfl.protocol import Party, VerticalProtocol  # noqa: E402
from fedrepro.vfl.search import (  # noqa: E402
    DartsSearch,
    MiLeNASSearch,
    Search,
    SplitTraining,
    batch_at,
    make_optimizers,
)
from toy import TinySearchable  # noqa: E402

N, D_OUT, CLASSES, BATCH, STEPS, SEED = 48, 4, 3, 8, 3, 11
DIMS = (3, 4, 5)
TRAIN, VAL, TEST = torch.arange(0, 24), torch.arange(24, 40), torch.arange(40, 48)
RULES = {
    "train": ("train", {}),
    "darts": ("darts", {}),
    "darts2": ("darts", {"second_order": True}),
    "darts2fixed": ("darts", {"second_order": True, "global_norm": False}),
    "milenas": ("milenas", {}),
    "milenas_unbundled": ("milenas", {"bundle": False}),
}
"""How each case's first word sets the recipe: DARTS second order with the global norm's exchange or a fixed r."""
CASES = (
    "darts",
    "darts2",
    "darts2fixed",
    "milenas",
    "milenas_unbundled",
    "train",
    "darts-dp",
    "darts2-dp",
    "milenas-dp",
    "train-dp",
)
"""rule[-dp]: three parties, the label party in the middle; -dp: both mechanisms on."""


def tiny_party(index: int, parties: int, label: int, seed: int) -> Party:
    """Party ``index`` alone: its own columns (and the labels and top network if it is the label party)."""
    columns = torch.Generator().manual_seed(derive_seed(seed, "columns", index))
    features = torch.randn(N, DIMS[index], generator=columns) * 3
    torch.manual_seed(derive_seed(seed, "bottom", index))
    bottom = TinySearchable(DIMS[index], D_OUT)
    if index != label:
        return Party(index, features, bottom)
    labels = torch.randint(0, CLASSES, (N,), generator=torch.Generator().manual_seed(derive_seed(seed, "labels")))
    torch.manual_seed(derive_seed(seed, "top"))
    return Party(index, features, bottom, labels, nn.Linear(parties * D_OUT, CLASSES))


def tiny_recipe(case: str, parties: int = 3, label: int = 1) -> VerticalRecipe:
    rule, knobs = RULES[case.split("-")[0]]
    dp = case.endswith("-dp")
    return VerticalRecipe(
        functools.partial(tiny_party, parties=parties, label=label, seed=SEED),
        parties,
        label,
        rule,
        SEED,
        fingerprint=f"tiny/{case}",
        threads=1,
        optimizers={"lr": 0.05},
        lam=0.5,
        xi=0.05,
        forward_mechanism=GaussianMechanism(5.0, 0.5) if dp else None,
        backward_mechanism=GaussianMechanism(0.2, 0.5) if dp else None,
        split_sizes=(("train", len(TRAIN)), ("val", len(VAL))),
        **knobs,
    )


def learning_rate(step: int) -> float:
    return 0.05 / (1 + step)


def digest(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    return {
        name: hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()[:16]
        for name, t in sorted(tensors.items())
    }


def outcome(history, channel, eval_channel, ledger, evaluation, states: dict[str, dict[str, torch.Tensor]]) -> dict:
    return {
        "history": history,
        "messages": [m.to_record() for m in channel.messages],
        "eval_messages": [m.to_record() for m in eval_channel.messages],
        "ledger": ledger.state(),
        "evaluation": evaluation,
        "states": {party: digest(state) for party, state in states.items()},
        "scalars": [m.to_record() for m in channel.scalars],
    }


def in_process(recipe: VerticalRecipe) -> dict:
    """The reference: ``VerticalProtocol`` and the rule of ``fedrepro.vfl.search``, every party in this process."""
    torch.set_num_threads(recipe.threads)
    protocol = VerticalProtocol(
        [recipe.build_party(j) for j in range(recipe.parties)],
        forward_mechanisms=recipe.forward_mechanism,
        backward_mechanism=recipe.backward_mechanism,
        seed=recipe.seed,
        split_sizes=dict(recipe.split_sizes),
    )
    weights, arch = make_optimizers(protocol, **recipe.optimizers)
    search: Search = {
        "train": lambda: SplitTraining(protocol, weights, arch, grad_clip=recipe.grad_clip),
        "darts": lambda: DartsSearch(
            protocol,
            weights,
            arch,
            grad_clip=recipe.grad_clip,
            second_order=recipe.second_order,
            xi=recipe.xi,
            r=recipe.r,
            global_norm=recipe.global_norm,
        ),
        "milenas": lambda: MiLeNASSearch(
            protocol, weights, arch, grad_clip=recipe.grad_clip, lam=recipe.lam, bundle=recipe.bundle
        ),
    }[recipe.rule]()
    while protocol.step < STEPS:
        s = protocol.step
        for optimizer in weights:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(s)
        search.step(batch_at(TRAIN, BATCH, s, recipe.seed, "train"), batch_at(VAL, BATCH, s, recipe.seed, "val"))
    evaluation = protocol.evaluate(TEST, batch_size=5, split="test")
    return outcome(
        search.history,
        protocol.channel,
        protocol.eval_channel,
        protocol.ledger,
        evaluation,
        {p.name: party_state(p) for p in protocol.parties},
    )


def drive(hub: VerticalHub) -> dict:
    """What the label party runs: the steps, then one evaluation."""
    while hub.step < STEPS:
        s = hub.step
        seed = hub.recipe.seed
        hub.run_step(
            batch_at(TRAIN, BATCH, s, seed, "train"), batch_at(VAL, BATCH, s, seed, "val"), lr=learning_rate(s)
        )
    return hub.evaluate(TEST, batch_size=5, split="test")


def local_hub(recipe: VerticalRecipe, work: Path) -> VerticalHub:
    """The node protocol with the other parties' workers called in this process (no network), each with its own
    directory under ``work``."""
    torch.set_num_threads(recipe.threads)
    workers = {j: PartyWorker(recipe, recipe.build_party(j), work / f"party_{j}") for j in recipe.others}
    return VerticalHub(recipe, recipe.build_party(recipe.label), LocalTransport(workers))


def local_outcome(hub: VerticalHub, evaluation: dict) -> dict:
    workers = hub.transport.workers.values()
    states = {hub.party.name: party_state(hub.party)} | {w.party.name: party_state(w.party) for w in workers}
    return outcome(hub.history, hub.channel, hub.eval_channel, hub.ledger, evaluation, dict(sorted(states.items())))


def local_nodes(recipe: VerticalRecipe, work: Path) -> dict:
    hub = local_hub(recipe, work)
    evaluation = drive(hub)
    hub.save_parties()
    return local_outcome(hub, evaluation)


def flower_nodes(recipe: VerticalRecipe, work: Path) -> dict:
    """The node protocol on Flower's simulation: the label party in the ServerApp, one node per other party; each
    other party's final networks read back from its own directory."""
    from safetensors.torch import load_file

    from fedrepro.fl.flower.vertical import VerticalSimulation

    torch.set_num_threads(recipe.threads)
    simulation = VerticalSimulation(recipe, work, drive)
    hub, evaluation = simulation.run()
    states = {hub.party.name: party_state(hub.party)}
    for j in recipe.others:
        saved = load_file(str(simulation.party_directory(j) / f"step-{STEPS:06d}" / f"party_{j}.safetensors"))
        states[f"party_{j}"] = {name: t for name, t in saved.items() if not name.startswith("optimizer.")}
    return outcome(hub.history, hub.channel, hub.eval_channel, hub.ledger, evaluation, dict(sorted(states.items())))


def digests(folder: Path) -> dict[str, str]:
    return {
        str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


def ssvfnas_cell(method: str, work: Path, runtime: str) -> dict:
    """One tiny SS-VFNAS cell (DP on) of the toy partition in process and with each party a Flower node of
    ``runtime``."""
    from test_ssvfnas import build_partition, tiny_params, toy_vertical, write_partition

    from fedrepro.ssvfnas import runs
    from fedrepro.ssvfnas.cells import Cell
    from fedrepro.ssvfnas.parties import REPORTS, deployment_parties, flower_parties

    tables, labels, splits, summary = build_partition(
        toy_vertical(work / "prepared", n=160), "toy", 2, 0.25, 0.5, 0, seed=0
    )
    write_partition(work / "partitions" / "toy-k2", tables, labels, splits, summary)
    params, cell = tiny_params(), Cell(method, "toy", 2, 1.0, 1.0, 0)
    runs.run_cell(params, cell, work / "partitions", work / "engine", work / "engine-ckpt", "inputs")
    runs.run_cell(
        params,
        cell,
        work / "partitions",
        work / "flower",
        work / "flower-ckpt",
        "inputs",
        parties=flower_parties if runtime == "flower-simulation" else deployment_parties,
    )
    reports = {
        phase: json.loads((work / "flower-ckpt" / "parties" / phase / REPORTS).read_text())
        for phase in ("search", "retrain")
    }
    return {"engine": digests(work / "engine"), runtime: digests(work / "flower"), "reports": reports}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="cases to run (default: all)")
    parser.add_argument("--ssvfnas-cell", metavar="METHOD", help="one tiny SS-VFNAS cell of METHOD instead")
    parser.add_argument(
        "--runtime",
        choices=("flower-simulation", "flower-deployment"),
        default="flower-simulation",
        help="the cell's Flower runtime (--ssvfnas-cell)",
    )
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])  # Ray workers import this
    if args.ssvfnas_cell:
        from fedrepro.fl.flower.federation import LocalFederation
        from flower_cells import NODE_TIMINGS

        LocalFederation.node_timings = NODE_TIMINGS  # the deployment's parties: each message waited for a node's ask
        args.out.write_text(
            json.dumps(ssvfnas_cell(args.ssvfnas_cell, args.work, args.runtime), indent=1, sort_keys=True)
        )
        return
    results = {}
    for case in args.only or CASES:
        recipe = tiny_recipe(case)
        results[case] = {"in-process": in_process(recipe), "flower-simulation": flower_nodes(recipe, args.work / case)}
        args.out.write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":  # run as the module: Ray then ships the recipe's functions by reference, not by value
    import vertical_cells

    vertical_cells.main()
