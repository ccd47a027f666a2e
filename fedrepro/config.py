"""Params: validated before any work, with one-line errors that name the key, the value and what is allowed.

``params.yaml`` has one ``scale`` switch (embedded | cpu | paper). Keys that depend on the scale are left
as ``null`` in their group and filled from ``scales/<scale>.yaml`` beside it (``<group>.<key>``); a value set
explicitly (for instance with ``dvc exp run -S train.rounds=3``) always wins over the scale's value. The presets
live in files of their own because DVC parses a stage's params file once per stage: a no-op ``dvc repro`` read
all three scales 22 times when they sat in ``params.yaml``.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from fedrepro.errors import ConfigError
from fedrepro.device import resolve_device
from fedrepro.hardware import resolve_precision

RE_CORPORA = ("pgr", "chemprot_cpr5", "chemprot_cpr_groups", "chemprot_scibert", "i2b2")
RE_LAYOUTS = ("pgr", "chemprot_cpr5", "chemprot_cpr_groups", "chemprot_scibert")  # a user's own corpus may follow
QA_LAYOUTS = ("insuranceqa", "medquad", "bioasq", "fiqa", "privacyqa")  # the public QA collections' file layouts
SCALES = ("embedded", "cpu", "paper")
RUNTIMES = ("engine", "flower-simulation", "flower-deployment")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataParams(_Strict):
    source: Literal["embedded", "mirror", "official"]
    mirror: str
    seed: int
    max_questions_per_client: int = Field(ge=0, description="train questions of the largest client; 0 = all")
    min_questions_per_client: int = Field(ge=1)
    client_train_questions: dict[str, Annotated[int, Field(ge=0)]] = Field(
        description="train questions of the named clients, in place of their skew-preserving cap; 0 = all"
    )
    max_eval_questions_per_client: int = Field(ge=0, description="valid/test questions per client; 0 = all")
    re_corpora: list[str] = Field(description=f"of {list(RE_CORPORA)}, or your own named in data.re_layouts")
    vertical_sets: dict[str, list[str] | None] = Field(description="FATE set -> host files to join (null: all)")
    own_files: dict[str, str] = Field(
        description="the user's own raw files, read from data.mirror at any source: {path under the mirror: sha256}"
    )
    qa_layouts: dict[str, Literal[QA_LAYOUTS]] = Field(  # type: ignore[valid-type]
        description="your own QA collections of partition.collections: "
        "{name: the public collection whose layout it follows}"
    )
    re_layouts: dict[str, Literal[RE_LAYOUTS]] = Field(  # type: ignore[valid-type]
        description="your own relation corpora of data.re_corpora: {name: the public corpus whose layout it follows}"
    )
    i2b2_dir: str | None = None
    modelnet40_dir: str | None = None
    modelnet40_image_size: int = Field(32, ge=4)
    modelnet40_max_objects: int = Field(0, ge=0, description="objects per class and split; 0 = all")

    @field_validator("own_files")
    @classmethod
    def _own_files_are_mirror_paths_with_sha256(cls, files: dict[str, str]) -> dict[str, str]:
        for path, digest in files.items():
            parts = path.split("/")
            if len(parts) < 2 or path.startswith("/") or any(part in ("", ".", "..") for part in parts):
                raise ValueError(
                    f"{path!r}: expected a relative path under data.mirror, collection folder first "
                    "(for example fate_vfl/clinic_hetero_guest.csv)"
                )
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ValueError(
                    f"{path!r}: {digest!r} is no sha256; expected 64 lowercase hex digits (sha256sum of the file)"
                )
        return files

    @model_validator(mode="after")
    def _re_corpora_are_known_or_declared(self) -> "DataParams":
        for index, name in enumerate(self.re_corpora):
            if name not in RE_CORPORA and name not in self.re_layouts:
                raise ValueError(
                    f"data.re_corpora.{index} = {name!r}: allowed {list(RE_CORPORA)}, or a corpus of your own "
                    "named in data.re_layouts with the layout it follows"
                )
        return self

    @field_validator("qa_layouts", "re_layouts")
    @classmethod
    def _own_layouts_need_a_raw_source(cls, layouts: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        """The embedded source prepares InsuranceQA's domains and a synthetic relation corpus only: a collection or
        corpus of the user's own would be acquired and then left unused, so say so instead."""
        if layouts and info.data.get("source") == "embedded":
            raise ValueError(
                f"applies only with data.source mirror or official (the embedded source prepares only its "
                f"own data); set data.source: mirror, or data.{info.field_name}: {{}}"
            )
        return layouts

    @property
    def raw_collections(self) -> list[str]:
        """The public raw collections acquire must bring for the configured RE corpora and vertical sets (the
        user's own come with data.own_files)."""
        needed = [c.split("_")[0] for c in self.re_corpora if c != "i2b2" and c not in self.re_layouts]
        return list(dict.fromkeys(needed + (["fate_vfl"] if self.vertical_sets else [])))


