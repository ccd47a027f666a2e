"""Stage acquire: bring the raw files into data/raw, each checked against its known sha256.

embedded: the InsuranceQA files shipped in the insuranceqa-data package (no mirror, no internet)
mirror:   a local directory laid out like the public sources (params data.mirror)
official: the publishers' URLs (fedrepro/data/sources.json); needs the internet
At every source, the user's own files (params data.own_files) come from data.mirror, checked against their sha256.
"""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.data.acquire import acquire, acquire_own
from fedrepro.data.embedded import copy_package_files
from fedrepro.io import atomic_dir, write_json

OUT = Path("data/raw")


def main() -> None:
    params = load_params()
    data = params.data
    if data.source == "embedded":
        with atomic_dir(OUT) as tmp:
            (tmp / "insuranceqa_pkg").mkdir()
            files = copy_package_files(tmp / "insuranceqa_pkg")
            own = acquire_own(data.own_files, data.vertical_sets, data.mirror, tmp)
            write_json(
                tmp / "manifest.json", {"source": "embedded", "files": files, **({"own_files": own} if own else {})}
            )
        return
    acquire(
        params.public_collections,
        data.source,
        data.mirror,
        OUT,
        own_files=data.own_files,
        vertical_sets=data.vertical_sets,
        own_collections=[*data.qa_layouts, *data.re_layouts],
    )


if __name__ == "__main__":
    run_stage(main)
