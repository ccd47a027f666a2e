"""FedMatch's task: answer selection with a cross-encoder and the pairwise hinge loss
``max(0, 1 - f(q, a+) + f(q, a-))``, evaluated by MAP and MRR over each question's candidates.

``loss="cross_entropy"`` is the released code's objective instead: each (q, a) pair classified relevant or
not. With one score per pair this is the 2-class softmax cross-entropy with the other logit fixed at 0, i.e.
binary cross-entropy on the score (positives labelled 1, mined negatives 0).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from fedrepro.device import model_device, to_device
from fedrepro.errors import DataError
from fedrepro.fl.algorithm import FederatedTask, TaskOutput
from fedrepro.io import read_table
from fedrepro.metrics.ranking import ranking_metrics
from fedrepro.tasks.encodings import kept_encoding
from fedrepro.seeding import derive_seed

LOSSES = ("hinge", "cross_entropy")

TRIPLE_COLUMNS = ("question_id", "question", "positive_id", "positive", "negative_id", "negative")
CANDIDATE_COLUMNS = ("split", "question_id", "question", "answer_id", "answer", "relevance")


@dataclass
class ClientQAData:
    """One client's mined training triples and its evaluation candidates (valid and test)."""

    triples: pd.DataFrame
    candidates: pd.DataFrame


def load_client_data(mined_dir: str | Path, client_ids: Sequence[str]) -> dict[str, ClientQAData]:
    """Read ``<mined_dir>/<client>/{triples,candidates}.parquet`` for each client."""
    clients = {}
    for client_id in client_ids:
        folder = Path(mined_dir) / client_id
        for name in ("triples", "candidates"):
            if not (folder / f"{name}.parquet").exists():
                raise DataError(f"{folder / name}.parquet is missing: run the mine stage for client {client_id!r}")
        clients[client_id] = ClientQAData(
            read_table(folder / "triples.parquet"), read_table(folder / "candidates.parquet")
        )
    return clients


