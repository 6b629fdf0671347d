"""LightningModules, one per file, on the shared bases (base.py; bi_encoder.py and rerank.py for
their families). The task registry imports a task's module by name when it is first asked for."""

from toolgraph.tasks.base import RetrievalTask, Task

__all__ = ["RetrievalTask", "Task"]
