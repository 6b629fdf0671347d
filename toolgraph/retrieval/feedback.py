"""An index that learns from its own usage: the logged requests nearest a query vote for the tools they used.

    toolgraph index feedback agent_log.jsonl --index runs/mcp_index

A ``feedback`` retriever holds the index's own retriever (``base/``, any retriever: t2a, dense, bm25, a
trained export) and a store of logged requests (``log.jsonl``: query text, the tool ids called, ok,
time; ``log_vectors.safetensors``: the queries' vectors). A query is scored by

    score(t) = minmax(base(t)) + weight * gate * votes(t)

- each of the ``neighbors`` logged queries nearest the query (cosine) counts
  ``c_e = exp((cos_e - 1) / kernel)`` (1 for the same text, ~0 for an unrelated one), times 1 for a
  successful task and ``failed_weight`` for a failed one;
- ``votes(t)``: the share of that count whose request called ``t`` (in [0, 1]);
- ``gate = E / (E + prior)``, ``E`` the summed count: the evidence near the query. With no logged
  request close to it the gate is ~0 and the base ranking is served unchanged (min-max keeps its
  order); with many close ones it tends to 1 and the log decides, the base ordering what it does not.

The constants were chosen by replaying each benchmark's training queries as a log and scoring val
(``benchmarks/feedback_bench.py replay``; docs/agents-and-serving.md, "Learning from usage"). The
neighbour vectors come from the base's own encoder (a dense index's, an agent index's dense member),
or ``encoder`` (default all-MiniLM-L6-v2 when the base has none, e.g. BM25).

Agent routers (t2a, ...) keep their agent ranking: an agent's votes are its tools' (the agents of the
tools a neighbour called), fused the same way over the router's own agent scores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import save_file

from toolgraph.config import bounded
from toolgraph.data.formats import iter_jsonl
from toolgraph.data.schema import ToolDataset
from toolgraph.data.usage_log import Entry, parse_entry
from toolgraph.errors import ConfigError, DataError
from toolgraph.nn.storage import read_matrix
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Ranking, Retriever, RetrieverConfig
from toolgraph.retrieval.manifest import mark_writing
from toolgraph.retrieval.topk import topk

LOG = "log.jsonl"
VECTORS = "log_vectors.safetensors"
FALLBACK_ENCODER = "all-MiniLM-L6-v2"


@dataclass
class FeedbackConfig(RetrieverConfig):
    name: str = "feedback"
    base: Any = None  # the index's own retriever: a saved folder (base/ once saved) or a config
    encoder: str | None = None  # neighbour vectors' encoder; None: the base's own (all-MiniLM-L6-v2 if it has none)
    # the defaults: chosen by replay on the val splits of ToolLens, MetaTool, UltraTool and ToolLinkOS
    # (benchmarks/feedback_bench.py replay; a grid of 480, benchmarks/results/feedback_grid.json)
    neighbors: int = bounded(20, ge=1)  # logged queries that vote
    kernel: float = bounded(0.1, gt=0)  # a neighbour at cosine c counts exp((c - 1) / kernel)
    prior: float = bounded(0.1, gt=0)  # gate = evidence / (evidence + prior)
    weight: float = bounded(8.0, ge=0)  # the votes' weight at a full gate, over the base score min-max normalised
    failed_weight: float = bounded(0.0, ge=0, le=1)  # a failed task's calls vote with this weight (0: kept out)
    max_queries: int = bounded(200_000, ge=1)  # the store's cap: the oldest entries are dropped first

    retriever_slots: ClassVar[tuple[str, ...]] = ("base",)


def minmax(scores: torch.Tensor) -> torch.Tensor:
    """Each row to [0, 1] (a constant row: all 0), order kept."""
    low = scores.min(dim=1, keepdim=True).values
    span = scores.max(dim=1, keepdim=True).values - low
    return (scores - low) / span.clamp_min(1e-12)


def nearest(queries: torch.Tensor, log_vectors: torch.Tensor, log_weights: torch.Tensor, neighbors: int,
            kernel: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``neighbors`` logged vectors nearest each query: their positions [Q, k] and counts [Q, k]
    (``exp((cos - 1) / kernel)`` times their weight: 1 ok, ``failed_weight`` failed)."""
    sims, idx = (queries @ log_vectors.T).topk(min(neighbors, len(log_vectors)), dim=1)
    return idx, torch.exp((sims.clamp(max=1.0) - 1.0) / kernel) * log_weights[idx]


