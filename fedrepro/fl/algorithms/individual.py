"""Individual: each client trains its own model on its own data; nothing is shared."""

from fedrepro.fl.algorithm import Algorithm


class Individual(Algorithm):
    name, label = "individual", "individual"
    federated = False
