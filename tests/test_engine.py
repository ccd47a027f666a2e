"""The federated engine: aggregation math, the channel, private state, sampling, determinism and resume."""

import json

import pytest
import torch

from fedrepro.errors import TrainingDiverged
from fedrepro.fl.algorithm import ClientUpdate, CommonSettings, LocalContext, TaskOutput
from fedrepro.fl.algorithms.fedavg import FedAvg
from fedrepro.fl.algorithms.fedcmc import FedCMC
from fedrepro.fl.algorithms.feddyn import CLIENT_GRADIENT, SERVER_STATE
from fedrepro.fl.algorithms.scaffold import Scaffold
from fedrepro.channel import SERVER, Channel, upload_problem
from fedrepro.fl.engine import STATE, Engine, EngineSettings, lr_factor
from fedrepro.io import write_json
from scaffold_invariant import control_variate_gap, largest_control
from toy import ToyTask, make_algorithm

SIZES = {"a": 40, "b": 20, "c": 8}


def make_engine(
    tmp_path,
    algorithm="fedavg",
    rounds=3,
    clients_per_round=0,
    seed=0,
    weighting="uniform",
    mu=0.0,
    local_epochs=1,
    fit_samples=0,
    **kwargs,
):
    torch.use_deterministic_algorithms(True)
    settings = EngineSettings(
        rounds=rounds,
        local_epochs=local_epochs,
        clients_per_round=clients_per_round,
        lr=0.01,
        batch_size=8,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=seed,
        fit_samples=fit_samples,
    )
    knobs = {"fedprox": {"mu": mu}, "feddyn": {"alpha": 0.1}}.get(algorithm, {})
    chosen = make_algorithm(algorithm, weighting, **knobs)
    return Engine(
        ToyTask(SIZES),
        chosen,
        settings,
        tmp_path / "ckpt",
        fingerprint=f"{algorithm}-{seed}-{rounds}",
        progress=False,
        **kwargs,
    )


def test_uniform_and_size_weighted_average():
    updates = [
        ClientUpdate("a", {"w": torch.tensor([1.0, 2.0])}, 30),
        ClientUpdate("b", {"w": torch.tensor([3.0, 6.0])}, 10),
    ]
    base = {"w": torch.zeros(2)}
    uniform = make_algorithm("fedavg", "uniform").aggregate(base, updates)
    sized = make_algorithm("fedavg", "size").aggregate(base, updates)
    assert torch.allclose(uniform["w"], torch.tensor([2.0, 4.0]))
    assert torch.allclose(sized["w"], torch.tensor([0.75 * 1 + 0.25 * 3, 0.75 * 2 + 0.25 * 6]))


def test_channel_counts_bytes_names_and_copies():
    channel = Channel()
    tensor = torch.ones(3, 4)
    delivered = channel.send(0, SERVER, "a", {"x": tensor, "y": torch.zeros(2, dtype=torch.float64)})
    channel.send(0, "a", SERVER, {"x": tensor})
    channel.send(1, "a", SERVER, {"x": tensor})
    assert channel.round_bytes(0) == {"up": 48, "down": 48 + 16}
    assert channel.round_bytes(1) == {"up": 48, "down": 0}
    assert channel.names_received("a") == {"x", "y"} and channel.names_received(SERVER) == {"x"}
    delivered["x"].add_(1)
    assert torch.equal(tensor, torch.ones(3, 4)), "the receiver must get a copy, not the sender's memory"
    assert channel.summary()["a->server"] == {"bytes": 96, "messages": 2}


def test_broadcast_counts_every_receiver_and_hands_over_a_copy():
    channel = Channel()
    tensor = torch.ones(5)
    delivered = channel.broadcast(0, SERVER, ["a", "b", "c"], {"w": tensor})
    assert channel.round_bytes(0) == {"up": 0, "down": 3 * 20}
    assert all(channel.names_received(c) == {"w"} for c in "abc")
    delivered["w"].add_(1)
    assert torch.equal(tensor, torch.ones(5))


def test_fedavg_round_bytes_match_model_size(tmp_path):
    engine = make_engine(tmp_path, rounds=1)
    engine.run()
    model_bytes = sum(p.numel() * 4 for p in engine.model.parameters())
    record = engine.state.history[0]
    assert record["bytes_up"] == record["bytes_down"] == len(SIZES) * model_bytes


def test_fedper_keeps_heads_private(tmp_path):
    engine = make_engine(tmp_path, algorithm="fedper")
    engine.run()
    assert not any(name.startswith("head.") for name in engine.channel.names_received(SERVER))
    for client in SIZES:
        assert not any(name.startswith("head.") for name in engine.channel.names_sent(client))
    heads = [engine.state.client_states[c]["param/head.weight"] for c in SIZES]
    assert not torch.equal(heads[0], heads[1]), "each client trains its own head"
    assert "head.weight" not in engine.state.global_weights