class PartitionParams(_Strict):
    embedded_domains: list[str] = Field(min_length=1)
    collections: list[str] = Field(min_length=1)


class MineParams(_Strict):
    backend: Literal["bm25s", "rank-bm25", "elasticsearch"]
    k1: float = Field(gt=0)
    b: float = Field(ge=0, le=1)
    negatives_per_question: int = Field(ge=1)
    max_triples_per_client: int = Field(ge=0, description="training triples kept per client (seeded sample); 0 = all")
    client_max_triples: dict[str, Annotated[int, Field(ge=0)]] = Field(
        description="training triples kept for the named clients, in place of max_triples_per_client; 0 = all"
    )
    eval_negatives: int = Field(ge=1)
    eval_pool: Literal["bm25", "official"]
    es_url: str | None = None


class TinyBertParams(_Strict):
    layers: int = Field(ge=1)
    hidden: int = Field(ge=8)
    heads: int = Field(ge=1)
    intermediate: int = Field(ge=8)
    vocab_size: int = Field(ge=100)


class ModelParams(_Strict):
    backbone: str = Field(min_length=1, description="tiny | minilm | a hub name or local directory")
    max_length: int = Field(ge=16, le=512)
    keep_layers: int = Field(
        ge=0, description="keep only the lowest N encoder layers of a pretrained backbone; 0 = all"
    )
    tiny: TinyBertParams


