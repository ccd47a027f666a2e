"""SS-VFNAS's track: its methods (``methods``), the vertical partitions (``partition``), the grid of cells (``cells``),
how one cell is searched, retrained and scored (``runs``) and what a cell costs at a scale (``costs``)."""
