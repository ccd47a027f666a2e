"""Params: validated before any work, with one-line errors that name the key, the value and what is allowed.

``params.yaml`` has one ``scale`` switch (embedded | cpu | paper). Keys that depend on the scale are left
as ``null`` in their group and filled from ``scales.<scale>.<group>``; a value set explicitly (for
instance with ``dvc exp run -S train.rounds=3``) always wins over the scale's value.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fedrepro.errors import ConfigError

RE_CORPORA = ("pgr", "chemprot_cpr_groups", "chemprot_scibert", "i2b2")
ALGORITHMS = ("individual", "centralised", "fedavg", "fedprox", "fedper")
SCALES = ("embedded", "cpu", "paper")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataParams(_Strict):
    source: Literal["embedded", "mirror", "official"]
    mirror: str
    seed: int
    max_questions_per_client: int = Field(ge=0, description="train questions of the largest client; 0 = all")
    min_questions_per_client: int = Field(ge=1)
    max_eval_questions_per_client: int = Field(ge=0, description="valid/test questions per client; 0 = all")
    re_corpora: list[Literal[RE_CORPORA]]  # type: ignore[valid-type]
    vertical_sets: dict[str, list[str] | None] = Field(description="FATE set -> host files to join (null: all)")
    i2b2_dir: str | None = None

    @property
    def raw_collections(self) -> list[str]:
        """The raw collections acquire must bring for the configured RE corpora and vertical sets."""
        needed = [c.split("_")[0] for c in self.re_corpora if c != "i2b2"]
        return list(dict.fromkeys(needed + (["fate_vfl"] if self.vertical_sets else [])))


class PartitionParams(_Strict):
    embedded_domains: list[str] = Field(min_length=1)
    collections: list[str] = Field(min_length=1)


class MineParams(_Strict):
    backend: Literal["bm25s", "rank-bm25", "elasticsearch"]
    k1: float = Field(gt=0)
    b: float = Field(ge=0, le=1)
    negatives_per_question: int = Field(ge=1)
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
    tiny: TinyBertParams


class TrainParams(_Strict):
    algorithms: list[Literal[ALGORITHMS]] = Field(min_length=1)  # type: ignore[valid-type]
    seeds: list[int] = Field(min_length=1)
    rounds: int = Field(ge=1)
    local_epochs: int = Field(ge=1, description="epochs each client trains between two aggregations")
    clients_per_round: int = Field(ge=0, description="k of T clients sampled each round; 0 = all")
    weighting: Literal["uniform", "size"]
    lr: float = Field(gt=0)
    batch_size: int = Field(ge=1)
    warmup_fraction: float = Field(ge=0, lt=1)
    max_grad_norm: float = Field(gt=0)
    fedprox_mu: float = Field(ge=0)
    eval_every: int = Field(ge=1)
    threads: int = Field(ge=1)


class ReportParams(_Strict):
    title: str


class Params(_Strict):
    scale: Literal[SCALES]  # type: ignore[valid-type]
    data: DataParams
    partition: PartitionParams
    mine: MineParams
    model: ModelParams
    train: TrainParams
    report: ReportParams

    @model_validator(mode="after")
    def _clients_per_round_fits(self) -> "Params":
        n_clients = len(self.partition.embedded_domains if self.data.source == "embedded" else self.partition.collections)
        if self.train.clients_per_round > n_clients:
            raise ValueError(
                f"train.clients_per_round = {self.train.clients_per_round}: more than the {n_clients} clients; "
                f"allowed 0 (all) .. {n_clients}"
            )
        return self


def _fill_from_scale(raw: dict[str, Any]) -> dict[str, Any]:
    """Replace every ``null`` in a group by the active scale's value for it."""
    scale = raw.get("scale")
    if scale not in SCALES:
        raise ConfigError(f"params: scale = {scale!r}: allowed {list(SCALES)}")
    presets = (raw.get("scales") or {}).get(scale)
    if not isinstance(presets, dict):
        raise ConfigError(f"params: scales.{scale} is missing; it must give the values of the scale {scale!r}")
    filled = copy.deepcopy({k: v for k, v in raw.items() if k != "scales"})
    for group, values in presets.items():
        target = filled.get(group)
        if not isinstance(target, dict):
            raise ConfigError(f"params: scales.{scale}.{group} names no group of params.yaml")
        for key, value in values.items():
            if key not in target:
                raise ConfigError(f"params: scales.{scale}.{group}.{key} names no key of the group {group}")
            if target[key] is None:
                target[key] = value
    return filled


def _one_line(error: ValidationError) -> str:
    first = error.errors()[0]
    key = ".".join(str(part) for part in first["loc"])
    if first["type"] == "missing":
        return f"params: {key} is missing"
    if first["type"] == "extra_forbidden":
        return f"params: {key} is not a known key"
    value = first.get("input")
    where = f"{key} = {value!r}: " if key else ""
    return f"params: {where}{first['msg']}"


def parse_params(raw: dict[str, Any]) -> Params:
    """Validate raw params (as read from params.yaml) into a frozen ``Params``; raise ConfigError on the first problem."""
    if not isinstance(raw, dict):
        raise ConfigError("params: expected a mapping at the top of params.yaml")
    filled = _fill_from_scale(raw)
    try:
        return Params.model_validate(filled)
    except ValidationError as error:
        raise ConfigError(_one_line(error)) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"params: {path} does not exist")
    with open(path, encoding="utf-8") as handle:
        return parse_params(yaml.safe_load(handle))
