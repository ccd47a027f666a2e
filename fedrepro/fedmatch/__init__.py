"""FedMatch's track: the methods of its Tables 2-3 and the cells of its grid (tables and the sweeps of Figs 5-8)."""
