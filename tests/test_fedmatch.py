"""FedMatch's methods on the engine: private patches and layers never uploaded, LG-FedAvg's split, CoverQuery's
covers, client sampling, resume, and the grid's cells."""

import json

import pandas as pd
import pytest
import torch
import yaml

from fedrepro.config import parse_params
from fedrepro.fedmatch.cells import Cell, aggregation_epochs, cell_params, sweep_cells, table_cells
from fedrepro.fedmatch.methods import METHODS
from fedrepro.fl.algorithm import CommonSettings
from fedrepro.fl.algorithms import build_algorithm
from fedrepro.fl.algorithms.coverquery import with_cover_queries
from fedrepro.channel import SERVER
from fedrepro.fl.engine import Engine, EngineSettings
from fedrepro.models.patches import PatchSpec, patch_norms
from fedrepro.fedmatch.runs import algorithm_settings
from test_config import RAW
from toy import ToyQATask, make_algorithm

SIZES = {"a": 12, "b": 8, "c": 4}


def make_engine(tmp_path, algorithm, rounds=2, clients_per_round=0, seed=0, on_round_end=None, **knobs):
    torch.use_deterministic_algorithms(True)
    engine_settings = EngineSettings(
        rounds=rounds,
        local_epochs=1,
        clients_per_round=clients_per_round,
        lr=0.01,
        batch_size=4,
        warmup_fraction=0.1,
        max_grad_norm=5.0,
        seed=seed,
    )
    chosen = make_algorithm(algorithm, **knobs)
    return Engine(
        ToyQATask(SIZES),
        chosen,
        engine_settings,
        tmp_path / "ckpt",
        fingerprint=f"{algorithm}-{rounds}-{seed}",
        progress=False,
        on_round_end=on_round_end,
    )


def uploaded_names(engine):
    return {name for client in SIZES for name in engine.channel.names_sent(client)}


@pytest.mark.parametrize("insertion", ["inner", "outer", "vertical", "horizontal"])
@pytest.mark.parametrize("structure", ["pal", "lr"])
def test_fedmatch_never_uploads_its_patch(tmp_path, insertion, structure):
    engine = make_engine(tmp_path, "fedmatch", patch=PatchSpec(insertion, structure, size=8, heads=2))
    engine.run()
    names = set(engine.params)
    patch = {n for n in names if ".patch." in n}
    assert patch, "the patch was injected"
    assert uploaded_names(engine) == names - patch, "everything but the patch is uploaded"
    assert engine.channel.names_received(SERVER) == names - patch
    first, second = (engine.state.client_states[c] for c in ("a", "b"))
    assert any(not torch.equal(first[f"param/{n}"], second[f"param/{n}"]) for n in patch), (
        "each client trains its own patch"
    )


def test_shared_layers_and_released_code_fidelity_widen_the_private_set(tmp_path):
    engine = make_engine(
        tmp_path, "fedmatch", patch=PatchSpec("horizontal", "lr", size=8), shared_layers=1, fidelity="released_code"
    )
    engine.run()
    sent = uploaded_names(engine)
    top = {n for n in engine.params if "layer.1." in n}
    assert top and not top & sent, "the top layer is private when only 1 layer is shared"
    assert not any("LayerNorm" in n for n in sent), "the released code keeps every LayerNorm private"
    assert any("layer.0.attention" in n for n in sent) and "head.weight" in sent


def test_lg_fedavg_keeps_the_representation_local_and_shares_the_top(tmp_path):
    engine = make_engine(tmp_path, "lg_fedavg", local_layers=None)
    engine.run()
    sent = uploaded_names(engine)
    assert not any(".embeddings." in f".{n}" or "encoder.layer.0." in n for n in sent)
    assert {n for n in engine.params if "encoder.layer.1." in n or n.startswith("head.")} == sent


def test_fedper_uploads_everything_but_the_head(tmp_path):
    engine = make_engine(tmp_path, "fedper")
    engine.run()
    assert uploaded_names(engine) == {n for n in engine.params if not n.startswith("head.")}


