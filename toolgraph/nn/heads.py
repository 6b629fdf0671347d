"""Heads on a text encoder (plain torch; no Lightning): the MLC tool classifier."""

from __future__ import annotations

import torch
from torch import nn

from toolgraph.nn.encoder import TextEncoder


def multi_hot(gold: torch.Tensor, n: int) -> torch.Tensor:
    """Gold indices [B, G] padded with -1 -> multi-hot [B, n] floats."""
    out = torch.zeros(gold.shape[0], n + 1, device=gold.device)
    out.scatter_(1, gold.clamp(min=-1) % (n + 1), 1.0)  # -1 lands in the extra last column
    return out[:, :n]


class ToolClassifier(nn.Module):
    """Multi-label classification (MLC): pooled query vector -> one logit per known tool."""

    def __init__(self, encoder: TextEncoder, n_tools: int, dropout: float = 0.1):
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.dim, n_tools)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.encoder(input_ids, attention_mask)))  # [B, T]
