"""The non-BERT text matchers of FedMatch's Table 3, each trained per client from scratch.

* ESIM (Chen et al., ACL 2017, "Enhanced LSTM for Natural Language Inference"): BiLSTM input encoding,
  masked dot-product soft alignment, enhancement [a; ã; a - ã; a * ã], a ReLU projection, BiLSTM composition,
  masked average and max pooling of both sides, an MLP with a tanh hidden layer.
* RE2 (Yang et al., ACL 2019, "Simple and Effective Text Matching with Richer Alignment Features"): ``blocks``
  blocks of (2-layer conv encoder, kernel 3, GELU) -> projected dot-product alignment -> fusion of the three
  G functions on [x; x'], [x; x - x'], [x; x * x'], joined by augmented residual connections exactly as in the
  paper: block 1 reads the embedding x(1); block n > 1 reads [x(1); o(n-1) + o(n-2)] with o(0) = 0. Alignment
  and fusion see [block input; encoder output]. Masked max pooling, then the symmetric prediction layer on
  [v1; v2; |v1 - v2|; v1 * v2].

Dimensions (scaled down from the papers' 300-d embeddings and 300 (ESIM) / 150 (RE2) hidden units):
``embedding_dim`` word vectors; ESIM's BiLSTMs have ``hidden`` units per direction; RE2's encoder, alignment,
fusion and prediction layers are ``hidden`` wide. Both share parameters between the two sides, as in the papers.

Deviations: word embeddings are random and trained, not pretrained GloVe (nothing can be downloaded here);
tokens are the backbone tokenizer's WordPiece ids, not whitespace words, so the matchers read the
cross-encoder's tokenised ``[CLS] q [SEP] a [SEP]`` pairs and split them with :func:`split_pair`; the
classifiers' softmax outputs become one scalar score for the pairwise hinge loss (RE2's prediction layer is
one GELU hidden layer, then that score). As in
:class:`~fedrepro.models.cross_encoder.CrossEncoder`, the last linear layer is ``head`` (FedPer keeps it
private) and ``features`` is what it reads (the MLP's hidden layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from fedrepro.errors import ConfigError
from fedrepro.models.heads import head_output

MATCHERS = ("esim", "re2")


@dataclass(frozen=True)
class MatcherSpec:
    vocab_size: int
    pad_id: int
    cls_id: int
    sep_id: int
    embedding_dim: int = 128
    hidden: int = 128
    dropout: float = 0.1


def _left_align(ids: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept tokens first, in order, trimmed to the longest side (at least 1 wide, so empty sides still run)."""
    order = torch.argsort((~keep).int(), dim=1, stable=True)[:, : max(int(keep.sum(1).max()), 1)]
    mask = keep.gather(1, order)
    return ids.gather(1, order).masked_fill(~mask, 0), mask