def test_individual_and_centralised_send_nothing(tmp_path):
    for name in ("individual", "centralised"):
        engine = make_engine(tmp_path / name, algorithm=name)
        engine.run()
        assert engine.channel.messages == []
        assert set(engine.state.client_states) == ({"pooled"} if name == "centralised" else set(SIZES))


def test_client_sampling_leaves_unsampled_private_state_untouched(tmp_path):
    engine = make_engine(tmp_path, algorithm="fedper", rounds=4, clients_per_round=2)
    snapshots = []
    engine.on_round_end = lambda record: snapshots.append(
        (record["clients"], {c: {k: v.clone() for k, v in s.items()} for c, s in engine.state.client_states.items()})
    )
    engine.run()
    assert all(len(clients) == 2 for clients, _ in snapshots)
    for (_, before), (clients, after) in zip(snapshots, snapshots[1:]):
        for client in set(before) - set(clients):
            assert all(torch.equal(before[client][k], after[client][k]) for k in before[client])


def test_fedprox_adds_the_proximal_term():
    model = torch.nn.Linear(2, 1)
    received = {name: (p.detach() + 1.0) for name, p in model.named_parameters()}
    loss = torch.tensor(0.5)
    context = LocalContext(0, "a", received)
    objective = make_algorithm("fedprox", mu=0.2).local_objective(model, TaskOutput(loss), context)
    n_params = sum(p.numel() for p in model.parameters())
    assert objective.item() == pytest.approx(0.5 + 0.5 * 0.2 * n_params)


def test_lr_schedule_warms_up_then_decays():
    factors = [lr_factor(step, 20, 0.1) for step in range(20)]
    assert factors[0] == pytest.approx(0.5) and factors[1] == pytest.approx(1.0)
    assert factors[2] > factors[10] > factors[19] > 0
    assert all(a >= b for a, b in zip(factors[1:], factors[2:]))


