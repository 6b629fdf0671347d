"""LoSemB (Zhuang et al., "Logic-Guided Semantic Bridging for Inductive Tool Retrieval", 2025).

Tools never seen in training are retrieved without retraining by transferring *logical features*
— how the query–tool graph moves a node away from its text embedding — from similar seen tools
and queries, and by pruning candidates to tools that similar past queries used.

    retriever:
      name: losemb
      layers: 2      # L
      top_j: 10      # J: similar training queries (tool identification, query transfer)
      top_i: 20      # I: similar training queries whose tools stay candidates

Notation: X = frozen text embeddings (L2-normalised), E = LightGCN output over the training
graph (mean of the L+1 layer outputs, eq. 3-5; ``graph: <run>`` takes the adapters of a trained
``model.gnn: lightgcn`` run, otherwise propagation is parameter-free).

* logical features (eq. 6): dE = E - X for training queries and for tools with invocations;
* similar-tool identification (eq. 7): a tool without invocations takes its top-J most similar
  training queries S_t (cosine of its document to the queries) and propagates them through the
  invoke matrix R: f = sum_{q in S_t} R[q] counts how often each seen tool serves them;
* tool transfer (eq. 8-9): dE_t = sum_s (f_s / sum f) dE_s;
* query transfer (eq. 10-11): a new query takes the top-J similar training queries, weights
  w = softmax(cos / temperature), dE_q = sum w dE_q';
* logical pruning (eq. 13): candidates = tools invoked by the top-I similar training queries,
  where an unseen tool counts as "invoked" by its S_t; non-candidates rank below every candidate
  (the list stays complete for the metrics);
* graph-enhanced similarity (eq. 14): s = (1 - alpha) cos(X_q + dE_q, X_t + dE_t) + alpha cos(X_q, X_t).

``add_tools(tools, example_queries=None)``: a new tool with example requests uses the training
queries nearest to *those requests* as S_t (query-to-query similarity is more reliable than
document-to-query), and each example becomes a pruning row that invokes the new tool. Without
examples the tool's document finds S_t (the default unseen-tool path above). Nothing is retrained.

The paper's equations were not available offline; this follows the method description in its
abstract and the issue (eq. numbers as cited there). Choices made here: dE is measured from the
text embedding X (so a new node, which only has X, lives in the same space); J serves both
transfers; alpha (default 0) blends in plain semantic similarity.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from toolgraph.config import TextEncoderSpec, accepts_renamed, bounded, encoder_spec
from toolgraph.data.formats import read_json
from toolgraph.data.schema import Tool, ToolDataset
from toolgraph.errors import ConfigError, DataError
from toolgraph.nn.storage import read_matrix, read_tensors
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Retriever, RetrieverConfig
from toolgraph.retrieval.dense import NODE_TEXT_KEYS, text_embedder


@accepts_renamed
@dataclass
class LoSemBConfig(RetrieverConfig):
    name: str = "losemb"
    encoder: TextEncoderSpec = field(default_factory=encoder_spec(max_length=128, max_query_length=128))
    layers: int = bounded(2, ge=0)  # L
    top_j: int = bounded(10, ge=1)  # J
    top_i: int = bounded(20, ge=1)  # I
    temperature: float = bounded(0.05, gt=0)  # softmax of eq. 10
    alpha: float = bounded(0.0, ge=0)  # weight of the plain semantic cosine in eq. 14
    edges: list[str] = field(default_factory=lambda: ["invokes"])  # graph of the logical features
    dependencies: str = "gold"  # when edges has depends_on: gold | an edges.jsonl
    graph: str | None = None  # a trained `model.gnn: lightgcn` run folder; None = parameter-free
    no_query_transfer: bool = False  # ablation: new queries get no logical feature
    no_tool_transfer: bool = False  # ablation: unseen tools get no logical feature
    no_relational_retrieval: bool = False  # ablation: no pruning, plain cosine of the aligned embeddings
    prune_unseen: bool = True  # false: tools without training queries are always candidates (only seen ones pruned)

    renamed: ClassVar[dict[str, str]] = NODE_TEXT_KEYS


@RETRIEVERS.register("losemb")
class LoSemBRetriever(Retriever):
    Config = LoSemBConfig
    name = "losemb"

    def __init__(self, config: LoSemBConfig | None = None):
        super().__init__(config)
        c = self.config
        if c.top_j < 1 or c.top_i < 1 or c.layers < 0:
            raise ConfigError(f"retriever: top_j and top_i must be >= 1 and layers >= 0 (got {c.top_j}, {c.top_i}, "
                              f"{c.layers})")
        self._embedder = None
        self.query_x = torch.zeros(0, 0)  # [n_q, D] training queries (+ example queries), normalised
        self.query_delta = torch.zeros(0, 0)  # [n_q, D] their logical features
        self.query_tools: list[list[str]] = []  # tools each row invokes
        self.seen_delta: dict[str, torch.Tensor] = {}  # tool id -> dE from the graph
        self.examples: dict[str, list[str]] = {}  # tool id -> example requests (add_tools)
        self.n_train = 0  # rows of query_x from fit(); the rest are example requests
        self.text_vectors: dict[str, torch.Tensor] = {}  # tool id -> X_t, so add_tools encodes only new tools
        # set by _build
        self.tool_x = torch.zeros(0, 0)
        self.tool_e = torch.zeros(0, 0)
        self.users = torch.zeros(0, 0, dtype=torch.bool)  # [n_q, N] row q "invokes" tool n (pruning)
        self.transferred: list[bool] = []

    # ---- text -----------------------------------------------------------------------------------
    @property
    def embedder(self):
        if self._embedder is None:
            self._embedder = text_embedder(self.config)
        return self._embedder

    def _queries_x(self, texts: Sequence[str]) -> torch.Tensor:
        return F.normalize(self.embedder.embed(list(texts), "encoding queries", self.config.encoder.max_query_length), dim=-1)

    # ---- logical features from the training graph (eq. 3-6) ------------------------------------
    def fit(self, dataset: ToolDataset) -> None:
        from toolgraph.data.graph import build_graph  # PyG, only when a graph is built
        from toolgraph.nn.gnn import build_gnn

        c = self.config
        train = dataset.split("train")
        if not train:
            raise DataError(f"losemb: {dataset.name!r} has no train queries to learn logical features from")
        ds = ToolDataset(dataset.name, dataset.tools, train, dataset.agents, dataset.dependencies)
        graph = build_graph(ds, self.embedder, c.edges, c.dependencies, query_max_length=c.encoder.max_query_length)
        gnn = self._trained_lightgcn() or build_gnn("lightgcn", graph.data["tool"].x.shape[1], c.layers)
        x = {t: F.normalize(v, dim=-1) if v.numel() else v for t, v in graph.x_dict().items()}
        with torch.no_grad():
            e = gnn.eval()(x, graph.edge_index_dict())
        self.query_x = x["query"]
        self.query_delta = e["query"] - x["query"]  # [n_q, D]
        self.query_tools = [list(q.tools) for q in train]
        invoked = {t for q in train for t in q.tools}
        delta_t = e["tool"] - x["tool"]
        self.seen_delta = {t.id: delta_t[i] for i, t in enumerate(graph.tools) if t.id in invoked}
        self.examples, self.n_train = {}, len(train)

    def _trained_lightgcn(self):
        if self.config.graph is None:
            return None
        from toolgraph.retrieval.gnn import GNNRetriever

        folder = Path(self.config.graph)
        folder = folder / "retriever" if (folder / "retriever").is_dir() else folder
        r = Retriever.load(folder)
        if not isinstance(r, GNNRetriever) or r.config.gnn != "lightgcn":
            raise ConfigError(f"retriever.graph: {str(folder)!r} is not a trained model.gnn=lightgcn run")
        if r.config.layers != self.config.layers:
            raise ConfigError(f"retriever.layers={self.config.layers} but the graph run has layers={r.config.layers}")
        return r.gnn

    # ---- index: tool transfer (eq. 7-9) ---------------------------------------------------------
    def _build(self) -> None:
        if not self.n_train:
            raise RuntimeError("losemb: fit(dataset) (or load) before index(tools)")
        c = self.config
        new = [t for t in self.tools if t.id not in self.text_vectors]
        if new:
            vecs = F.normalize(self.embedder.embed(self.documents(new), "encoding tools"), dim=-1)
            self.text_vectors.update(zip((t.id for t in new), vecs, strict=True))
        self.tool_x = torch.stack([self.text_vectors[t.id] for t in self.tools])  # [N, D]
        col = {t.id: i for i, t in enumerate(self.tools)}
        n_q, n = self.query_x.shape[0], len(self.tools)
        users = torch.zeros(n_q, n, dtype=torch.bool)
        for r, tools in enumerate(self.query_tools):
            for t in tools:
                if t in col:
                    users[r, col[t]] = True
        seen_ids = [t.id for t in self.tools if t.id in self.seen_delta]
        seen_delta = torch.stack([self.seen_delta[i] for i in seen_ids]) if seen_ids else torch.zeros(0, self.tool_x.shape[1])
        seen_users = users[:, [col[i] for i in seen_ids]].float()  # [n_q, S]: R restricted to seen tools
        train_x = self.query_x[: self.n_train]
        delta = torch.zeros_like(self.tool_x)
        self.transferred = []
        for i, t in enumerate(self.tools):
            if t.id in self.seen_delta:
                delta[i] = self.seen_delta[t.id]
                self.transferred.append(False)
                continue
            probes = self._queries_x(self.examples[t.id]) if t.id in self.examples else self.tool_x[i: i + 1]
            near = (probes @ train_x.T).topk(min(c.top_j, self.n_train), dim=1).indices.flatten().unique()  # S_t
            users[near if c.prune_unseen else slice(None), i] = True  # counts as used by S_t (or by every row)
            freq = seen_users[near].sum(0)  # [S]  eq. 7
            if not c.no_tool_transfer and freq.sum() > 0:
                delta[i] = (freq / freq.sum()) @ seen_delta  # eq. 8-9
            self.transferred.append(True)
        self.users = users
        self.tool_e = self.tool_x + delta  # [N, D]

    # ---- retrieval: query transfer (eq. 10-11), pruning (13), similarity (14) ------------------
    def score(self, queries: list[str]) -> torch.Tensor:
        c = self.config
        xq = self._queries_x(queries)  # [Q, D]
        sims = xq @ self.query_x.T  # [Q, n_q]
        eq = xq
        if not c.no_query_transfer:
            top = sims[:, : self.n_train].topk(min(c.top_j, self.n_train), dim=1)
            w = torch.softmax(top.values / c.temperature, dim=1)  # [Q, J]  eq. 10
            eq = xq + torch.einsum("qj,qjd->qd", w, self.query_delta[top.indices])  # eq. 11
        s = F.normalize(eq, dim=-1) @ F.normalize(self.tool_e, dim=-1).T  # [Q, N]  eq. 14
        if c.alpha:
            s = (1 - c.alpha) * s + c.alpha * (xq @ self.tool_x.T)
        if c.no_relational_retrieval:
            return s
        near = sims.topk(min(c.top_i, sims.shape[1]), dim=1).indices  # [Q, I]
        candidate = self.users[near].any(1)  # [Q, N]  eq. 13
        return torch.where(candidate, s, s - 4.0)  # cosines lie in [-1, 1]: every candidate ranks first

    # ---- live index ----------------------------------------------------------------------------
    def add_tools(self, tools: Iterable[Tool], example_queries: Mapping[str, Sequence[str]] | None = None) -> None:
        """Index new tools without retraining; ``example_queries``: tool id -> example requests."""
        new = list(tools)
        examples = {k: list(v) for k, v in (example_queries or {}).items() if v}
        unknown = set(examples) - {t.id for t in new}
        if unknown:
            raise DataError(f"add_tools: example_queries for tools not being added: {sorted(unknown)[:5]}")
        if examples:
            texts = [q for tid in examples for q in examples[tid]]
            owners = [tid for tid in examples for _ in examples[tid]]
            xq = self._queries_x(texts)
            top = (xq @ self.query_x[: self.n_train].T).topk(min(self.config.top_j, self.n_train), dim=1)
            w = torch.softmax(top.values / self.config.temperature, dim=1)
            dq = torch.einsum("qj,qjd->qd", w, self.query_delta[top.indices])  # the examples' own transfer
            self.query_x = torch.cat([self.query_x, xq])
            self.query_delta = torch.cat([self.query_delta, dq])
            self.query_tools += [[tid] for tid in owners]
            self.examples.update(examples)
        super().add_tools(new)

    def remove_tools(self, ids: Iterable[str]) -> None:
        drop = set(ids)
        for tid in drop:
            self.examples.pop(tid, None)
            self.seen_delta.pop(tid, None)
            self.text_vectors.pop(tid, None)
        super().remove_tools(drop)

    # ---- persistence ---------------------------------------------------------------------------
    def _save_state(self, folder: Path) -> None:
        seen = sorted(self.seen_delta)
        tensors = {"query_x": self.query_x, "query_delta": self.query_delta, "tool_x": self.tool_x,
                   "seen_delta": torch.stack([self.seen_delta[i] for i in seen]) if seen else torch.zeros(0)}
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "losemb.safetensors"))
        state = {"n_train": self.n_train, "query_tools": self.query_tools, "seen": seen, "examples": self.examples}
        (folder / "losemb.json").write_text(json.dumps(state) + "\n")

    def _load_state(self, folder: Path) -> None:
        path, state_path = folder / "losemb.safetensors", folder / "losemb.json"
        t = read_tensors(path)  # in memory: the file may be rewritten under a running server
        state = read_json(state_path)
        if not isinstance(state, dict) or any(k not in state for k in ("n_train", "query_tools", "seen", "examples")):
            raise DataError("expected an object with n_train, query_tools, seen, examples; re-save the retriever",
                            state_path)
        n_queries = len(state["query_tools"])
        self.query_x = read_matrix(path, "query_x", n_queries, "queries of losemb.json", t)
        d, of = (self.query_x.shape[1] if n_queries else None), "the query_x vectors"  # one space for all
        self.query_delta = read_matrix(path, "query_delta", n_queries, "queries of losemb.json", t, d, of)
        seen = read_matrix(path, "seen_delta", len(state["seen"]), "seen tools of losemb.json", t, d, of) \
            if state["seen"] else None
        self.seen_delta = dict(zip(state["seen"], seen, strict=True)) if seen is not None else {}
        self.n_train, self.query_tools, self.examples = state["n_train"], state["query_tools"], state["examples"]
        tool_x = read_matrix(path, "tool_x", len(self.tools), "tools", t, d, of)
        self.text_vectors = dict(zip((tool.id for tool in self.tools), tool_x, strict=True))
        self._build()

    # ---- analysis --------------------------------------------------------------------------------
    def alignment_kl(self, dims: int = 16, shrink: float = 1e-3) -> dict[str, float]:
        """KL(unseen || seen) between tool-embedding distributions, before and after alignment
        (paper Table 5). Estimator: project onto the top ``dims`` principal axes of the seen tools'
        graph embeddings E, fit a Gaussian to each set (covariance + ``shrink`` * I, so a set with
        fewer points than dims stays well-defined) and take the closed form. Seen = X + dE (graph);
        unseen before = X, after = X + transferred dE."""
        mask = torch.tensor(self.transferred)
        if mask.all() or not mask.any():
            raise DataError("alignment_kl: needs both seen and unseen tools in the index")
        seen = self.tool_e[~mask]
        centered = seen - seen.mean(0)
        _, _, v = torch.linalg.svd(centered, full_matrices=False)
        basis = v[: min(dims, v.shape[0])].T  # [D, d]
        return {"before": gaussian_kl(self.tool_x[mask] @ basis, seen @ basis, shrink),
                "after": gaussian_kl(self.tool_e[mask] @ basis, seen @ basis, shrink)}


def gaussian_kl(a: torch.Tensor, b: torch.Tensor, shrink: float = 1e-3) -> float:
    """KL(N(mu_a, S_a) || N(mu_b, S_b)) of Gaussians fitted to the rows of a [n, d] and b [m, d]."""
    a, b = a.double(), b.double()
    d = a.shape[1]
    eye = torch.eye(d, dtype=torch.float64)
    sa = torch.cov(a.T).reshape(d, d) + shrink * eye if a.shape[0] > 1 else shrink * eye
    sb = torch.cov(b.T).reshape(d, d) + shrink * eye if b.shape[0] > 1 else shrink * eye
    diff = (b.mean(0) - a.mean(0)).unsqueeze(1)
    sb_inv = torch.linalg.inv(sb)
    kl = 0.5 * (torch.trace(sb_inv @ sa) + (diff.T @ sb_inv @ diff).item() - d
                + torch.logdet(sb).item() - torch.logdet(sa).item())
    return float(kl)
