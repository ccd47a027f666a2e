"""Each algorithm's defining computation against a value computed here from its paper's definition (issue 48).

Every test builds a toy (a few numbers, a 3 -> 2 linear layer, fixed seeds), computes the expected loss, gradient,
client state or server update by hand with plain torch formulas written from the paper, and compares it with what
the algorithm's own hooks give when called as the engine calls them (client: ``local_objective``, backward,
``after_backward``, ``upload``; server: ``server_extras``, ``aggregate``). No expected value comes from the algorithm
module's helpers, so a flipped sign, a wrong operand, a dropped term or a swapped temperature fails.

Checked elsewhere against values computed by hand or by another library: the uniform and size aggregation weights
(``test_engine.test_uniform_and_size_weighted_average``), SCAFFOLD's and FedDyn's server-state invariants
(``test_engine``), FedPer's, LG-FedAvg's and FedMatch's private parameters (``test_engine``, ``test_fedmatch``), the
number and length of CoverQuery's covers (``test_fedmatch``), FedCMC's local average similarity and client choice rule
(``test_fedcmc``), and the trivial baselines: always-the-commonest-class and stratified-random F1 against scikit-learn
(``test_fedcmc_sanity``), chance MAP/MRR against an enumeration of every ordering (``test_ranking_metrics``), BM25
alone (``test_fedmatch_sanity``, ``test_fedmatch_report``), the majority class and the label party alone
(``test_ssvfnas``).
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

from fedrepro.fl.algorithm import ClientUpdate, LocalContext, TaskOutput
from fedrepro.fl.algorithms.coverquery import with_cover_queries
from fedrepro.fl.algorithms.fedcmc import MAJOR_VECTORS
from fedrepro.fl.algorithms.feddyn import CLIENT_GRADIENT, SERVER_STATE
from fedrepro.fl.algorithms.moon import PREVIOUS
from fedrepro.fl.algorithms.scaffold import CONTROL
from fedrepro.models.relation import CLASSIFIER
from toy import make_algorithm


class ClientsOnly:
    """What ``prepare_task`` reads of a task on the server: the client ids, their training sizes, their label counts."""

    def __init__(self, sizes: dict[str, int], label_counts: dict[str, list[float]] | None = None) -> None:
        self.client_ids, self.sizes, self.counts = list(sizes), sizes, label_counts or {}

    def num_train_samples(self, client_ids) -> int:
        return sum(self.sizes[c] for c in client_ids)

    def label_counts(self, client_id: str) -> torch.Tensor:
        return torch.tensor(self.counts[client_id])


def linear_layer(seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(3, 2)


def random_like(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """One standard-normal tensor per parameter (entries both below and above 1 in size, so |d| and d^2 differ)."""
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(p.shape, generator=generator) for name, p in model.named_parameters()}


def batch(seed: int, rows: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 3, generator=generator), torch.randn(rows, 2, generator=generator)


def squared_error(model: nn.Linear, x: torch.Tensor, y: torch.Tensor) -> TaskOutput:
    """The task loss F(W, b) = 1/(2n) sum_i ||W x_i + b - y_i||^2."""
    return TaskOutput(loss=0.5 * (model(x) - y).pow(2).sum(dim=1).mean())


def squared_error_gradients(
    weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> dict[str, torch.Tensor]:
    """dF/dW = R^T X / n and dF/db = mean_i r_i, with the residuals R = X W^T + b - Y (by hand, no autograd)."""
    residual = x @ weight.T + bias - y
    return {"weight": residual.T @ x / len(x), "bias": residual.mean(dim=0)}


def weights_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def cross_entropy_by_hand(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean_i (log sum_c e^{l_ic} - l_{i,y_i})."""
    return (logits.exp().sum(dim=1).log() - logits[torch.arange(len(targets)), targets]).mean()