class TrainParams(_Strict):
    rounds: int = Field(ge=1)
    local_epochs: int = Field(ge=1, description="epochs each client trains between two aggregations")
    clients_per_round: int = Field(ge=0, description="k of T clients sampled each round; 0 = all")
    weighting: Literal["uniform", "size"]
    lr: float = Field(gt=0)
    batch_size: int = Field(ge=1)
    warmup_fraction: float = Field(ge=0, lt=1)
    max_grad_norm: float = Field(gt=0)
    eval_every: int = Field(ge=0, description="rounds between validation MAP/MRR; 0 = none")
    fit_samples: int = Field(
        ge=0,
        description="training samples each evaluated model's training loss is measured on "
        "(the same every round); 0 = all",
    )
    threads: int = Field(ge=1)
    device: str = Field(
        description="auto | cpu | cuda | cuda:N: where every cell of the three papers computes; auto = "
        "a GPU when torch sees one, else the CPU (resolved here, see fedrepro.device)"
    )
    precision: Literal["fp32", "bf16", "auto"] = Field(
        description="bf16 = bfloat16 autocast for training and scoring (each model's scores and logits computed in "
        "fp32 from its features); auto = bf16 where the device has bf16 instructions (the CPU's, or the "
        "GPU's), else fp32 (resolved here, so recipes, fingerprints and reports see the one used)"
    )

    runtime: Literal[RUNTIMES] = Field(  # type: ignore[valid-type]
        description="engine (in process) | flower-simulation (Flower on Ray) | "
        "flower-deployment (SuperLink + SuperNodes)"
    )
    # How long a flower-deployment server waits for a round's replies before it closes the round without the silent
    # clients (a crashed silo must not stall the others). It bounds the whole round, not one client: on one machine
    # the launcher runs the round's ClientApps a core budget at a time (one at a time on 2 cores), and one FedMatch
    # client's round of 1,000 triples on a 6-layer MiniLM takes several minutes there, so the default (an hour) lets a
    # slow CPU round of every client finish; a lost silo costs its round that long at most. No "no limit" value.
    reply_timeout: float = Field(gt=0, description="seconds a flower-deployment server waits for a round's replies")
    # How long one cell's flower-deployment run may take in all before the stage stops it (its checkpoints stay, so
    # rerunning the stage resumes). A day by default: a CPU-scale FedMatch cell runs its rounds' ClientApps one at a
    # time on 2 cores, tens of minutes a round; a run that hangs in a way no reply timeout catches still ends.
    run_timeout: float = Field(gt=0, description="seconds one cell's flower-deployment run may take in all")
    # Silo-local data (fedrepro.fl.silo) on Flower: each cell's data laid out one directory per client under the
    # cell's checkpoint folder, each node reading its own client's alone and the server only the manifest; each
    # client's final evaluation runs on a task built from its own directory. The engine trains every client in one
    # process, so it refuses this; methods that share nothing train in process on the whole task on every runtime.
    silo_local: bool = Field(description="on Flower, every node reads only its own client's data directory")

    @field_validator("silo_local")
    @classmethod
    def _silo_local_on_flower(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("runtime") == "engine":
            raise ValueError(
                "needs train.runtime flower-simulation or flower-deployment: the engine trains every "
                "client in one process, from the whole data"
            )
        return value

    @field_validator("device")
    @classmethod
    def _resolve_device(cls, value: str) -> str:
        return resolve_device(value)

    @field_validator("precision")
    @classmethod
    def _resolve_precision(cls, value: str, info: ValidationInfo) -> str:
        return resolve_precision(value, info.data.get("device", "cpu"))


class FedMatchSettings(_Strict):
    """Knobs of every FedMatch-track cell (a change reruns every cell)."""

    fidelity: Literal["paper", "released_code"]
    patch_size: int = Field(ge=1, description="r, the patch's projection size")
    patch_heads: int = Field(ge=1, description="attention heads of a PAL patch")
    shared_layers: int | None = Field(ge=0, description="bottom encoder layers shared; the rest private; null = all")
    clients_sampled: int = Field(ge=1, description="k clients per round for the _cs methods")
    matcher_dim: int = Field(ge=4, description="embedding and hidden size of RE2 and ESIM")
    matcher_lr: float = Field(
        gt=0, description="learning rate of RE2 and ESIM, trained from scratch (BERT's is train.lr)"
    )
    pooling: Literal["cls", "mean"] = Field(
        description="the cross-encoder's pair state: [CLS] (the paper) or the masked "
        "mean of the token states (what a sentence-transformer backbone is trained to give)"
    )


class FedMatchSweeps(_Strict):
    """The points of Figs 5-8 (one checkpointed cell per point and seed); an empty list skips that figure."""

    seeds: list[int] = Field(min_length=1)
    shared_layers: list[int] = Field(description="an empty list skips the figure (the report says so)")
    patch_size: list[int]
    aggregate_every: list[int]
    data_ratio: list[int | float]
    data_ratio_methods: list[str] = Field(min_length=1)


class FedMatchParams(_Strict):
    methods: list[str] = Field(min_length=1, description="every row of Tables 2-3: one cached cell per method x seed")
    seeds: list[int] = Field(min_length=1)
    table2: list[str]
    table3: list[str]
    sweeps: FedMatchSweeps
    settings: FedMatchSettings

    @model_validator(mode="after")
    def _tables_within_methods(self) -> "FedMatchParams":
        for key in ("table2", "table3"):
            missing = [m for m in getattr(self, key) if m not in self.methods]
            if missing:
                raise ValueError(f"fedmatch.{key} lists {missing}, which fedmatch.methods does not run; add them there")
        return self


class FedCMCSettings(_Strict):
    """Knobs of every FedCMC-track cell: its own backbone and training (the paper's, not FedMatch's)."""

    backbone: str = Field(
        min_length=1, description="tiny | minilm | a hub name (distilbert-base-uncased) | a local directory"
    )
    max_length: int = Field(ge=8)
    keep_layers: int = Field(ge=0)
    rounds: int = Field(ge=1)
    clients: int = Field(ge=2, description="K, the clients the training split is partitioned among")
    local_epochs: int = Field(ge=1)
    steps_per_epoch: int = Field(
        ge=0,
        description="0: a local epoch is one pass over the client's data; N: every "
        "client takes N steps a local epoch, so a large client's update is not also longer",
    )
    lr: float = Field(gt=0)
    batch_size: int = Field(ge=1)
    eval_every: int = Field(
        ge=0, description="rounds between valid and test F1 of the global model (convergence rule, Fig 3); 0 = none"
    )
    partition: Literal["dirichlet", "iid", "quantity"]
    balance: bool = Field(description="NIID-Bench's balance trick in the Dirichlet draw")
    min_client_size: int = Field(
        ge=0, description="training sentences every client must get (bounded redraws); 0 = none"
    )
    max_train_sentences: int = Field(
        ge=0, description="seeded sample of each corpus's training split, label mix kept; 0 = all"
    )
    max_eval_sentences: int = Field(ge=0, description="the same for its valid and test splits; 0 = all")
    negative_labels: list[str] = Field(description="no-relation labels, left out of micro/macro-F1")

    def local_work(self) -> str:
        """What a client does between two aggregations, as the reports' setup lines say it."""
        steps = f" of {self.steps_per_epoch} steps for every client" if self.steps_per_epoch else ""
        return f"{self.local_epochs} local epoch(s){steps}"


class FedCMCSweeps(_Strict):
    """Fig 3b / the clients table / Fig 4 / Table 3 at one dataset; an empty list leaves that one out (the report says
    so)."""

    seeds: list[int] = Field(min_length=1)
    dataset: str
    alpha: float = Field(gt=0)
    methods: list[str] = Field(
        min_length=1, description="methods of the clients and local-epochs sweeps (fedcmc.methods' names)"
    )
    clients: list[int]
    local_epochs: list[int]
    vectors: list[str] = Field(description="FedCMC's vector rules (checked with the method names, by fedcmc.cells)")
    vectors_alpha: float = Field(gt=0)
    subset_dataset: str
    subset_size: int = Field(ge=1)
    subset_modes: list[Literal["balanced", "natural"]]
    subset_methods: list[str]


class FedCMCParams(_Strict):
    methods: list[str] = Field(
        min_length=1,
        description="federated algorithms by their registry name (checked by the training stage: config does not "
        "import the algorithms)",
    )
    datasets: list[str] = Field(
        min_length=1, description="prepared RE corpora: synthetic-re (embedded) or data.re_corpora names"
    )
    alphas: list[float] = Field(min_length=1)
    seeds: list[int] = Field(min_length=1)
    target_f1: float = Field(gt=0, le=1, description="Fig 3a: rounds each method needs to reach this test micro-F1")
    sweeps: FedCMCSweeps
    settings: FedCMCSettings

    @model_validator(mode="after")
    def _positive_alphas(self) -> "FedCMCParams":
        for index, alpha in enumerate(self.alphas):
            if alpha <= 0:
                raise ValueError(f"fedcmc.alphas.{index} = {alpha}: a Dirichlet concentration must be > 0")
        return self


class SSVFNASSplit(_Strict):
    """How ssvfnas_partition splits each aligned dataset (once, seeded by data.seed, stratified by label)."""

    test_fraction: float = Field(gt=0, lt=1)
    valid_fraction: float = Field(
        gt=0, lt=1, description="share of the training rows held out for alpha (the paper: 0.5)"
    )
    max_samples: int = Field(ge=0, description="seeded stratified cap on a dataset's aligned rows; 0 = all")


class SSVFNASSearch(_Strict):
    """The collaborative search (both rules) and each party's supernet."""

    steps: int = Field(ge=1, description="collaborative search steps (each: one train and one search-valid batch)")
    batch_size: int = Field(ge=1)
    lr: float = Field(
        gt=0, description="SGD on the weights, cosine-annealed to lr_min (the released code: 0.025 -> 0.001)"
    )
    lr_min: float = Field(ge=0)
    momentum: float = Field(ge=0, lt=1)
    weight_decay: float = Field(ge=0)
    grad_clip: float = Field(gt=0, description="each party clips its own weight gradient to this norm")
    arch_lr: float = Field(gt=0, description="Adam on the alphas (the released code: 3e-4)")
    arch_weight_decay: float = Field(ge=0)
    second_order: bool = Field(description="VFNAS-1 with DARTS's second-order (finite-difference) alpha gradient")
    milenas_lambda: float = Field(
        ge=0, description="MiLeNAS: alpha gradient = train gradient + lambda x valid gradient"
    )
    cells: int = Field(ge=1)
    nodes: int = Field(ge=1)
    width: int = Field(ge=1, description="channels (conv) or units (MLP) of every cell edge")
    out_dim: int = Field(ge=1, description="size of the embedding N_j each party sends")
    eval_every: int = Field(ge=1, description="steps between the test-accuracy points of the accuracy-vs-bytes curve")
    checkpoint_every: int = Field(ge=1, description="steps between checkpoints; a killed cell resumes from the last")


class SSVFNASMoCo(_Strict):
    """The self-supervised pre-search (MoCo v2) every party runs on its own features before an ss_ method's search."""

    steps: int = Field(ge=1)
    batch_size: int = Field(ge=2)
    lr: float = Field(gt=0, description="SGD on the supernet weights and the head (alphas: search.arch_lr with Adam)")
    projection_dim: int = Field(ge=1)
    queue_size: int = Field(ge=1)
    momentum: float = Field(ge=0, le=1)
    temperature: float = Field(gt=0)


class SSVFNASRetrain(_Strict):
    """Training the derived networks (and the hand-designed baseline) from scratch, through the same protocol."""

    steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)
    lr_min: float = Field(ge=0)
    eval_every: int = Field(
        ge=1,
        description="steps between validation points (mean training loss, held-out accuracy): "
        "what the health rule judges the cell by",
    )
    held_out_fraction: float = Field(
        gt=0,
        lt=1,
        description="share of each partition's train split (stratified, seeded by "
        "data.seed) that no phase of a cell trains on; the retraining's "
        "validation accuracy is scored on it, never on test",
    )
    width: int | None = Field(ge=1, description="the derived networks' width; null = the search's")
    cells: int | None = Field(ge=1, description="the derived networks' cells; null = the search's")
    baseline_depth: int = Field(ge=1, description="layers of the hand-designed baseline (its width is sized to match)")


