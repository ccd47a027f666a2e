"""Stage acquire: bring the raw files into data/raw, each checked against its known sha256.

embedded: the InsuranceQA files shipped in the insuranceqa-data package (no mirror, no internet)
mirror:   a local directory laid out like the public sources (params data.mirror)
official: the publishers' URLs (fedrepro/data/sources.json); needs the internet
"""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.data.embedded import copy_package_files
from fedrepro.io import atomic_dir, write_json

OUT = Path("data/raw")


def main() -> None:
    params = load_params()
    if params.data.source == "embedded":
        with atomic_dir(OUT) as tmp:
            (tmp / "insuranceqa_pkg").mkdir()
            files = copy_package_files(tmp / "insuranceqa_pkg")
            write_json(tmp / "manifest.json", {"source": "embedded", "files": files})
        return
    from fedrepro.data.acquire import acquire

    acquire(params.partition.collections + params.data.raw_collections, params.data.source, params.data.mirror, OUT)


if __name__ == "__main__":
    run_stage(main)