class QAMatchingTask(FederatedTask):
    """Pre-tokenises every (question, answer) pair once; batches are padded to their own longest sequence."""

    def __init__(
        self,
        clients: dict[str, ClientQAData],
        tokenizer,
        build_model: Callable[[], nn.Module],
        max_length: int,
        batch_size: int,
        eval_batch_size: int = 128,
        loss: str = "hinge",
    ) -> None:
        if loss not in LOSSES:
            raise ValueError(f"loss {loss!r}: allowed {LOSSES}")
        self.client_ids = list(clients)
        self.tokenizer, self._build_model, self.loss = tokenizer, build_model, loss
        self.max_length, self.batch_size, self.eval_batch_size = max_length, batch_size, eval_batch_size
        self.candidates = {cid: data.candidates for cid, data in clients.items()}
        self.candidate_encodings = {
            cid: self._encode(data.candidates["question"], data.candidates["answer"]) for cid, data in clients.items()
        }
        self._set_triples({cid: data.triples for cid, data in clients.items()})

    def _set_triples(self, triples: dict[str, pd.DataFrame]) -> None:
        self.triples = triples
        self.positives = {cid: self._encode(frame["question"], frame["positive"]) for cid, frame in triples.items()}
        self.negatives = {cid: self._encode(frame["question"], frame["negative"]) for cid, frame in triples.items()}

    def with_triples(self, triples: dict[str, pd.DataFrame]) -> "QAMatchingTask":
        """The same task (candidates, tokenizer, model) training on other triples; this task is left untouched."""
        other = copy.copy(self)
        other._set_triples({cid: triples[cid] for cid in self.client_ids})
        return other

    def with_train_fraction(self, ratio: float, seed: int) -> "QAMatchingTask":
        """Every client keeps a seeded ``ratio`` of its training questions (with all their triples); Fig 8's data
        ratio."""
        if not 0 < ratio <= 1:
            raise ValueError(f"data ratio {ratio}: allowed (0, 1]")
        kept = {}
        for cid, frame in self.triples.items():
            questions = np.array(sorted(frame["question_id"].unique()))
            count = max(1, round(ratio * len(questions)))
            chosen = np.random.default_rng(derive_seed(seed, "data_ratio", cid)).choice(
                questions, size=count, replace=False
            )
            kept[cid] = frame[frame["question_id"].isin(set(chosen))].reset_index(drop=True)
        return self.with_triples(kept)

    def _encode(self, questions: pd.Series, answers: pd.Series) -> list[dict[str, list[int]]]:
        if len(questions) == 0:
            return []

        def encode() -> list[dict[str, list[int]]]:
            encoded = self.tokenizer(
                list(questions),
                list(answers),
                truncation="longest_first",
                max_length=self.max_length,
                return_token_type_ids=True,
                return_attention_mask=True,
            )
            keys = ("input_ids", "token_type_ids", "attention_mask")
            return [{k: encoded[k][i] for k in keys} for i in range(len(questions))]

        return kept_encoding(self.tokenizer, ("pairs", self.max_length), (list(questions), list(answers)), encode)

    def _pad(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        return dict(self.tokenizer.pad(rows, return_tensors="pt"))

    def build_model(self) -> nn.Module:
        return self._build_model()

    def num_train_samples(self, client_ids: Sequence[str]) -> int:
        return sum(len(self.positives[c]) for c in client_ids)

    def train_batches(self, client_ids: Sequence[str], generator: torch.Generator) -> Iterator[dict[str, torch.Tensor]]:
        """Shuffled batches of triples; each batch holds the B positive pairs followed by the B negative pairs."""
        index = [(c, i) for c in client_ids for i in range(len(self.positives[c]))]
        order = torch.randperm(len(index), generator=generator).tolist()
        for start in range(0, len(order), self.batch_size):
            chosen = [index[j] for j in order[start : start + self.batch_size]]
            rows = [self.positives[c][i] for c, i in chosen] + [self.negatives[c][i] for c, i in chosen]
            yield self._pad(rows)

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> TaskOutput:
        scores, features = model(**to_device(batch, model_device(model)))
        half = scores.shape[0] // 2
        if self.loss == "hinge":
            loss = torch.relu(1.0 - scores[:half] + scores[half:]).mean()
        else:
            labels = torch.cat([torch.ones(half), torch.zeros(scores.shape[0] - half)]).to(scores.device)
            loss = nn.functional.binary_cross_entropy_with_logits(scores.float(), labels)
        return TaskOutput(loss=loss, logits=scores, features=features)

    def _split_encodings(self, client_id: str, split: str) -> list[dict[str, list[int]]]:
        frame = self.candidates[client_id]
        return [
            enc for enc, keep in zip(self.candidate_encodings[client_id], (frame["split"] == split).to_numpy()) if keep
        ]

    def candidate_batches(self, client_id: str, split: str) -> Iterator[dict[str, torch.Tensor]]:
        """The client's ``split`` candidates as padded model inputs, in the candidate table's order."""
        rows = self._split_encodings(client_id, split)
        for start in range(0, len(rows), self.eval_batch_size):
            yield self._pad(rows[start : start + self.eval_batch_size])

    def score(self, model: nn.Module, client_id: str, split: str) -> pd.DataFrame:
        """The candidates of ``split`` with the model's score for each (higher = more relevant), under the caller's
        precision (the engine's ``scoring``): the model computes its scores in fp32 from its features
        (``fedrepro.models.heads``), so bf16 rounding does not tie candidates. Batches hold pairs of similar length
        (in table order a fifth to a third of BioASQ's and PrivacyQA's CPU-scale valid tokens were padding); the rows
        keep the table's order."""
        frame = self.candidates[client_id]
        rows = self._split_encodings(client_id, split)
        by_length = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
        scores, device = np.empty(len(rows)), model_device(model)
        for start in range(0, len(by_length), self.eval_batch_size):
            chosen = by_length[start : start + self.eval_batch_size]
            batch_scores, _ = model(**to_device(self._pad([rows[i] for i in chosen]), device))
            scores[chosen] = batch_scores.float().cpu().numpy()
        scored = frame.loc[(frame["split"] == split).to_numpy(), ["question_id", "answer_id", "relevance"]].copy()
        scored["score"] = scores
        return scored

    def evaluate(self, model: nn.Module, client_id: str, split: str) -> dict[str, float]:
        scored = self.score(model, client_id, split)
        return ranking_metrics(*qrels_and_run(scored))


def qrels_and_run(scored: pd.DataFrame) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    """TREC-style qrels (relevant answers) and run (scores of every candidate) from a scored candidate table."""
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for row in scored.itertuples(index=False):
        qid, aid = str(row.question_id), str(row.answer_id)
        run.setdefault(qid, {})[aid] = float(row.score)
        if row.relevance > 0:
            qrels.setdefault(qid, {})[aid] = int(row.relevance)
    return qrels, run