class SSVFNASDP(_Strict):
    """The Gaussian mechanism's clipping bounds and the delta epsilon is reported at (levels: ssvfnas.dp_levels)."""

    clip_forward: float = Field(gt=0, description="C1, per-sample L2 bound of each sent embedding")
    clip_backward: float = Field(gt=0, description="C2, per-sample L2 bound of each returned gradient")
    delta: float = Field(gt=0, lt=1)


class SSVFNASParams(_Strict):
    methods: list[str] = Field(
        min_length=1,
        description="rows of the main table (checked by ssvfnas.cells: config "
        "imports no paper's method list, which every stage would then depend on)",
    )
    datasets: list[str] = Field(
        min_length=1, description="digits and/or FATE classification sets of data.vertical_sets"
    )
    parties: list[int] = Field(min_length=1, description="K values; each dataset runs at every K it allows")
    dp_levels: list[list[float]] = Field(min_length=1, description="(sigma1, sigma2) noise multipliers; [0, 0] = no DP")
    seeds: list[int] = Field(min_length=1)
    target_accuracy: float = Field(gt=0, le=1)
    fidelity: Literal["paper", "released_code"]
    threads: int = Field(ge=1, description="torch threads of every cell (tiny networks: one is faster than two)")
    split: SSVFNASSplit
    search: SSVFNASSearch
    moco: SSVFNASMoCo
    retrain: SSVFNASRetrain
    dp: SSVFNASDP

    @model_validator(mode="after")
    def _levels_and_parties(self) -> "SSVFNASParams":
        for index, level in enumerate(self.dp_levels):
            if len(level) != 2 or any(not 0 <= s < float("inf") for s in level):
                raise ValueError(
                    f"ssvfnas.dp_levels.{index} = {level}: a pair [sigma1, sigma2] of finite noise multipliers >= 0"
                )
        seen = [tuple(level) for level in self.dp_levels]
        if len(set(seen)) != len(seen):
            raise ValueError(f"ssvfnas.dp_levels = {self.dp_levels}: a level is listed twice")
        for key in ("datasets", "parties", "seeds", "methods"):
            values = getattr(self, key)
            if len(set(values)) != len(values):
                raise ValueError(f"ssvfnas.{key} = {values}: a value is listed twice")
        for index, k in enumerate(self.parties):
            if k < 2:
                raise ValueError(f"ssvfnas.parties.{index} = {k}: a vertical federation has at least 2 parties")
        if self.search.lr_min > self.search.lr or self.retrain.lr_min > self.retrain.lr:
            raise ValueError("ssvfnas: search.lr_min and retrain.lr_min must not exceed their lr")
        return self


