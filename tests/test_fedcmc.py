"""FedCMC's track: the model, the task, the six baselines' hooks and what crosses the channel."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from fedrepro.data.label_skew import partition_corpus
from fedrepro.data.relation import synthetic_relations
from fedrepro.fl.algorithm import TaskOutput
from fedrepro.fl.algorithms.fedcmc import MAJOR_VECTORS, choose_clients, contrastive_loss
from fedrepro.fl.algorithms.fedlc import calibration
from fedrepro.fl.algorithms.fedrs import restricted_scale
from fedrepro.fl.algorithms.moon import PREVIOUS
from fedrepro.fl.algorithms.scaffold import CONTROL
from fedrepro.channel import SERVER
from fedrepro.fl.engine import GLOBAL, Engine, EngineSettings
from fedrepro.models.backbone import build_encoder, train_wordpiece
from fedrepro.models.relation import CLASSIFIER, RelationClassifier, add_entity_markers, local_average_similarity
from fedrepro.tasks.relation import RelationTask, encode_marked
from toy import make_algorithm

TINY = {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 32}


@pytest.fixture(scope="module")
def corpus():
    return synthetic_relations(n_sentences=240, n_classes=3, seed=3, vocab_size=60)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    tok = train_wordpiece(corpus.table["text"].str.replace(r"</?e[12]>", " ", regex=True), 300)
    add_entity_markers(tok)
    return tok


def make_task(corpus, tokenizer, clients=3, alpha=0.5, negative=()):
    assignment, _ = partition_corpus(corpus.table, clients, "dirichlet", alpha, seed=0, min_size=2)

    def build():
        return RelationClassifier(build_encoder("tiny", len(tokenizer), TINY, 64), len(corpus.classes))

    return RelationTask(corpus.table, assignment, corpus.classes, negative, tokenizer, build, 64, 8)


def run_engine(task, method, tmp_path, rounds=2, **knobs):
    algorithm = make_algorithm(method, "size", **knobs)
    engine_settings = EngineSettings(
        rounds=rounds,
        local_epochs=1,
        clients_per_round=0,
        lr=1e-3,
        batch_size=8,
        warmup_fraction=0.0,
        max_grad_norm=1.0,
        seed=0,
        eval_every=1,
        eval_splits=("valid", "test"),
    )
    engine = Engine(task, algorithm, engine_settings, tmp_path / method, f"fp-{method}", progress=False)
    engine.run()
    return engine


# ----- model and task --------------------------------------------------------------------------------


def test_entity_spans_cover_the_entities_and_a_long_sentence_keeps_both(tokenizer):
    text = "a b <e1> x y </e1> c <e2> z </e2> d"
    [short] = encode_marked(tokenizer, [text], 64)
    tokens = tokenizer.convert_ids_to_tokens(short.input_ids)
    assert tokens[short.e1[0] - 1] == "<e1>" and tokens[short.e1[1]] == "</e1>"
    assert tokens[short.e2[0] - 1] == "<e2>" and tokens[short.e2[1]] == "</e2>"
    long_text = " ".join(["w"] * 80) + " " + text
    [cut] = encode_marked(tokenizer, [long_text], 16)
    assert cut.truncated and len(cut.input_ids) == 16
    cut_tokens = tokenizer.convert_ids_to_tokens(cut.input_ids)
    assert {"<e1>", "</e1>", "<e2>", "</e2>"} <= set(cut_tokens)
    assert cut.e1[1] > cut.e1[0] and cut.e2[1] > cut.e2[0]


def test_relation_features_are_the_sum_of_entity_word_pieces(corpus, tokenizer):
    task = make_task(corpus, tokenizer)
    model = task.build_model().eval()
    batch = next(task.train_batches(task.client_ids[:1], torch.Generator().manual_seed(0)))
    logits, features = model(**{k: v for k, v in batch.items() if k != "labels"})
    hidden = model.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    first = batch["e1_mask"][0].bool()
    assert torch.allclose(features[0, :16], hidden[0, first].sum(dim=0), atol=1e-5)
    assert logits.shape == (len(batch["labels"]), len(corpus.classes)) and features.shape[1] == model.feature_dim == 32
    assert model.classifier.weight.shape == (3, 32)


def test_f1_leaves_out_the_negative_class(corpus, tokenizer):
    task = make_task(corpus, tokenizer, negative=["rel0"])
    predictions = pd.DataFrame(
        {"label": ["rel0", "rel1", "rel2", "rel0"], "predicted": ["rel0", "rel1", "rel0", "rel1"]}
    )
    scores = task.scores(predictions)
    # positives rel1, rel2: one true positive (rel1), one false positive (rel1 for rel0), one false negative (rel2)
    assert scores["micro_f1"] == pytest.approx(0.5) and scores["accuracy"] == pytest.approx(0.5)


def test_predictions_batched_by_length_keep_the_splits_order_and_equal_one_sentence_at_a_time(corpus, tokenizer):
    """``predict`` batches sentences of similar length (less padding); each row must still be its own sentence's
    prediction, as scoring the sentences one at a time in file order gives."""
    task = make_task(corpus, tokenizer)
    torch.manual_seed(0)
    model = task.build_model().eval()
    rows, sentences = task.eval_sets["test"]
    assert len({len(s.input_ids) for s in sentences}) > 1, "no lengths to sort by"
    predicted = task.predict(model, "test")
    assert predicted["sentence_id"].tolist() == rows["sentence_id"].tolist()
    with torch.no_grad():
        one_by_one = [task.classes[int(model(**task._batch([s]))[0].argmax())] for s in sentences]
    assert predicted["predicted"].tolist() == one_by_one


def test_the_last_rounds_valid_scores_are_the_final_models_so_a_cell_need_not_score_it_again(
    corpus, tokenizer, tmp_path
):
    """``run_cell`` takes the final valid scores from the last round's record: they must be what scoring the
    global model after the run gives."""
    engine = run_engine(make_task(corpus, tokenizer), "fedavg", tmp_path)
    last = engine.state.history[-1]
    with torch.no_grad():
        assert last["valid"][GLOBAL] == engine.task.evaluate(engine.global_model(), GLOBAL, "valid")
        assert last["test"][GLOBAL] == engine.task.evaluate(engine.global_model(), GLOBAL, "test")


# ----- the algorithms' arithmetic on hand-made numbers -----------------------------------------------


def test_local_average_similarity_and_major_vector_choice():
    classifier = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    d = local_average_similarity(classifier)
    s = float(1 / np.sqrt(2))
    assert torch.allclose(d, torch.tensor([s / 2, s / 2, s]), atol=1e-6)
    similarity = torch.tensor([[0.1, 0.9, 0.5], [0.4, 0.2, 0.3], [0.7, 0.6, 0.8]])  # clients x classes
    rng = np.random.default_rng(0)
    assert choose_clients(similarity, "major", rng) == [0, 1, 1]
    assert choose_clients(similarity, "minor", rng) == [2, 0, 2]
    assert all(0 <= k < 3 for k in choose_clients(similarity, "random", rng))


def test_contrastive_loss_prefers_the_own_class_vector():
    vectors = torch.eye(3)
    features = torch.tensor([[5.0, 0.0, 0.0]])
    near = contrastive_loss(features, vectors, torch.tensor([0]), 0.5)
    far = contrastive_loss(features, vectors, torch.tensor([1]), 0.5)
    expected = -torch.log_softmax(torch.tensor([2.0, 0.0, 0.0]), dim=0)[0]  # cosines 1, 0, 0 over T = 0.5
    assert near.item() == pytest.approx(expected.item(), abs=1e-6) and far > near


def test_fedrs_scales_logits_by_counts_as_its_author_does():
    counts = torch.tensor([10.0, 5.0, 0.0])
    assert torch.allclose(restricted_scale(counts, 0.5, mask=False), torch.tensor([1.0, 0.75, 0.5]))
    assert torch.allclose(restricted_scale(counts, 0.5, mask=True), torch.tensor([1.0, 1.0, 0.5]))


def test_fedlc_shifts_logits_by_tau_over_fourth_root_of_counts():
    shift = calibration(torch.tensor([16.0, 1.0, 0.0]), 2.0)
    assert torch.allclose(shift, torch.tensor([1.0, 2.0, 2.0]))


def test_fedrs_and_fedlc_losses_use_the_clients_own_counts(corpus, tokenizer):
    task = make_task(corpus, tokenizer)
    client = task.client_ids[0]
    logits, targets = torch.tensor([[1.0, 2.0, 0.5]]), torch.tensor([1])
    output = TaskOutput(loss=torch.tensor(0.0), logits=logits, targets=targets)
    context = type("Context", (), {"client_id": client})()
    counts = task.label_counts(client)
    for name, adjusted in (
        ("fedrs", logits * restricted_scale(counts, 0.5, False)),
        ("fedlc", logits - calibration(counts, 1.0)),
    ):
        algorithm = make_algorithm(name, **{"fedrs": {"alpha": 0.5, "mask": False}, "fedlc": {"tau": 1.0}}[name])
        algorithm.prepare_task(task, None, 0)
        expected = torch.nn.functional.cross_entropy(adjusted, targets)
        assert algorithm.local_objective(None, output, context).item() == pytest.approx(expected.item(), abs=1e-6)


# ----- what crosses the channel -----------------------------------------------------------------------


def test_fedcmc_sends_only_the_major_vectors_beyond_fedavg(corpus, tokenizer, tmp_path):
    task = make_task(corpus, tokenizer)
    fedavg = run_engine(task, "fedavg", tmp_path)
    fedcmc = run_engine(task, "fedcmc", tmp_path, mu=1.0, temperature=0.5)
    model_names = set(fedavg.shared_names)
    assert fedcmc.channel.names_received(SERVER) == model_names == fedavg.channel.names_received(SERVER)
    assert fedcmc.channel.names_sent(SERVER) == model_names | {MAJOR_VECTORS}
    first, second = (fedcmc.channel.round_bytes(r)["down"] - fedavg.channel.round_bytes(r)["down"] for r in (0, 1))
    assert (
        first == 0 and second == len(task.client_ids) * 3 * 32 * 4
    )  # round 1 has no vectors yet; then C x 2d floats each
    record = fedcmc.state.history[-1]
    assert len(record["vector_clients"]) == 3 and len(record["diagnostics"]["local_similarity"]) == len(task.client_ids)
    assert set(record["test"]) == {GLOBAL}


def test_fedcmc_none_is_fedavg(corpus, tokenizer, tmp_path):
    task = make_task(corpus, tokenizer)
    fedavg = run_engine(task, "fedavg", tmp_path)
    none = run_engine(task, "fedcmc", tmp_path, mu=1.0, temperature=1.0, vectors="none")
    for name, value in fedavg.state.global_weights.items():
        assert torch.equal(value, none.state.global_weights[name])


def test_scaffold_sends_variates_and_keeps_its_own(corpus, tokenizer, tmp_path):
    task = make_task(corpus, tokenizer)
    engine = run_engine(task, "scaffold", tmp_path)
    shared = set(engine.shared_names)
    controls = {CONTROL + n for n in shared}
    assert engine.channel.names_received(SERVER) == shared | controls
    assert engine.channel.names_sent(SERVER) == shared | controls
    state = engine.state.client_states[task.client_ids[0]]
    assert {k for k in state if k.startswith("state/")} == {"state/" + c for c in controls}
    server_control = engine.state.global_weights[CONTROL + CLASSIFIER]
    assert server_control.abs().sum() > 0  # the variates moved


def test_moon_previous_model_never_leaves_the_client(corpus, tokenizer, tmp_path):
    task = make_task(corpus, tokenizer)
    engine = run_engine(task, "moon", tmp_path, mu=1.0, temperature=0.5, projection_dim=8)
    everything = {n for m in engine.channel.messages for n in m.names}
    assert not any(n.startswith(PREVIOUS) for n in everything)
    assert engine.channel.names_received(SERVER) == set(engine.shared_names)
    assert any(n.startswith("moon_projection.") for n in engine.shared_names)
    state = engine.state.client_states[task.client_ids[0]]
    assert any(k.startswith("state/" + PREVIOUS) for k in state)


@pytest.mark.parametrize("method", ["fedcmc", "scaffold", "moon"])
def test_a_killed_run_resumes_to_identical_results(corpus, tokenizer, tmp_path, method):
    task = make_task(corpus, tokenizer)
    knobs = {
        "fedcmc": {"mu": 1.0, "temperature": 1.0},
        "moon": {"mu": 1.0, "temperature": 0.5, "projection_dim": 8},
    }.get(method, {})
    reference = run_engine(task, method, tmp_path / "reference", rounds=3, **knobs)

    def crash(record):
        if record["round"] == 2:
            raise KeyboardInterrupt("killed")

    def engine(on_round_end=None):
        settings = EngineSettings(
            rounds=3,
            local_epochs=1,
            clients_per_round=0,
            lr=1e-3,
            batch_size=8,
            warmup_fraction=0.0,
            max_grad_norm=1.0,
            seed=0,
            eval_every=1,
            eval_splits=("valid", "test"),
        )
        return Engine(
            task,
            make_algorithm(method, "size", **knobs),
            settings,
            tmp_path / "run",
            "fp",
            progress=False,
            on_round_end=on_round_end,
        )

    with pytest.raises(KeyboardInterrupt):
        engine(crash).run()
    resumed = engine().run()
    assert json.dumps(resumed.history, sort_keys=True) == json.dumps(reference.state.history, sort_keys=True)
    for name, value in reference.state.global_weights.items():
        assert torch.equal(value, resumed.global_weights[name])


def test_run_fingerprint_follows_the_cells_own_algorithm_knobs():
    from fedrepro.config import parse_params
    from fedrepro.fedcmc.cells import Cell
    from fedrepro.fedcmc.runs import run_fingerprint
    from test_config import RAW

    params = parse_params(RAW)
    moon, fedavg = (Cell(m, "synthetic-re", 0.5, 10, 1, 0) for m in ("moon", "fedavg"))
    changed = params.model_copy(
        update={"algorithms": {**params.algorithms, "moon": {**params.algorithms["moon"], "mu": 0.5}}}
    )
    assert run_fingerprint(changed, moon, "inputs") != run_fingerprint(params, moon, "inputs")
    assert run_fingerprint(changed, fedavg, "inputs") == run_fingerprint(params, fedavg, "inputs")
    major, minor = (Cell("fedcmc", "synthetic-re", 0.5, 10, 1, 0, vectors=v) for v in ("major", "minor"))
    assert run_fingerprint(params, minor, "inputs") != run_fingerprint(params, major, "inputs")
