"""A tiny regression task for engine tests: fast, and generic enough to exercise every hook."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from fedrepro.device import model_device, to_device
from fedrepro.fl.algorithm import Algorithm, CommonSettings, FederatedTask, TaskOutput
from fedrepro.fl.algorithms import REGISTRY, build_algorithm


def make_algorithm(name: str, weighting: str = "uniform", seed: int = 0, **knobs) -> Algorithm:
    """``name`` built as a paper's runs build it: its own knobs (its ``Settings``) plus the common settings."""
    return build_algorithm(name, REGISTRY[name].Settings(**knobs), CommonSettings(weighting=weighting, seed=seed))


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).squeeze(-1)


class ToyTask(FederatedTask):
    """Each client has its own linear target, so personalised heads really differ."""

    def __init__(self, sizes: dict[str, int], batch_size: int = 8) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.client_ids = list(sizes)
        self.batch_size = batch_size
        self.data = {}
        for index, (client, size) in enumerate(sizes.items()):
            x = torch.randn(size + 16, 4, generator=generator)
            w = torch.randn(4, generator=generator) + index
            self.data[client] = (x, x @ w)

    def build_model(self) -> nn.Module:
        return ToyModel()

    def num_train_samples(self, client_ids: Sequence[str]) -> int:
        return sum(len(self.data[c][0]) - 16 for c in client_ids)

    def train_batches(self, client_ids: Sequence[str], generator: torch.Generator):
        x = torch.cat([self.data[c][0][16:] for c in client_ids])
        y = torch.cat([self.data[c][1][16:] for c in client_ids])
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), self.batch_size):
            index = order[start : start + self.batch_size]
            yield x[index], y[index]

    def forward(self, model: nn.Module, batch) -> TaskOutput:
        x, y = to_device(batch, model_device(model))
        prediction = model(x)
        return TaskOutput(loss=((prediction - y) ** 2).mean(), logits=prediction)

    def evaluate(self, model: nn.Module, client_id: str, split: str) -> dict[str, float]:
        x, y = to_device(self.data[client_id], model_device(model))
        return {"mse": float(((model(x[:16]) - y[:16]) ** 2).mean())}