class ReportParams(_Strict):
    title: str


class Params(_Strict):
    scale: Literal[SCALES]  # type: ignore[valid-type]
    data: DataParams
    partition: PartitionParams
    mine: MineParams
    model: ModelParams
    train: TrainParams
    algorithms: dict[str, dict[str, Any]] = Field(
        description="each algorithm's own knobs, {name: {knob: value}}; checked against the algorithm's Settings "
        "(fedrepro/fl/algorithms/<name>.py) when a training stage builds its cells"
    )
    fedmatch: FedMatchParams
    fedcmc: FedCMCParams
    ssvfnas: SSVFNASParams
    report: ReportParams

    @property
    def qa_clients(self) -> list[str]:
        """FedMatch's clients: the embedded domains, or the QA collections of a mirror or official run."""
        return self.partition.embedded_domains if self.data.source == "embedded" else self.partition.collections

    @model_validator(mode="after")
    def _per_client_caps_name_clients(self) -> "Params":
        for key, caps in (
            ("data.client_train_questions", self.data.client_train_questions),
            ("mine.client_max_triples", self.mine.client_max_triples),
        ):
            known = self.partition.collections + self.partition.embedded_domains  # unused where the source lacks it
            unknown = sorted(set(caps) - set(known))
            if unknown:
                raise ValueError(
                    f"{key} names {unknown}, which are no QA collection or embedded domain; allowed {known}"
                )
        return self

    @model_validator(mode="after")
    def _qa_collections_are_known_or_declared(self) -> "Params":
        for index, name in enumerate(self.partition.collections):
            if name not in QA_LAYOUTS and name not in self.data.qa_layouts:
                raise ValueError(
                    f"partition.collections.{index} = {name!r}: allowed {list(QA_LAYOUTS)}, or a collection of "
                    "your own named in data.qa_layouts with the layout it follows"
                )
        return self

    @model_validator(mode="after")
    def _clients_per_round_fits(self) -> "Params":
        n_clients = len(self.qa_clients)
        for key, value, least in (
            ("train.clients_per_round", self.train.clients_per_round, "0 (all)"),
            ("fedmatch.settings.clients_sampled", self.fedmatch.settings.clients_sampled, "1"),
        ):
            if value > n_clients:
                raise ValueError(f"{key} = {value}: more than the {n_clients} clients; allowed {least} .. {n_clients}")
        return self

    @property
    def public_collections(self) -> list[str]:
        """The public raw collections acquire brings: the QA collections and what the RE and vertical data need."""
        return [c for c in self.partition.collections if c not in self.data.qa_layouts] + self.data.raw_collections

    @model_validator(mode="after")
    def _ssvfnas_datasets_exist(self) -> "Params":
        from fedrepro.data.vertical import DIGITS, MODELNET40, REGRESSION_SETS, vertical_views

        sets = self.data.vertical_sets  # prepared by the mirror/official sources (the embedded one: digits only)
        for index, name in enumerate(self.ssvfnas.datasets):
            where = f"ssvfnas.datasets.{index} = {name!r}"
            if name in REGRESSION_SETS:
                raise ValueError(
                    f"{where}: a regression set (continuous target); SS-VFNAS's grid reports accuracy, so "
                    "only classification sets run"
                )
            if name == MODELNET40 and self.data.modelnet40_dir is None:
                raise ValueError(f"{where}: data.modelnet40_dir is not set (a local copy of ModelNet40v1png)")
            if name not in (DIGITS, MODELNET40) and name not in sets:
                allowed = [DIGITS, MODELNET40] + sorted(n for n in sets if n not in REGRESSION_SETS)
                raise ValueError(
                    f"{where}: neither the digits, ModelNet40 nor a set of data.vertical_sets; allowed {allowed}"
                )
            views = vertical_views(name, sets.get(name))
            if not views:
                raise ValueError(
                    f"{where}: its number of host files is not known here; list its hosts in data.vertical_sets"
                )
            if not set(views) & set(self.ssvfnas.parties):
                raise ValueError(
                    f"{where}: runs at K in {sorted(views)}, none of ssvfnas.parties {self.ssvfnas.parties}"
                )
        return self