@pytest.mark.parametrize("clients_per_round", [1, 0])
def test_a_clients_lr_schedule_follows_the_federations_clock_whatever_rounds_it_missed(
    tmp_path, monkeypatch, clients_per_round
):
    """A client that starts round r is at step r x local_epochs x its batches per epoch of a schedule over every
    round: one sampled late decays its rate as much as one sampled in every round (with every client in every
    round, these are the steps 0..total-1 each client always took)."""
    from fedrepro.fl import engine as engine_module

    steps_taken = []
    monkeypatch.setattr(
        engine_module,
        "lr_factor",
        lambda step, total, warmup: steps_taken.append((step, total)) or lr_factor(step, total, warmup),
    )
    rounds, epochs = 4, 2
    engine = make_engine(tmp_path, rounds=rounds, clients_per_round=clients_per_round, local_epochs=epochs)
    engine.run()
    expected = []
    for record in engine.state.history:
        for client in record["clients"]:
            per_round = epochs * -(-SIZES[client] // 8)
            expected += [((record["round"] - 1) * per_round + i, rounds * per_round) for i in range(per_round)]
    assert steps_taken == expected
    first_round = {}
    for record in engine.state.history:
        first_round.update({client: record["round"] for client in record["clients"] if client not in first_round})
    assert max(first_round.values()) == (1 if clients_per_round == 0 else 3), "a client first sampled in round 3"


def test_steps_per_epoch_gives_every_client_the_same_local_steps(tmp_path, monkeypatch):
    """With steps_per_epoch N, the 40-sample client (5 batches) stops after N and the 8-sample one (1 batch) cycles
    over N fresh shuffles, so FedAvg weights them by their data alone, not by data x steps."""
    from fedrepro.fl import engine as engine_module

    passes = []
    task = ToyTask(SIZES)
    original = task.train_batches
    monkeypatch.setattr(task, "train_batches", lambda ids, generator: passes.append(ids[0]) or original(ids, generator))
    settings = EngineSettings(
        rounds=2,
        local_epochs=2,
        steps_per_epoch=3,
        clients_per_round=0,
        lr=0.01,
        batch_size=8,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=0,
        eval_every=0,
    )
    engine = Engine(
        task, make_algorithm("fedavg", "size"), settings, tmp_path / "ckpt", fingerprint="steps", progress=False
    )
    assert {c: engine.trainer.steps_per_round(c) for c in SIZES} == {"a": 6, "b": 6, "c": 6}
    steps = []
    monkeypatch.setattr(engine_module, "lr_factor", lambda step, total, warmup: steps.append((step, total)) or 1.0)
    engine.run()
    assert steps == [(r * 6 + i, 12) for r in range(2) for _ in SIZES for i in range(6)]
    assert passes.count("c") == 2 * 2 * 3, "one batch a pass: a fresh shuffle for each of the 3 steps of an epoch"
    assert passes.count("a") == 2 * 2, "5 batches a pass: one pass covers the 3 steps"


def test_same_seed_gives_byte_identical_history(tmp_path):
    first = make_engine(tmp_path / "1", algorithm="fedprox", mu=0.1).run().history
    second = make_engine(tmp_path / "2", algorithm="fedprox", mu=0.1).run().history
    other = make_engine(tmp_path / "3", algorithm="fedprox", mu=0.1, seed=1).run().history
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert json.dumps(first, sort_keys=True) != json.dumps(other, sort_keys=True)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedper", "individual"])
def test_resume_after_a_crash_matches_an_uninterrupted_run(tmp_path, algorithm):
    reference = make_engine(tmp_path / "ref", algorithm=algorithm, rounds=4, clients_per_round=2).run()

    def crash(record):
        if record["round"] == 2:
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        make_engine(tmp_path / "run", algorithm=algorithm, rounds=4, clients_per_round=2, on_round_end=crash).run()
    resumed_engine = make_engine(tmp_path / "run", algorithm=algorithm, rounds=4, clients_per_round=2)
    assert resumed_engine.state.next_round == 2
    resumed = resumed_engine.run()
    assert json.dumps(resumed.history, sort_keys=True) == json.dumps(reference.history, sort_keys=True)
    for name, value in reference.global_weights.items():
        assert torch.equal(value, resumed.global_weights[name])
    assert (
        resumed_engine.channel.summary()
        == make_engine(tmp_path / "ref", algorithm=algorithm, rounds=4, clients_per_round=2).channel.summary()
    )


def test_a_checkpoint_from_other_settings_is_not_resumed(tmp_path):
    make_engine(tmp_path, rounds=2).run()
    settings = EngineSettings(
        rounds=2,
        local_epochs=1,
        clients_per_round=0,
        lr=0.05,
        batch_size=8,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=0,
    )
    engine = Engine(
        ToyTask(SIZES),
        make_algorithm("fedavg"),
        settings,
        tmp_path / "ckpt",
        fingerprint="something else",
        progress=False,
    )
    assert engine.state.next_round == 0


@pytest.mark.parametrize(
    "entries,message",
    [
        (
            {"moon": {"mu": 1.0, "temperature": 0.5, "projection_dim": 8, "muu": 1.0}},
            "params: algorithms.moon.muu is not a known key",
        ),
        ({"moon": {"mu": 1.0, "projection_dim": 8}}, "params: algorithms.moon.temperature is missing"),
        (
            {"fedrs": {"alpha": 2, "mask": False}},
            "params: algorithms.fedrs.alpha = 2: Input should be less than or equal to 1",
        ),
        ({"fedfoo": {}}, "params: algorithms.fedfoo names no registered algorithm"),
        (
            {"fedcmc": {"mu": 1.0, "temperature": 0.5, "vectors": "minor"}},
            "params: algorithms.fedcmc.vectors is set for each cell from fedcmc.sweeps.vectors",
        ),
    ],
)
def test_a_wrong_algorithm_knob_names_its_key_whichever_algorithm_the_cell_runs(entries, message):
    """Every entry of the algorithms group is checked when any cell is built, so the first cell of a stage stops it."""
    from fedrepro.errors import ConfigError
    from fedrepro.fl.algorithms import algorithm_settings

    with pytest.raises(ConfigError) as error:
        algorithm_settings("fedavg", entries)
    assert str(error.value).startswith(message)


def test_a_cell_sets_the_knobs_a_figure_sweeps_over_the_params_entry():
    from fedrepro.fl.algorithms import algorithm_settings

    entries = {"fedcmc": {"mu": 0.3, "temperature": 0.5}}
    assert algorithm_settings("fedcmc", entries) == FedCMC.Settings(mu=0.3, temperature=0.5, vectors="major")
    assert algorithm_settings("fedcmc", entries, vectors="none").vectors == "none"
    assert algorithm_settings("fedavg", entries) == FedAvg.Settings()


def test_run_fingerprint_changes_with_params_and_inputs_not_with_the_grid_that_lists_the_cell():
    import yaml

    from fedrepro.config import parse_params
    from fedrepro.fedmatch import runs
    from fedrepro.fedmatch.cells import Cell
    from test_config import RAW

    params = parse_params(yaml.safe_load(yaml.safe_dump(RAW)))
    base = runs.run_fingerprint(params, Cell("fedavg", 0), "inputs")
    assert base == runs.run_fingerprint(params, Cell("fedavg", 0), "inputs")
    assert base != runs.run_fingerprint(params, Cell("fedavg", 1), "inputs")
    assert base != runs.run_fingerprint(params, Cell("fedavg", 0, "patch_size", "64"), "inputs")
    assert base != runs.run_fingerprint(params, Cell("fedavg", 0), "other inputs")
    changed = params.model_copy(update={"train": params.train.model_copy(update={"lr": 0.123})})
    assert base != runs.run_fingerprint(changed, Cell("fedavg", 0), "inputs")
    waits = params.model_copy(
        update={"train": params.train.model_copy(update={"reply_timeout": 5.0, "run_timeout": 9.0})}
    )
    assert runs.run_fingerprint(waits, Cell("fedavg", 0), "inputs") == base, "how long a server waits shapes no run"
    settings = params.fedmatch.settings.model_copy(update={"matcher_dim": 7})
    changed = params.model_copy(update={"fedmatch": params.fedmatch.model_copy(update={"settings": settings})})
    assert base != runs.run_fingerprint(changed, Cell("fedavg", 0), "inputs")
    knob = params.model_copy(update={"algorithms": {**params.algorithms, "fedprox": {"mu": 0.5}}})
    assert runs.run_fingerprint(knob, Cell("fedprox", 0), "inputs") != runs.run_fingerprint(
        params, Cell("fedprox", 0), "inputs"
    )
    assert runs.run_fingerprint(knob, Cell("fedavg", 0), "inputs") == base, (
        "another algorithm's knob leaves this run as it was"
    )
    table = params.fedmatch.settings.patch_size
    h_lr = runs.run_fingerprint(params, Cell("fedmatch_h_lr", 0), "inputs")
    assert runs.run_fingerprint(params, Cell("fedmatch_h_lr", 0, "patch_size", str(table)), "inputs") == h_lr, (
        "Fig 6's point at the table's patch size is the table cell: one run, trained once"
    )
    assert runs.run_fingerprint(params, Cell("fedmatch_h_lr", 0, "patch_size", str(2 * table)), "inputs") != h_lr
    assert runs.run_fingerprint(params, Cell("fedmatch_h_lr", 0, "data_ratio", "1.0"), "inputs") == h_lr
    layers = params.model.tiny.layers if params.model.keep_layers == 0 else params.model.keep_layers
    assert params.model.backbone == "tiny" and params.fedmatch.settings.shared_layers is None
    assert runs.run_fingerprint(params, Cell("fedmatch_h_lr", 0, "shared_layers", str(layers)), "inputs") == h_lr, (
        "Fig 5's point sharing every layer is the table cell (shared_layers null: all)"
    )
    assert runs.run_fingerprint(params, Cell("fedmatch_h_lr", 0, "shared_layers", str(layers - 1)), "inputs") != h_lr
    assert runs.run_fingerprint(params, Cell("fedmatch_h_lr", 0, "data_ratio", "0.4"), "inputs") != h_lr


def test_memory_accounting_follows_what_each_algorithm_keeps(tmp_path):
    fedper = make_engine(tmp_path / "fedper", algorithm="fedper", rounds=1)
    fedper.run()
    individual = make_engine(tmp_path / "individual", algorithm="individual", rounds=1)
    individual.run()
    head = sum(p.numel() * 4 for n, p in fedper.model.named_parameters() if n.startswith("head."))
    model = fedper.memory_bytes()["model"]
    assert fedper.memory_bytes() == {
        "model": model,
        "server_shared": model - head,
        "private_per_client_max": head,
        "private_all_clients": len(SIZES) * head,
    }
    assert individual.memory_bytes()["server_shared"] == 0
    assert individual.memory_bytes()["private_all_clients"] == len(SIZES) * model


# ----- non-finite uploads and training ----------------------------------------------------------------------
def test_an_upload_is_refused_naming_the_client_and_the_field_when_malformed_or_not_finite():
    server = {"encoder.w": torch.zeros(2, 3), "head.b": torch.zeros(1), "control/encoder.w": torch.zeros(2, 3)}
    shared = ["encoder.w", "head.b"]
    good = {"encoder.w": torch.ones(2, 3), "head.b": torch.ones(1)}
    assert upload_problem("a", good, server, shared) is None
    assert "client b: upload field 'patch.x'" in upload_problem("b", {**good, "patch.x": torch.ones(1)}, server, shared)
    assert "client c: upload lacks field 'head.b'" in upload_problem(
        "c", {"encoder.w": torch.ones(2, 3)}, server, shared
    )
    wrong = upload_problem("d", {**good, "encoder.w": torch.ones(3, 2)}, server, shared)
    assert "client d: upload field 'encoder.w' is (3, 2)" in wrong and "expected (2, 3)" in wrong
    poisoned = torch.tensor([[1.0, float("nan"), 1.0], [float("inf"), 1.0, -float("inf")]])
    assert (
        upload_problem("e", {**good, "encoder.w": poisoned}, server, shared)
        == "client e: upload field 'encoder.w' holds 3 non-finite values (NaN or Inf) of 6"
    )
    control = {**good, "control/encoder.w": torch.full((2, 3), float("nan"))}
    assert "client f: upload field 'control/encoder.w' holds 6 non-finite" in upload_problem(
        "f", control, server, shared
    )


class NanUploadFedAvg(FedAvg):
    """Client b uploads one NaN in its head's bias every round (its own training stays finite)."""

    def upload(self, shared, context):
        if context.client_id != "b":
            return shared
        return {**shared, "head.bias": torch.full_like(shared["head.bias"], float("nan"))}


def test_the_engine_refuses_a_non_finite_upload_and_records_it_as_that_clients_miss(tmp_path):
    settings = EngineSettings(
        rounds=2,
        local_epochs=1,
        clients_per_round=0,
        lr=0.01,
        batch_size=8,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=0,
    )
    engine = Engine(
        ToyTask(SIZES),
        NanUploadFedAvg(FedAvg.Settings(), CommonSettings()),
        settings,
        tmp_path,
        "nan-upload",
        progress=False,
    )
    engine.run()
    for record in engine.state.history:
        assert record["clients"] == ["a", "c"]
        assert record["missed"] == {
            "b": "rejected: client b: upload field 'head.bias' holds 1 non-finite values (NaN or Inf) of 1"
        }
    assert all(bool(torch.isfinite(t).all()) for t in engine.state.global_weights.values())
    assert "b" not in {m.sender for m in engine.channel.messages}, "a refused upload never crosses the channel"


class NanClientTask(ToyTask):
    """Client c's training inputs are NaN: its first local step's loss is NaN."""

    def __init__(self, sizes):
        super().__init__(sizes)
        x, y = self.data["c"]
        self.data["c"] = (torch.full_like(x, float("nan")), y)


def test_a_client_whose_own_training_goes_non_finite_stops_the_run_naming_client_round_and_step(tmp_path):
    settings = EngineSettings(
        rounds=2,
        local_epochs=1,
        clients_per_round=0,
        lr=0.01,
        batch_size=8,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=0,
    )
    engine = Engine(NanClientTask(SIZES), make_algorithm("fedavg"), settings, tmp_path, "nan-training", progress=False)
    with pytest.raises(
        TrainingDiverged,
        match=r"client c diverged in round 1 at local step 1 of 1 \(schedule step 1 "
        r"of 2\): training loss nan",
    ):
        engine.run()
    assert engine.state.next_round == 0, "nothing of the diverged round was kept"


def test_a_client_without_training_batches_trains_nothing_and_the_round_loss_is_over_the_others(tmp_path):
    settings = EngineSettings(
        rounds=2,
        local_epochs=1,
        clients_per_round=0,
        lr=0.01,
        batch_size=8,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=0,
    )
    engine = Engine(
        ToyTask({"a": 16, "empty": 0}),
        make_algorithm("fedavg", "size"),
        settings,
        tmp_path,
        "empty-client",
        progress=False,
    )
    result = engine.trainer.client_round(0, "empty", engine.state.global_weights, {})
    assert result.train_loss is None and result.num_samples == 0
    alone = engine.trainer.client_round(0, "a", engine.state.global_weights, {}).train_loss
    engine.run()
    assert engine.state.history[0]["train_loss"] == pytest.approx(alone)
    assert all(record["clients"] == ["a", "empty"] for record in engine.state.history)


# ----- strict JSON ----------------------------------------------------------------------------------------------
def test_write_json_refuses_nan_and_inf_naming_the_file_and_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"state.json: history\[1\].train_loss is not a finite number"):
        write_json(tmp_path / "state.json", {"history": [{"train_loss": 1.0}, {"train_loss": float("nan")}]})
    with pytest.raises(ValueError, match=r"valid.a.mse is not a finite number"):
        write_json(tmp_path / "other.json", {"valid": {"a": {"mse": float("inf")}}})
    assert not list(tmp_path.iterdir()), "nothing half-written"
    write_json(tmp_path / "fine.json", {"b": None, "a": [1, 2.5]})
    assert (tmp_path / "fine.json").read_text() == '{\n  "a": [\n    1,\n    2.5\n  ],\n  "b": null\n}\n'


