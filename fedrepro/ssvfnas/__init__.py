"""SS-VFNAS's track: the grid of cells (``cells``) and how one cell is searched, retrained and scored (``runs``)."""
