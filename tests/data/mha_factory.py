"""A test fixture: a small transformer built on ``torch.nn.MultiheadAttention`` with the structure
of DeepSpeedExamples' ``SimpleTransformerModel`` (training/bf16_master_weight/train.py): token and
learned position embeddings, post-norm blocks of batch-first multi-head attention and a GELU MLP,
an untied output projection. ``make()`` is the ``module:factory`` that ``parplan graph`` calls."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.ff = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: Any) -> Any:
        attended, _ = self.attention(x, x, x)
        x = self.norm1(x + attended)
        return self.norm2(x + self.ff(x))


class Model(nn.Module):
    def __init__(self, vocab: int = 96, hidden: int = 32, layers: int = 2, heads: int = 4, max_seq: int = 64) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.pos_embedding = nn.Embedding(max_seq, hidden)
        self.layers = nn.ModuleList([Block(hidden, heads) for _ in range(layers)])
        self.output_proj = nn.Linear(hidden, vocab)

    def forward(self, input_ids: Any) -> Any:
        batch, seq = input_ids.shape
        positions = torch.arange(seq, device=input_ids.device).unsqueeze(0).expand(batch, -1)
        x = self.embedding(input_ids) + self.pos_embedding(positions)
        for layer in self.layers:
            x = layer(x)
        return self.output_proj(x)


def make() -> Model:
    return Model()
