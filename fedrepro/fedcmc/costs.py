"""What FedCMC's cells cost at a given scale (``FedCMCCosts``; ``plan --scale paper`` of ``scripts/cpu_snapshot.py``
prints it), and what the largest of a stage's cells reserves on a GPU (``largest_cell_gpu_memory``), counted by the
conventions and rules of ``fedrepro.costs``: the relation classifier reads one sequence a sentence, counted at
``fedcmc.settings.max_length``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from fedrepro.costs import (
    ALGORITHM_STATE,
    AlgorithmState,
    CellCost,
    Memory,
    ModelShape,
    cap,
    cell_gpu_memory,
    encoder_config,
    evaluated_rounds,
    fit_sequences,
    forward_flops,
    meta_encoder,
    model_shape,
    text_memory,
    training_flops,
    transformer_activation_bytes,
)

I2B2_STATED = {"train": 3120, "test": 6293, "classes": 8}
"""The 2010 i2b2/VA relations as the FedCMC paper states them (section 4.1, "Datasets": 9,413 sentences, 3,120 in the
training and 6,293 in the test set as released, 8 relation types; validation sets "randomly sampled by 10% from the
training set"). The corpus is distributed only under the n2c2 data use agreement, so no mirror holds it."""


@dataclass(frozen=True)
class RECorpusSize:
    name: str
    sentences: dict[str, int]
    """train, valid and test sentences."""
    classes: int
    table: pd.DataFrame | None
    """The prepared table (``schema.RE_COLUMNS``) where the corpus was read, so each partition is drawn as the
    pipeline draws it; None for stated statistics."""
    source: str


def re_corpus_size(params, name: str, mirror: Path) -> RECorpusSize:
    """A relation corpus read from the mirror (or i2b2 from ``data.i2b2_dir``) with the pipeline's loaders; i2b2
    without its files: the paper's statistics (``I2B2_STATED``), its validation sentences carved from training."""
    from fedrepro.data.prepare import RE_LOADERS, re_folder
    from fedrepro.data.relation import VALID_FRACTION, load_i2b2
    from fedrepro.errors import DataError

    if name == "i2b2" and params.data.i2b2_dir is None:
        valid = round(I2B2_STATED["train"] * VALID_FRACTION)
        return RECorpusSize(
            name,
            {"train": I2B2_STATED["train"] - valid, "valid": valid, "test": I2B2_STATED["test"]},
            I2B2_STATED["classes"],
            None,
            "the FedCMC paper's statistics (section 4.1)",
        )
    if name == "i2b2":
        corpus, source = load_i2b2(params.data.i2b2_dir, seed=params.data.seed), f"counted from {params.data.i2b2_dir}"
    else:
        folder = re_folder(name, params.data.re_layouts)
        if not (Path(mirror) / folder).is_dir():
            raise DataError(
                f"costs: the relation corpus {name!r} is not in the mirror {mirror} ({folder}/): its sizes are "
                "counted there (the shared copy of the FedCMC paper states split sizes for i2b2 only)"
            )
        corpus = RE_LOADERS[params.data.re_layouts.get(name, name)](Path(mirror), params.data.seed, folder)
        source = f"counted from {mirror}"
    table = corpus.table
    return RECorpusSize(
        name,
        table.groupby("split").size().reindex(["train", "valid", "test"], fill_value=0).to_dict(),
        table["label"].nunique(),
        table,
        source,
    )


class FedCMCCosts:
    """Every FedCMC cell's cost at ``params``' scale: its partition drawn as ``fedrepro.fedcmc.partition`` draws it
    (clients' training sentences), or for a corpus known only from stated statistics, equal shares."""

    def __init__(self, params, corpora: dict[str, RECorpusSize], precision: str) -> None:
        self.params, self.corpora, self.precision = params, corpora, precision
        self._partitions: dict[str, tuple[list[int], int, int]] = {}
        self._shapes: dict[str, ModelShape] = {}
        self.notes = [
            "corpora: "
            + "; ".join(
                f"{c.name} {c.sentences['train']:,} / {c.sentences['valid']:,} / "
                f"{c.sentences['test']:,} train / valid / test sentences, {c.source}"
                for c in corpora.values()
            )
        ]

    @classmethod
    def from_mirror(cls, params, mirror: Path, precision: str) -> "FedCMCCosts":
        """The corpora the grid names (main table and sweeps), read from the mirror (``re_corpus_size``)."""
        fc = params.fedcmc
        names = dict.fromkeys([*fc.datasets, fc.sweeps.dataset, fc.sweeps.subset_dataset])
        return cls(params, {name: re_corpus_size(params, name, mirror) for name in names}, precision)

    def partition(self, cell) -> tuple[list[int], int, int]:
        """(training sentences of each client, valid sentences, test sentences) of the cell's partition."""
        from fedrepro.fedcmc.partition import build_partition

        if cell.partition not in self._partitions:
            corpus, settings = self.corpora[cell.dataset], self.params.fedcmc.settings
            if corpus.table is not None:
                _, assignment, _ = build_partition(self.params, cell, corpus.table)
                counts = assignment.groupby(["split", "client"], observed=False).size()
                sizes = (counts["train"].tolist(), int(counts["valid"].sum()), int(counts["test"].sum()))
            else:
                train = (
                    self.params.fedcmc.sweeps.subset_size
                    if cell.subset
                    else cap(corpus.sentences["train"], settings.max_train_sentences)
                )
                shares = [train // cell.clients + (k < train % cell.clients) for k in range(cell.clients)]
                sizes = (
                    shares,
                    cap(corpus.sentences["valid"], settings.max_eval_sentences),
                    cap(corpus.sentences["test"], settings.max_eval_sentences),
                )
            self._partitions[cell.partition] = sizes
        return self._partitions[cell.partition]

    def shape(self, cell) -> ModelShape:
        """The cell's relation classifier (entity markers added to the vocabulary), adapted by its algorithm."""
        from fedrepro.data.schema import ENTITY_MARKERS
        from fedrepro.fedcmc.runs import algorithm_settings
        from fedrepro.fl.algorithm import CommonSettings
        from fedrepro.fl.algorithms import build_algorithm
        from fedrepro.models.relation import RelationClassifier

        key = f"{cell.method} {cell.vectors} {cell.dataset}"
        if key not in self._shapes:
            settings, tiny = self.params.fedcmc.settings, self.params.model.tiny.model_dump()
            param = "fedcmc.settings.backbone"
            vocab = encoder_config(settings.backbone, tiny, param).vocab_size + len(ENTITY_MARKERS)
            algorithm = build_algorithm(
                cell.method, algorithm_settings(self.params, cell), CommonSettings(weighting="size", seed=cell.seed)
            )
            with torch.device("meta"):
                encoder = meta_encoder(settings.backbone, vocab, tiny, settings.max_length, settings.keep_layers, param)
                model = algorithm.adapt_model(RelationClassifier(encoder, self.corpora[cell.dataset].classes))
            self._shapes[key] = model_shape(model, algorithm.is_private)
        return self._shapes[key]

    def memory(self, cell) -> Memory:
        """The cell's bytes on its device: its model, batch, length, precision and clients, not its corpus's size."""
        settings, shape = self.params.fedcmc.settings, self.shape(cell)
        activations = transformer_activation_bytes(
            shape.transformer, settings.max_length, settings.batch_size, self.precision
        )
        return text_memory(shape, cell.method, self.precision, activations, cell.clients, cell.clients, False)

    def __call__(self, cell) -> CellCost:
        settings, train = self.params.fedcmc.settings, self.params.train
        length, shape = settings.max_length, self.shape(cell)
        clients, valid, test = self.partition(cell)
        epochs = settings.rounds * cell.local_epochs
        per_epoch = [
            min(n, 1) * settings.steps_per_epoch * settings.batch_size if settings.steps_per_epoch else n
            for n in clients
        ]
        sequences = {f"client {k}": n * epochs for k, n in enumerate(per_epoch)}
        state = ALGORITHM_STATE.get(cell.method, AlgorithmState())
        step = training_flops(shape, length) + state.extra_forwards * forward_flops(shape, length)
        evaluated = evaluated_rounds(settings.rounds, settings.eval_every)
        scored = evaluated * (fit_sequences(train.fit_samples, settings.batch_size, sum(clients)) + valid + test) + test
        memory = self.memory(cell)
        return CellCost(
            cell.name,
            cell.name,
            shape.total,
            shape.trained,
            {c: n * length for c, n in sequences.items()},
            scored * length,
            sum(sequences.values()) * step,
            scored * forward_flops(shape, length),
            memory,
        )


# ----- placing cells on GPUs ----------------------------------------------------------------------------------------

HEAD_CLASSES = 64
"""The relation classes a GPU estimate assumes where a stage has not counted them: a head of C x 2d weights is under
0.1% of the model at C = 64, so the estimate does not hang on it."""


def largest_cell_gpu_memory(params, cells: list) -> int | None:
    """Bytes to reserve on a GPU for the largest of a FedCMC stage's ``cells`` (``cell_gpu_memory``; None for no
    cells), what ``fedrepro.grid.placement`` packs GPUs by. A cell's memory depends on its model, batch, length,
    precision and how many clients the federation keeps state for, never on how much data a client holds, so the
    data's sizes are left at zero here."""
    precision = params.train.precision
    corpora = {
        cell.dataset: RECorpusSize(cell.dataset, {"train": 0, "valid": 0, "test": 0}, HEAD_CLASSES, None, "")
        for cell in cells
    }
    costs = FedCMCCosts(params, corpora, precision)
    return max((cell_gpu_memory(costs.memory(cell)) for cell in cells), default=None)
