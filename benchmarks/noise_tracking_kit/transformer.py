"""The ``transformer`` task of benchmarks/noise_tracking.py: a small decoder-only transformer
on sequences of a random order-2 Markov chain.

The language: 32 symbols; the next symbol's distribution given the two before it mixes a
Zipf unigram (0.1), a bigram on the last symbol (0.3) and a trigram on both (0.6), the rows of
the last two drawn once from a Dirichlet(0.03) (sharp, not deterministic: about 1.9 nats a
symbol on average over the pairs, against log 32 ≈ 3.5), the first two symbols uniform.
Everything is generated from ``DATA_SEED``. An example is one sequence of ``CONTEXT + 1``
symbols: the model reads the first ``CONTEXT`` and predicts each next one; its loss is the
mean over its ``CONTEXT`` tokens, as the batch's mean loss weighs it.

The model: token and position embeddings (``nn.Embedding``, the positions given per example
so that the layer sees the batch dim), 2 pre-norm blocks (LayerNorm; causal attention with its
own ``nn.Linear`` projections, written out since ``vmap`` has no batching rule for the CPU's
fused attention; a 4× MLP), a final LayerNorm and a linear head: every parameter is in a
layer bsmon measures per example.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

DATA_SEED = 0
SYMBOLS = 32
CONTEXT = 32
SEQUENCES = 200_000


def markov_sequences(count: int = SEQUENCES, seed: int = DATA_SEED) -> torch.Tensor:
    """``count`` sequences of ``CONTEXT + 1`` symbols of the chain, (count, CONTEXT + 1)."""
    rng = np.random.default_rng(seed)
    unigram = 1 / np.arange(1, SYMBOLS + 1)
    bigram = rng.dirichlet(np.full(SYMBOLS, 0.03), size=SYMBOLS)
    trigram = rng.dirichlet(np.full(SYMBOLS, 0.03), size=SYMBOLS * SYMBOLS)
    pairs = np.arange(SYMBOLS * SYMBOLS)
    table = 0.1 * unigram / unigram.sum() + 0.3 * bigram[pairs % SYMBOLS] + 0.6 * trigram[pairs]
    cumulative = table.cumsum(1)
    cumulative[:, -1] = 1.0
    out = np.empty((count, CONTEXT + 1), dtype=np.int64)
    out[:, :2] = rng.integers(0, SYMBOLS, (count, 2))
    for t in range(2, CONTEXT + 1):
        rows = cumulative[out[:, t - 2] * SYMBOLS + out[:, t - 1]]
        out[:, t] = (rows < rng.random((count, 1))).sum(1)
    return torch.from_numpy(out)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        y = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    """Tokens (batch, CONTEXT) → next-symbol logits (batch, CONTEXT, SYMBOLS)."""

    def __init__(self, width: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(SYMBOLS, width)
        self.positions = nn.Embedding(CONTEXT, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, SYMBOLS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        where = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        x = self.tokens(tokens) + self.positions(where)
        return self.head(self.norm(self.blocks(x)))


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean over every token of the batch: per sequence, the mean over its tokens."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
