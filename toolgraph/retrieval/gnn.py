"""A trained graph encoder (LightGCN / GAT / GraphSAGE) as a Retriever.

Tools of the training graph keep the embeddings the full graph gave them; a query, or a tool that
was not in the graph (``add_tools``), is an isolated node: the GNN runs on its text embedding alone
(exactly how val/test queries are scored during training). Scores are cosine similarities.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from safetensors.torch import save_file

from toolgraph.config import TextEncoderSpec, accepts_renamed, bounded, encoder_spec
from toolgraph.data.formats import read_json
from toolgraph.errors import DataError
from toolgraph.nn.storage import read_matrix, read_tensors
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Retriever, RetrieverConfig
from toolgraph.retrieval.dense import NODE_TEXT_KEYS, text_embedder

if TYPE_CHECKING:
    from toolgraph.nn.gnn import GraphEncoder


@accepts_renamed
@dataclass
class GNNConfig(RetrieverConfig):
    name: str = "gnn"
    gnn: Literal["lightgcn", "gat", "sage"] = "lightgcn"
    dim: int = bounded(384, ge=1)  # text feature size
    layers: int = bounded(2, ge=0)
    hidden: int = bounded(384, ge=1)
    heads: int = bounded(4, ge=1)
    # the frozen text encoder of the node features
    encoder: TextEncoderSpec = field(default_factory=encoder_spec(max_length=128, max_query_length=128))

    renamed: ClassVar[dict[str, str]] = NODE_TEXT_KEYS


@RETRIEVERS.register("gnn")
class GNNRetriever(Retriever):
    Config = GNNConfig
    name = "gnn"

    def __init__(self, config: GNNConfig | None = None, gnn: GraphEncoder | None = None,
                 graph_tools: dict[str, torch.Tensor] | None = None):
        super().__init__(config)
        c = self.config
        if gnn is None:
            from toolgraph.nn.gnn import build_gnn  # PyG is imported only when a GNN is built

            gnn = build_gnn(c.gnn, c.dim, c.layers, c.hidden, c.heads)
        self.gnn = gnn
        self.gnn.eval()
        self.graph_tools = graph_tools or {}  # tool id -> embedding from the training graph
        self._embedder = None
        self.tool_vectors = torch.zeros(0, 0)

    @property
    def embedder(self):
        if self._embedder is None:
            self._embedder = text_embedder(self.config)
        return self._embedder

    @torch.no_grad()
    def isolated(self, node_type: str, x: torch.Tensor) -> torch.Tensor:
        """GNN output of nodes with no edges: [n, D] -> [n, out]."""
        return self.gnn({node_type: x}, {})[node_type]

    def _build(self) -> None:
        new = [t for t in self.tools if t.id not in self.graph_tools]
        fresh = {}
        if new:
            x = self.embedder.embed(self.documents(new), "encoding tools")
            fresh = dict(zip((t.id for t in new), self.isolated("tool", x), strict=True))
        vecs = torch.stack([self.graph_tools.get(t.id, fresh.get(t.id)) for t in self.tools])  # [N, out]
        self.tool_vectors = torch.nn.functional.normalize(vecs, dim=-1)

    def score(self, queries: list[str]) -> torch.Tensor:
        x = self.embedder.embed(list(queries), "encoding queries", self.config.encoder.max_query_length)  # [Q, D]
        q = torch.nn.functional.normalize(self.isolated("query", x), dim=-1)
        return q @ self.tool_vectors.T  # [Q, N]

    def _save_state(self, folder: Path) -> None:
        save_file({k: v.contiguous() for k, v in self.gnn.state_dict().items()}, str(folder / "gnn.safetensors"))
        ids = sorted(self.graph_tools)
        (folder / "graph_tools.json").write_text(json.dumps(ids) + "\n")
        stacked = torch.stack([self.graph_tools[i] for i in ids]) if ids else torch.zeros(0, 0)
        save_file({"vectors": stacked.contiguous()}, str(folder / "graph_tools.safetensors"))

    def _load_state(self, folder: Path) -> None:
        path = folder / "gnn.safetensors"
        try:
            self.gnn.load_state_dict(read_tensors(path))
        except RuntimeError as e:  # missing / unexpected keys, other shapes
            raise DataError(f"does not fit the configured {self.config.gnn} network ({str(e)[:300]}); "
                            "re-save the retriever", path) from None
        ids = read_json(folder / "graph_tools.json")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise DataError("expected a JSON list of tool ids; re-save the retriever", folder / "graph_tools.json")
        if ids:
            width = self.isolated("tool", torch.zeros(1, self.config.dim)).shape[1]  # what the GNN gives a query
            vectors = read_matrix(folder / "graph_tools.safetensors", "vectors", len(ids),
                                  "tools of graph_tools.json", width=width, width_of="the GNN's outputs")
        else:
            vectors = torch.zeros(0, 0)
        self.graph_tools = dict(zip(ids, vectors, strict=True))
        self._build()
