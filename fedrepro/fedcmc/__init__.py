"""FedCMC's track: its methods (``methods``), the client splits (``partition``), the grid of cells (``cells``), how
one cell is built, run and scored (``runs``) and what a cell costs at a scale (``costs``)."""
