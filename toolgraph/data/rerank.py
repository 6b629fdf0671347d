"""Training data for rerankers: each query with N first-stage candidates.

Protocol (docs/usage-and-rerank.md): the first stage ranks every training query over the whole
catalog; its top N are the candidates. During training, gold tools missing from the top N replace
the lowest-ranked non-gold candidates (so every query has positives to learn from), then the N
candidates are shuffled (so the reranker cannot learn the first stage's order). At val/test and
in the exported retriever the candidates are the first stage's top N as they come: no injection,
no shuffle, so a gold tool the first stage misses stays missed.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from toolgraph.data.text import LabelCollator, LabelDataModule


def select_candidates(ranked: list[int], gold: list[int], n: int, inject: bool, shuffle: bool,
                      rng: random.Random) -> list[int]:
    """The N candidates of one training query (tool indices) under the protocol above."""
    cands = list(ranked[:n])
    if inject:
        gold_set = set(gold)
        missing = [g for g in gold if g not in cands][:n]
        slots = [i for i in range(len(cands) - 1, -1, -1) if cands[i] not in gold_set]  # worst first
        for g in missing:
            if slots:
                cands[slots.pop(0)] = g
            elif len(cands) < n:
                cands.append(g)
    if shuffle:
        rng.shuffle(cands)
    return cands


class RerankCollator(LabelCollator):
    """Adds ``texts``, ``cands`` [B, N] (tool indices, -1 padded) and ``target`` [B, N] multi-hot."""

    def __init__(self, tokenizer, query_texts: list[str], gold: list[list[int]], max_query_length: int,
                 ranked: list[list[int]], n: int, inject: bool, shuffle: bool, tokenize: bool = True,
                 scores: list[torch.Tensor] | None = None):
        super().__init__(tokenizer, query_texts, gold, max_query_length, tokenize)
        self.ranked, self.n, self.inject, self.shuffle = ranked, n, inject, shuffle
        self.scores = scores  # the first stage's scores of ranked: adds ``first`` [B, N]

    def __call__(self, items: list[tuple[int, int]]) -> dict[str, Any]:
        out = super().__call__(items)
        cands = [select_candidates(self.ranked[q], self.gold[q], self.n, self.inject, self.shuffle,
                                   random.Random(seed)) for q, seed in items]
        width = max(len(c) for c in cands)
        idx = torch.full((len(items), width), -1, dtype=torch.long)
        for i, c in enumerate(cands):
            idx[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        gold = out["gold"]  # [B, G]
        out["cands"] = idx  # [B, N]
        out["target"] = ((idx.unsqueeze(2) == gold.unsqueeze(1)).any(2) & (idx >= 0)).float()  # [B, N]
        out["texts"] = [self.query_texts[q] for q, _ in items]
        if self.scores is not None:
            out["first"] = torch.stack([self._first(q, idx[i]) for i, (q, _) in enumerate(items)])
        return out

    def _first(self, q: int, cands: torch.Tensor) -> torch.Tensor:
        """First-stage scores of one query's candidates; an injected gold tool (ranked below the
        top N) gets the lowest score retrieved, padding 0."""
        score = dict(zip(self.ranked[q], self.scores[q].tolist(), strict=False))
        low = min(score.values(), default=0.0)
        return torch.tensor([score.get(c, low) if c >= 0 else 0.0 for c in cands.tolist()])


class RerankDataModule(LabelDataModule):
    """``train_ranked[i]``: the first stage's top tool indices for training query i;
    ``eval_ranked[text]``: the same for every val/test query, ``eval_scores[text]`` their first-stage
    scores (set by the task)."""

    train_ranked: list[list[int]]
    eval_ranked: dict[str, list[int]]
    eval_scores: dict[str, torch.Tensor]  # the first stage's scores of eval_ranked
    train_scores: list[torch.Tensor] | None = None  # those of train_ranked, when training adds them
    candidates: int = 32
    inject_gold: bool = True
    shuffle: bool = True

    def train_collator(self) -> Any:
        return RerankCollator(self.tok, [q.text for q in self.train_queries], self.train_gold,
                              self.cfg.max_query_length, self.train_ranked, self.candidates, self.inject_gold,
                              self.shuffle, self.tokenize_train, self.train_scores)
