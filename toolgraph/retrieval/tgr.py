"""TGR retriever (Tool Graph Retriever, 2025): dense tool vectors smoothed over the tool-dependency
graph with a parameter-free GCN (``nn.propagate.gcn_smooth``), then cosine retrieval.

The graph is either the dataset's annotated dependencies (``graph: gold`` — "TGR-m"; read in
``fit``, so pass ``dependency_splits`` in ``data.options`` to keep test chains out) or an edge
file written by ``toolgraph graph build`` from the discriminator ("TGR-d"), thresholded here.
Any encoder works: a name, an exported bi-encoder folder, or a run's ``retriever/encoder``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from toolgraph.config import accepts_renamed, bounded, from_dict, to_dict
from toolgraph.data.formats import read_edges, read_json
from toolgraph.data.schema import ToolDataset
from toolgraph.errors import ConfigError, DataError
from toolgraph.nn.propagate import gcn_smooth
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever


@accepts_renamed
@dataclass
class TGRConfig(DenseConfig):
    name: str = "tgr"
    graph: str = "gold"  # gold (dataset dependencies) | path to edges.jsonl from `toolgraph graph build`
    threshold: float | None = bounded(None, ge=0, le=1)  # edge-file prob kept; None: the file's val-chosen one
    max_prerequisites: int | None = bounded(None, ge=1)  # edge file: keep each tool's k most probable prerequisites
    layers: int = bounded(1, ge=0)
    alpha: float = bounded(1.0, ge=0, le=1)  # x <- (1 - alpha) x + alpha * A_hat x per layer (1: TGR)
    boost: float = bounded(0.0, ge=0)  # + boost * the best score among the tools that need this one
    direction: Literal["to_prerequisite", "to_dependent", "symmetric"] = "to_prerequisite"  # nn/propagate.py


@RETRIEVERS.register("tgr")
class TGRRetriever(DenseRetriever):
    Config = TGRConfig
    name = "tgr"

    def __init__(self, config: TGRConfig | None = None, encoder=None, tokenizer=None):
        super().__init__(config, encoder, tokenizer)
        self.edges: list[tuple[str, str]] = []  # (source needs target), by tool id
        self._edge_index: torch.Tensor | None = None  # [2, E] positions; built on first use
        if self.config.graph != "gold":
            self.edges = read_edges(self.config.graph, self.config.threshold, self.config.max_prerequisites)

    def fit(self, dataset: ToolDataset) -> None:
        if self.config.graph == "gold":
            self.edges = [(d.source, d.target) for d in dataset.dependencies]

    def _build(self) -> None:
        super()._build()  # [N, H] encoder vectors (cached)
        edges = self._index_edges().T  # [E, 2]
        smoothed = gcn_smooth(self.tool_vectors, edges, self.config.layers, self.config.direction, self.config.alpha)
        self.tool_vectors = F.normalize(smoothed, dim=-1) if self.config.encoder.normalize else smoothed
        self.graph_edges = len(edges)
        self._build_faiss()

    def _index_edges(self) -> torch.Tensor:
        """The graph's edges among the indexed tools as positions, [2, E] (dependent, prerequisite)."""
        index = {t.id: i for i, t in enumerate(self.tools)}
        pairs = [(index[s], index[t]) for s, t in self.edges if s in index and t in index]
        self._edge_index = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).T.contiguous()
        return self._edge_index

    def score(self, queries: list[str]) -> torch.Tensor:
        """Cosine scores [Q, N]; with ``boost``, a prerequisite also gets ``boost`` times the best score
        of the tools that need it: "delete my account" ranks DeleteAccount first and, through the
        edge, GetUserToken next to it (Pass@k needs both)."""
        scores = super().score(queries)
        edge_index = self._edge_index if self._edge_index is not None else self._index_edges()
        if self.config.boost <= 0 or not edge_index.numel():
            return scores
        needs, needed = edge_index  # [E] source (dependent), [E] target (prerequisite)
        best = torch.zeros_like(scores).scatter_reduce(1, needed.expand(len(scores), -1), scores[:, needs],
                                                       reduce="amax", include_self=True)  # [Q, N], >= 0
        return scores + self.config.boost * best

    def _search(self, queries: list[str], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.config.boost > 0:  # the boost is on scores: exact search over them
            return Retriever._search(self, queries, k)
        return super()._search(queries, k)

    def _save_state(self, folder: Path) -> None:
        super()._save_state(folder)
        (folder / "edges.json").write_text(json.dumps(self.edges))

    def _load_state(self, folder: Path) -> None:
        path = folder / "edges.json"
        if path.is_file():
            edges = read_json(path)
            if not isinstance(edges, list) or not all(isinstance(e, list) and len(e) == 2 for e in edges):
                raise DataError("expected a JSON list of [source, target] tool id pairs; re-save the retriever", path)
            self.edges = [tuple(e) for e in edges]
        super()._load_state(folder)
        self._edge_index = None  # the saved vectors are smoothed already; the boost indexes the edges on use


def with_graph(retriever: Retriever, graph: str, **options: object) -> TGRRetriever:
    """The TGR version of a loaded dense retriever (a checkpoint's, an exported folder's): the same
    encoder and tools, tool vectors smoothed over ``graph`` (an edges.jsonl or a ``toolgraph depgraph
    build`` folder). ``options``: TGRConfig keys (alpha, boost, threshold, layers, direction)."""
    if not isinstance(retriever, DenseRetriever):
        raise ConfigError(f"--graph smooths tool vectors over a graph: it needs a dense retriever, not "
                          f"{type(retriever).__name__}")
    unknown = sorted(set(options) - {"alpha", "boost", "threshold", "layers", "direction", "max_prerequisites"})
    if unknown:
        raise ConfigError(f"--graph-option: unknown key(s) {unknown}; expected alpha, boost, threshold, layers, "
                          "direction, max_prerequisites")
    dense = to_dict(retriever.config)  # its encoder spec, tool text, batching and index, as they are
    base = {f.name: dense[f.name] for f in fields(DenseConfig) if f.name != "name"}
    config = from_dict(TGRConfig(), {**base, **options, "graph": str(graph)}, "--graph-option")
    tgr = TGRRetriever(config, retriever.encoder, retriever._tokenizer)
    tgr.index(list(retriever.tools))
    if tgr.edges and not tgr.graph_edges:
        raise ConfigError(f"--graph {graph}: none of its {len(tgr.edges)} edges joins two tools of this retriever "
                          f"(graph ids like {tgr.edges[0][0]!r}, tool ids like {retriever.tools[0].id!r})")
    return tgr