SCALES_FOLDER = "scales"
"""Beside params.yaml: one ``<scale>.yaml`` per scale, the values its null keys take."""


def read_raw_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    """``params.yaml`` as a dict, with each scale's presets (``scales/<scale>.yaml`` beside it) under ``scales``:
    what ``parse_params`` validates."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"params: {path} does not exist")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ConfigError(f"params: {path}: expected a mapping at the top")
    if "scales" in raw:
        raise ConfigError(
            f"params: {path}: scales: the presets now live in {SCALES_FOLDER}/<scale>.yaml beside it, one "
            "file per scale (move each scales.<scale> mapping there)"
        )
    folder = path.parent / SCALES_FOLDER
    raw["scales"] = {
        scale: yaml.safe_load((folder / f"{scale}.yaml").read_text(encoding="utf-8"))
        for scale in SCALES
        if (folder / f"{scale}.yaml").exists()
    }
    return raw


def fill_from_scale(raw: dict[str, Any]) -> dict[str, Any]:
    """Replace every ``null`` in a group by the active scale's value for it."""
    scale = raw.get("scale")
    if scale not in SCALES:
        raise ConfigError(f"params: scale = {scale!r}: allowed {list(SCALES)}")
    presets = (raw.get("scales") or {}).get(scale)
    if not isinstance(presets, dict):
        raise ConfigError(
            f"params: {SCALES_FOLDER}/{scale}.yaml is missing or empty; it must give the values of the "
            f"scale {scale!r} for the keys params.yaml leaves null"
        )
    filled = copy.deepcopy({k: v for k, v in raw.items() if k != "scales"})
    _fill(filled, presets, f"{SCALES_FOLDER}/{scale}.yaml", "")
    return filled


