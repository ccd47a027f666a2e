"""What FedMatch's cells cost at a given scale (``FedMatchCosts``; ``plan --scale paper`` of
``scripts/cpu_snapshot.py`` prints it), and what the largest of a stage's cells reserves on a GPU
(``largest_cell_gpu_memory``), counted by the conventions and rules of ``fedrepro.costs``. FedMatch's own:

* **Sequence and token.** FedMatch trains on triples, two sequences each (the question with its positive and with its
  negative answer), each counted at ``model.max_length``; at FedMatch's 256 most pairs are cut to it anyway (the CPU
  scale's data checks: reports/cpu/fedmatch/data-checks.md).
* **FLOPs.** RE2 and ESIM (no attention layers) count every non-embedding parameter per token; their soft alignment
  (about 4.T.d per token, under 1% at d = 300) is left out, as are PAL patches' attention in r dimensions (r/d of the
  backbone's attention term, itself 5% of a BERT-base step at T = 256).
* **Bytes.** RE2 and ESIM: the bytes autograd saves in one CPU forward of one pair at the cell's length (fp32), times
  the batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from fedrepro.costs import (
    ALGORITHM_STATE,
    DTYPE_BYTES,
    FP32,
    AlgorithmState,
    CellCost,
    Memory,
    ModelShape,
    cell_gpu_memory,
    encoder_config,
    evaluated_rounds,
    fit_sequences,
    forward_flops,
    meta_encoder,
    model_shape,
    saved_bytes,
    text_memory,
    training_flops,
    transformer_activation_bytes,
)


@dataclass(frozen=True)
class QAClientSize:
    """One FedQA client at its scale: training questions and (question, gold answer) pairs, and per evaluation split
    the questions and the candidates they are ranked among."""

    train_questions: int
    train_pairs: int
    eval_questions: dict[str, int]
    eval_candidates: dict[str, int]


def qa_collection_size(collection, official: bool, eval_negatives: int) -> QAClientSize:
    """A whole collection as its loader reads it (``fedrepro.data.qa_collections``). Candidates of an evaluation
    question: its gold answers and its official pool (their union), or its gold answers and ``eval_negatives`` BM25
    hits (``fedrepro.retrieval.mining``)."""
    pairs = collection.pairs
    train = pairs[pairs["split"] == "train"]
    questions, candidates = {}, {}
    for split in ("valid", "test"):
        rows = pairs.loc[pairs["split"] == split, ["question_id", "answer_id"]]
        questions[split] = rows["question_id"].nunique()
        if official:
            pooled = collection.pools[collection.pools["question_id"].isin(set(rows["question_id"]))]
            candidates[split] = len(pd.concat([rows, pooled[["question_id", "answer_id"]]]).drop_duplicates())
        else:
            candidates[split] = len(rows.drop_duplicates()) + eval_negatives * questions[split]
    return QAClientSize(train["question_id"].nunique(), len(train), questions, candidates)


def qa_client_sizes(params, mirror: Path) -> dict[str, QAClientSize]:
    """FedQA's clients (``partition.collections``) counted from the raw mirror with the pipeline's own loaders, then cut
    to the scale's caps as the partition stage cuts them (the paper scale keeps everything): training questions by
    the skew-preserving caps, evaluation questions by ``max_eval_questions_per_client``, and pairs and candidates in
    proportion to the questions kept."""
    from fedrepro.data.partition import skew_preserving_caps
    from fedrepro.data.qa_collections import load_collection
    from fedrepro.errors import DataError

    whole = {}
    for name in params.partition.collections:
        if not (Path(mirror) / name).is_dir():
            raise DataError(
                f"costs: the FedQA collection {name!r} is not in the mirror {mirror}: its sizes are counted "
                "there (the shared copy of the FedMatch paper lacks its Table 1, so no stated sizes stand in)"
            )
        collection = load_collection(name, Path(mirror), params.data.seed, params.data.qa_layouts.get(name))
        official = params.mine.eval_pool == "official" and collection.pools is not None
        whole[name] = qa_collection_size(collection, official, params.mine.eval_negatives)
    data = params.data
    caps = skew_preserving_caps(
        {c: s.train_questions for c, s in whole.items()},
        data.max_questions_per_client,
        data.min_questions_per_client,
        data.client_train_questions,
    )
    sizes = {}
    for name, size in whole.items():
        questions = {split: min(n, data.max_eval_questions_per_client or n) for split, n in size.eval_questions.items()}
        candidates = {
            split: round(size.eval_candidates[split] * questions[split] / n) if n else 0
            for split, n in size.eval_questions.items()
        }
        pairs = round(size.train_pairs * caps[name] / size.train_questions) if size.train_questions else 0
        sizes[name] = QAClientSize(caps[name], pairs, questions, candidates)
    return sizes


class FedMatchCosts:
    """Every FedMatch cell's cost at ``params``' scale (its sweep point applied: ``fedrepro.fedmatch.cells``); the
    clients are counted once, each method's model built once per setting. Left out of the scoring: the patched cells'
    patch-effect diagnostic (2 x 2 batches of 128 valid candidates a client, under 0.1% of a cell's scoring)."""

    def __init__(self, params, clients: dict[str, QAClientSize], precision: str, source: str) -> None:
        self.params, self.clients, self.precision = params, clients, precision
        self._shapes: dict[str, ModelShape] = {}
        self._pair_activations: dict[str, int] = {}
        self.notes = [
            f"clients {source}: "
            + ", ".join(f"{c} {s.train_pairs:,} training pairs" for c, s in clients.items())
            + f"; x {params.mine.negatives_per_question} BM25 negatives, 2 sequences a triple"
        ]

    @classmethod
    def from_mirror(cls, params, mirror: Path, precision: str) -> "FedMatchCosts":
        return cls(
            params, qa_client_sizes(params, mirror), precision, f"counted from {mirror} with the pipeline's loaders"
        )

    def triples(self, client: str) -> int:
        """Training triples of a client: every (question, gold answer) pair with each of its mined negatives, capped."""
        mine = self.params.mine
        triples = self.clients[client].train_pairs * mine.negatives_per_question
        cap = mine.client_max_triples.get(client, mine.max_triples_per_client)
        return min(triples, cap) if cap else triples

    def shape(self, params, method: str) -> ModelShape:
        """The method's model as the engine holds it (built, adapted by its algorithm), on the meta device."""
        from fedrepro.fedmatch.methods import METHODS
        from fedrepro.fedmatch.runs import algorithm_settings
        from fedrepro.fl.algorithm import CommonSettings
        from fedrepro.fl.algorithms import build_algorithm
        from fedrepro.models.cross_encoder import CrossEncoder

        key = f"{method} {params.fedmatch.settings.model_dump_json()}"
        if key not in self._shapes:
            recipe, model_params = METHODS[method], params.model
            tiny = model_params.tiny.model_dump()
            vocab = encoder_config(model_params.backbone, tiny, "model.backbone").vocab_size
            algorithm = build_algorithm(
                recipe.algorithm, algorithm_settings(params, method), CommonSettings(weighting=params.train.weighting)
            )
            with torch.device("meta"):
                if recipe.model == "bert":
                    model = CrossEncoder(
                        meta_encoder(
                            model_params.backbone,
                            vocab,
                            tiny,
                            model_params.max_length,
                            model_params.keep_layers,
                            "model.backbone",
                        ),
                        params.fedmatch.settings.pooling,
                    )
                else:
                    model = matcher(recipe.model, vocab, params.fedmatch.settings.matcher_dim)
                model = algorithm.adapt_model(model)
            self._shapes[key] = model_shape(model, algorithm.is_private)
        return self._shapes[key]

    def matcher_activations(self, name: str, dim: int, length: int) -> int:
        """Bytes RE2 or ESIM saves for the backward of one pair of ``length`` tokens (question and answer halves:
        the largest alignment matrix), measured in fp32 on the CPU (the matchers do not run on meta tensors). Token
        ids 0, 1 and 2 stand for padding, [CLS] and [SEP]; the words are random ids of a 1,000-word vocabulary (an
        embedding lookup saves its indices, not its table, so the vocabulary's size changes nothing here)."""
        key = f"{name} {dim} {length}"
        if key not in self._pair_activations:
            half = (length - 3) // 2
            with torch.random.fork_rng():
                torch.manual_seed(0)
                model = matcher(name, 3 + 1000, dim)
                words = torch.randint(3, 3 + 1000, (1, length))
            words[0, 0], words[0, 1 + half], words[0, -1] = 1, 2, 2
            types = torch.zeros_like(words)
            types[0, 2 + half :] = 1
            self._pair_activations[key] = saved_bytes(
                lambda: model(input_ids=words, attention_mask=torch.ones_like(words), token_type_ids=types)
            )
        return self._pair_activations[key]

    def memory(self, cell) -> Memory:
        """The cell's bytes on its device: they depend on its model, batch, length, precision and how many clients
        the federation keeps state for, not on how much data each holds."""
        from fedrepro.fedmatch.cells import cell_params
        from fedrepro.fedmatch.methods import METHODS
        from fedrepro.fl.algorithms import REGISTRY

        params = cell_params(self.params, cell)
        recipe, train, length = METHODS[cell.method], params.train, params.model.max_length
        shape, algorithm = self.shape(params, cell.method), REGISTRY[recipe.algorithm]
        per_round = (
            params.fedmatch.settings.clients_sampled
            if recipe.client_sampling
            else train.clients_per_round or len(self.clients)
        )
        batch = 2 * train.batch_size  # a batch of B triples is B positive and B negative pairs
        if shape.transformer is not None:
            activations = transformer_activation_bytes(shape.transformer, length, batch, self.precision)
        else:
            pair = self.matcher_activations(recipe.model, params.fedmatch.settings.matcher_dim, length)
            activations = pair * batch * DTYPE_BYTES[self.precision] // FP32
        return text_memory(
            shape, recipe.algorithm, self.precision, activations, len(self.clients), per_round, algorithm.pooled
        )

    def __call__(self, cell) -> CellCost:
        from fedrepro.fedmatch.cells import cell_params
        from fedrepro.fedmatch.methods import METHODS
        from fedrepro.fedmatch.runs import data_ratio
        from fedrepro.fl.algorithms import REGISTRY

        params = cell_params(self.params, cell)
        recipe, train, length = METHODS[cell.method], params.train, params.model.max_length
        shape, algorithm = self.shape(params, cell.method), REGISTRY[recipe.algorithm]
        clients = list(self.clients)
        per_round = (
            params.fedmatch.settings.clients_sampled
            if recipe.client_sampling
            else train.clients_per_round or len(clients)
        )
        share = 1.0 if algorithm.pooled else per_round / len(clients)  # each client's chance to train in a round
        covers = 1 + params.algorithms["coverquery"]["cover_queries"] if recipe.algorithm == "coverquery" else 1
        epochs = train.rounds * train.local_epochs
        sequences = {c: 2 * self.triples(c) * data_ratio(cell) * covers * share * epochs for c in clients}
        state = ALGORITHM_STATE.get(recipe.algorithm, AlgorithmState())
        step = training_flops(shape, length) + state.extra_forwards * forward_flops(shape, length)
        evaluated = evaluated_rounds(train.rounds, train.eval_every)
        scored = sum(
            evaluated
            * (
                2 * fit_sequences(train.fit_samples, train.batch_size, self.triples(c))
                + self.clients[c].eval_candidates["valid"]
            )
            + self.clients[c].eval_candidates["test"]
            for c in clients
        )
        memory = self.memory(cell)
        settings = params.fedmatch.settings
        if shape.transformer is not None and (settings.shared_layers or 0) >= shape.transformer.layers:
            settings = settings.model_copy(update={"shared_layers": None})  # every layer shared is all shared (as the
            # run fingerprint has it: fedrepro.fedmatch.runs), so Fig 5's top point is the table's cell
        run = json.dumps(
            [cell.method, cell.seed, data_ratio(cell), train.model_dump(mode="json"), settings.model_dump(mode="json")]
        )
        return CellCost(
            cell.name,
            run,
            shape.total,
            shape.trained,
            {c: round(n * length) for c, n in sequences.items()},
            scored * length,
            sum(sequences.values()) * step,
            scored * forward_flops(shape, length),
            memory,
        )


def matcher(name: str, vocab_size: int, dim: int) -> nn.Module:
    """FedMatch's RE2 or ESIM as ``fedrepro.fedmatch.runs`` builds it (padding, [CLS] and [SEP] ids 0, 1 and 2)."""
    from fedrepro.models.matchers import MatcherSpec, build_matcher

    return build_matcher(
        name, MatcherSpec(vocab_size=vocab_size, pad_id=0, cls_id=1, sep_id=2, embedding_dim=dim, hidden=dim)
    )


# ----- placing cells on GPUs ----------------------------------------------------------------------------------------


def largest_cell_gpu_memory(params, cells: list) -> int | None:
    """Bytes to reserve on a GPU for the largest of a FedMatch stage's ``cells`` (``cell_gpu_memory``; None for no
    cells), what ``fedrepro.grid.placement`` packs GPUs by. A cell's memory depends on its model, batch, length,
    precision and how many clients the federation keeps state for, never on how much data a client holds, so the
    data's sizes are left at zero here."""
    precision = params.train.precision
    nothing = QAClientSize(0, 0, {"valid": 0, "test": 0}, {"valid": 0, "test": 0})
    clients = params.partition.collections if params.data.source != "embedded" else params.partition.embedded_domains
    costs = FedMatchCosts(params, {client: nothing for client in clients}, precision, "no data counted")
    return max((cell_gpu_memory(costs.memory(cell)) for cell in cells), default=None)