class ToyQATask(FederatedTask):
    """A tiny answer-selection task on a 2-layer BERT cross-encoder: random token pairs, positives share the
    question's tokens. Small enough for engine tests of patches, private names and resume."""

    def __init__(self, sizes: dict[str, int], vocab: int = 60, length: int = 12, batch_size: int = 4) -> None:
        generator = torch.Generator().manual_seed(99)
        self.client_ids, self.batch_size, self.vocab = list(sizes), batch_size, vocab
        self.data = {}
        for client, size in sizes.items():
            questions = torch.randint(5, vocab, (size, length // 2), generator=generator)
            negatives = torch.randint(5, vocab, (size, length // 2), generator=generator)
            self.data[client] = (questions, questions.flip(1), negatives)

    def build_model(self) -> nn.Module:
        from transformers import BertConfig, BertModel

        from fedrepro.models.cross_encoder import CrossEncoder

        config = BertConfig(
            vocab_size=self.vocab,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
        )
        return CrossEncoder(BertModel(config, add_pooling_layer=False))

    def num_train_samples(self, client_ids: Sequence[str]) -> int:
        return sum(len(self.data[c][0]) for c in client_ids)

    def _pairs(self, questions: torch.Tensor, answers: torch.Tensor) -> dict[str, torch.Tensor]:
        ids = torch.cat([questions, answers], dim=1)
        types = torch.cat([torch.zeros_like(questions), torch.ones_like(answers)], dim=1)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": types}

    def train_batches(self, client_ids: Sequence[str], generator: torch.Generator):
        q, pos, neg = (torch.cat([self.data[c][i] for c in client_ids]) for i in range(3))
        order = torch.randperm(len(q), generator=generator)
        for start in range(0, len(q), self.batch_size):
            index = order[start : start + self.batch_size]
            yield self._pairs(torch.cat([q[index], q[index]]), torch.cat([pos[index], neg[index]]))

    def forward(self, model: nn.Module, batch) -> TaskOutput:
        scores, features = model(**batch)
        half = scores.shape[0] // 2
        return TaskOutput(loss=torch.relu(1.0 - scores[:half] + scores[half:]).mean(), logits=scores, features=features)

    def evaluate(self, model: nn.Module, client_id: str, split: str) -> dict[str, float]:
        q, pos, neg = self.data[client_id]
        scores, _ = model(**self._pairs(torch.cat([q, q]), torch.cat([pos, neg])))
        return {"accuracy": float((scores[: len(q)] > scores[len(q) :]).float().mean())}


def relation_parts(clients: int = 3, sentences: int = 120):
    """The tiny relation cell's synthetic corpus, its partition and the tokenizer with the entity markers."""
    from fedrepro.data.label_skew import partition_corpus
    from fedrepro.data.relation import synthetic_relations
    from fedrepro.models.backbone import train_wordpiece
    from fedrepro.models.relation import add_entity_markers

    corpus = synthetic_relations(n_sentences=sentences, n_classes=3, seed=3, vocab_size=60)
    tokenizer = train_wordpiece(corpus.table["text"].str.replace(r"</?e[12]>", " ", regex=True), 300)
    add_entity_markers(tokenizer)
    assignment, _ = partition_corpus(corpus.table, clients, "dirichlet", 0.5, seed=0, min_size=2)
    return corpus, assignment, tokenizer


def relation_model(tokenizer, classes: list[str]):
    from fedrepro.models.backbone import build_encoder
    from fedrepro.models.relation import RelationClassifier

    tiny = {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 32}
    return lambda: RelationClassifier(build_encoder("tiny", len(tokenizer), tiny, 64), len(classes))


def relation_task(clients: int = 3, sentences: int = 120, batch_size: int = 8):
    """A tiny relation-extraction cell (synthetic corpus, Dirichlet label skew, 1-layer BERT): labels, features and
    a classifier, so every hook of every registered algorithm has what it needs. Module-level and seeded, so a
    Flower node rebuilds exactly the same task."""
    from fedrepro.tasks.relation import RelationTask

    corpus, assignment, tokenizer = relation_parts(clients, sentences)
    return RelationTask(
        corpus.table,
        assignment,
        corpus.classes,
        (),
        tokenizer,
        relation_model(tokenizer, corpus.classes),
        64,
        batch_size,
    )


def write_relation_silos(root, clients: int = 3, sentences: int = 120):
    """The tiny relation cell laid out as its silos would receive it (``fedrepro.fl.silo``)."""
    from fedrepro.fl.silo import write_silos
    from fedrepro.tasks.relation import silo_tables

    corpus, assignment, _ = relation_parts(clients, sentences)
    train = assignment[assignment["split"] == "train"]
    tables = silo_tables(corpus.table, assignment)
    return write_silos(
        root, tables, {c: int((train["client"] == c).sum()) for c in tables}, told={"classes": corpus.classes}
    )


def relation_silo_task(data_dir, batch_size: int = 8):
    """One client's tiny relation task from its silo directory (the tokenizer, shared by the federation, rebuilt)."""
    from fedrepro.fl.silo import read_silo
    from fedrepro.tasks.relation import SENTENCES, RelationTask

    silo = read_silo(data_dir)
    rows, classes = silo.tables[SENTENCES], silo.told["classes"]
    _, _, tokenizer = relation_parts()
    return RelationTask(
        rows[["sentence_id", "text"]],
        rows.drop(columns="text"),
        classes,
        (),
        tokenizer,
        relation_model(tokenizer, classes),
        64,
        batch_size,
    )


def relation_server_view(silos_dir):
    """The server's view of the tiny silo-local relation cell: the manifest, the model, the counts scored."""
    import functools

    from fedrepro.fl.silo import ServerTaskView, read_manifest
    from fedrepro.tasks.relation import scores_from_counts, similarity_diagnostics

    corpus, _, tokenizer = relation_parts()
    return ServerTaskView(
        read_manifest(silos_dir),
        relation_model(tokenizer, corpus.classes),
        diagnose=similarity_diagnostics,
        score_counts=functools.partial(scores_from_counts, classes=corpus.classes, positive=list(corpus.classes)),
    )


class FaultyNodesTask(ToyTask):
    """A node failing two ways: client ``crashes`` raises whenever it trains (a fault of its node, not of its
    training); client ``diverges`` has NaN inputs, so its first local loss is NaN."""

    def __init__(self, sizes: dict[str, int], crashes: str, diverges: str) -> None:
        super().__init__(sizes)
        self.crashes = crashes
        x, y = self.data[diverges]
        self.data[diverges] = (torch.full_like(x, float("nan")), y)

    def train_batches(self, client_ids: Sequence[str], generator: torch.Generator):
        if self.crashes in client_ids:
            raise OSError(f"client {self.crashes}: its disk failed")
        yield from super().train_batches(client_ids, generator)


class TinySearchable(nn.Module):
    """Two candidate ops mixed by softmax(alpha): the smallest thing with both weights and alphas."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.ops = nn.ModuleList([nn.Linear(d_in, d_out), nn.Sequential(nn.Linear(d_in, d_out), nn.Tanh())])
        self.alpha = nn.Parameter(0.5 * torch.randn(2))

    def arch_parameters(self):
        return [self.alpha]

    def weight_parameters(self):
        return list(self.ops.parameters())

    def forward(self, x):
        mix = torch.softmax(self.alpha, 0)
        return sum(m * op(x) for m, op in zip(mix, self.ops))
