"""What every paper's report shares: figures, the statistics the claims are tested with, the claims row, number
formatting, tidy frames of evaluated cells, health marks and the sanity protocol's report. Each paper's own report is
``fedrepro/<paper>/report.py`` (tables, claims, figures) and ``render.py`` (the markdown); the data tables are
``data_tables``."""
