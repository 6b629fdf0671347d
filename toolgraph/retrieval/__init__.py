"""Inference-side retrievers. Every method is a :class:`Retriever` (see base.py), one module each.

This package is the retriever registry's home: the registry imports the module of a retriever by
name the first time it is asked for (toolgraph/registry.py), so nothing here is imported eagerly.
"""

from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Hit, Ranking, Retriever, RetrieverConfig

__all__ = ["RETRIEVERS", "Hit", "Ranking", "Retriever", "RetrieverConfig", "resolve_retriever"]


def __getattr__(name: str):  # noqa: ANN202 - the resolver lives in loading.py, imported only when asked for
    if name in ("resolve_retriever", "build_retriever"):  # build_retriever: its earlier name
        from toolgraph.retrieval.loading import resolve_retriever

        return resolve_retriever
    raise AttributeError(f"module 'toolgraph.retrieval' has no attribute {name!r}")
