"""FedCMC's track: the grid of cells (``cells``) and how one cell is built and run (``runs``)."""