class NanScoreTask(ToyTask):
    """Client b has nothing to score (its metric is NaN), and client empty has no training batch."""

    def evaluate(self, model, client_id, split):
        return {"mse": float("nan")} if client_id == "b" else super().evaluate(model, client_id, split)


def test_the_checkpoint_state_is_strict_json_with_null_for_what_is_no_number(tmp_path):
    settings = EngineSettings(
        rounds=2,
        local_epochs=1,
        clients_per_round=1,
        lr=0.01,
        batch_size=8,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=0,
    )
    engine = Engine(
        NanScoreTask({"a": 16, "b": 8, "empty": 0}),
        make_algorithm("fedavg"),
        settings,
        tmp_path,
        "nan-scores",
        progress=False,
    )
    engine.run()

    def refuse(token):
        raise AssertionError(f"state.json holds a bare {token}")

    state = json.loads((tmp_path / "latest" / "state.json").read_text(), parse_constant=refuse)
    assert state["history"][0]["clients"] == ["empty"]
    assert state["history"][0]["train_loss"] is None, "a round whose only client had no batch trained nothing"
    assert all(record["valid"]["b"]["mse"] is None for record in state["history"])
    assert state["history"] == engine.state.history


# ----- SCAFFOLD's bookkeeping -------------------------------------------------------------------------------------
class RefusedOnceScaffold(Scaffold):
    """Client b's upload of round 1 holds a NaN (its own training stays finite); its later uploads are sound."""

    def upload(self, shared, context):
        sent = super().upload(shared, context)
        if (context.client_id, context.round) != ("b", 0):
            return sent
        return {**sent, "head.bias": torch.full_like(sent["head.bias"], float("nan"))}


