"""Centralised: one model trained on the pooled data of all clients; an upper bound that is not private."""

from fedrepro.fl.algorithm import Algorithm


class Centralised(Algorithm):
    name, label = "centralised", "centralised"
    federated = False
    pooled = True
