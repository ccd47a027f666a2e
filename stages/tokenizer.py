"""Stage fedmatch_tokenizer: for the tiny backbone, a WordPiece vocabulary trained on the clients' training text.

The vocabulary stands in for a public pretrained one (it is built from all clients' training text, so it is
not private); other backbones bring their own tokenizer and this stage only records that.
"""

from pathlib import Path

from fedrepro.cli import run_stage
from fedrepro.config import load_params
from fedrepro.io import atomic_dir, read_table, write_json
from fedrepro.models.backbone import train_wordpiece

PARTITION, OUT = Path("data/partition/qa"), Path("data/tokenizer")


def training_text():
    for folder in sorted(PARTITION.iterdir()):
        pairs = read_table(folder / "pairs.parquet")
        yield from pairs.loc[pairs["split"] == "train", "question"].unique()
        yield from read_table(folder / "train_pool.parquet")["answer"]


def main() -> None:
    model = load_params().model
    with atomic_dir(OUT) as tmp:
        if model.backbone == "tiny":
            train_wordpiece(training_text(), model.tiny.vocab_size).save_pretrained(str(tmp))
        write_json(tmp / "info.json", {"backbone": model.backbone, "trained_here": model.backbone == "tiny"})


if __name__ == "__main__":
    run_stage(main)
