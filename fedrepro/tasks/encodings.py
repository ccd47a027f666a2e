"""Tokenised texts kept for a process's later cells.

A stage's process (or each cell worker it forks) trains its cells one after another, and every cell of a paper
tokenises the same texts with the same tokenizer: at the embedded scale that was about 2 s of a 10-s FedMatch cell.
So an encoding is kept under what determines it (the tokenizer's full definition, the encoding's own settings, the
texts) and handed to the next cell that asks for it. The encodings are read, never changed, by the tasks (they are
already shared by every epoch and round of a cell), so sharing them across cells changes no number.
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable, Sequence, TypeVar

Encoded = TypeVar("Encoded")
KEPT = 32
"""Encodings kept at once, the least recently used dropped first: a FedMatch task holds three a client (its
candidates, positives and negatives), a FedCMC task one a client and split."""
_kept: OrderedDict[tuple, Any] = OrderedDict()
_tokenizer_digests: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 of the tokenizer's whole definition (vocabulary, normaliser, added tokens such as entity markers)."""
    digest = _tokenizer_digests.get(tokenizer)
    if digest is None:
        backend = tokenizer.backend_tokenizer.to_str()
        digest = hashlib.sha256(backend.encode()).hexdigest()
        _tokenizer_digests[tokenizer] = digest
    return digest


def texts_digest(*columns: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for column in columns:
        digest.update(str(len(column)).encode())
        for text in column:
            digest.update(text.encode() + b"\0")
    return digest.hexdigest()


def kept_encoding(
    tokenizer: Any, settings: Hashable, columns: Sequence[Sequence[str]], encode: Callable[[], Encoded]
) -> Encoded:
    """``encode()``'s result for these texts, tokenizer and ``settings``, from an earlier cell of this process if
    one made it."""
    key = (tokenizer_digest(tokenizer), settings, texts_digest(*columns))
    if key in _kept:
        _kept.move_to_end(key)
        return _kept[key]
    encoded = encode()
    _kept[key] = encoded
    while len(_kept) > KEPT:
        _kept.popitem(last=False)
    return encoded
