"""Query k-nearest-neighbours: a query's tools are voted by the training queries most like it.

Each of the ``neighbors`` training queries closest to the query (cosine of their vectors, any encoder:
pretrained or a fine-tuned bi-encoder folder) votes for every tool it used, with weight
``softmax(cosine / temperature)`` over the neighbours. A tool's score is the sum of its votes plus
``description_weight`` x the cosine between the query and the tool's own text, which orders the tools
no neighbour used (at the default 1e-3 it never outweighs a vote difference larger than 0.002).

Where Tool2Vec averages a tool's training queries into one vector, this keeps every training query
and the *set* of tools it used, so it carries which tools go together: on ToolLens every test query's
gold set is a set some training query used. Alone it trails a trained classifier; fused with one
(``fusion``, ``method: score``, ``normalize: none``, its weight chosen on val) it is a cheap second
opinion (docs/usage-and-rerank.md, "Query neighbours"). Only ``usage_splits`` (train) are read:
never the evaluated split.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from toolgraph.config import accepts_renamed, bounded
from toolgraph.data.formats import read_json
from toolgraph.data.schema import ToolDataset
from toolgraph.errors import DataError
from toolgraph.nn.storage import check_width, read_matrix
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever

EXAMPLES = "examples.json"
VECTORS = "example_vectors.safetensors"


@accepts_renamed
@dataclass
class QueryKNNConfig(DenseConfig):
    name: str = "query_knn"
    neighbors: int = bounded(10, ge=1)  # training queries that vote
    temperature: float = bounded(0.05, gt=0)  # softmax over the neighbours' cosines
    description_weight: float = bounded(1.0e-3, ge=0)  # + this x cosine(query, tool text): orders unvoted tools
    usage_splits: list[str] = field(default_factory=lambda: ["train"])  # never the evaluated split


@RETRIEVERS.register("query_knn")
class QueryKNNRetriever(DenseRetriever):
    Config = QueryKNNConfig
    name = "query_knn"

    def __init__(self, config: QueryKNNConfig | None = None, **kw):
        super().__init__(config, **kw)
        self.examples: list[tuple[str, list[str]]] = []  # (training query text, the tool ids it used)
        self.example_vectors = torch.zeros(0, 0)  # [E, H]; independent of the catalog, so kept across index()
        self._example_tools = torch.zeros(0, 0, dtype=torch.long)  # [E, G] catalog positions, -1 padded

    def fit(self, dataset: ToolDataset) -> None:
        examples = [(q.text, list(q.tools)) for split in self.config.usage_splits for q in dataset.split(split)
                    if q.tools]
        if [t for t, _ in examples] != [t for t, _ in self.examples]:  # the same texts keep their vectors
            self.example_vectors = torch.zeros(0, 0)
        self.examples = examples

    def _build(self) -> None:
        super()._build()  # tool_vectors: the description vectors
        if self.examples and len(self.example_vectors) != len(self.examples):
            texts = [self.prefix("query") + text for text, _ in self.examples]
            self.example_vectors = self.embed(texts, "encoding training queries", self.config.encoder.max_query_length)
        self._index_examples()

    def _index_examples(self) -> None:
        """Each training query's tools as positions in the catalog (tools it lacks are dropped)."""
        pos = {t.id: i for i, t in enumerate(self.tools)}
        rows = [[pos[t] for t in tools if t in pos] for _, tools in self.examples]
        width = max((len(r) for r in rows), default=0)
        self._example_tools = torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long
                                           ).reshape(len(rows), width)

    def score(self, queries: list[str]) -> torch.Tensor:
        if not self.examples:
            raise DataError("query_knn has no training queries: fit(dataset) before index (evaluate does), "
                            "or load a saved query_knn folder")
        q = self.encode_queries(queries)  # [Q, H]
        sims, nearest = (q @ self.example_vectors.T).topk(min(self.config.neighbors, len(self.examples)), dim=1)
        weights = torch.softmax(sims / self.config.temperature, dim=1)  # [Q, k]
        tools = self._example_tools[nearest]  # [Q, k, G]
        n = len(self.tools)
        votes = torch.zeros(len(queries), n + 1)  # the last column takes the padding (-1)
        votes.scatter_add_(1, tools.where(tools >= 0, n).flatten(1),
                           weights.unsqueeze(2).expand_as(tools).flatten(1))
        return votes[:, :n] + self.config.description_weight * (q @ self.tool_vectors.T)  # [Q, N]

    # the training queries and their vectors survive save/load: a loaded index votes without the dataset
    def _save_state(self, folder: Path) -> None:
        super()._save_state(folder)
        (folder / EXAMPLES).write_text(json.dumps([{"text": t, "tools": ts} for t, ts in self.examples],
                                                  ensure_ascii=False) + "\n")
        save_file({"example_vectors": self.example_vectors.contiguous()}, str(folder / VECTORS))

    def _load_state(self, folder: Path) -> None:
        path = folder / EXAMPLES
        data = read_json(path)
        if not isinstance(data, list) or not all(isinstance(e, dict) and isinstance(e.get("text"), str)
                                                 and isinstance(e.get("tools"), list) for e in data):
            raise DataError('expected a JSON list of {"text": query, "tools": [tool ids]}; re-save the retriever',
                            path)
        self.examples = [(e["text"], [str(t) for t in e["tools"]]) for e in data]
        self.example_vectors = read_matrix(folder / VECTORS, "example_vectors", len(self.examples), "training queries")
        super()._load_state(folder)  # the description vectors (their file, or _build)
        check_width(self.example_vectors, "example_vectors", self.tool_vectors.shape[1], folder / VECTORS,
                    "the tool vectors")  # both come from the one encoder
        self._index_examples()