def test_client_sampling_leaves_unsampled_patches_byte_identical(tmp_path):
    snapshots = []
    engine = make_engine(
        tmp_path, "fedmatch", rounds=4, clients_per_round=1, patch=PatchSpec("horizontal", "lr", size=8)
    )
    engine.on_round_end = lambda record: snapshots.append(
        (record["clients"], {c: {k: v.clone() for k, v in s.items()} for c, s in engine.state.client_states.items()})
    )
    engine.run()
    compared = 0
    for (_, before), (clients, after) in zip(snapshots, snapshots[1:]):
        for client in set(before) - set(clients):
            assert all(torch.equal(before[client][k], after[client][k]) for k in before[client])
            compared += 1
    assert compared > 0


def test_each_client_trains_its_own_patch_across_rounds(tmp_path):
    # The patch is trainable, in the optimizer and kept per client between rounds: after training every client's
    # up-projection (zero at the start) has moved, the clients' patches differ, and the model a client is scored
    # with carries its own patch.
    engine = make_engine(tmp_path, "fedmatch", rounds=3, patch=PatchSpec("horizontal", "lr", size=8))
    after_first = {}
    engine.on_round_end = lambda record: (
        after_first
        or after_first.update({c: {k: v.clone() for k, v in s.items()} for c, s in engine.state.client_states.items()})
    )
    engine.run()
    norms, ups = {}, {}
    with torch.no_grad():
        for client, model in engine.client_models():
            norms[client] = patch_norms(model.named_parameters(), engine.initial_private)
            ups[client] = next(p.clone() for n, p in model.named_parameters() if n.endswith("patch.up.weight"))
            stored = engine.state.client_states[client]
            assert torch.equal(ups[client], next(v for k, v in stored.items() if k.endswith("patch.up.weight")))
            first = next(v for k, v in after_first[client].items() if k.endswith("patch.up.weight"))
            assert not torch.equal(first, ups[client])  # rounds 2-3 moved it on from where round 1 left it
    assert all(n["up"] > 0 and n["down_change"] > 0 for n in norms.values())
    assert not torch.equal(ups["a"], ups["b"])


def test_a_killed_fedmatch_run_resumes_to_identical_results(tmp_path):
    spec = PatchSpec("inner", "pal", size=8, heads=2)
    reference = make_engine(tmp_path / "ref", "fedmatch", rounds=3, patch=spec).run()

    def crash(record):
        if record["round"] == 2:
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        make_engine(tmp_path / "run", "fedmatch", rounds=3, patch=spec, on_round_end=crash).run()
    resumed = make_engine(tmp_path / "run", "fedmatch", rounds=3, patch=spec).run()
    assert json.dumps(resumed.history, sort_keys=True) == json.dumps(reference.history, sort_keys=True)
    for client, tensors in reference.client_states.items():
        assert all(torch.equal(v, resumed.client_states[client][k]) for k, v in tensors.items())


def triples(questions=3, negatives=2):
    rows = [
        (
            f"q{i}",
            f"how do i file claim number {i}",
            f"p{i}",
            f"file the claim form {i} online",
            f"n{i}{j}",
            f"renters policy deductible rider {j}",
        )
        for i in range(questions)
        for j in range(negatives)
    ]
    return pd.DataFrame(rows, columns=["question_id", "question", "positive_id", "positive", "negative_id", "negative"])


def test_cover_queries_hide_every_real_question_among_k_covers():
    frame, k = triples(), 3
    upload = with_cover_queries(frame, k, seed=5)
    assert "question_id" not in upload.columns, "nothing in the upload names the real question"
    assert len(upload) == (k + 1) * len(frame)
    for question, rows in frame.groupby("question_id"):
        real = rows["question"].iloc[0]
        groups = upload[upload["question"] == real]["group"].unique()
        assert len(groups) == 1, "a real question travels in exactly one group"
        members = upload[upload["group"] == groups[0]]["question"]
        assert members.nunique() == k + 1 and (members.value_counts() == len(rows)).all()
        covers = set(members) - {real}
        assert all(len(c.split()) == len(real.split()) for c in covers), "covers have the real question's length"
    assert upload.equals(with_cover_queries(frame, k, seed=5)) and not upload.equals(
        with_cover_queries(frame, k, seed=6)
    )


