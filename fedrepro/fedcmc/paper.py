"""What the FedCMC paper says, typed in once: its names of the corpora, the gains and rounds it reports, and the one
reading of ChemProt. Everything else the report shows is measured on the cells; keeping the paper's side in a module
of its own keeps the two apart, and lets the tables, the claims and the markdown quote the same numbers."""

DATASET_LABELS = {"i2b2": "2010 i2b2/VA", "chemprot_cpr5": "ChemProt (CPR)", "pgr": "PGR"}
PAPER_GAINS = {
    0.05: {"i2b2": 12.99, "chemprot_cpr5": 8.39, "pgr": 4.04},
    0.5: {"i2b2": 9.08, "chemprot_cpr5": 7.81, "pgr": 2.12},
}
"""FedCMC − FedAvg F1 the paper reports (ANCHORS.md), by alpha and dataset."""
CHEMPROT_READING = (
    "ChemProt is `chemprot_cpr5`, the five CPR relation types (CPR:3/4/5/6/9) with no no-relation class: "
    "the paper counts 10,307 CPR sentences in 5 relation types (the positive pairs; the CPR-group version "
    "with NA candidates has 38,106) and draws Table 3's balanced subset as 100 per class of 500, i.e. 5 classes"
)
"""The one reading of ChemProt the main table, Table 3 and the figures share, and why (the paper's Datasets and
Table 3)."""
PAPER_ROUNDS = {"fedcmc": 5, "fedrs": 15, "fedavg": 20}
"""Rounds to 45% F1 at alpha 0.05 the paper reports (Fig 3a)."""