def cosine_by_hand(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise a_i . b_j / (|a_i| |b_j|), an (len(a), len(b)) matrix."""
    return (a @ b.T) / (a.pow(2).sum(dim=1).sqrt()[:, None] * b.pow(2).sum(dim=1).sqrt()[None, :])


# ----- FedProx -------------------------------------------------------------------------------------------------
def test_fedprox_adds_mu_over_two_times_the_squared_distance_to_the_global_weights():
    """FedProx (Li et al., MLSys 2020, the local objective): h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2, so the
    gradient a client steps along is grad F_k(w) + mu (w - w^t)."""
    mu, model, (x, y) = 0.3, linear_layer(0), batch(1)
    received = random_like(model, 2)
    output = squared_error(model, x, y)
    objective = make_algorithm("fedprox", mu=mu).local_objective(model, output, LocalContext(0, "a", received))
    w = weights_of(model)
    distance = sum(float((w[n] - received[n]).pow(2).sum()) for n in w)
    assert objective.item() == pytest.approx(output.loss.item() + mu / 2 * distance, rel=1e-6)
    objective.backward()
    task_gradients = squared_error_gradients(w["weight"], w["bias"], x, y)
    for name, param in model.named_parameters():
        assert torch.allclose(param.grad, task_gradients[name] + mu * (w[name] - received[name]), atol=1e-6)


# ----- SCAFFOLD ----------------------------------------------------------------------------------------------------
def test_scaffold_corrects_each_gradient_by_c_minus_c_k_and_keeps_the_mean_raw_gradient_as_c_k():
    """SCAFFOLD (Karimireddy et al., ICML 2020, Alg. 1, client): a client steps along g_k(y) - c_k + c. After its K
    steps its new variate c_k+ is the mean of the raw gradients g_k of its steps (the module's stated variant of the
    paper's options I/II under Adam); it uploads c_k+ - c_k beside its weights and keeps c_k+."""
    algorithm, model = make_algorithm("scaffold"), linear_layer(0)
    server_variate, own_variate = random_like(model, 3), random_like(model, 4)
    received = {**weights_of(model), **{CONTROL + n: v for n, v in server_variate.items()}}
    context = LocalContext(0, "a", received, client_state={CONTROL + n: v for n, v in own_variate.items()})
    raw_sum = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
    for step in range(2):
        x, y = batch(10 + step)
        w = weights_of(model)
        raw = squared_error_gradients(w["weight"], w["bias"], x, y)
        model.zero_grad()
        algorithm.local_objective(model, squared_error(model, x, y), context).backward()
        for name, param in model.named_parameters():
            assert torch.allclose(param.grad, raw[name] - own_variate[name] + server_variate[name], atol=1e-6)
            raw_sum[name] += raw[name]
        algorithm.after_backward(model, context)
        context.steps += 1
        with torch.no_grad():  # a plain SGD step, so the second gradient is taken elsewhere
            for param in model.parameters():
                param -= 0.5 * param.grad
    shared = weights_of(model)
    upload = algorithm.upload(dict(shared), context)
    for name, value in shared.items():
        new_variate = raw_sum[name] / 2
        assert torch.equal(upload[name], value)
        assert torch.allclose(context.client_state[CONTROL + name], new_variate, atol=1e-6)
        assert torch.allclose(upload[CONTROL + name], new_variate - own_variate[name], atol=1e-6)


def test_scaffold_server_averages_the_weights_and_moves_c_by_the_sampled_share_of_the_mean_change():
    """SCAFFOLD (Alg. 1, server, global step 1): x <- mean_{k in S} y_k, c <- c + |S|/N mean_{k in S} (c_k+ - c_k);
    here |S| = 2 of N = 5 clients, whose sizes must not weigh in under uniform weighting."""
    algorithm = make_algorithm("scaffold")
    algorithm.prepare_task(ClientsOnly(dict.fromkeys("abcde", 10)), None, 0)
    server = {"w": torch.tensor([1.0, -2.0]), CONTROL + "w": torch.tensor([0.5, 0.25])}
    updates = [
        ClientUpdate("a", {"w": torch.tensor([3.0, 0.0]), CONTROL + "w": torch.tensor([0.2, -0.4])}, 10),
        ClientUpdate("b", {"w": torch.tensor([1.0, 4.0]), CONTROL + "w": torch.tensor([1.0, 0.6])}, 30),
    ]
    result = algorithm.aggregate(server, updates)
    # weights: ([3, 0] + [1, 4]) / 2
    # variate: [0.5, 0.25] + 2/5 * ([0.2, -0.4] + [1.0, 0.6]) / 2 = [0.5 + 0.24, 0.25 + 0.04]
    assert torch.allclose(result["w"], torch.tensor([2.0, 2.0]))
    assert torch.allclose(result[CONTROL + "w"], torch.tensor([0.74, 0.29]))


# ----- FedDyn ------------------------------------------------------------------------------------------------------
def test_feddyn_local_objective_and_gradient_estimate():
    """FedDyn (Acar et al., ICLR 2021, Alg. 1, client): theta_k^t = argmin L_k(theta) - <grad L_k(theta_k^{t-1}), theta>
    + alpha/2 ||theta - theta^{t-1}||^2, then the gradient estimate
    grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1})."""
    alpha, model, (x, y) = 0.3, linear_layer(0), batch(1)
    algorithm = make_algorithm("feddyn", alpha=alpha)
    received, estimate = random_like(model, 2), random_like(model, 3)
    context = LocalContext(0, "a", received, client_state={CLIENT_GRADIENT + n: v for n, v in estimate.items()})
    output = squared_error(model, x, y)
    objective = algorithm.local_objective(model, output, context)
    w = weights_of(model)
    linear = sum(float((estimate[n] * w[n]).sum()) for n in w)
    distance = sum(float((w[n] - received[n]).pow(2).sum()) for n in w)
    assert objective.item() == pytest.approx(output.loss.item() - linear + alpha / 2 * distance, rel=1e-6)
    objective.backward()
    task_gradients = squared_error_gradients(w["weight"], w["bias"], x, y)
    for name, param in model.named_parameters():
        expected = task_gradients[name] - estimate[name] + alpha * (w[name] - received[name])
        assert torch.allclose(param.grad, expected, atol=1e-6)
    trained = {n: v + 0.1 * torch.arange(v.numel()).reshape(v.shape) for n, v in w.items()}
    algorithm.upload(dict(trained), context)
    for name, value in trained.items():
        expected = estimate[name] - alpha * (value - received[name])
        assert torch.allclose(context.client_state[CLIENT_GRADIENT + name], expected, atol=1e-6)


@pytest.mark.parametrize("weighting", ["uniform", "size"])
def test_feddyn_server_moves_h_by_the_participants_drift_and_subtracts_h_over_alpha(weighting):
    """FedDyn (Alg. 1, server): h^t = h^{t-1} - alpha sum_{k in P} q_k (theta_k^t - theta^{t-1}) with q_k = 1/m (the
    paper) or N_k / N (size weighting), and theta^t = sum_{k in P} p_k theta_k^t - h^t / alpha with p_k = 1/|P| or
    N_k / N_P. Two of four clients take part."""
    alpha, sizes = 0.5, {"a": 10, "b": 30, "c": 20, "d": 40}
    algorithm = make_algorithm("feddyn", weighting, alpha=alpha)
    algorithm.prepare_task(ClientsOnly(sizes), None, 0)
    theta, h = torch.tensor([1.0, -1.0]), torch.tensor([0.2, 0.4])
    uploads = {"a": torch.tensor([2.0, 0.0]), "b": torch.tensor([0.0, 1.0])}
    result = algorithm.aggregate(
        {"w": theta, SERVER_STATE + "w": h}, [ClientUpdate(c, {"w": v}, sizes[c]) for c, v in uploads.items()]
    )
    q = {"a": 1 / 4, "b": 1 / 4} if weighting == "uniform" else {"a": 10 / 100, "b": 30 / 100}
    p = {"a": 1 / 2, "b": 1 / 2} if weighting == "uniform" else {"a": 10 / 40, "b": 30 / 40}
    new_h = h - alpha * sum(q[c] * (v - theta) for c, v in uploads.items())
    assert torch.allclose(result[SERVER_STATE + "w"], new_h)
    assert torch.allclose(result["w"], sum(p[c] * v for c, v in uploads.items()) - new_h / alpha)


# ----- MOON --------------------------------------------------------------------------------------------------------
class Encoder(nn.Module):
    """A 2 -> 3 feature extractor; MOON adds its projection head ``moon_projection`` (3 -> 3 -> ReLU -> 2)."""

    feature_dim = 3

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(2, 3)


def encoder_output(model: Encoder, x: torch.Tensor) -> TaskOutput:
    features = model.body(x)
    return TaskOutput(loss=features.pow(2).mean(), features=features, rerun=lambda other: encoder_output(other, x))


def projected_by_hand(weights: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """z = W2 relu(W1 (B x + b) + b1) + b2 from the named tensors of one model."""

    def layer(name: str, inputs: torch.Tensor) -> torch.Tensor:
        return inputs @ weights[f"{name}.weight"].T + weights[f"{name}.bias"]

    return layer("moon_projection.2", torch.clamp(layer("moon_projection.0", layer("body", x)), min=0))


def test_moon_adds_mu_times_the_model_contrastive_loss_against_the_global_and_previous_representations():
    """MOON (Li, He and Song, CVPR 2021, the model-contrastive loss): l_con = -log e^{sim(z, z_glob)/tau}
    / (e^{sim(z, z_glob)/tau} + e^{sim(z, z_prev)/tau}), sim the cosine, z the projected representation by the model
    being trained, z_glob by the round's global model, z_prev by the client's model of its previous round; the local
    loss is l_sup + mu l_con. On a client's first round the previous model is the global one, so l_con = log 2."""
    mu, tau = 0.7, 0.3
    algorithm = make_algorithm("moon", mu=mu, temperature=tau, projection_dim=2)
    torch.manual_seed(0)
    model = algorithm.adapt_model(Encoder())
    x = torch.randn(5, 2, generator=torch.Generator().manual_seed(1))
    received, previous = random_like(model, 2), random_like(model, 3)
    context = LocalContext(0, "a", received, client_state={PREVIOUS + n: v for n, v in previous.items()})
    output = encoder_output(model, x)
    objective = algorithm.local_objective(model, output, context)
    z = projected_by_hand(weights_of(model), x)
    positive = cosine_by_hand(z, projected_by_hand(received, x)).diagonal() / tau
    negative = cosine_by_hand(z, projected_by_hand(previous, x)).diagonal() / tau
    contrastive = -(positive.exp() / (positive.exp() + negative.exp())).log().mean()
    assert objective.item() == pytest.approx(output.loss.item() + mu * contrastive.item(), rel=1e-5)
    first_round = algorithm.local_objective(model, output, LocalContext(0, "b", received))
    assert first_round.item() == pytest.approx(output.loss.item() + mu * torch.tensor(2.0).log().item(), rel=1e-5)


# ----- FedRS and FedLC ---------------------------------------------------------------------------------------------
LOGITS = torch.randn(5, 4, generator=torch.Generator().manual_seed(7))
TARGETS = torch.tensor([0, 1, 2, 3, 1])
COUNTS = [8.0, 2.0, 0.0, 4.0]


def label_skewed_objective(name: str, counts: list[float], **knobs) -> float:
    algorithm = make_algorithm(name, **knobs)
    algorithm.prepare_task(ClientsOnly({"a": int(sum(counts))}, {"a": counts}), None, 0)
    output = TaskOutput(loss=torch.tensor(0.0), logits=LOGITS, targets=TARGETS)
    return algorithm.local_objective(None, output, LocalContext(0, "a", {})).item()


@pytest.mark.parametrize("mask", [False, True])
def test_fedrs_restricts_the_softmax_by_scaling_the_logits_of_the_clients_rare_and_missing_classes(mask):
    """FedRS (Li and Zhan, KDD 2021, the restricted softmax): p_c proportional to e^{alpha_c o_c}, alpha_c = 1 for a
    class the client holds and alpha for one it misses (``mask``); the author's count-scaled form
    alpha_c = n_c / max_j n_j (1 - alpha) + alpha. Counts 8, 2, 0, 4 and alpha 0.3 (not 0.5, where alpha and
    1 - alpha could be swapped unseen)."""
    scales = torch.tensor([1.0, 1.0, 0.3, 1.0] if mask else [1.0, 0.25 * 0.7 + 0.3, 0.3, 0.5 * 0.7 + 0.3])
    expected = cross_entropy_by_hand(LOGITS * scales, TARGETS).item()
    assert label_skewed_objective("fedrs", COUNTS, alpha=0.3, mask=mask) == pytest.approx(expected, rel=1e-6)


def test_fedlc_subtracts_tau_times_the_inverse_fourth_root_of_each_class_count_from_its_logit():
    """FedLC (Zhang et al., ICML 2022, the calibrated loss): cross-entropy on f_c(x) - tau n_c^{-1/4}, n_c the
    client's samples of class c (a missing class counted as 1). Counts 16, 1, 0, 81 give shifts tau/2, tau, tau,
    tau/3."""
    tau = 0.7
    shifts = torch.tensor([tau / 2, tau, tau, tau / 3])
    expected = cross_entropy_by_hand(LOGITS - shifts, TARGETS).item()
    assert label_skewed_objective("fedlc", [16.0, 1.0, 0.0, 81.0], tau=tau) == pytest.approx(expected, rel=1e-6)


# ----- FedCMC ------------------------------------------------------------------------------------------------------
def test_fedcmc_adds_mu_times_the_contrast_of_each_feature_with_the_major_class_vectors():
    """FedCMC (Zhang et al., 2023, the local loss): L = L_CE + mu * mean_i -log e^{cos(h_i, v_{y_i})/T}
    / sum_c e^{cos(h_i, v_c)/T}, v_c the major vector of class c the server sent; before the first aggregation (no
    vectors yet) plain L_CE."""
    mu, temperature = 0.4, 0.2
    generator = torch.Generator().manual_seed(5)
    features, vectors = torch.randn(4, 6, generator=generator), torch.randn(3, 6, generator=generator)
    targets = torch.tensor([0, 2, 1, 2])
    algorithm = make_algorithm("fedcmc", "size", mu=mu, temperature=temperature)
    output = TaskOutput(loss=torch.tensor(1.25), features=features, targets=targets)
    objective = algorithm.local_objective(None, output, LocalContext(1, "a", {MAJOR_VECTORS: vectors}))
    contrast = cross_entropy_by_hand(cosine_by_hand(features, vectors) / temperature, targets)
    assert objective.item() == pytest.approx(1.25 + mu * contrast.item(), rel=1e-6)
    assert algorithm.local_objective(None, output, LocalContext(0, "a", {})).item() == 1.25


def test_fedcmc_server_takes_each_class_vector_from_the_client_least_similar_on_that_class():
    """FedCMC (Def. 1 and the major classifier vectors): d_{k,c} = 1/(C-1) sum_{c' != c} cos(theta_{k,c}, theta_{k,c'});
    the major vector of class c is row c of client argmin_k d_{k,c}'s classifier, sent to every client; the model is
    FedAvg with p_k = N_k / N. Three clients and three classes, so a swapped client/class index keeps its shape."""
    sizes = {"a": 10, "b": 30, "c": 60}
    generator = torch.Generator().manual_seed(11)
    classifiers = {c: torch.randn(3, 2, generator=generator) for c in sizes}
    biases = {c: torch.randn(3, generator=generator) for c in sizes}
    algorithm = make_algorithm("fedcmc", "size", mu=1.0, temperature=0.5)
    algorithm.server_extras(1)
    updates = [ClientUpdate(c, {CLASSIFIER: classifiers[c], "classifier.bias": biases[c]}, n) for c, n in sizes.items()]
    result = algorithm.aggregate(
        {CLASSIFIER: torch.zeros(3, 2), "classifier.bias": torch.zeros(3), MAJOR_VECTORS: torch.zeros(3, 2)}, updates
    )
    similarity = {}
    for client, rows in classifiers.items():
        cosine = cosine_by_hand(rows, rows)
        for c in range(3):
            similarity[client, c] = sum(float(cosine[c, other]) for other in range(3) if other != c) / 2
    owners = [min(sizes, key=lambda client: similarity[client, c]) for c in range(3)]
    assert owners != [max(sizes, key=lambda client: similarity[client, c]) for c in range(3)]
    assert torch.equal(result[MAJOR_VECTORS], torch.stack([classifiers[owner][c] for c, owner in enumerate(owners)]))
    assert algorithm.round_notes() == {"vector_clients": owners}
    assert torch.allclose(result[CLASSIFIER], sum(sizes[c] / 100 * classifiers[c] for c in sizes))
    assert torch.allclose(result["classifier.bias"], sum(sizes[c] / 100 * biases[c] for c in sizes))


# ----- CoverQuery --------------------------------------------------------------------------------------------------
def test_cover_questions_are_made_of_the_clients_own_answer_words():
    """CoverQuery (cover queries after TrackMeNot, Howe and Nissenbaum 2009, as the module defines them): each real
    question travels with k covers of its own length whose words are drawn from the client's answer texts, so a cover
    looks like the client's domain; the questions' own words, absent from every answer here, never appear in one."""
    rows = [
        (f"q{i}", f"alpha beta gamma q{i}", f"p{i}", f"Claim Form {i} online", f"n{i}", "policy deductible rider")
        for i in range(3)
    ]
    columns = ["question_id", "question", "positive_id", "positive", "negative_id", "negative"]
    frame = pd.DataFrame(rows, columns=columns)
    answer_words = {w for text in pd.concat([frame["positive"], frame["negative"]]) for w in text.lower().split()}
    upload = with_cover_queries(frame, 4, seed=2)
    covers = set(upload["question"]) - set(frame["question"])
    assert len(covers) > 1 and all(len(cover.split()) == 4 and set(cover.split()) <= answer_words for cover in covers)