def test_a_client_whose_upload_was_refused_keeps_the_state_it_started_the_round_with(tmp_path):
    """The server did not count b's round 1, so b goes on as if it had not trained it: SCAFFOLD's c stays the mean
    of every c_k (b keeping the c_b of a refused round broke it), as on a Flower node (test_flower)."""
    settings = EngineSettings(
        rounds=3,
        local_epochs=1,
        clients_per_round=0,
        lr=0.01,
        batch_size=8,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=0,
    )
    engine = Engine(
        ToyTask(SIZES),
        RefusedOnceScaffold(Scaffold.Settings(), CommonSettings()),
        settings,
        tmp_path,
        "refused-once",
        progress=False,
    )
    gaps = []
    engine.on_round_end = lambda record: gaps.append(
        control_variate_gap(engine.state.global_weights, engine.state.client_states, engine.train_ids)
    )
    history = engine.run().history
    assert (
        list(history[0]["missed"]) == ["b"] and [record["clients"] for record in history[1:]] == [["a", "b", "c"]] * 2
    )
    scale = max(largest_control(state) for state in engine.state.client_states.values())
    assert scale > 1e-3 and max(gaps) <= 1e-5 * scale, (gaps, scale)


def test_a_client_round_trained_again_carries_nothing_over_from_the_first_time(tmp_path):
    """A round trained again (a server resumed after a crash, a node whose reply the server did not count) is the
    same round: SCAFFOLD once kept summing its gradients into the first time's sums."""
    engine = make_engine(tmp_path, algorithm="scaffold")
    _, outgoing = engine.open_round(0)
    first = engine.trainer.client_round(0, "a", outgoing, {})
    again = engine.trainer.client_round(0, "a", outgoing, {})
    assert first.upload.keys() == again.upload.keys()
    assert all(torch.equal(first.upload[name], again.upload[name]) for name in first.upload)


