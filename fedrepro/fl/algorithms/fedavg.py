"""FedAvg (McMahan et al., 2017): every parameter shared, server averages the uploads."""

from fedrepro.fl.algorithm import Algorithm


class FedAvg(Algorithm):
    name, label = "fedavg", "FedAvg"
