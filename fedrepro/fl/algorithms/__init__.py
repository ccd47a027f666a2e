"""One small file per algorithm; ``build_algorithm`` maps the name used in params.yaml to its class."""

from fedrepro.errors import ConfigError
from fedrepro.fl.algorithm import Algorithm, AlgorithmSettings
from fedrepro.fl.algorithms.centralised import Centralised
from fedrepro.fl.algorithms.fedavg import FedAvg
from fedrepro.fl.algorithms.fedper import FedPer
from fedrepro.fl.algorithms.fedprox import FedProx
from fedrepro.fl.algorithms.individual import Individual

REGISTRY: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (Individual, Centralised, FedAvg, FedProx, FedPer)
}


def build_algorithm(name: str, settings: AlgorithmSettings) -> Algorithm:
    if name not in REGISTRY:
        raise ConfigError(f"params: train.algorithms contains {name!r}; allowed {sorted(REGISTRY)}")
    return REGISTRY[name](settings)