def test_coverquery_central_trainer_only_sees_covered_questions(tmp_path):
    from fedrepro.fl.algorithms.coverquery import CoverQuery
    from fedrepro.channel import Channel

    class Task:
        client_ids = ["a", "b"]
        triples = {"a": triples(3), "b": triples(2)}

        def with_triples(self, new):
            task = Task()
            task.triples = new
            return task

    channel = Channel()
    central = CoverQuery(CoverQuery.Settings(cover_queries=2), CommonSettings()).prepare_task(Task(), channel, seed=0)
    assert [m.receiver for m in channel.messages] == [SERVER, SERVER]
    assert channel.names_received(SERVER) == {
        f"training_triples.{c}" for c in ("group", "question", "positive_id", "positive", "negative_id", "negative")
    }
    for client, frame in Task.triples.items():
        received = central.triples[client]
        assert len(received) == 3 * len(frame)
        assert received.groupby("question_id")["question"].nunique().eq(3).all()


def test_every_table_method_builds_its_algorithm():
    params = parse_params(RAW)
    for name, method in METHODS.items():
        settings = algorithm_settings(params, name)
        assert build_algorithm(method.algorithm, settings, CommonSettings()).name == method.algorithm
        if method.algorithm == "fedmatch":
            knobs = params.fedmatch.settings
            assert settings.patch == PatchSpec(method.insertion, method.structure, knobs.patch_size, knobs.patch_heads)


def test_cells_are_named_by_method_seed_and_each_points_yaml_value():
    params = parse_params(RAW)
    names = {c.name for c in table_cells(params)}
    assert f"fedmatch_h_lr-{params.fedmatch.seeds[0]}" in names
    points = {c.name for c in sweep_cells(params)}
    ratio = params.fedmatch.sweeps.data_ratio[-1]  # the scale's YAML value: 1.0 stays "1.0", as the store knows it
    assert f"data_ratio-{ratio}-individual-0" in points and str(ratio) == "1.0"
    assert cell_params(params, Cell("fedmatch_h_lr", 0, "patch_size", "64")).fedmatch.settings.patch_size == 64


@pytest.mark.parametrize(
    "rounds,periods,epochs", [(4, [1, 2, 3], 6), (3, [1, 2, 3], 6), (11, [1, 2, 3], 12), (4, [1, 2], 4), (4, [], 4)]
)
def test_every_aggregation_period_of_fig7_trains_the_same_local_epochs(rounds, periods, epochs):
    raw = yaml.safe_load(yaml.safe_dump(RAW))
    raw["train"]["rounds"], raw["fedmatch"]["sweeps"]["aggregate_every"] = rounds, periods
    params = parse_params(raw)
    assert aggregation_epochs(params) == epochs
    for period in periods:
        train = cell_params(params, Cell("fedmatch_h_lr", 0, "aggregate_every", str(period))).train
        assert (train.local_epochs, train.local_epochs * train.rounds) == (period, epochs)


def test_the_embedded_params_list_every_method_of_both_tables():
    fedmatch = yaml.safe_load(yaml.safe_dump(RAW))["fedmatch"]
    assert len(fedmatch["table2"]) == 8
    assert {
        "individual_re2",
        "individual_esim",
        "individual",
        "coverquery",
        "fedavg",
        "fedprox",
        "lg_fedavg",
        "fedper",
        "fedmatch_h_lr",
        "fedavg_cs",
        "fedmatch_cs",
    } <= set(fedmatch["table3"])


def test_an_empty_sweep_skips_its_figure_and_only_it():
    raw = yaml.safe_load(yaml.safe_dump(RAW))
    raw["fedmatch"]["sweeps"]["patch_size"] = []
    cells = sweep_cells(parse_params(raw))
    assert not [c for c in cells if c.sweep == "patch_size"]
    assert {c.sweep for c in cells} == {"shared_layers", "aggregate_every", "data_ratio"}
