"""CoverQuery: a privacy-enhanced *central* baseline in the query-obfuscation tradition.

FedMatch's Table 3 lists CoverQuery without defining it. We follow the cover-query idea of TrackMeNot
(Howe & Nissenbaum, 2009) and of query obfuscation for private search (e.g. Arampatzis et al., "A query
obfuscation scheme for privacy-preserving search", JASIST 2015): a user's real query is never disclosed on
its own but hidden among k generated *cover queries*, so the receiver cannot tell which one is real.

Here every client sends its training data to a central trainer; each real question travels in a group with
k cover questions of the same length whose words are drawn (by frequency) from the client's own answer texts,
so the covers are plausible for its domain. Each cover is paired with the real question's positive and
negative answers, and the group is shuffled. The central trainer cannot separate real from cover questions,
so it trains one model on everything it received: the price of the obfuscation is that noise.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
from pydantic import Field

from fedrepro.fl.algorithm import Algorithm
from fedrepro.channel import SERVER, Channel
from fedrepro.seeding import derive_seed

UPLOAD_COLUMNS = ["group", "question", "positive_id", "positive", "negative_id", "negative"]


def with_cover_queries(triples: pd.DataFrame, k: int, seed: int) -> pd.DataFrame:
    """The upload of one client: each real question hidden in a shuffled group with ``k`` generated covers.

    Groups are numbered in a seeded random order; nothing in the table says which member is real.
    """
    rng = np.random.default_rng(seed)
    words = Counter(
        w for text in pd.concat([triples["positive"], triples["negative"]]) for w in str(text).lower().split()
    )
    vocabulary = np.array(sorted(words))
    weights = np.array([words[w] for w in vocabulary], dtype=float)
    weights /= weights.sum()
    questions = sorted(triples["question_id"].unique())
    group_of = dict(zip(questions, rng.permutation(len(questions))))
    members = {}
    for question_id in questions:
        real = triples.loc[triples["question_id"] == question_id, "question"].iloc[0]
        length = max(1, len(str(real).split()))
        covers = [" ".join(rng.choice(vocabulary, size=length, p=weights)) for _ in range(k)]
        members[question_id] = list(rng.permutation([real, *covers]))
    rows = []
    for row in triples.itertuples(index=False):
        for question in members[row.question_id]:
            rows.append(
                (int(group_of[row.question_id]), question, row.positive_id, row.positive, row.negative_id, row.negative)
            )
    upload = pd.DataFrame(rows, columns=UPLOAD_COLUMNS)
    return upload.sort_values(["group"], kind="stable").reset_index(drop=True)


class CoverQuery(Algorithm):
    name, label = "coverquery", "CoverQuery"
    federated = False
    pooled = True

    class Settings(Algorithm.Settings):
        cover_queries: int = Field(ge=1, description="generated cover questions sent with each real question")

    def prepare_task(self, task, channel: Channel, seed: int):
        """Each client uploads its obfuscated triples; the central trainer trains on exactly what arrived."""
        arrived = {}
        for client_id in task.client_ids:
            upload = with_cover_queries(
                task.triples[client_id], self.settings.cover_queries, derive_seed(seed, "cover_queries", client_id)
            )
            received = channel.send_table(-1, client_id, SERVER, "training_triples", upload)
            arrived[client_id] = received.assign(question_id=received["group"].map(lambda g: f"{client_id}-group-{g}"))
        return task.with_triples(arrived)
