"""SS-VFNAS's parties as nodes (``fedrepro.vfl.nodes``): each party computes only on its own side, and the run is the
in-process protocol's, bit for bit (every party's final networks, the history, both channel logs, the privacy
ledger, the evaluation), with DP on and off; on Flower's simulation too, each party a node holding only its own
columns."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedrepro.errors import FederationError
from fedrepro.vfl.nodes import BACKWARD, FORWARD, SAVE, SEQUENCE, LocalTransport, PartyWorker, VerticalHub
from fedrepro.vfl.search import batch_at
from loopback import run_on_loopback
from vertical_cells import (
    BATCH,
    CASES,
    STEPS,
    TRAIN,
    VAL,
    drive,
    in_process,
    learning_rate,
    local_hub,
    local_nodes,
    local_outcome,
    tiny_recipe,
)

HERE = Path(__file__).resolve().parent
FLOWER_CASES = ("milenas-dp", "darts2")
"""On Flower: MiLeNAS with both mechanisms on (each node draws its own noise), DARTS second order without DP (five
passes a step, the parties moving their own weights, the global norm's scalars)."""
RESULTS = ("states", "history", "messages", "eval_messages", "ledger", "evaluation")


@pytest.mark.parametrize("case", CASES)
def test_the_node_protocol_is_the_in_process_protocol(tmp_path, case):
    recipe = tiny_recipe(case)
    nodes, reference = local_nodes(recipe, tmp_path), in_process(recipe)
    for key in RESULTS:
        assert nodes[key] == reference[key], key
    for j in recipe.others:  # each party's own directory holds its own bottom network and optimizers, nothing else
        saved = load_file(str(tmp_path / f"party_{j}" / f"step-{STEPS:06d}" / f"party_{j}.safetensors"))
        assert saved and all(name.startswith(("bottom.", "optimizer.")) for name in saved)


@pytest.mark.parametrize("case", ["darts2-dp", "milenas_unbundled"])
def test_a_run_resumed_from_its_checkpoint_is_the_straight_run(tmp_path, case):
    """Every process of the run lost (the label party's and every node's): each rebuilt party loads its own file
    of the label party's last complete checkpoint, and the run goes on to the straight run's end, bit for bit."""
    recipe = tiny_recipe(case)
    straight = local_nodes(recipe, tmp_path / "straight")
    first = local_hub(recipe, tmp_path / "resumed")
    for step in range(STEPS):
        seed = recipe.seed
        first.run_step(
            batch_at(TRAIN, BATCH, step, seed, "train"), batch_at(VAL, BATCH, step, seed, "val"), lr=learning_rate(step)
        )
        if step < STEPS - 1:  # the last step's checkpoint never comes: the run is killed before it
            first.save_state(tmp_path / "hub")
    assert sorted(p.name for p in (tmp_path / "resumed" / "party_0").iterdir()) == ["step-000001", "step-000002"]
    resumed = local_hub(recipe, tmp_path / "resumed")
    resumed.load_state(tmp_path / "hub")
    assert resumed.step == STEPS - 1
    evaluation = drive(resumed)
    resumed.save_parties()
    outcome = local_outcome(resumed, evaluation)
    for key in (*RESULTS, "scalars"):
        assert outcome[key] == straight[key], key


@pytest.mark.parametrize("case", ["milenas-dp", "darts2-dp"])
def test_a_party_gets_only_its_gradients_and_the_label_party_commands(tmp_path, case):
    """From the channel's logs: party j receives its own gradients (and, in DARTS second order, the global norm's
    total) and the label party's commands, and sends nothing but to the label party."""
    nodes = local_nodes(tiny_recipe(case), tmp_path)
    for j in (0, 2):
        received = {name for message in nodes["messages"] if message[2] == f"party_{j}" for name in message[3]}
        total = {"gradnorm/total"} if case.startswith("darts2") else set()
        assert received == {f"gradient/party_{j}/train", f"gradient/party_{j}/val"} | total
        commands = {name for message in nodes["scalars"] if message[2] == f"party_{j}" for name in message[3]}
        update = {"update/updates"} if case.startswith("darts2") else set()
        assert (
            commands
            == {
                "forward/batches",
                "forward/grad",
                "forward/training",
                "forward/noise_key",
                "backward/splits",
                "backward/updates",
                "backward/slots",
                "backward/norm_of",
            }
            | update
        )
    assert {message[2] for message in nodes["messages"] if message[1] != "party_1"} == {"party_1"}


def test_each_side_refuses_the_other_role():
    recipe = tiny_recipe("darts")
    with pytest.raises(ValueError, match="party_1: a party worker holds no labels"):
        PartyWorker(recipe, recipe.build_party(1))
    with pytest.raises(ValueError, match="party_0: the hub is the label party party_1"):
        VerticalHub(recipe, recipe.build_party(0), LocalTransport({}))


class Truncating(PartyWorker):
    """A party whose activations lose their last row."""

    def forward(self, command):
        return {name: tensor[:-1] for name, tensor in super().forward(command).items()}


class Silent(PartyWorker):
    """A party that never reports its share of DARTS's global gradient norm."""

    def backward(self, command, tensors):
        super().backward(command, tensors)
        return {}


def test_a_wrong_reply_or_a_party_that_lost_its_forward_is_named():
    recipe = tiny_recipe("train")
    workers = {0: PartyWorker(recipe, recipe.build_party(0)), 2: Truncating(recipe, recipe.build_party(2))}
    hub = VerticalHub(recipe, recipe.build_party(1), LocalTransport(workers))
    with pytest.raises(FederationError, match=r"party_2: reply field 'activation/party_2/train' is \(7, 4\)"):
        hub.run_step(TRAIN[:8])
    darts2 = tiny_recipe("darts2")
    workers = {0: PartyWorker(darts2, darts2.build_party(0)), 2: Silent(darts2, darts2.build_party(2))}
    hub = VerticalHub(darts2, darts2.build_party(1), LocalTransport(workers))
    with pytest.raises(FederationError, match="party_2: its backward reply lacks a finite scalar 'gradnorm/party_2'"):
        hub.run_step(TRAIN[:8], TRAIN[8:16])
    restarted = PartyWorker(recipe, recipe.build_party(0))  # a node that lost its memory between forward and backward
    with pytest.raises(FederationError, match="party_0: a gradient for split 'train' without its forward pass"):
        restarted.handle(BACKWARD, {"splits": ["train"], "updates": []}, {"gradient/party_0/train": torch.zeros(8, 4)})


class Counting(LocalTransport):
    """``LocalTransport`` that keeps the op of each message it carries."""

    def __init__(self, workers):
        super().__init__(workers)
        self.ops = []

    def exchange(self, op, commands):
        self.ops.append(
            op if op != SEQUENCE else "+".join(inner for inner, _ in next(iter(commands.values()))[0]["ops"])
        )
        return super().exchange(op, commands)


@pytest.mark.parametrize("case, per_step", [("milenas", 1), ("train", 1), ("darts", 2), ("milenas_unbundled", 2)])
def test_a_backward_travels_with_the_next_message_to_its_party(tmp_path, case, per_step):
    """A step of MiLeNAS or split training is one message to each party (each backward rides ahead of the next
    forward), DARTS first order two; the run, its logs and its ledger are the in-process run's."""
    recipe = tiny_recipe(case)
    transport = Counting(
        {j: PartyWorker(recipe, recipe.build_party(j), tmp_path / f"party_{j}") for j in recipe.others}
    )
    hub = VerticalHub(recipe, recipe.build_party(recipe.label), transport)
    evaluation = drive(hub)  # STEPS steps, then an evaluation of TEST in batches of 5: two forwards
    hub.save_parties()
    outcome, reference = local_outcome(hub, evaluation), in_process(recipe)
    for key in RESULTS:
        assert outcome[key] == reference[key], key
    assert transport.ops == [FORWARD] + [f"{BACKWARD}+{FORWARD}"] * (STEPS * per_step) + [FORWARD, SAVE]
    assert not hub.waiting


def test_a_command_before_the_last_of_a_sequence_may_not_reply():
    recipe = tiny_recipe("darts2")
    worker = PartyWorker(recipe, recipe.build_party(0))
    forward = {"batches": {"train": TRAIN[:8].tolist()}, "grad": True, "training": True, "noise_key": ["step", 0, 1]}
    with pytest.raises(FederationError, match=r"party_0: command 0 \('forward'\) of a sequence replied"):
        worker.handle(SEQUENCE, {"ops": [[FORWARD, forward], [FORWARD, forward]]}, {})


def test_parties_as_flower_nodes_give_the_in_process_run(tmp_path):
    """Each other party a node of Flower's simulation (its own columns, network, optimizers and DP draws), the label
    party in the ServerApp; tensors cross as exact float32 bytes, so the runs are identical."""
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")
    out = tmp_path / "results.json"
    run_on_loopback(
        [
            sys.executable,
            str(HERE / "vertical_cells.py"),
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
            "--only",
            *FLOWER_CASES,
        ],
        timeout=900,
    )
    results = json.loads(out.read_text())
    for case in FLOWER_CASES:
        flower, reference = results[case]["flower-simulation"], results[case]["in-process"]
        for key in RESULTS:
            assert flower[key] == reference[key], (case, key)


@pytest.mark.parametrize("runtime", ["flower-simulation", "flower-deployment"])
def test_an_ssvfnas_cell_with_its_parties_as_flower_nodes_writes_the_engines_outputs(tmp_path, runtime):
    """``train.runtime`` for SS-VFNAS: a pre-searched DARTS cell with DP, party_1 a node holding only its columns (on
    the deployment: a SuperNode whose per-message ClientApps hand each command to party_1's own service process);
    every output file is the engine's, byte for byte, and besides the protocol's tensors only party_1's reports of
    its own work crossed (its pre-search losses, its alphas' entropy and shift per curve point, its genotype,
    alphas' summary and network sizes)."""
    pytest.importorskip("flwr", reason="the flower extra is not installed (pip install -e '.[flower]')")
    out = tmp_path / "results.json"
    run_on_loopback(
        [
            sys.executable,
            str(HERE / "vertical_cells.py"),
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
            "--ssvfnas-cell",
            "ss_vfnas1",
            "--runtime",
            runtime,
        ],
        timeout=900,
    )
    results = json.loads(out.read_text())
    assert results[runtime] == results["engine"] and "metrics.json" in results["engine"]
    reports = {
        phase: [names for _, sender, receiver, names, _ in log if (sender, receiver) == ("party_1", "party_0")]
        for phase, log in results["reports"].items()
    }
    asked = [
        names
        for log in results["reports"].values()
        for _, sender, _, names, _ in log
        if sender == "party_0" and not set(names) <= {"local/task", "local/presearch", "local/rows"}
    ]
    assert reports["search"] == [["begin/report"]] + [["alphas/report"]] * 3 + [["finish/report"]] and not asked
    assert reports["retrain"] == [["parameters/report"]]
