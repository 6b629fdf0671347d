"""Inference-side retrievers. Every method is a :class:`Retriever` (see base.py).

This package is the retriever registry's home: importing it registers every retriever, and the
registry imports it by name the first time a retriever name is looked up (toolgraph/registry.py).
Nothing here imports Lightning or PyG at module level.
"""

from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval import agents, bm25, classifier, dense, gnn, losemb, pipeline, rerankers, tgr, tool2vec  # noqa: F401  (register)
from toolgraph.retrieval.base import Ranking, Retriever, RetrieverConfig, build_retriever

__all__ = ["RETRIEVERS", "Ranking", "Retriever", "RetrieverConfig", "build_retriever"]
