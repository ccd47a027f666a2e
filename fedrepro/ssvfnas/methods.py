"""SS-VFNAS's methods: the rows of its main table, each a search rule with or without the self-supervised pre-search,
the hand-designed baseline they are compared with, and the label party alone (a trivial row).

Plain names that import nothing; each paper's cells module checks a run's lists against them when it builds the grid.
"""

METHODS = {
    "vfnas1": ("darts", False),
    "vfnas2": ("milenas", False),
    "ss_vfnas1": ("darts", True),
    "ss_vfnas2": ("milenas", True),
}
"""method -> (search rule, MoCo v2 pre-search first)"""
BASELINE = "hand_designed"
LABEL_ALONE = "label_party_alone"
"""the trivial row: the label party's own network trained on its own features only (nothing crosses, so no DP)"""
