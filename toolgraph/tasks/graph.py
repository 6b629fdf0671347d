"""Graph learning on the query–tool–agent graph: LightGCN, GAT, GraphSAGE in one task.

    python train.py --config configs/graph_toollens.yaml model.gnn=gat data.setting=inductive-30

Node features come from a frozen text encoder (cached); only the GNN trains, full-batch (PyG's
neighbour loaders need torch-sparse, a 15-minute compile here). Each step takes a batch of
training queries, hides *their* invoke edges (they are scored as isolated nodes, exactly like a
test query, so the model cannot read the answer off its own edges), runs the GNN over the whole
graph and applies InfoNCE over all tools (other gold tools masked) or BPR with one uniform
negative. Validation is full-corpus retrieval of the val queries (isolated nodes).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import lightning as L
import torch
import torch.nn.functional as F

from toolgraph.config import TaskConfig, TextEncoderSpec, ToolText, accepts_renamed, bounded, unread_keys
from toolgraph.data import prepare_dataset
from toolgraph.data.graph import (
    EDGE_KINDS,
    ToolGraph,
    build_graph,
    graph_datamodule,
    save_graph_stats,
    without_queries_edges,
)
from toolgraph.data.schema import ToolDataset
from toolgraph.nn.encoder import resolve_model
from toolgraph.nn.gnn import build_gnn
from toolgraph.nn.losses import false_negative_mask, info_nce
from toolgraph.registry import TASKS
from toolgraph.retrieval.dense import NodeText, text_embedder
from toolgraph.retrieval.gnn import GNNConfig, GNNRetriever
from toolgraph.tasks.base import RetrievalTask


@accepts_renamed
@dataclass
class GraphTaskConfig(TaskConfig):
    renamed: ClassVar[dict[str, str]] = {"cache_dir": "encoder.cache_dir"}  # before the encoder was one spec
    name: str = "graph"
    gnn: Literal["lightgcn", "gat", "sage"] = "lightgcn"
    layers: int = bounded(2, ge=0)
    hidden: int = bounded(384, ge=1)  # GAT / SAGE width (LightGCN keeps the text dimension)
    heads: int = bounded(4, ge=1)  # GAT attention heads
    dropout: float = bounded(0.1, ge=0, lt=1)
    loss: Literal["infonce", "bpr"] = "infonce"
    temperature: float = bounded(0.05, gt=0)
    # the frozen encoder of the node features: name, pooling, normalize, cache_dir (its embedding cache);
    # node texts are truncated by data.max_tool_length / data.eval_max_query_length
    encoder: TextEncoderSpec = field(default_factory=TextEncoderSpec)
    tool_text: ToolText = "default"
    edges: list[Literal["invokes", "depends_on", "belongs_to"]] = field(default_factory=lambda: list(EDGE_KINDS))
    dependencies: str = "gold"  # gold (the dataset's) | an edges.jsonl / graph folder from `toolgraph graph build`
    dependency_threshold: float = bounded(0.5, ge=0, le=1)
    hide_batch_edges: bool = True  # score training queries as isolated nodes (as at test time)

    def validate(self):
        yield from unread_keys(self.encoder, TextEncoderSpec(),
                               ("max_length", "max_query_length", "query_prefix", "doc_prefix"),
                               "node texts are truncated by data.max_tool_length and data.eval_max_query_length, "
                               "without a prefix")


def text_dim(encoder: str) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(resolve_model(encoder), trust_remote_code=False).hidden_size)


@TASKS.register("graph")
class GraphTask(RetrievalTask):
    Config = GraphTaskConfig

    def build(self, artifacts: dict[str, Any] | None) -> None:
        m = self.model_cfg
        self.dim = int(artifacts["dim"]) if artifacts else text_dim(m.encoder.name)
        self.gnn = build_gnn(m.gnn, self.dim, m.layers, m.hidden, m.heads, m.dropout)
        self.graph: ToolGraph | None = None
        self._x: dict[str, torch.Tensor] = {}  # the graph on this module's device (moved once)
        self._edges: dict[tuple[str, str, str], torch.Tensor] = {}
        self._scored: tuple[torch.Tensor, torch.Tensor] | None = None

    def node_text(self) -> NodeText:
        """The node features' encoder with this run's lengths (tool documents, queries kept long)."""
        d = self.cfg.data
        spec = replace(self.model_cfg.encoder, max_length=d.max_tool_length, max_query_length=d.eval_max_query_length)
        return NodeText(encoder=spec, tool_text=self.model_cfg.tool_text)

    # ---- data ---------------------------------------------------------------------------------
    def build_graph(self, ds: ToolDataset) -> ToolGraph:
        m = self.model_cfg
        return build_graph(ds, text_embedder(self.node_text()), m.edges, m.dependencies,
                           m.dependency_threshold, query_max_length=self.cfg.data.eval_max_query_length)

    def make_datamodule(self, ds: ToolDataset, data_cfg: Any, seed: int) -> L.LightningDataModule:
        self.graph = self.build_graph(ds)
        self.gnn.fit_features(torch.cat([self.graph.data["query"].x, self.graph.data["tool"].x]))
        return graph_datamodule(ds, self.graph, data_cfg, seed)

    def _graph_on_device(self) -> tuple[dict[str, torch.Tensor], dict[tuple[str, str, str], torch.Tensor]]:
        if self.graph is None:
            raise RuntimeError("GraphTask: no graph; train through datamodule_for() (train.py)")
        if not self._x or next(iter(self._x.values())).device != self.device:
            self._x = {t: v.to(self.device) for t, v in self.graph.x_dict().items()}
            self._edges = {e: v.to(self.device) for e, v in self.graph.edge_index_dict().items()}
        return self._x, self._edges

    # ---- training -----------------------------------------------------------------------------
    def compute_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        x, edges = self._graph_on_device()
        qidx = batch["query_index"]  # [B]
        if self.model_cfg.hide_batch_edges:
            edges = without_queries_edges(edges, qidx, x["query"].shape[0])
        out = self.gnn(x, edges)
        q = F.normalize(out["query"][qidx], dim=-1)  # [B, H]
        t = F.normalize(out["tool"], dim=-1)  # [N, H]
        n = t.shape[0]
        if self.model_cfg.loss == "infonce":
            mask = false_negative_mask(batch["gold"], torch.arange(n, device=self.device), batch["positive"])
            loss = info_nce(q, t, batch["positive"], self.model_cfg.temperature, mask)
        else:
            neg = self._negatives(batch["gold"], n)  # [B]
            pos_s = (q * t[batch["positive"]]).sum(-1)
            neg_s = (q * t[neg]).sum(-1)
            loss = -F.logsigmoid((pos_s - neg_s) / self.model_cfg.temperature).mean()
        # outputs no loss reads (e.g. agent nodes after the last layer) stay in the autograd graph
        # with zero weight, so DDP finds a gradient for every parameter
        return loss + 0.0 * sum(v.sum() for v in out.values())

    def _negatives(self, gold: torch.Tensor, n: int) -> torch.Tensor:
        """One uniform tool per query that is not among its gold tools (re-drawn until it is not)."""
        neg = torch.randint(0, n, (gold.shape[0],), device=gold.device)
        for _ in range(20):
            bad = (gold == neg.unsqueeze(1)).any(1)
            if not bad.any():
                break
            neg[bad] = torch.randint(0, n, (int(bad.sum()),), device=gold.device)
        return neg

    # ---- retrieval ----------------------------------------------------------------------------
    @torch.no_grad()
    def prepare_scoring(self) -> None:
        x, edges = self._graph_on_device()
        out = self.gnn(x, edges)
        self._scored = (F.normalize(out["query"], dim=-1), F.normalize(out["tool"], dim=-1))

    def score(self, batch: dict[str, Any]) -> torch.Tensor:
        q, t = self._scored
        return q[batch["query_index"]] @ t.T  # [B, N]

    # ---- export -------------------------------------------------------------------------------
    def checkpoint_artifacts(self) -> dict[str, Any]:
        return {"dim": self.dim}

    def as_retriever(self, tools: list | None = None) -> Any:
        """The trained GNN as an in-memory ``gnn`` retriever. From a bare checkpoint
        (``toolgraph.load(best.ckpt)``) the graph is rebuilt from the run's data section (cached
        features); the catalog is that graph's tools unless ``tools`` is given."""
        m = self.model_cfg
        if self.graph is None:
            self.graph = self.build_graph(prepare_dataset(self.cfg.data))
        was_training = self.gnn.training
        self.gnn.eval()
        with torch.no_grad():
            x, edges = self._graph_on_device()
            tool_out = self.gnn(x, edges)["tool"].cpu()
        self.gnn.train(was_training)
        graph_tools = {t.id: v for t, v in zip(self.graph.tools, tool_out, strict=True)}
        cfg = GNNConfig(gnn=m.gnn, dim=self.dim, layers=m.layers, hidden=m.hidden, heads=m.heads,
                        encoder=self.node_text().encoder, tool_text=m.tool_text)
        r = GNNRetriever(cfg, copy.deepcopy(self.gnn).cpu().eval(), graph_tools)
        r.index(self.graph.tools if tools is None else tools)
        return r

    def finish(self, out: Path, dm: L.LightningDataModule, extra: Any = None) -> dict[str, Any]:
        save_graph_stats(self.graph, out)
        return super().finish(out, dm, extra)  # results.json last
