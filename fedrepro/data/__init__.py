"""Data layer: acquiring raw files, preparing tidy tables, partitioning them among clients or parties."""
