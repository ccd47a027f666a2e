"""FedCMC's methods: the rows of its Table 2, each an algorithm of ``fedrepro.fl.algorithms`` by the same name.

Plain names that import nothing, so the params (``fedrepro.config``) can check a run's lists against them.
"""

METHODS = ("fedavg", "fedprox", "scaffold", "moon", "fedrs", "fedlc", "fedcmc")
VECTORS = ("major", "minor", "random", "none")
"""Which classifier vectors FedCMC contrasts with (Fig 4's ablation): the paper's major ones, or the others."""
