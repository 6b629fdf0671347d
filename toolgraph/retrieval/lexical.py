"""BM25 as the lexical side of a hybrid in training: a catalog's BM25 scores, per dataset of a mixture,
min-max normalised as the served hybrid fuses them (``model.bm25_fusion``, tasks/bi_encoder.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from toolgraph.config import ToolText
from toolgraph.data.schema import Tool
from toolgraph.retrieval.bm25 import BM25Config, BM25Retriever
from toolgraph.retrieval.fusion_model import normalise


class CatalogBM25:
    """BM25 of queries against one part of a catalog at a time (``groups`` [N]: a mixture's datasets; None:
    one part), min-max normalised per query over that part, as the hybrid fuses them (dense + w x BM25,
    ``method: score``): the lexical side a bi-encoder trains beside (``model.bm25_fusion``)."""

    def __init__(self, tools: Sequence[Tool], groups: Sequence[int] | None = None, tool_text: ToolText = "default"):
        self.size = len(tools)
        groups = list(groups) if groups is not None else [0] * len(tools)
        self.parts: dict[int, tuple[torch.Tensor, BM25Retriever]] = {}
        for g in sorted(set(groups)):
            cols = [i for i, x in enumerate(groups) if x == g]
            bm25 = BM25Retriever(BM25Config(tool_text=tool_text))
            bm25.index([tools[i] for i in cols])
            self.parts[g] = (torch.tensor(cols), bm25)

    def scores(self, queries: list[str], group: int = 0) -> torch.Tensor:
        """[Q, N] each query's BM25 over part ``group`` in [0, 1] (min-max; no shared term: zeros), 0 elsewhere."""
        cols, bm25 = self.parts[group]
        out = torch.zeros(len(queries), self.size)
        out[:, cols] = normalise(bm25.score(queries), "minmax")
        return out
