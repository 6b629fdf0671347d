"""Inference-side retrievers. Every method is a :class:`Retriever` (see base.py), one module each.

This package is the retriever registry's home: the registry imports the module of a retriever by
name the first time it is asked for (toolgraph/registry.py), so nothing here is imported eagerly.
"""

from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Ranking, Retriever, RetrieverConfig, build_retriever

__all__ = ["RETRIEVERS", "Ranking", "Retriever", "RetrieverConfig", "build_retriever"]
