"""SS-VFNAS's track: its methods (``methods``), the grid of cells (``cells``) and how one cell is searched, retrained
and scored (``runs``)."""
