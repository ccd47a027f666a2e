"""The tiny backbone's WordPiece vocabulary: identical across processes (the library's trainer alone is not)."""

import json
import subprocess
import sys

TRAIN = """
import json, sys
from fedrepro.models.backbone import train_wordpiece
words = "premium policy claim deductible annuity renters coverage beneficiary rider underwriting".split()
texts = [" ".join(words[(i * 7 + j) % len(words)] + "s" * (j % 3) for j in range(12)) for i in range(300)]
tokenizer = train_wordpiece(texts, 120)
print(json.dumps([tokenizer.get_vocab(), tokenizer("premiums riders", "claim")["input_ids"]], sort_keys=True))
"""


def train_in_new_process():
    return subprocess.run([sys.executable, "-c", TRAIN], capture_output=True, text=True, check=True).stdout


def test_wordpiece_training_is_identical_across_processes():
    runs = {train_in_new_process() for _ in range(3)}
    assert len(runs) == 1
    vocab, ids = json.loads(runs.pop())
    assert ids[0] == vocab["[CLS]"] and ids.count(vocab["[SEP]"]) == 2
    assert "##s" in vocab and "[PAD]" in vocab
