"""Inference-side retrievers. Every method is a :class:`Retriever`; see base.py."""

from __future__ import annotations

from typing import Any

from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval import agents, bm25, classifier, dense, gnn, losemb, pipeline, rerankers, tgr, tool2vec  # noqa: F401  (register)
from toolgraph.retrieval.base import Ranking, Retriever, RetrieverConfig

__all__ = ["RETRIEVERS", "Ranking", "Retriever", "RetrieverConfig", "build_retriever"]


def build_retriever(config: Any) -> Retriever:
    """A retriever from its typed config (``config.name`` picks the class)."""
    return RETRIEVERS.get(config.name)(config)
