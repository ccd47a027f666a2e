"""FedMatch's track: its methods (``methods``: the rows of Tables 2-3), the cells of its grid (``cells``: the tables and
the sweeps of Figs 5-8), how one cell is built, run and scored (``runs``) and what a cell costs at a scale
(``costs``)."""
