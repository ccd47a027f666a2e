"""FedCMC's task: sentence-level relation classification, cross-entropy, scored by F1 on the global test set.

The headline metric is micro-F1 over the *positive* relation classes (the no-relation class excluded), as
ChemProt is usually scored; macro-F1 over the same classes and accuracy over all classes sit beside it.
When a corpus has no no-relation class (PGR's ``false`` is one; the synthetic corpus has none) every class
counts as positive and micro-F1 equals accuracy.

On silo-local data (``fedrepro.fl.silo``) each client holds its own share of the global valid and test sets (the
partition assigns every sentence of every split to one client, so the shares are disjoint and their union is the
set) and scores the global model on it; only per-class counts cross (``class_counts``), and the server's scores from
their sums (``scores_from_counts``) are exactly those of ``scores`` on the union, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import f1_score
from torch import nn

from fedrepro.data.schema import E1_CLOSE, E1_OPEN, E2_CLOSE, E2_OPEN
from fedrepro.device import model_device, to_device
from fedrepro.errors import DataError
from fedrepro.fl.algorithm import ClientUpdate, FederatedTask, TaskOutput
from fedrepro.fl.engine import GLOBAL
from fedrepro.models.relation import CLASSIFIER, local_average_similarity
from fedrepro.tasks.encodings import kept_encoding

COUNT_KINDS = ("tp", "fp", "fn")
"""Per class: true positives, false positives, false negatives; a count crosses as ``<kind>/<class>``."""
SENTENCES = "sentences"
"""A client's silo table: its rows of the partition (every split) with their text."""


@dataclass(frozen=True)
class EncodedSentence:
    input_ids: list[int]
    e1: tuple[int, int]
    """Token positions [start, end) of the first entity's word pieces (between its markers)."""
    e2: tuple[int, int]
    truncated: bool


def encode_marked(tokenizer, texts: Sequence[str], max_length: int) -> list[EncodedSentence]:
    """Token ids of ``[CLS] sentence [SEP]``; a sentence longer than ``max_length`` keeps a window centred on its
    two entities (plain truncation would often cut off the second entity), and is flagged ``truncated``. An earlier
    cell's encoding of the same texts is reused (``fedrepro.tasks.encodings``)."""
    return kept_encoding(
        tokenizer, ("marked", max_length), (list(texts),), lambda: _encode_marked(tokenizer, texts, max_length)
    )