def split_pair(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor, cls_id: int, sep_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(question_ids, question_mask, answer_ids, answer_mask), each left-aligned and padded with 0 / False."""
    real = attention_mask.bool() & (input_ids != sep_id)
    question = real & (token_type_ids == 0) & (input_ids != cls_id)
    answer = real & (token_type_ids == 1)
    return (*_left_align(input_ids, question), *_left_align(input_ids, answer))


def _align(
    a: torch.Tensor,
    b: torch.Tensor,
    a_mask: torch.Tensor,
    b_mask: torch.Tensor,
    a_key: torch.Tensor | None = None,
    b_key: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft alignment both ways; padding gets the lowest finite energy (-inf would make an empty side NaN) and
    zero weight after the softmax, so an empty side aligns to 0."""
    a_key, b_key = (a if a_key is None else a_key), (b if b_key is None else b_key)
    energy = a_key @ b_key.transpose(1, 2)
    pair = a_mask[:, :, None] & b_mask[:, None, :]
    energy = energy.masked_fill(~pair, torch.finfo(energy.dtype).min)
    a_aligned = (energy.softmax(2) * pair) @ b
    b_aligned = (energy.softmax(1) * pair).transpose(1, 2) @ a
    return a_aligned, b_aligned


def _max_pool(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    pooled = x.masked_fill(~mask[:, :, None], float("-inf")).max(1).values
    return torch.where(mask.any(1, keepdim=True), pooled, torch.zeros_like(pooled))


def _mean_pool(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask[:, :, None].to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1)


class _Matcher(nn.Module):
    """Shared plumbing: split the pair, embed each side, score ``self.match``'s vector with ``head``."""

    def __init__(self, spec: MatcherSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embedding = nn.Embedding(spec.vocab_size, spec.embedding_dim, padding_idx=spec.pad_id)
        self.dropout = nn.Dropout(spec.dropout)
        self.head = nn.Linear(spec.hidden, 1)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores (batch,) and the matching features (batch, hidden); scoring computes the scores in fp32
        (``head_output``)."""
        q_ids, q_mask, a_ids, a_mask = split_pair(
            input_ids, attention_mask, token_type_ids, self.spec.cls_id, self.spec.sep_id
        )
        features = self.match(self.dropout(self.embedding(q_ids)), q_mask, self.dropout(self.embedding(a_ids)), a_mask)
        return head_output(self.head, features, self.training).squeeze(-1), features


class _BiLSTM(nn.Module):
    """A BiLSTM over packed sequences, so the backward direction never reads padding."""

    def __init__(self, size_in: int, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(size_in, hidden, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        return pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=x.shape[1])[0]


class ESIM(_Matcher):
    def __init__(self, spec: MatcherSpec) -> None:
        super().__init__(spec)
        h = spec.hidden
        self.encode = _BiLSTM(spec.embedding_dim, h)
        self.project = nn.Sequential(nn.Linear(8 * h, h), nn.ReLU(), nn.Dropout(spec.dropout))
        self.compose = _BiLSTM(h, h)
        self.mlp = nn.Sequential(nn.Linear(8 * h, h), nn.Tanh(), nn.Dropout(spec.dropout))

    def match(self, q, q_mask, a, a_mask):
        q, a = self.encode(q, q_mask), self.encode(a, a_mask)
        q_aligned, a_aligned = _align(q, a, q_mask, a_mask)
        pooled = []
        for x, x_aligned, mask in ((q, q_aligned, q_mask), (a, a_aligned, a_mask)):
            enhanced = torch.cat([x, x_aligned, x - x_aligned, x * x_aligned], -1)
            composed = self.compose(self.project(enhanced), mask)
            pooled += [_mean_pool(composed, mask), _max_pool(composed, mask)]
        return self.mlp(torch.cat(pooled, -1))


class _RE2Block(nn.Module):
    def __init__(self, size_in: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.conv = nn.ModuleList([nn.Conv1d(size_in, hidden, 3, padding=1), nn.Conv1d(hidden, hidden, 3, padding=1)])
        width = size_in + hidden
        self.key = nn.Sequential(nn.Dropout(dropout), nn.Linear(width, hidden), nn.GELU())
        self.fuse = nn.ModuleList(
            [nn.Sequential(nn.Dropout(dropout), nn.Linear(2 * width, hidden), nn.GELU()) for _ in range(3)]
        )
        self.out = nn.Sequential(nn.Dropout(dropout), nn.Linear(3 * hidden, hidden), nn.GELU())

    def encode(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Padding is zeroed before each conv so it looks like the convs' own zero padding."""
        m = mask[:, :, None].to(x.dtype)
        h = x
        for conv in self.conv:
            h = nn.functional.gelu(conv((h * m).transpose(1, 2)).transpose(1, 2))
        return torch.cat([x, h], -1)

    def fusion(self, x: torch.Tensor, x_aligned: torch.Tensor) -> torch.Tensor:
        parts = [g(torch.cat([x, other], -1)) for g, other in zip(self.fuse, (x_aligned, x - x_aligned, x * x_aligned))]
        return self.out(torch.cat(parts, -1))

    def forward(self, q, q_mask, a, a_mask):
        q, a = self.encode(q, q_mask), self.encode(a, a_mask)
        q_aligned, a_aligned = _align(q, a, q_mask, a_mask, self.key(q), self.key(a))
        return self.fusion(q, q_aligned), self.fusion(a, a_aligned)


class RE2(_Matcher):
    def __init__(self, spec: MatcherSpec, blocks: int = 2) -> None:
        super().__init__(spec)
        e, h = spec.embedding_dim, spec.hidden
        self.blocks = nn.ModuleList([_RE2Block(e if n == 0 else e + h, h, spec.dropout) for n in range(blocks)])
        self.mlp = nn.Sequential(nn.Dropout(spec.dropout), nn.Linear(4 * h, h), nn.GELU(), nn.Dropout(spec.dropout))

    def match(self, q, q_mask, a, a_mask):
        previous = (0, 0)  # o(n - 2), with o(0) = 0
        out_q, out_a = self.blocks[0](q, q_mask, a, a_mask)
        for block in self.blocks[1:]:
            residual = (out_q + previous[0], out_a + previous[1])
            previous = (out_q, out_a)
            out_q, out_a = block(torch.cat([q, residual[0]], -1), q_mask, torch.cat([a, residual[1]], -1), a_mask)
        v_q, v_a = _max_pool(out_q, q_mask), _max_pool(out_a, a_mask)
        return self.mlp(torch.cat([v_q, v_a, (v_q - v_a).abs(), v_q * v_a], -1))


def build_matcher(name: str, spec: MatcherSpec) -> nn.Module:
    """The matcher a method of ``fedrepro/fedmatch/methods.py`` names (``model="re2"`` or ``"esim"``)."""
    if name not in MATCHERS:
        raise ConfigError(
            f"matcher {name!r} (a method's model in fedrepro/fedmatch/methods.py): allowed {list(MATCHERS)}"
        )
    return ESIM(spec) if name == "esim" else RE2(spec)
