"""The heterogeneous query–tool–agent graph (PyG ``HeteroData``) and its datamodule.

Nodes: every query of the dataset (all splits; only *training* queries get edges, so val/test
queries are isolated nodes scored from their text alone), every tool, every agent. Edges:

* query –invokes→ tool for each training query's gold tools (+ ``rev_invokes``);
* tool –depends_on→ tool (the dependent tool points at its prerequisite; + reverse) from the
  dataset's dependencies (``gold``; keep test chains out with ``data.options.dependency_splits``)
  or a TGR ``edges.jsonl`` (``toolgraph graph build``);
* tool –belongs_to→ agent (+ reverse) from each tool's owner.

Node features are text embeddings from a frozen encoder that the caller passes in (a
``retrieval.dense.text_embedder``, read through the embedding cache: a second run encodes nothing).
Training is full-batch: every step runs the GNN over the whole graph
and scores a batch of training queries against every tool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import lightning as L
import torch
from torch.utils.data import DataLoader, Sampler
from torch_geometric.data import HeteroData

from toolgraph.data.formats import read_edges
from toolgraph.data.schema import Tool, ToolDataset, natural_key
from toolgraph.data.text import ContrastiveBatchSampler, ResumableDataModule, _Identity, pad_gold
from toolgraph.errors import ConfigError
from toolgraph.nn.gnn import EDGE_TYPES, INVOKES

EDGE_KINDS = ("invokes", "depends_on", "belongs_to")


class TextEmbedder(Protocol):
    """What the graph builder needs to make node features (``retrieval.dense.text_embedder`` gives one)."""

    def embed(self, texts: list[str], what: str = "encoding", max_length: int | None = None) -> torch.Tensor:
        """texts -> [len, D]"""

    def documents(self, tools: Sequence[Tool] | None = None) -> list[str]:
        """the text of each tool"""


@dataclass
class ToolGraph:
    """A HeteroData plus the id <-> index maps that give its rows meaning."""

    data: HeteroData
    tools: list[Tool]
    query_ids: list[str]
    query_split: list[str]
    gold: list[list[int]]  # per query node: gold tool indices
    agents: list[str]
    stats: dict[str, Any] = field(default_factory=dict)

    def split_index(self, split: str) -> list[int]:
        return [i for i, s in enumerate(self.query_split) if s == split]

    def x_dict(self) -> dict[str, torch.Tensor]:
        return {t: self.data[t].x for t in self.data.node_types}

    def edge_index_dict(self) -> dict[tuple[str, str, str], torch.Tensor]:
        return {e: self.data[e].edge_index for e in self.data.edge_types}


def read_dependency_edges(ds: ToolDataset, source: str, threshold: float = 0.5) -> list[tuple[str, str]]:
    """(dependent, prerequisite) pairs: the dataset's own (``gold``) or an edges.jsonl / graph folder."""
    if source == "gold":
        return [(d.source, d.target) for d in ds.dependencies]
    known = {t.id for t in ds.tools}
    return [(a, b) for a, b in read_edges(source, threshold) if a in known and b in known]


def build_graph(ds: ToolDataset, embedder: TextEmbedder, edges: Sequence[str] = EDGE_KINDS,
                dependencies: str = "gold", dependency_threshold: float = 0.5,
                query_max_length: int | None = None) -> ToolGraph:
    """The graph of ``ds``; node features from ``embedder`` (queries truncated at ``query_max_length``)."""
    unknown = set(edges) - set(EDGE_KINDS)
    if unknown:
        raise ConfigError(f"model.edges: unknown edge kinds {sorted(unknown)}; expected some of {EDGE_KINDS}")
    tools = sorted(ds.tools, key=lambda t: natural_key(t.id))
    tool_index = {t.id: i for i, t in enumerate(tools)}
    queries = list(ds.queries)
    agents = sorted({t.agent for t in tools if t.agent is not None}, key=natural_key)
    agent_index = {a: i for i, a in enumerate(agents)}
    agent_text = {a.id: f"{a.name}: {a.description}".strip(": ") for a in ds.agents}

    data = HeteroData()
    data["query"].x = embedder.embed([q.text for q in queries], "encoding queries", query_max_length)
    data["tool"].x = embedder.embed(embedder.documents(tools), "encoding tools")
    dim = data["tool"].x.shape[1]
    data["agent"].x = embedder.embed([agent_text.get(a, a) for a in agents], "encoding agents") if agents \
        else torch.zeros(0, dim)

    gold = [[tool_index[t] for t in q.tools] for q in queries]
    pairs: dict[tuple[str, str, str], list[tuple[int, int]]] = {e: [] for e in EDGE_TYPES}
    if "invokes" in edges:
        pairs[INVOKES] = [(qi, ti) for qi, q in enumerate(queries) if q.split == "train" for ti in gold[qi]]
    if "depends_on" in edges:
        deps = read_dependency_edges(ds, dependencies, dependency_threshold)
        pairs[("tool", "depends_on", "tool")] = sorted({(tool_index[a], tool_index[b]) for a, b in deps if a != b})
    if "belongs_to" in edges:
        pairs[("tool", "belongs_to", "agent")] = [(i, agent_index[t.agent]) for i, t in enumerate(tools)
                                                  if t.agent is not None]
    forward = [e for e in EDGE_TYPES if not e[1].startswith("rev_")]
    for e in forward:
        ei = torch.tensor(pairs[e], dtype=torch.long).reshape(-1, 2).T.contiguous()  # [2, E]
        data[e].edge_index = ei
        data[(e[2], f"rev_{e[1]}", e[0])].edge_index = ei.flip(0)
    stats = {"queries": len(queries), "tools": len(tools), "agents": len(agents),
             **{e[1]: len(pairs[e]) for e in forward},
             "tools_without_invocations": len(tools) - len({t for _, t in pairs[INVOKES]})}
    return ToolGraph(data, tools, [q.id for q in queries], [q.split for q in queries], gold, agents, stats)