@pytest.mark.parametrize("clients_per_round", [2, 0])
def test_scaffold_server_variate_stays_the_mean_of_every_clients_variate(tmp_path, clients_per_round):
    """c == mean over all N clients of c_k after every round (see ``scaffold_invariant``): it holds only if clients
    upload their change c_k+ - c_k and the server adds |S|/N of the mean change. With 2 of 3 clients sampled a
    client trains in some rounds and not others, so an upload of c_k+ itself would break it in round 2."""
    engine = make_engine(tmp_path, algorithm="scaffold", rounds=3, clients_per_round=clients_per_round)
    gaps = []
    engine.on_round_end = lambda record: gaps.append(
        control_variate_gap(engine.state.global_weights, engine.state.client_states, engine.train_ids)
    )
    engine.run()
    sampled = [record["clients"] for record in engine.state.history]
    assert clients_per_round == 0 or any(set(a) != set(b) for a, b in zip(sampled, sampled[1:]))
    scale = max(largest_control(state) for state in engine.state.client_states.values())
    assert scale > 1e-3, "the variates moved (else the invariant is trivially true)"
    assert max(gaps) <= 1e-5 * scale, (gaps, scale)


def test_every_evaluation_scores_each_evaluated_model_on_its_own_training_data(tmp_path):
    """``fit_loss`` is the sample-weighted mean of each client's model on its own training batches: for FedPer
    (a private head per client) it must be each client's own model, not the global one, in eval mode."""
    engine = make_engine(tmp_path, algorithm="fedper", rounds=2)
    history = engine.run().history
    assert all("fit" in record and record["fit_loss"] is not None for record in history)
    expected = {}
    for client_id, model in engine.client_models():
        losses = [
            engine.task.forward(model, b).loss.item()
            for b in engine.task.train_batches([client_id], torch.Generator().manual_seed(0))
        ]
        expected[client_id] = sum(losses) / len(losses)
    fit = history[-1]["fit"]
    assert {c: fit[c]["loss"] for c in fit} == pytest.approx(expected, rel=1e-6)
    sizes = {c: fit[c]["samples"] for c in fit}
    assert sizes == {c: n for c, n in SIZES.items()}
    assert history[-1]["fit_loss"] == pytest.approx(sum(expected[c] * SIZES[c] for c in SIZES) / sum(SIZES.values()))


