"""LightningModules, one per file, on the shared base in base.py."""

from toolgraph.tasks import bi_encoder, classifier, cross_encoder, discriminator, graph, refiner, tool2vec  # noqa: F401  (register)
from toolgraph.tasks.base import RetrievalTask, Task

__all__ = ["RetrievalTask", "Task"]
