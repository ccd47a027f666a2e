"""SS-VFNAS's track: its methods (``methods``), the vertical partitions (``partition``), the grid of cells (``cells``)
and how one cell is searched, retrained and scored (``runs``)."""