def test_fit_samples_scores_the_same_first_batches_every_round_and_weights_by_all_the_data(tmp_path):
    """``fit_samples``: each evaluated model's training loss over the first ceil(fit_samples / batch_size) batches of
    the one fixed order (the same sample every round), still weighted by the client's whole training size."""
    engine = make_engine(tmp_path, algorithm="fedper", rounds=2, fit_samples=12)  # 2 batches of 8
    history = engine.run().history
    for client_id, model in engine.client_models():
        batches = list(engine.task.train_batches([client_id], torch.Generator().manual_seed(0)))
        first_two = [engine.task.forward(model, b).loss.item() for b in batches[:2]]
        every = [engine.task.forward(model, b).loss.item() for b in batches]
        assert history[-1]["fit"][client_id]["loss"] == pytest.approx(sum(first_two) / len(first_two), rel=1e-6)
        if len(batches) > 2:
            assert history[-1]["fit"][client_id]["loss"] != pytest.approx(sum(every) / len(every), rel=1e-6)
        assert history[-1]["fit"][client_id]["samples"] == SIZES[client_id]


def test_one_bf16_scoring_context_around_every_clients_model_scores_each_with_its_own_weights(tmp_path):
    """Autocast caches its bf16 copies of the weights for the length of its context: the clients' models, loaded one
    after the other into the one module inside a single ``scoring`` context (as FedMatch's end-of-cell scoring does),
    must each be scored with their own weights, as in a context of their own."""
    from fedrepro.fl.engine import scoring

    engine = make_engine(tmp_path, algorithm="individual", rounds=1)
    engine.run()
    with scoring("bf16"):
        together = {
            client_id: engine.task.evaluate(model, client_id, "test") for client_id, model in engine.client_models()
        }
    alone = {}
    for client_id, model in engine.client_models():
        with scoring("bf16"):
            alone[client_id] = engine.task.evaluate(model, client_id, "test")
    assert len(set(map(str, alone.values()))) == len(alone), "the clients' models should score differently"
    assert together == alone


def _scoring_models():
    """(model in eval mode, its inputs, its last layer) for each kind of model a paper scores with."""
    from transformers import BertConfig, BertModel

    from fedrepro.models.cross_encoder import CrossEncoder
    from fedrepro.models.matchers import MatcherSpec, build_matcher
    from fedrepro.models.relation import RelationClassifier

    torch.manual_seed(0)

    def encoder():
        return BertModel(
            BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
            add_pooling_layer=False,
        )

    ids = torch.randint(5, 50, (6, 10))
    ids[:, 0], ids[:, 4], ids[:, -1] = 1, 2, 2  # [CLS] question [SEP] answer [SEP] for the matchers
    mask, types = torch.ones_like(ids), (torch.arange(10) > 4).long().expand(6, 10)
    relation = RelationClassifier(encoder(), 3)
    pair = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    re2 = build_matcher("re2", MatcherSpec(vocab_size=50, pad_id=0, cls_id=1, sep_id=2, embedding_dim=16, hidden=16))
    return {
        "relation": (
            relation.eval(),
            {"input_ids": ids, "attention_mask": mask, "e1_mask": mask, "e2_mask": mask},
            relation.classifier,
        ),
        "cross-encoder": (CrossEncoder(encoder(), "mean").eval(), pair, None),
        "re2": (re2.eval(), pair, re2.head),
    }


