"""FedPer (Arivazhagan et al., 2019): the backbone is shared, the scoring head stays on each client."""

from fedrepro.fl.algorithm import Algorithm

HEAD_PREFIX = "head."


class FedPer(Algorithm):
    name, label = "fedper", "FedPer"

    def is_private(self, name: str) -> bool:
        return name.startswith(HEAD_PREFIX)