def without_queries_edges(edges: dict[tuple[str, str, str], torch.Tensor], hide: torch.Tensor,
                          num_queries: int) -> dict[tuple[str, str, str], torch.Tensor]:
    """``edges`` with every invoke edge of the query nodes in ``hide`` removed, so the queries
    scored in a training step are isolated, exactly as a new query is at test time. Works on
    whatever device the edges live on (no copy of the graph per step)."""
    out = dict(edges)
    inv = out[INVOKES]
    mask = torch.zeros(num_queries, dtype=torch.bool, device=inv.device)
    mask[hide.to(inv.device)] = True
    kept = inv[:, ~mask[inv[0]]]
    out[INVOKES] = kept
    out[("tool", "rev_invokes", "query")] = kept.flip(0)
    return out


class GraphBatchCollator:
    """(query position among training queries, tool, -1) triples -> node indices + padded gold."""

    def __init__(self, query_nodes: list[int], gold: list[list[int]]):
        self.query_nodes, self.gold = query_nodes, gold

    def __call__(self, items: list[Any]) -> dict[str, Any]:
        if items and isinstance(items[0], tuple):
            nodes = [self.query_nodes[q] for q, _, _ in items]
            positive = torch.tensor([t for _, t, _ in items])
        else:
            nodes, positive = [self.query_nodes[q] for q in items], None
        out = {"query_index": torch.tensor(nodes), "gold": pad_gold([self.gold[n] for n in nodes])}  # [B], [B, G]
        if positive is not None:
            out["positive"] = positive  # [B]
        return out


class GraphDataModule(ResumableDataModule):
    """Training: seeded, rank-sharded batches of (training query, one gold tool); val/test: batches
    of query node indices. The graph itself is held by the task and moved to its device once."""

    def __init__(self, dataset: ToolDataset, graph: ToolGraph, batch_size: int, eval_batch_size: int,
                 val_split: str = "val", test_split: str = "test", seed: int = 0):
        super().__init__()
        self.ds, self.graph, self.seed = dataset, graph, seed
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.val_split, self.test_split = val_split, test_split
        self.tools = graph.tools
        self.train_nodes = graph.split_index("train")
        self.train_queries = self.train_nodes  # what training.train() checks is non-empty

    def train_size(self) -> int:
        return len(self.train_nodes)

    def train_sampler(self, rank: int, world: int) -> Sampler:
        gold = [self.graph.gold[n] for n in self.train_nodes]
        return ContrastiveBatchSampler(gold, min(self.batch_size, len(gold)), self.seed, rank, world)

    def train_collator(self) -> Any:
        return GraphBatchCollator(self.train_nodes, self.graph.gold)

    def _eval_loader(self, split: str) -> DataLoader:
        rank, world = self._rank_world()
        nodes = self.graph.split_index(split)[rank::world]  # shard by rank; metric states are summed
        return DataLoader(_Identity(len(nodes)), batch_size=self.eval_batch_size,
                          collate_fn=GraphBatchCollator(nodes, self.graph.gold))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_split)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_split)


def graph_datamodule(ds: ToolDataset, graph: ToolGraph, cfg: Any, seed: int) -> L.LightningDataModule:
    return GraphDataModule(ds, graph, cfg.batch_size, cfg.eval_batch_size, cfg.val_split, cfg.test_split, seed)


def save_graph_stats(graph: ToolGraph, folder: Path) -> None:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "graph.json").write_text(json.dumps(graph.stats, indent=2) + "\n")
