"""FedCMC's track: its methods (``methods``), the client splits (``partition``), the grid of cells (``cells``) and how
one cell is built, run and scored (``runs``)."""
