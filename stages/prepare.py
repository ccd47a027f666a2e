"""Stage prepare: tidy tables for every collection (QA: question id, question, answer id, answer, split, domain),
plus the statistics the report shows (FedQA Table 1 shape)."""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.data.prepare import prepare_embedded, prepare_raw, write_fate_sets, write_modelnet40
from fedrepro.data.vertical import own_vertical_sets
from fedrepro.io import atomic_dir, write_json

RAW, OUT = Path("data/raw"), Path("data/prepared")


def main() -> None:
    params = load_params()
    data = params.data
    with atomic_dir(OUT) as tmp:
        if data.source == "embedded":
            stats = prepare_embedded(RAW, tmp, data.seed)
            write_fate_sets(RAW, tmp, own_vertical_sets(data.vertical_sets, data.own_files), stats)  # the user's tables
        else:
            stats = prepare_raw(
                RAW,
                tmp,
                data.seed,
                params.partition.collections,
                data.re_corpora,
                data.vertical_sets,
                data.i2b2_dir,
                data.qa_layouts,
                data.re_layouts,
            )
        if data.modelnet40_dir is not None:  # SS-VFNAS's own images, from the user's copy at any source
            write_modelnet40(tmp, data.modelnet40_dir, data.modelnet40_image_size, data.modelnet40_max_objects, stats)
        for line in stats["skipped"]:
            print(line)
        write_json(tmp / "statistics.json", stats)


if __name__ == "__main__":
    run_stage(main)
