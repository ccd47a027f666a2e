"""One small file per algorithm; ``REGISTRY`` maps the name used in params.yaml to its class, and ``algorithm_settings``
reads that algorithm's knobs (its ``Settings``) from params.yaml's ``algorithms.<name>`` entry."""

from typing import Any, Mapping

from pydantic import ValidationError

from fedrepro.config import validation_lines
from fedrepro.errors import ConfigError
from fedrepro.fl.algorithm import Algorithm, CommonSettings
from fedrepro.fl.algorithms.centralised import Centralised
from fedrepro.fl.algorithms.coverquery import CoverQuery
from fedrepro.fl.algorithms.fedavg import FedAvg
from fedrepro.fl.algorithms.fedcmc import FedCMC
from fedrepro.fl.algorithms.feddyn import FedDyn
from fedrepro.fl.algorithms.fedlc import FedLC
from fedrepro.fl.algorithms.fedmatch import FedMatch
from fedrepro.fl.algorithms.fedper import FedPer
from fedrepro.fl.algorithms.fedprox import FedProx
from fedrepro.fl.algorithms.individual import Individual
from fedrepro.fl.algorithms.fedrs import FedRS
from fedrepro.fl.algorithms.lg_fedavg import LGFedAvg
from fedrepro.fl.algorithms.moon import Moon
from fedrepro.fl.algorithms.scaffold import Scaffold

REGISTRY: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (
        Individual,
        Centralised,
        CoverQuery,
        FedAvg,
        FedProx,
        LGFedAvg,
        FedPer,
        FedMatch,
        Scaffold,
        Moon,
        FedRS,
        FedLC,
        FedCMC,
        FedDyn,
    )
}


def algorithm_settings(name: str, entries: Mapping[str, Mapping[str, Any]], **per_cell: Any) -> Algorithm.Settings:
    """``name``'s settings for one cell: its entry of params.yaml's ``algorithms`` group (none: no knobs) plus the knobs
    the paper's runs set for this cell (``Settings.set_per_cell``).

    Every entry of the group is checked first (config.py cannot: it does not import the algorithms, which every
    stage would then depend on), so a wrong knob of any algorithm stops a training stage before its first cell."""
    for other, knobs in entries.items():
        per_cell_knobs = _validated(other, knobs).set_per_cell
        swept = sorted(set(knobs) & set(per_cell_knobs))
        if swept:
            raise ConfigError(
                f"params: algorithms.{other}.{swept[0]} is set for each cell from {per_cell_knobs[swept[0]]}; "
                "set it there"
            )
    return _validated(name, {**entries.get(name, {}), **per_cell})


def _validated(name: str, knobs: Mapping[str, Any]) -> Algorithm.Settings:
    if name not in REGISTRY:
        raise ConfigError(f"params: algorithms.{name} names no registered algorithm; allowed {sorted(REGISTRY)}")
    try:
        return REGISTRY[name].Settings.model_validate(dict(knobs))
    except ValidationError as error:
        first, *others = validation_lines(error, f"algorithms.{name}")
        raise ConfigError("; ".join([first] + [line.removeprefix("params: ") for line in others])) from None


def build_algorithm(name: str, settings: Algorithm.Settings, common: CommonSettings) -> Algorithm:
    if name not in REGISTRY:
        raise ConfigError(f"algorithm {name!r} is not registered; allowed {sorted(REGISTRY)}")
    return REGISTRY[name](settings, common)
