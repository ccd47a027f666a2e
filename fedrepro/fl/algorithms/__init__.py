"""One small file per algorithm; ``build_algorithm`` maps the name used in params.yaml to its class."""

from fedrepro.errors import ConfigError
from fedrepro.fl.algorithm import Algorithm, AlgorithmSettings
from fedrepro.fl.algorithms.centralised import Centralised
from fedrepro.fl.algorithms.coverquery import CoverQuery
from fedrepro.fl.algorithms.fedavg import FedAvg
from fedrepro.fl.algorithms.fedcmc import FedCMC
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
    cls.name: cls for cls in (Individual, Centralised, CoverQuery, FedAvg, FedProx, LGFedAvg, FedPer, FedMatch,
                              Scaffold, Moon, FedRS, FedLC, FedCMC)
}


def build_algorithm(name: str, settings: AlgorithmSettings) -> Algorithm:
    if name not in REGISTRY:
        raise ConfigError(f"algorithm {name!r} is not registered; allowed {sorted(REGISTRY)}")
    return REGISTRY[name](settings)
