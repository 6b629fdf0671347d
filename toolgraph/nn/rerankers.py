"""Reranker networks (plain torch; no Lightning).

``ToolRefiner`` (Moon et al. 2024): the query's token embeddings followed by N candidate-tool
vectors, each projected to the encoder's embedding size and appended as extra input embeddings;
the encoder's output at each candidate position gives that candidate's logit. One forward pass
scores all N candidates, so its cost grows with the query length + N, not with N full texts.

``PairScorer``: a cross-encoder; each (query, tool text) pair is one sequence, logit from [CLS].
"""

from __future__ import annotations

import torch
from torch import nn


class ToolRefiner(nn.Module):
    def __init__(self, backbone: nn.Module, vector_dim: int, dropout: float = 0.1):
        super().__init__()
        self.backbone = backbone
        embed_dim = backbone.get_input_embeddings().embedding_dim  # DeBERTa may embed below hidden size
        self.project = nn.Linear(vector_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)
        self.score = nn.Linear(backbone.config.hidden_size, 1)
        self.use_token_types = getattr(backbone.config, "type_vocab_size", 0) >= 2

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, vectors: torch.Tensor,
                vector_mask: torch.Tensor) -> torch.Tensor:
        """input_ids/attention_mask [B, L]; vectors [B, N, D]; vector_mask [B, N] (False = padding)
        -> logits [B, N]."""
        b, length = input_ids.shape
        n = vectors.shape[1]
        words = self.backbone.get_input_embeddings()(input_ids)  # [B, L, E] (right-padded)
        cands = self.project(vectors.to(words.dtype))  # [B, N, E]
        # each row packed as [query tokens][N tool slots][padding]: the slots start right after the
        # row's own last token, so positions (absolute or relative) never depend on batch padding
        slots = attention_mask.sum(1, keepdim=True) + torch.arange(n, device=input_ids.device)  # [B, N]
        embeds = torch.cat([words, words.new_zeros(b, n, words.shape[2])], dim=1)  # [B, L+N, E]
        embeds = embeds.scatter(1, slots.unsqueeze(2).expand(-1, -1, words.shape[2]), cands)
        mask = torch.cat([attention_mask, attention_mask.new_zeros(b, n)], dim=1)  # [B, L+N]
        mask = mask.scatter(1, slots, vector_mask.to(mask.dtype))
        extra = {}
        if self.use_token_types:  # segment B marks the tool slots (BERT); DeBERTa-v3 has no segments
            types = torch.zeros_like(mask).scatter(1, slots, 1)
            extra["token_type_ids"] = types
        hidden = self.backbone(inputs_embeds=embeds, attention_mask=mask, **extra).last_hidden_state  # [B, L+N, H]
        at_slots = hidden.gather(1, slots.unsqueeze(2).expand(-1, -1, hidden.shape[2]))  # [B, N, H]
        return self.score(self.dropout(at_slots)).squeeze(-1)  # [B, N]


class PairScorer(nn.Module):
    """Cross-encoder head on [CLS] of a jointly read pair: one score (reranking) or ``outputs``
    class logits (the 3-way dependency discriminator)."""

    def __init__(self, backbone: nn.Module, dropout: float = 0.1, outputs: int = 1):
        super().__init__()
        self.backbone = backbone
        self.dropout = nn.Dropout(dropout)
        self.score = nn.Linear(backbone.config.hidden_size, outputs)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        extra = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        out = self.score(self.dropout(hidden[:, 0]))  # [P, outputs]
        return out.squeeze(-1) if out.shape[-1] == 1 else out  # [P] or [P, outputs]
