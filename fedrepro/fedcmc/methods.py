"""FedCMC's methods: the rows of its Table 2 are the engine's federated algorithms by their registry name
(``fedrepro.fl.algorithms.REGISTRY``; ``fedcmc.runs.check_methods`` checks ``fedcmc.methods`` against it), so an
algorithm added there joins this grid by being named in ``fedcmc.methods``.

Plain names that import nothing; each paper's cells module checks a run's lists against them when it builds the grid.
"""

PAPER_METHODS = ("fedavg", "fedprox", "scaffold", "moon", "fedrs", "fedlc", "fedcmc")
"""The rows of the paper's Table 2; its claims are about these, so another algorithm in the grid is an extra row."""
VECTORS = ("major", "minor", "random", "none")
"""Which classifier vectors FedCMC contrasts with (Fig 4's ablation): the paper's major ones, or the others."""
