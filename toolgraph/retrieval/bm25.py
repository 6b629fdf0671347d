"""BM25 (Robertson & Zaragoza) through ``bm25s`` — a maintained, sparse-matrix implementation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import bm25s
import numpy as np
import torch

from toolgraph.config import ToolText, bounded
from toolgraph.data.schema import Tool
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Retriever, RetrieverConfig
from toolgraph.retrieval.fusion_model import normalise
from toolgraph.retrieval.progress import progress_enabled

BAR_FROM = 20_000  # documents: a smaller index is built without a progress bar


@dataclass
class BM25Config(RetrieverConfig):
    name: str = "bm25"
    k1: float = bounded(1.5, ge=0)
    b: float = bounded(0.75, ge=0, le=1)
    method: Literal["lucene", "robertson", "atire", "bm25l", "bm25+"] = "lucene"  # bm25s variants
    stopwords: str | None = "en"  # bm25s stopword list, or null


@RETRIEVERS.register("bm25")
class BM25Retriever(Retriever):
    Config = BM25Config
    name = "bm25"

    def _build(self) -> None:
        cfg = self.config
        docs = self.documents()
        # a large corpus (BEIR) takes a while (a catalog of a few thousand tools, milliseconds: no bar); query
        # batches in score() stay quiet: evaluate() has one bar over all the queries
        show = progress_enabled(len(docs) >= BAR_FROM)
        tokens = bm25s.tokenize(docs, stopwords=cfg.stopwords, show_progress=show)
        self._bm25 = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
        self._bm25.index(tokens, show_progress=show)

    def score(self, queries: list[str]) -> torch.Tensor:
        # full score vectors (not bm25s.retrieve) so ties are broken by tool id, like every retriever
        tokenized = bm25s.tokenize(queries, stopwords=self.config.stopwords, return_ids=False, show_progress=False)
        rows = [self._bm25.get_scores(q) if q else np.zeros(len(self.tools), dtype=np.float32) for q in tokenized]
        return torch.from_numpy(np.stack(rows).astype(np.float32))  # [Q, N]


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