def _fill(target: dict[str, Any], presets: dict[str, Any], file: str, where: str) -> None:
    """Recursively copy each preset into the matching key of ``target`` where that key is null."""
    for key, value in presets.items():
        name = f"{where}.{key}" if where else key
        if key not in target:
            raise ConfigError(f"params: {file}: {name} names no key of params.yaml")
        if target[key] is None:  # a leaf the scale fills, a mapping included (data.client_train_questions)
            target[key] = value
        elif isinstance(value, dict):
            if not isinstance(target[key], dict):
                raise ConfigError(f"params: {file}: {name} names no group of params.yaml")
            _fill(target[key], value, file, name)


def check_names(key: str, names: list[str], allowed: Any) -> None:
    """Each of ``names`` (params' ``key``) is one of ``allowed``, or a ConfigError names the first that is not. The
    papers' method lists are checked so, by the paper's own cells module, when its grid is built."""
    for index, name in enumerate(names):
        if name not in allowed:
            raise ConfigError(f"params: {key}.{index} = {name!r}: allowed {sorted(allowed)}")


def _is_group(loc: tuple, prefix: str) -> bool:
    """Whether ``loc`` (a validation error's) is a whole group of params (a model, checked by its model validator)
    rather than one key: the root of the model validated, or, under ``Params``, a key whose type is a model."""
    if not loc:
        return True
    if prefix:
        return False
    model: Any = Params
    for part in loc:
        field = model.model_fields.get(str(part)) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return False
        model = field.annotation
    return isinstance(model, type) and issubclass(model, BaseModel)


def validation_lines(error: ValidationError, prefix: str = "") -> list[str]:
    """Every problem of ``error``, one line each, its key under ``prefix`` (the group a model validated). A check of a
    whole group (a model validator) names its own key in its message, so its input, the whole group, is not printed."""
    lines = []
    for problem in error.errors():
        key = ".".join(([prefix] if prefix else []) + [str(part) for part in problem["loc"]])
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "missing":
            lines.append(f"params: {key} is missing")
        elif problem["type"] == "extra_forbidden":
            lines.append(f"params: {key} is not a known key")
        elif _is_group(problem["loc"], prefix):
            lines.append(f"params: {message}")
        else:
            lines.append(f"params: {key} = {problem.get('input')!r}: {message}")
    return lines


def one_line(error: ValidationError, prefix: str = "") -> str:
    """The first problem of ``error`` in one line (``validation_lines``)."""
    return validation_lines(error, prefix)[0]


def parse_params(raw: dict[str, Any]) -> Params:
    """Validate raw params (as ``read_raw_params`` reads them) into a frozen ``Params``; raise ConfigError on the first
    problem."""
    if not isinstance(raw, dict):
        raise ConfigError("params: expected a mapping at the top of params.yaml")
    filled = fill_from_scale(raw)
    try:
        return Params.model_validate(filled)
    except ValidationError as error:
        raise ConfigError(one_line(error)) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    return parse_params(read_raw_params(path))
