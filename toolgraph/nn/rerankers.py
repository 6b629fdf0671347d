"""Reranker networks (plain torch; no Lightning).

``ToolRefiner`` (Moon et al. 2024): the query's token embeddings followed by N candidate-tool
vectors, each projected to the encoder's embedding size and appended as extra input embeddings;
the encoder's output at each candidate position gives that candidate's logit. One forward pass
scores all N candidates, so its cost grows with the query length + N, not with N full texts.
``slot_layer: K`` (> 0) lets the candidate slots join above the embeddings and the first K layers,
which then read the query alone: with those layers frozen, their outputs are the same every epoch
and can be cached (``nn.frozen``), so training runs only the layers where query and tools meet.
``learned_tools: T`` (> 0) adds a trainable offset per known tool to its vector (``tool_inputs``),
zero at the start: the given vectors (Tool2Vec) are where training starts, and a tool without a row
(one added after training) keeps its vector as it is.

``PairScorer``: a cross-encoder; each (query, tool text) pair is one sequence, logit from [CLS].
"""

from __future__ import annotations

import torch
from torch import nn

from toolgraph.nn.frozen import check_depth, run_layers, stack


class ToolRefiner(nn.Module):
    def __init__(self, backbone: nn.Module, vector_dim: int, dropout: float = 0.1, slot_layer: int = 0,
                 learned_tools: int = 0):
        super().__init__()
        self.backbone = backbone
        self.slot_layer = slot_layer
        if slot_layer:
            check_depth(backbone, slot_layer)
        # slots at the input: the embedding size (DeBERTa may embed below hidden size); higher up: hidden size,
        # layer-normalised like every hidden state there (a projected vector has no natural scale)
        embed_dim = backbone.config.hidden_size if slot_layer else backbone.get_input_embeddings().embedding_dim
        self.project = nn.Linear(vector_dim, embed_dim)
        self.slot_norm = nn.LayerNorm(embed_dim, eps=getattr(backbone.config, "layer_norm_eps", 1e-12)) \
            if slot_layer else None
        self.dropout = nn.Dropout(dropout)
        self.score = nn.Linear(backbone.config.hidden_size, 1)
        self.use_token_types = getattr(backbone.config, "type_vocab_size", 0) >= 2
        self.tool_offsets = nn.Embedding(learned_tools, vector_dim) if learned_tools else None
        if self.tool_offsets is not None:
            nn.init.zeros_(self.tool_offsets.weight)

    def tool_inputs(self, vectors: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The candidates' slot inputs: ``vectors`` [B, N, D] plus the learned offset of each candidate's
        row ``rows`` [B, N] (-1: a tool without one) when ``learned_tools`` > 0."""
        if self.tool_offsets is None:
            return vectors
        offsets = self.tool_offsets(rows.clamp(min=0)) * (rows >= 0).unsqueeze(-1).to(vectors.dtype)
        return vectors + offsets.to(vectors.dtype)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, vectors: torch.Tensor,
                vector_mask: torch.Tensor) -> torch.Tensor:
        """input_ids/attention_mask [B, L]; vectors [B, N, D]; vector_mask [B, N] (False = padding)
        -> logits [B, N]."""
        if self.slot_layer:  # the query alone through the bottom, then the slots join
            states = run_layers(self.backbone, stack(self.backbone)[0](input_ids=input_ids), attention_mask, 0,
                                self.slot_layer)
            return self.forward_states(states, attention_mask, vectors, vector_mask)
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

    def forward_states(self, states: torch.Tensor, attention_mask: torch.Tensor, vectors: torch.Tensor,
                       vector_mask: torch.Tensor) -> torch.Tensor:
        """``slot_layer`` > 0: the query's hidden states after layer ``slot_layer`` [B, L, H] (computed
        here or read from a cache) -> logits [B, N]. Above the embeddings there are no positions, so the
        N slots simply follow the (padded) query and the attention mask hides the padding."""
        n = vectors.shape[1]
        slots = self.slot_norm(self.project(vectors.to(states.dtype)))  # [B, N, H]
        hidden = torch.cat([states, slots], dim=1)  # [B, L+N, H]
        mask = torch.cat([attention_mask, vector_mask.to(attention_mask.dtype)], dim=1)  # [B, L+N]
        hidden = run_layers(self.backbone, hidden, mask, self.slot_layer)
        return self.score(self.dropout(hidden[:, -n:])).squeeze(-1)  # [B, N]


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
