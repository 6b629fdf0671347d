"""LightningModules, one per file, on the shared base in base.py."""

from toolgraph.tasks import bi_encoder, classifier, cross_encoder, refiner, tool2vec  # noqa: F401  (register)
from toolgraph.tasks.base import RetrievalTask

__all__ = ["RetrievalTask"]