def tally(idx: torch.Tensor, counts: torch.Tensor, log_items: torch.Tensor, n_items: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``votes`` [Q, n_items] (each item's share of the neighbours' count) and ``evidence`` [Q] (the summed
    count); ``log_items``: [E, G] item positions each logged request used, -1 padded."""
    evidence = counts.sum(dim=1)
    items = log_items[idx]  # [Q, k, G]
    votes = torch.zeros(len(idx), n_items + 1)  # the last column takes the padding
    votes.scatter_add_(1, items.where(items >= 0, n_items).flatten(1), counts.unsqueeze(2).expand_as(items).flatten(1))
    return votes[:, :n_items] / evidence.clamp_min(1e-30).unsqueeze(1), evidence


def neighbour_votes(queries: torch.Tensor, log_vectors: torch.Tensor, log_items: torch.Tensor,
                    log_weights: torch.Tensor, n_items: int, neighbors: int, kernel: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tally` of the :func:`nearest` logged requests (zeros for an empty log)."""
    if len(log_vectors) == 0:
        return torch.zeros(len(queries), n_items), torch.zeros(len(queries))
    return tally(*nearest(queries, log_vectors, log_weights, neighbors, kernel), log_items, n_items)


def fuse(base_scores: torch.Tensor, votes: torch.Tensor, evidence: torch.Tensor, prior: float,
         weight: float) -> torch.Tensor:
    """``minmax(base) + weight * gate * votes``, ``gate = evidence / (evidence + prior)``."""
    gate = evidence / (evidence + prior)
    return minmax(base_scores) + (weight * gate).unsqueeze(1) * votes


@RETRIEVERS.register("feedback")
class FeedbackRetriever(Retriever):
    Config = FeedbackConfig
    name = "feedback"

    def __init__(self, config: FeedbackConfig | None = None, base: Retriever | None = None):
        super().__init__(config)
        self._base_retriever = base
        self._folder: Path | None = None
        self._encoder: Any = None
        self.entries: list[Entry] = []
        self.log_vectors = torch.zeros(0, 0)
        self._tool_items = self._agent_items = torch.zeros(0, 0, dtype=torch.long)
        if base is not None:
            self.tools = list(base.tools)

    # ---- members --------------------------------------------------------------------------------
    @property
    def base(self) -> Retriever:
        if self._base_retriever is None:
            from toolgraph.retrieval.loading import resolve_retriever

            if self.config.base is None:
                raise ConfigError("retriever.base is required for a feedback index: the retriever it learns over")
            self._base_retriever = resolve_retriever(self.config.base, "retriever.base", self._folder)
            if isinstance(self._base_retriever, FeedbackRetriever):
                raise ConfigError("retriever.base: a feedback index over another feedback index; give its base")
        return self._base_retriever

    @property
    def agents(self) -> list:
        return getattr(self.base, "agents", [])

    def neighbour_encoder(self) -> Any:
        """The dense retriever whose ``encode_queries`` gives the neighbour vectors."""
        if self._encoder is None:
            from toolgraph.retrieval.agents import AgentRetriever
            from toolgraph.retrieval.dense import DenseRetriever
            from toolgraph.retrieval.loading import resolve_retriever

            base = self.base
            if self.config.encoder is not None:
                self._encoder = resolve_retriever({"name": "dense", "encoder": self.config.encoder}, "retriever.encoder")
            elif isinstance(base, DenseRetriever):
                self._encoder = base
            elif isinstance(base, AgentRetriever) and (base.uses_dense or base.config.dense is not None):
                self._encoder = base.dense
            else:
                self._encoder = resolve_retriever({"name": "dense", "encoder": FALLBACK_ENCODER}, "retriever.encoder")
        return self._encoder

    # ---- the catalog: the base's ------------------------------------------------------------------
    def fit(self, dataset: ToolDataset) -> None:
        self.base.fit(dataset)

    def index(self, tools, agents=None) -> None:
        if agents is not None:
            self.base.index(tools, agents)
        else:
            self.base.index(tools)
        self.refresh()

    def add_tools(self, tools, *args) -> None:
        self.base.add_tools(tools, *args)
        self.refresh()

    def remove_tools(self, ids) -> None:
        self.base.remove_tools(ids)
        self.refresh()

    def refresh(self) -> None:
        """Take the base's catalog (after it was indexed or synced) and place the log's tools in it;
        logged tools no longer in the catalog stop voting (their entries stay in the store)."""
        self.tools = list(self.base.tools)
        pos = {t.id: i for i, t in enumerate(self.tools)}
        self._tool_items = item_matrix([[pos[t] for t in e.tools if t in pos] for e in self.entries])
        agents = {a.id: i for i, a in enumerate(self.agents)}
        owner = {t.id: t.agent for t in self.tools}
        self._agent_items = item_matrix([list(dict.fromkeys(agents[owner[t]] for t in e.tools
                                                        if owner.get(t) in agents)) for e in self.entries])

    # ---- the store --------------------------------------------------------------------------------
    def set_entries(self, entries: list[Entry]) -> int:
        """Replace the store with ``entries`` (oldest first, at most ``max_queries``: the oldest beyond it
        are dropped), encoding only the texts new to the store; returns how many were encoded."""
        entries = entries[max(0, len(entries) - self.config.max_queries):]
        known = dict(zip((e.query for e in self.entries), self.log_vectors))
        todo = list(dict.fromkeys(e.query for e in entries if e.query not in known))
        if todo:
            known.update(zip(todo, self.neighbour_encoder().encode_queries(todo)))
        self.entries = entries
        self.log_vectors = torch.stack([known[e.query] for e in entries]) if entries else torch.zeros(0, 0)
        self.refresh()
        return len(todo)

    def _weights(self) -> torch.Tensor:
        return torch.tensor([1.0 if e.ok else self.config.failed_weight for e in self.entries])

    # ---- scoring ------------------------------------------------------------------------------------
    def _nearest(self, queries: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.neighbour_encoder().encode_queries(queries)
        return nearest(q, self.log_vectors, self._weights(), self.config.neighbors, self.config.kernel)

    def _fuse(self, scores: torch.Tensor, found: tuple[torch.Tensor, torch.Tensor], items: torch.Tensor) -> torch.Tensor:
        votes, evidence = tally(*found, items, scores.shape[1])
        return fuse(scores, votes, evidence, self.config.prior, self.config.weight)

    def score(self, queries: list[str]) -> torch.Tensor:
        base = self._base_tool_scores(queries)
        if not self.entries:
            return base  # a cold index: the base's own scores
        return self._fuse(base, self._nearest(queries), self._tool_items)

    def _base_tool_scores(self, queries: list[str]) -> torch.Tensor:
        from toolgraph.retrieval.agents import AgentRetriever

        base = self.base
        if isinstance(base, AgentRetriever):
            return base.tool_scores(queries)
        return base.score(queries)

    def retrieve_agents(self, queries, k, steps=None, batch_size: int = 256, merge=None, progress=False) -> Ranking:
        from toolgraph.retrieval.agents import AgentRetriever

        if not isinstance(self.base, AgentRetriever):  # the fused tool ranking rolled up to owners
            return super().retrieve_agents(queries, k, steps, batch_size, merge, progress)
        if steps is None and self.entries:
            return self.retrieve_agents_and_tools(queries, k)[0]
        return self.base.retrieve_agents(queries, k, steps, batch_size, merge, progress)  # step-wise: the router's

    def retrieve_agents_and_tools(self, queries, k) -> tuple[Ranking, Ranking]:
        from toolgraph.retrieval.agents import AgentRetriever

        base = self.base
        if not isinstance(base, AgentRetriever):
            return super().retrieve_agents_and_tools(queries, k)
        queries = list(queries)
        raw = base.raw_scores(queries)
        agent_scores, tool_scores = base.agent_scores_from(raw), base.tool_scores_from(raw)
        if self.entries:  # one neighbour search: agents are voted by their tools' logged requests
            found = self._nearest(queries)
            tool_scores = self._fuse(tool_scores, found, self._tool_items)
            agent_scores = self._fuse(agent_scores, found, self._agent_items)
        agent_values, agent_idx = topk(agent_scores, k)
        tool_values, tool_idx = topk(tool_scores, len(self.tools), self.tools)
        return (Ranking([[base.agents[i].id for i in row] for row in agent_idx.tolist()], agent_values),
                Ranking([[self.tools[i].id for i in row] for row in tool_idx.tolist()], tool_values))

    # ---- persistence --------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        mark_writing(folder)
        self.base.save(folder / "base")
        spec = self.config
        self.config = type(spec)(**{**vars(spec), "base": "base"})
        try:
            return Retriever.save(self, folder)
        finally:
            self.config = spec

    def _save_state(self, folder: Path) -> None:
        with (folder / LOG).open("w", encoding="utf-8") as f:
            for e in self.entries:
                f.write(json.dumps(e.to_dict(), ensure_ascii=False) + "\n")
        save_file({"log_vectors": self.log_vectors.contiguous()}, str(folder / VECTORS))

    def _load_state(self, folder: Path) -> None:
        self._folder = folder
        self._base_retriever = None
        base = self.base
        if [t.id for t in base.tools] != [t.id for t in self.tools]:
            raise DataError("the feedback index's tools differ from its base index's; the folder mixes two saves: "
                            "sync the index again", folder / "tools.jsonl")
        path = folder / LOG
        entries = [parse_entry(obj, path, lineno, None, 0.0) for lineno, obj in iter_jsonl(path)]
        vectors = read_matrix(folder / VECTORS, "log_vectors", len(entries), f"logged queries ({LOG})")
        self.entries, self.log_vectors = entries, vectors
        self.refresh()


def item_matrix(rows: list[list[int]]) -> torch.Tensor:
    """Each logged request's item positions as one [E, G] tensor, -1 padded."""
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.long).reshape(len(rows), width)


def wrap(base: Retriever, **config: Any) -> FeedbackRetriever:
    """A feedback retriever over ``base`` with an empty store (``config``: FeedbackConfig keys)."""
    return FeedbackRetriever(FeedbackConfig(**config), base=base)


__all__ = ["FeedbackConfig", "FeedbackRetriever", "fuse", "item_matrix", "minmax", "nearest", "neighbour_votes",
           "tally", "wrap"]
