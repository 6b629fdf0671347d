"""BM25 (Robertson & Zaragoza) through ``bm25s`` — a maintained, sparse-matrix implementation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import bm25s
import numpy as np
import torch

from toolgraph.config import bounded
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Retriever, RetrieverConfig
from toolgraph.retrieval.progress import progress_enabled


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
        show = progress_enabled()  # a large corpus (BEIR) takes a while; query batches in score() stay quiet:
        # evaluate() has one bar over all the queries
        tokens = bm25s.tokenize(self.documents(), stopwords=cfg.stopwords, show_progress=show)
        self._bm25 = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
        self._bm25.index(tokens, show_progress=show)

    def score(self, queries: list[str]) -> torch.Tensor:
        # full score vectors (not bm25s.retrieve) so ties are broken by tool id, like every retriever
        tokenized = bm25s.tokenize(queries, stopwords=self.config.stopwords, return_ids=False, show_progress=False)
        rows = [self._bm25.get_scores(q) if q else np.zeros(len(self.tools), dtype=np.float32) for q in tokenized]
        return torch.from_numpy(np.stack(rows).astype(np.float32))  # [Q, N]