@pytest.mark.parametrize("kind", ["relation", "cross-encoder", "re2"])
def test_bf16_scoring_runs_the_body_in_bf16_and_keeps_the_scores_fp32(kind):
    """Under ``scoring("bf16")`` the body runs in bf16 (faster on bf16 CPUs) but each model computes its scores or
    logits from its features in fp32 (bf16's 8-bit mantissa tied candidates and classes); in training mode autocast
    decides, as before."""
    from fedrepro.fl.engine import scoring

    model, inputs, head = _scoring_models()[kind]
    head = head if head is not None else model.head
    with scoring("bf16"):
        scores, features = model(**inputs)
        bf16_head = head(features)
    with scoring("fp32"):
        fp32_features = model(**inputs)[1]
    assert not torch.equal(features.float(), fp32_features), "the body did not run under bf16 autocast"
    assert scores.dtype == torch.float32
    assert torch.equal(scores, head(features.float()).squeeze(-1) if scores.dim() == 1 else head(features.float()))
    assert bf16_head.dtype == torch.bfloat16 and not torch.equal(scores, bf16_head.float().reshape(scores.shape))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.train()(**inputs)[0].dtype == torch.bfloat16


@pytest.mark.parametrize("weighting", ["uniform", "size"])
def test_feddyn_server_state_stays_the_weighted_mean_of_every_clients_gradient_estimate(tmp_path, weighting):
    """FedDyn's h == sum over all m clients of q_k g_k after every round (q_k = 1/m, or N_k / N under size
    weighting): it holds only if the server moves h by the participants' q_k, not their weights renormalised over
    the round, when 2 of 3 clients train. And h never leaves the server: each client receives what FedAvg sends."""
    engine = make_engine(tmp_path, algorithm="feddyn", rounds=3, clients_per_round=2, weighting=weighting)
    sizes = {c: engine.task.num_train_samples([c]) for c in SIZES}
    q = {c: (sizes[c] / sum(sizes.values()) if weighting == "size" else 1 / len(SIZES)) for c in SIZES}
    gaps = []

    def gap(record):
        worst = 0.0
        for name, h in engine.state.global_weights.items():
            if name.startswith(SERVER_STATE):
                gradient = CLIENT_GRADIENT + name.removeprefix(SERVER_STATE)
                mean = sum(
                    q[c] * engine.state.client_states.get(c, {}).get(STATE + gradient, torch.zeros_like(h))
                    for c in SIZES
                )
                worst = max(worst, float((h - mean).abs().max()))
        gaps.append(worst)

    engine.on_round_end = gap
    engine.run()
    sampled = [record["clients"] for record in engine.state.history]
    assert any(set(a) != set(b) for a, b in zip(sampled, sampled[1:]))
    scale = max(
        float(t.abs().max()) for name, t in engine.state.global_weights.items() if name.startswith(SERVER_STATE)
    )
    assert scale > 1e-4, "h moved (else the invariant is trivially true)"
    assert max(gaps) <= 1e-6, (gaps, scale)
    model_bytes = sum(p.numel() * 4 for p in engine.model.parameters())
    assert all(record["bytes_down"] == record["bytes_up"] == 2 * model_bytes for record in engine.state.history)
    assert not any(name.startswith("feddyn/") for c in SIZES for name in engine.channel.names_received(c))


def test_feddyn_adds_the_linear_and_proximal_terms_and_updates_its_gradient_estimate():
    model = torch.nn.Linear(2, 1)
    received = {name: (p.detach() + 1.0) for name, p in model.named_parameters()}
    gradients = {CLIENT_GRADIENT + name: torch.full_like(p, 0.5) for name, p in model.named_parameters()}
    context = LocalContext(0, "a", received, client_state=dict(gradients))
    algorithm = make_algorithm("feddyn", alpha=0.2)
    objective = algorithm.local_objective(model, TaskOutput(torch.tensor(0.5)), context)
    weights_sum = sum(float(p.detach().sum()) for p in model.parameters())
    n_params = sum(p.numel() for p in model.parameters())
    assert objective.item() == pytest.approx(0.5 - 0.5 * weights_sum + 0.5 * 0.2 * n_params)
    shared = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert algorithm.upload(shared, context) is shared
    for name, value in shared.items():  # g_k - alpha (theta_k - theta_server), with theta_k - theta_server = -1
        assert torch.allclose(context.client_state[CLIENT_GRADIENT + name], torch.full_like(value, 0.5 + 0.2))