def _encode_marked(tokenizer, texts: Sequence[str], max_length: int) -> list[EncodedSentence]:
    markers = [tokenizer.convert_tokens_to_ids(m) for m in (E1_OPEN, E1_CLOSE, E2_OPEN, E2_CLOSE)]
    if tokenizer.unk_token_id in markers:
        raise DataError("the tokenizer does not know the entity markers; call add_entity_markers(tokenizer) first")
    budget = max_length - 2
    encoded = []
    for text, ids in zip(texts, tokenizer(list(texts), add_special_tokens=False)["input_ids"]):
        try:
            where = [ids.index(m) for m in markers]
        except ValueError:
            raise DataError(f"sentence without its four entity markers: {text[:120]!r}") from None
        start, truncated = 0, len(ids) > budget
        if truncated:
            low, high = min(where), max(where) + 1
            start = low if high - low > budget else max(0, min(low - (budget - (high - low)) // 2, len(ids) - budget))
        window = ids[start : start + budget]
        spans = []
        for open_at, close_at in ((where[0], where[1]), (where[2], where[3])):
            first, last = max(open_at + 1 - start, 0), min(close_at - start, len(window))
            spans.append((first + 1, max(first, last) + 1))  # +1 for [CLS]
        encoded.append(
            EncodedSentence([tokenizer.cls_token_id] + window + [tokenizer.sep_token_id], spans[0], spans[1], truncated)
        )
    return encoded


class RelationTask(FederatedTask):
    """Clients' training sentences (their Dirichlet share) and the global valid/test sets, tokenised once."""

    evaluates_global_model = True

    def __init__(
        self,
        corpus: pd.DataFrame,
        assignment: pd.DataFrame,
        classes: list[str],
        negative_labels: Sequence[str],
        tokenizer,
        build_model: Callable[[], nn.Module],
        max_length: int,
        batch_size: int,
        eval_batch_size: int = 64,
    ) -> None:
        table = assignment.merge(corpus[["sentence_id", "text"]], on="sentence_id", how="left", validate="one_to_one")
        if table["text"].isna().any():
            raise DataError(
                f"partition names sentences the corpus lacks, e.g. "
                f"{table.loc[table['text'].isna(), 'sentence_id'].iloc[0]}"
            )
        unknown = sorted(set(table["label"]) - set(classes))
        if unknown:
            raise DataError(f"labels {unknown} are not among the corpus classes {classes}")
        self.classes, self.pad_id = list(classes), tokenizer.pad_token_id
        self.positive = positive_classes(classes, negative_labels)
        self._build_model, self.batch_size, self.eval_batch_size = build_model, batch_size, eval_batch_size
        index = {c: i for i, c in enumerate(classes)}
        train = table[table["split"] == "train"]
        self.client_ids = sorted(train["client"].unique())
        self.train: dict[str, tuple[list[EncodedSentence], np.ndarray]] = {}
        for client_id in self.client_ids:
            rows = train[train["client"] == client_id]
            self.train[client_id] = (
                encode_marked(tokenizer, rows["text"], max_length),
                rows["label"].map(index).to_numpy(),
            )
        self.eval_sets: dict[str, tuple[pd.DataFrame, list[EncodedSentence]]] = {}
        for split in ("valid", "test"):
            rows = table[table["split"] == split].reset_index(drop=True)
            self.eval_sets[split] = (
                rows[["sentence_id", "label", "client"]],
                encode_marked(tokenizer, rows["text"], max_length),
            )
        self.truncated = sum(s.truncated for group in self.train.values() for s in group[0])

    def build_model(self) -> nn.Module:
        return self._build_model()

    def num_train_samples(self, client_ids: Sequence[str]) -> int:
        return sum(len(self.train[c][1]) for c in client_ids)

    def label_counts(self, client_id: str) -> torch.Tensor:
        return torch.bincount(torch.tensor(self.train[client_id][1]), minlength=len(self.classes)).float()

    def _batch(self, sentences: list[EncodedSentence], labels: np.ndarray | None = None) -> dict[str, torch.Tensor]:
        width = max(len(s.input_ids) for s in sentences)
        input_ids = torch.full((len(sentences), width), self.pad_id, dtype=torch.long)
        attention, e1, e2 = (torch.zeros((len(sentences), width), dtype=torch.long) for _ in range(3))
        for row, sentence in enumerate(sentences):
            input_ids[row, : len(sentence.input_ids)] = torch.tensor(sentence.input_ids)
            attention[row, : len(sentence.input_ids)] = 1
            e1[row, sentence.e1[0] : sentence.e1[1]] = 1
            e2[row, sentence.e2[0] : sentence.e2[1]] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention, "e1_mask": e1, "e2_mask": e2}
        if labels is not None:
            batch["labels"] = torch.as_tensor(labels, dtype=torch.long)
        return batch

    def train_batches(self, client_ids: Sequence[str], generator: torch.Generator) -> Iterator[dict[str, torch.Tensor]]:
        index = [(c, i) for c in client_ids for i in range(len(self.train[c][1]))]
        order = torch.randperm(len(index), generator=generator).tolist()
        for start in range(0, len(order), self.batch_size):
            chosen = [index[j] for j in order[start : start + self.batch_size]]
            yield self._batch(
                [self.train[c][0][i] for c, i in chosen], np.array([self.train[c][1][i] for c, i in chosen])
            )

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> TaskOutput:
        batch = to_device(batch, model_device(model))
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        logits, features = model(**inputs)
        loss = nn.functional.cross_entropy(logits.float(), batch["labels"])
        return TaskOutput(loss=loss, logits=logits, features=features, targets=batch["labels"])

    def predict(self, model: nn.Module, split: str) -> pd.DataFrame:
        """The split's sentences with gold and predicted labels (and which client's share each one is). Batches hold
        sentences of similar length (in file order a third of the tokens were padding); rows keep the split's order."""
        rows, sentences = self.eval_sets[split]
        by_length = sorted(range(len(sentences)), key=lambda i: len(sentences[i].input_ids))
        predicted, device = np.empty(len(sentences), dtype=np.int64), model_device(model)
        with torch.no_grad():
            for start in range(0, len(by_length), self.eval_batch_size):
                chosen = by_length[start : start + self.eval_batch_size]
                logits, _ = model(**to_device(self._batch([sentences[i] for i in chosen]), device))
                predicted[chosen] = logits.argmax(dim=-1).cpu().numpy()
        out = rows.copy()
        out["predicted"] = [self.classes[i] for i in predicted]
        return out

    def scores(self, predictions: pd.DataFrame) -> dict[str, float]:
        index = {c: i for i, c in enumerate(self.classes)}
        gold, predicted = predictions["label"].map(index), predictions["predicted"].map(index)
        return {
            "micro_f1": float(f1_score(gold, predicted, labels=self.positive, average="micro", zero_division=0)),
            "macro_f1": float(f1_score(gold, predicted, labels=self.positive, average="macro", zero_division=0)),
            "accuracy": float((gold == predicted).mean()),
        }

    def class_counts(self, predictions: pd.DataFrame) -> dict[str, int]:
        """Every class's true positives, false positives and false negatives among ``predictions`` (the sufficient
        statistics of ``scores``: counts of disjoint shares add up to the counts of their union)."""
        gold, predicted = predictions["label"].to_numpy(), predictions["predicted"].to_numpy()
        counts = {}
        for name in self.classes:
            counts[f"tp/{name}"] = int(((gold == name) & (predicted == name)).sum())
            counts[f"fp/{name}"] = int(((gold != name) & (predicted == name)).sum())
            counts[f"fn/{name}"] = int(((gold == name) & (predicted != name)).sum())
        return counts

    def scores_from_counts(self, counts: dict[str, int]) -> dict[str, float]:
        return scores_from_counts(counts, self.classes, [self.classes[i] for i in self.positive])

    def evaluate(self, model: nn.Module, client_id: str, split: str) -> dict[str, float]:
        """The model on the global ``split`` (``client_id`` GLOBAL), or on that client's share of it."""
        return self.scores(self.share(self.predict(model, split), client_id))

    def evaluation_counts(self, model: nn.Module, client_id: str, split: str) -> dict[str, int]:
        """``class_counts`` of the model on this client's share of the global ``split``."""
        return self.class_counts(self.share(self.predict(model, split), client_id))

    @staticmethod
    def share(predictions: pd.DataFrame, client_id: str) -> pd.DataFrame:
        return predictions if client_id == GLOBAL else predictions[predictions["client"] == client_id]

    def diagnose_round(self, updates: list[ClientUpdate]) -> dict[str, list]:
        return similarity_diagnostics(updates)


def similarity_diagnostics(updates: list[ClientUpdate]) -> dict[str, list]:
    """Each uploading client's local average similarity d_{k,c} (FedCMC Fig 1), from its classifier vectors: read
    off the uploads alone, so a server holding no client data records it too."""
    return {
        "clients": [u.client_id for u in updates],
        "local_similarity": [
            [round(float(v), 6) for v in local_average_similarity(u.tensors[CLASSIFIER])]
            for u in updates
            if CLASSIFIER in u.tensors
        ],
    }


def scores_from_counts(counts: dict[str, int], classes: list[str], positive: list[str]) -> dict[str, float]:
    """``RelationTask.scores`` from ``class_counts`` (summed over shares), doing the float operations sklearn and
    pandas do (F1 = 2 TP / (true + predicted), 0 where nothing is true or predicted; macro the mean of the classes'
    F1; accuracy the correct over all), so the numbers are equal bit for bit. A function of the counts and the class
    names alone: the server of a silo-local run, which holds no sentence, scores with it."""
    missing = [f"{kind}/{c}" for c in classes for kind in COUNT_KINDS if f"{kind}/{c}" not in counts]
    if missing:
        raise DataError(f"relation scores: counts lack {missing[:3]} ({len(missing)} missing)")
    tp, fp, fn = ({c: int(counts[f"{kind}/{c}"]) for c in classes} for kind in COUNT_KINDS)

    def f1(names: list[str]) -> float:
        denominator = float(sum(2 * tp[c] + fp[c] + fn[c] for c in names))
        return 2.0 * sum(tp[c] for c in names) / denominator if denominator else 0.0

    total = sum(tp[c] + fn[c] for c in classes)
    return {
        "micro_f1": f1(positive),
        "macro_f1": float(np.mean([f1([c]) for c in positive])),
        "accuracy": sum(tp.values()) / total if total else float("nan"),
    }


def positive_classes(classes: list[str], negative_labels: Sequence[str]) -> list[int]:
    """Indices of the classes micro- and macro-F1 count: all but the no-relation ones (all, when every class is one)."""
    return [i for i, c in enumerate(classes) if c not in set(negative_labels)] or list(range(len(classes)))


def silo_tables(corpus: pd.DataFrame, assignment: pd.DataFrame) -> dict[str, dict[str, pd.DataFrame]]:
    """What each client's silo holds (``fedrepro.fl.silo.write_silos``): its rows of the partition, every split, with
    their text, in the partition's order (so a task built from them batches exactly as one built from the whole)."""
    table = assignment.merge(corpus[["sentence_id", "text"]], on="sentence_id", how="left", validate="one_to_one")
    trained = set(table.loc[table["split"] == "train", "client"])
    stranded = sorted(set(table["client"]) - trained)
    if stranded:
        raise DataError(
            f"partition: clients {stranded} hold evaluation sentences but no training sentence, so no "
            "silo of the federation would score them"
        )
    return {
        client_id: {SENTENCES: rows.reset_index(drop=True)} for client_id, rows in table.groupby("client", sort=True)
    }
