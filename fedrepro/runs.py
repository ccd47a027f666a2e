"""Assembling one FedMatch-track run (task + algorithm + engine) from validated params.

Shared by the train and evaluate stages, the tests and the benchmarks, so they all build the very same run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fedrepro.config import Params
from fedrepro.fl.algorithm import AlgorithmSettings
from fedrepro.fl.algorithms import build_algorithm
from fedrepro.fl.engine import Engine, EngineSettings
from fedrepro.models.backbone import build_encoder, load_tokenizer
from fedrepro.models.cross_encoder import CrossEncoder
from fedrepro.seeding import seed_everything
from fedrepro.tasks.qa import QAMatchingTask, load_client_data


def tree_digest(*folders: Path, pattern: str = "*") -> str:
    """sha256 over the relative names and bytes of every file matching ``pattern`` under the folders."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(p for p in Path(folder).rglob(pattern) if p.is_file()):
            digest.update(str(path.relative_to(folder)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def code_digest() -> str:
    """sha256 over fedrepro's Python sources: a checkpoint written by other code is never resumed."""
    return tree_digest(Path(__file__).resolve().parent, pattern="*.py")


def run_fingerprint(params: Params, algorithm: str, seed: int, inputs_digest: str) -> str:
    """Changes whenever anything that shapes the run changes (params, inputs, code); a checkpoint from
    another run is never resumed."""
    train = params.train.model_dump(exclude={"algorithms", "seeds"})
    payload = {"algorithm": algorithm, "seed": seed, "model": params.model.model_dump(), "train": train,
               "inputs": inputs_digest, "code": code_digest()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def build_qa_task(params: Params, mined_dir: Path, tokenizer_dir: Path) -> QAMatchingTask:
    """The clients' mined data, tokenised once; the task can serve several runs (e.g. every evaluated cell)."""
    model_params = params.model
    tokenizer = load_tokenizer(model_params.backbone, tokenizer_dir)
    clients = load_client_data(mined_dir, sorted(p.name for p in Path(mined_dir).iterdir() if p.is_dir()))

    def build_model() -> CrossEncoder:
        encoder = build_encoder(model_params.backbone, len(tokenizer), model_params.tiny.model_dump(), model_params.max_length)
        return CrossEncoder(encoder)

    return QAMatchingTask(clients, tokenizer, build_model, model_params.max_length, params.train.batch_size)


def build_engine(
    params: Params,
    task: QAMatchingTask,
    algorithm: str,
    seed: int,
    inputs_digest: str,
    checkpoint_dir: Path,
    progress: bool = True,
) -> Engine:
    """An engine for one (algorithm, seed) cell; it resumes from ``checkpoint_dir`` when that holds this run."""
    train = params.train
    seed_everything(seed, train.threads)
    settings = EngineSettings(
        rounds=train.rounds, local_epochs=train.local_epochs, clients_per_round=train.clients_per_round, lr=train.lr,
        batch_size=train.batch_size, warmup_fraction=train.warmup_fraction, max_grad_norm=train.max_grad_norm,
        seed=seed, eval_every=train.eval_every,
    )
    fingerprint = run_fingerprint(params, algorithm, seed, inputs_digest)
    chosen = build_algorithm(algorithm, AlgorithmSettings(weighting=train.weighting, fedprox_mu=train.fedprox_mu))
    return Engine(task, chosen, settings, checkpoint_dir, fingerprint, progress=progress)
