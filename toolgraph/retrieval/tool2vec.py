"""Tool2Vec (Moon et al., "Efficient and Scalable Estimation of Tool Representations in Vector
Space", 2024): a tool's vector is the mean of the vectors of the training queries that used it.

Queries are embedded by any encoder (pretrained, or a fine-tuned bi-encoder folder). A tool with
usage gets ``normalize(w * mean(query vectors) + (1 - w) * description vector)`` with
``w = usage_weight``; a tool nobody used in training (e.g. added later) keeps its description
vector, so the index still takes new tools without retraining.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from toolgraph.config import accepts_renamed, bounded
from toolgraph.data.formats import read_json
from toolgraph.data.schema import ToolDataset
from toolgraph.errors import DataError
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever


@accepts_renamed
@dataclass
class Tool2VecConfig(DenseConfig):
    name: str = "tool2vec"
    usage_weight: float = bounded(1.0, ge=0, le=1)  # 1: usage only (the paper); 0: plain description vectors
    usage_splits: list[str] = field(default_factory=lambda: ["train"])  # never the evaluated split


@RETRIEVERS.register("tool2vec")
class Tool2VecRetriever(DenseRetriever):
    Config = Tool2VecConfig
    name = "tool2vec"

    def __init__(self, config: Tool2VecConfig | None = None, **kw):
        super().__init__(config, **kw)
        if not 0.0 <= self.config.usage_weight <= 1.0:
            raise ValueError(f"retriever.usage_weight must be in [0, 1], got {self.config.usage_weight}")
        self.usage: dict[str, list[str]] = {}  # tool id -> texts of the training queries that use it

    def fit(self, dataset: ToolDataset) -> None:
        self.usage = {}
        for split in self.config.usage_splits:
            for q in dataset.split(split):
                for t in q.tools:
                    self.usage.setdefault(t, []).append(q.text)

    def _build(self) -> None:
        docs = [self.prefix("document") + d for d in self.documents()]
        vectors = self.embed(docs, "encoding tools")  # [N, H] description vectors
        w = self.config.usage_weight
        used = [i for i, t in enumerate(self.tools) if t.id in self.usage]
        if used and w > 0:
            texts = [self.prefix("query") + q for i in used for q in self.usage[self.tools[i].id]]
            qvecs = self.embed(texts, "encoding usage queries", self.config.encoder.max_query_length)  # [U, H]
            owner = torch.tensor([k for k, i in enumerate(used) for _ in self.usage[self.tools[i].id]])  # [U]
            means = torch.zeros(len(used), qvecs.shape[1]).index_add_(0, owner, qvecs)
            means /= torch.bincount(owner, minlength=len(used)).unsqueeze(1).float()  # [n_used, H]
            mixed = w * means + (1 - w) * vectors[used]
            vectors[used] = torch.nn.functional.normalize(mixed, dim=1) if self.config.encoder.normalize else mixed
        self.tool_vectors = vectors
        self._build_faiss()

    # the usage survives save/load, so a loaded index still takes add_tools without losing it
    def _save_state(self, folder: Path) -> None:
        super()._save_state(folder)
        (folder / "usage.json").write_text(json.dumps(self.usage, ensure_ascii=False) + "\n")

    def _load_state(self, folder: Path) -> None:
        path = folder / "usage.json"
        self.usage = read_json(path) if path.is_file() else {}
        if not isinstance(self.usage, dict) or not all(isinstance(v, list) for v in self.usage.values()):
            raise DataError("expected a JSON object: tool id -> list of query texts; re-save the retriever", path)
        super()._load_state(folder)
