"""fedrepro: reproduce federated-learning papers (FedMatch, FedCMC, SS-VFNAS) from raw data.

The library knows nothing about DVC: stage scripts in ``stages/`` read params, call in here and
write outputs.
"""

__version__ = "0.1.0"
