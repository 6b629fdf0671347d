"""Agent routing: rank agents (MCP servers, RapidAPI tools) and the tools inside them.

Four methods share one index of tool and agent *entities* in a dense vector space plus BM25 over
the same entity texts; they differ only in which entities rank an agent:

* ``t2a`` — Tool-to-Agent retrieval (Algorithm 1): tools and agents ranked together; each entity
  stands for its owner (an agent for itself); agents are ranked by their best entity. (Algorithm 1
  takes the top-N entities, maps them to owners and deduplicates: for any N deep enough to reach K
  agents that order is exactly "best entity first", which is what is computed.)
* ``agent_only`` — agents ranked by their own description alone;
* ``tool_only`` — agents ranked by their best tool (tool hits rolled up);
* ``mcp_zero`` — MCP-Zero-style hierarchical routing: servers scored against the request, the top
  ``servers`` kept, their tools scored, and a server's score is the best
  ``(s_server * s_tool) * max(s_server, s_tool)`` over its tools (cosines clipped at 0; dense only;
  MCP-Zero lets the model write separate server and tool requests — here both are the query).

Entity scores (``scorer``): ``dense`` (cosine), ``bm25``, ``score`` (the default) — each member's
scores min-max normalised per query over the entities ranked, then ``dense_weight * dense +
bm25_weight * bm25`` (the fusion retriever's ``method: score``; bm25_weight 0.3 unless given, the
weight chosen on the datasets' val splits) — ``rrf`` — reciprocal rank fusion
sum_m w_m / (rrf_k + rank_m) of the dense and BM25 rankings — or ``weighted_rrf``, which also
weights each entity by its type (``agent_weight`` / ``tool_weight``, as Agent-as-a-Graph does).

Tool-level output (``retrieve``): the tools of the ``route_agents`` best agents first, by their
own tool score, then every other tool (``tool_only``: plain tool ranking). ``retrieve_agents`` gives
the agent ranking; both take ``steps`` for step-wise querying (retrieval/steps.py).

The encoder is any dense retriever (``dense``: a saved retriever / run folder / .ckpt of a
fine-tuned bi-encoder, or a config dict; default: all-MiniLM-L6-v2 zero-shot). Entity vectors are
kept by document text, so re-indexing a changed catalog encodes only new or changed texts
(``encoded`` counts them); they are saved with the index, so loading encodes nothing. With
``scorer: bm25`` no encoder is built, loaded or run: the index holds no vectors and no ``dense/``
folder (its ``dense`` spec is kept, so a scorer that needs vectors later encodes them then).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import bm25s
import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from toolgraph.config import StepMerge, bounded
from toolgraph.data.formats import iter_jsonl
from toolgraph.data.schema import Agent, Tool, ToolDataset, natural_key
from toolgraph.errors import ConfigError, DataError
from toolgraph.nn.storage import read_matrix, read_tensors
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Ranking, Retriever, RetrieverConfig
from toolgraph.retrieval.fusion_model import normalise
from toolgraph.retrieval.manifest import mark_writing
from toolgraph.retrieval.pipeline import _save_with
from toolgraph.retrieval.progress import batches
from toolgraph.retrieval.steps import merged_scores, ranks, split_scores
from toolgraph.retrieval.topk import topk

NONE = -1.0e9  # score of an agent with no entity (no tools, not indexed)


# BM25's weight beside dense (1.0) when bm25_weight is not given. score: 0.3, the weight the datasets' val
# splits choose leave-one-dataset-out (benchmarks/general_hybrid.py; docs/general.md, "Dense + BM25": mean
# val R@5 0.558 over the 7 datasets with a val split, RRF 0.543); rrf / weighted_rrf: equal votes
BM25_WEIGHT = {"score": 0.3, "rrf": 1.0, "weighted_rrf": 1.0}

# the general tool retriever when it is installed, MiniLM otherwise (nn/encoder.py says which on stderr);
# each request split into clauses, a tool scored by 0.3 x the whole request + 0.7 x its best clause, each clause's
# own best tool first (cover): the rule the val splits choose for the hybrid (benchmarks/query_split.py,
# docs/general.md)
DEFAULT_DENSE = {"name": "dense", "encoder": {"name": "toolgraph-general", "max_length": 128}, "query_split": "clauses",
                 "query_split_whole": 0.3, "query_split_cover": True}


@dataclass
class AgentRetrieverConfig(RetrieverConfig):
    name: str = "t2a"
    dense: Any = None  # dense retriever: path or config dict (None: DEFAULT_DENSE)
    scorer: Literal["dense", "bm25", "score", "rrf", "weighted_rrf"] = "score"
    rrf_k: int = bounded(60, ge=0)
    dense_weight: float = bounded(1.0, ge=0)
    bm25_weight: float | None = bounded(None, ge=0)  # None: the scorer's own default (BM25_WEIGHT)
    agent_weight: float = bounded(1.0, ge=0)  # weighted_rrf: weight of agent entities
    tool_weight: float = bounded(1.0, ge=0)  # weighted_rrf: weight of tool entities
    agent_text: Literal["description", "description+tools"] = "description"  # +tools: lists its tool names
    route_agents: int = bounded(3, ge=0)  # tool-level output: tools of this many best agents come first
    servers: int = bounded(5, ge=1)  # mcp_zero: servers kept at the first stage
    step_merge: StepMerge = "max"  # retrieval/steps.py

    retriever_slots: ClassVar[tuple[str, ...]] = ("dense",)  # an inline dense config: renamed keys by its name

    def bm25_share(self) -> float:
        """BM25's weight beside dense: ``bm25_weight``, or the scorer's default when it is None."""
        return self.bm25_weight if self.bm25_weight is not None else BM25_WEIGHT.get(self.scorer, 1.0)


def diff_counts(old: dict[str, Any], new: dict[str, Any]) -> dict[str, int]:
    """added / removed / updated / unchanged between two catalogs keyed by id, their entries compared
    field by field (Tool and Agent are dataclasses: no text of a million-tool catalog is hashed)."""
    unchanged = sum(old.get(k) == v for k, v in new.items())
    added = sum(k not in old for k in new)
    return {"added": added, "removed": sum(k not in new for k in old), "updated": len(new) - added - unchanged,
            "unchanged": unchanged}


class AgentRetriever(Retriever):
    """Shared base: entity index, scorers, step-wise querying, persistence. Variants pick how
    entity scores become agent scores (``agent_scores_from``); every score derives from one ``raw_scores`` call per query batch."""

    Config = AgentRetrieverConfig
    ranks_agents = True  # evaluate() takes the agent ranking from retrieve_agents, not a roll-up
    uses_agents = True  # agent entities take part in ranking agents
    uses_tools = True  # tool entities take part in ranking agents

    def __init__(self, config: AgentRetrieverConfig | None = None, dense: Retriever | None = None):
        super().__init__(config)
        c = self.config
        if c.route_agents < 1 or c.servers < 1:
            raise ConfigError("retriever.route_agents and retriever.servers must be >= 1")
        self._dense = dense
        self._base: Path | None = None
        self.agents: list[Agent] = []
        self.encoded = 0  # entity texts encoded so far (sync reports it)
        self._vectors: dict[str, torch.Tensor] = {}  # sha1(document) -> vector
        self.tool_vectors = self.agent_vectors = torch.zeros(0, 0)

    # ---- members --------------------------------------------------------------------------------
    @property
    def dense(self):
        from toolgraph.retrieval.dense import DenseRetriever
        from toolgraph.retrieval.loading import resolve_retriever

        if self._dense is None:
            spec = self.config.dense if self.config.dense is not None else DEFAULT_DENSE
            r = resolve_retriever(spec, "retriever.dense", self._base)
            if not isinstance(r, DenseRetriever):
                raise ConfigError(f"retriever.dense: needs a dense retriever (bi-encoder), got {type(r).__name__}")
            self._dense = r
        return self._dense

    # ---- index ----------------------------------------------------------------------------------
    def fit(self, dataset: ToolDataset) -> None:
        """Take the dataset's agents (their descriptions); ``index`` then gets the tools."""
        self.agents = list(dataset.agents)

    def index(self, tools: Iterable[Tool], agents: Iterable[Agent] | None = None) -> None:
        """Index tools and their agents (agents named by tools but not given get a bare entry)."""
        tools = list(tools)
        given = {a.id: a for a in (self.agents if agents is None else agents)}
        owners = dict.fromkeys(t.agent for t in tools if t.agent is not None)
        agents = [given.get(a, Agent(a, a)) for a in owners] + [a for a in given.values() if a.id not in owners]
        self.agents = sorted(agents, key=lambda a: natural_key(a.id))  # ties between agents: by id
        super().index(tools)

    def sync(self, tools: Iterable[Tool], agents: Iterable[Agent]) -> dict[str, int]:
        """Replace the catalog; only new or changed entity texts are encoded. Returns counts."""
        tools, agents = list(tools), list(agents)
        old = {t.id: t for t in self.tools} | {f"agent:{a.id}": a for a in self.agents}
        new = {t.id: t for t in tools} | {f"agent:{a.id}": a for a in agents}
        before = self.encoded
        self.index(tools, agents)
        return {**diff_counts(old, new), "encoded": self.encoded - before, "tools": len(self.tools),
                "agents": len(self.agents)}

    def add_tools(self, tools: Iterable[Tool], agents: Iterable[Agent] = ()) -> None:
        new = list(tools)
        clash = {t.id for t in new} & {t.id for t in self.tools}
        if clash:
            raise DataError(f"add_tools: ids already indexed: {sorted(clash)[:5]}")
        extra = {a.id: a for a in agents}
        self.index(self.tools + new, [extra.pop(a.id, a) for a in self.agents] + list(extra.values()))

    def agent_documents(self) -> list[str]:
        names: dict[str, list[str]] = {}
        if self.config.agent_text == "description+tools":
            for t in self.tools:
                if t.agent is not None:
                    names.setdefault(t.agent, []).append(t.name)
        return [a.document(names.get(a.id, ())) for a in self.agents]

    @property
    def uses_dense(self) -> bool:
        """Whether the scorer needs entity vectors (and so the dense encoder): every scorer but bm25."""
        return self.config.scorer != "bm25"

    def _embed(self, docs: list[str]) -> torch.Tensor:
        if not self.uses_dense:  # BM25 alone: no vectors, the encoder is never built
            return torch.zeros(len(docs), 0)
        keys = [hashlib.sha1(d.encode()).hexdigest() for d in docs]
        todo = list(dict.fromkeys(d for d, k in zip(docs, keys) if k not in self._vectors))
        if todo:
            d = self.dense
            vecs = d.embed([d.prefix("document") + t for t in todo], "encoding tools and agents")
            self.encoded += len(todo)
            for t, v in zip(todo, vecs):
                self._vectors[hashlib.sha1(t.encode()).hexdigest()] = v
        dim = next(iter(self._vectors.values())).shape[0] if self._vectors else 0
        out = torch.stack([self._vectors[k] for k in keys]) if keys else torch.zeros(0, dim)
        self._vectors = {k: self._vectors[k] for k in keys}  # keep only what the index holds
        return F.normalize(out, dim=-1) if self.dense.config.normalize else out

    def _build(self) -> None:
        tool_docs, agent_docs = self.documents(), self.agent_documents()
        vecs = self._embed(tool_docs + agent_docs)
        self.tool_vectors, self.agent_vectors = vecs[: len(tool_docs)], vecs[len(tool_docs):]
        self._index_structures(tool_docs + agent_docs)

    def _index_structures(self, docs: list[str]) -> None:
        self._bm25 = bm25s.BM25()
        self._bm25.index(bm25s.tokenize(docs, stopwords="en", show_progress=False), show_progress=False)
        agent_pos = {a.id: i for i, a in enumerate(self.agents)}
        self.owner = torch.tensor([agent_pos.get(t.agent, -1) for t in self.tools], dtype=torch.long)  # [N]

    # ---- entity scores --------------------------------------------------------------------------
    def _dense_scores(self, queries: list[str]) -> torch.Tensor:
        entities = torch.cat([self.tool_vectors, self.agent_vectors])

        def score(texts: list[str]) -> torch.Tensor:
            q = self.dense.encode_queries(texts)
            return (F.normalize(q, dim=-1) if self.dense.config.normalize else q) @ entities.T

        # the dense member's query_split: each request's pieces scored, an entity's score its best piece's
        # (blended with the whole request's by query_split_whole)
        config = self.dense.config
        return split_scores(score, queries, getattr(config, "query_split", "none"),
                            getattr(config, "query_split_whole", 0.0),
                            getattr(config, "query_split_cover", False))  # [Q, N + A]

    def _bm25_scores(self, queries: list[str]) -> torch.Tensor:
        tokens = bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        n = len(self.tools) + len(self.agents)
        rows = [self._bm25.get_scores(t) if t else np.zeros(n, dtype=np.float32) for t in tokens]
        return torch.from_numpy(np.stack(rows).astype(np.float32))

    def raw_scores(self, queries: list[str]) -> dict[str, torch.Tensor]:
        """The scorer's raw [Q, N + A] score matrices (``dense`` and/or ``bm25``), computed once per
        query batch; every ranking below is derived from them (the queries are encoded once)."""
        c = self.config
        raw = {}
        if self.uses_dense:
            if self.tool_vectors.shape[-1] == 0 and (self.tools or self.agents):
                self._build()  # indexed under scorer bm25 (no vectors), now asked for dense scores
            raw["dense"] = self._dense_scores(queries)
        if c.scorer != "dense":
            raw["bm25"] = self._bm25_scores(queries)
        return raw

    def fuse(self, raw: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """[Q, N + A] scores of the entities in ``mask`` (the others get NONE) under ``scorer``."""
        c = self.config
        if c.scorer in raw:  # dense or bm25 alone
            return raw[c.scorer].masked_fill(~mask, NONE)
        weights = {"dense": c.dense_weight, "bm25": c.bm25_share()}
        if c.scorer == "score":
            fused = sum(weights[m] * normalise(s, "minmax", mask) for m, s in raw.items())
            return fused.masked_fill(~mask, NONE)
        fused = sum(weights[m] / (c.rrf_k + ranks(s.masked_fill(~mask, NONE)).float()) for m, s in raw.items())
        if c.scorer == "weighted_rrf":
            fused = fused * self._type_weights()
        return fused.masked_fill(~mask, NONE)

    def entity_scores(self, queries: list[str], mask: torch.Tensor) -> torch.Tensor:
        return self.fuse(self.raw_scores(queries), mask)

    def _type_weights(self) -> torch.Tensor:
        c = self.config
        return torch.cat([torch.full((len(self.tools),), c.tool_weight), torch.full((len(self.agents),), c.agent_weight)])

    def _mask(self, tools: bool, agents: bool) -> torch.Tensor:
        return torch.cat([torch.full((len(self.tools),), tools), torch.full((len(self.agents),), agents)])

    # ---- variant hook ---------------------------------------------------------------------------
    def agent_scores_from(self, raw: dict[str, torch.Tensor]) -> torch.Tensor:
        """[Q, A]: an agent's score is its best entity's (``uses_tools`` / ``uses_agents`` pick which)."""
        s = self.fuse(raw, self._mask(self.uses_tools, self.uses_agents))
        q, n = s.shape[0], len(self.tools)
        best = torch.full((q, len(self.agents)), NONE)
        if self.uses_tools and n:
            owned = self.owner >= 0
            best = best.scatter_reduce(1, self.owner[owned].expand(q, -1), s[:, :n][:, owned], reduce="amax")
        if self.uses_agents:
            best = torch.maximum(best, s[:, n:])
        return best

    def tool_scores_from(self, raw: dict[str, torch.Tensor]) -> torch.Tensor:
        """[Q, N]: tools of the ``route_agents`` best agents first (by tool score), then the rest."""
        own = self.fuse(raw, self._mask(True, False))[:, : len(self.tools)]
        chosen = topk(self.agent_scores_from(raw), self.config.route_agents)[1]  # [Q, R]
        inside = (self.owner.unsqueeze(0).unsqueeze(-1) == chosen.unsqueeze(1)).any(-1)  # [Q, N]
        return own + inside.float() * (own.abs().max() + 1.0) * 4  # chosen agents' tools above all others

    def agent_scores(self, queries: list[str]) -> torch.Tensor:
        return self.agent_scores_from(self.raw_scores(queries))

    def tool_scores(self, queries: list[str]) -> torch.Tensor:
        return self.tool_scores_from(self.raw_scores(queries))

    # ---- protocol -------------------------------------------------------------------------------
    def score(self, queries: list[str]) -> torch.Tensor:
        return self.tool_scores(queries)

    def retrieve_agents(self, queries: Sequence[str], k: int, steps: Sequence[Sequence[str]] | None = None,
                        batch_size: int = 256, merge: str | None = None, progress: bool | str = False) -> Ranking:
        """Top-k agents per query; with ``steps`` (one list per query) each step is scored and the
        scores merged by ``merge`` (default: ``step_merge`` of the config)."""
        if not self.agents:
            raise RuntimeError(f"{type(self).__name__}: index(tools, agents) before retrieve_agents()")
        ids, scores = [], []
        for part in batches(len(queries), batch_size, progress):
            if steps is None:
                s = self.agent_scores(list(queries[part]))
            else:
                s = merged_scores(self.agent_scores, [list(x) for x in steps[part]],
                                  merge or self.config.step_merge, self.config.rrf_k)
            values, idx = topk(s, k)
            scores.append(values)
            ids += [[self.agents[i].id for i in row] for row in idx.tolist()]
        return Ranking(ids, torch.cat(scores) if scores else torch.zeros(0, k))

    def retrieve_agents_and_tools(self, queries: Sequence[str], k: int) -> tuple[Ranking, Ranking]:
        if not self.agents:
            raise RuntimeError(f"{type(self).__name__}: index(tools, agents) before retrieve_agents_and_tools()")
        raw = self.raw_scores(list(queries))
        agent_values, agent_idx = topk(self.agent_scores_from(raw), k)
        tool_values, tool_idx = topk(self.tool_scores_from(raw), len(self.tools))
        return (Ranking([[self.agents[i].id for i in row] for row in agent_idx.tolist()], agent_values),
                Ranking([[self.tools[i].id for i in row] for row in tool_idx.tolist()], tool_values))

    # ---- persistence ----------------------------------------------------------------------------
    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        mark_writing(folder)
        spec = self.config.dense  # a loaded index's encoder folder (dense/) is kept whatever the scorer
        inside = isinstance(spec, (str, Path)) and self._base is not None and (self._base / spec).exists()
        if not (self.uses_dense or self._dense is not None or inside):
            return _save_with(self, folder)  # no encoder to save: the dense spec stays as given
        self.dense.save(folder / "dense")
        return _save_with(self, folder, dense="dense")

    def _save_state(self, folder: Path) -> None:
        with (folder / "agents.jsonl").open("w", encoding="utf-8") as f:
            for a in self.agents:
                f.write(json.dumps({k: v for k, v in vars(a).items() if v is not None}, ensure_ascii=False) + "\n")
        save_file({"tool_vectors": self.tool_vectors.contiguous(), "agent_vectors": self.agent_vectors.contiguous()},
                  str(folder / "entity_vectors.safetensors"))

    def _load_state(self, folder: Path) -> None:
        self._base = folder
        self.agents = _read_agents(folder / "agents.jsonl")
        path = folder / "entity_vectors.safetensors"
        vecs = read_tensors(path)  # in memory: the file may be rewritten under a running server
        self.tool_vectors = read_matrix(path, "tool_vectors", len(self.tools), "tools", vecs)
        self.agent_vectors = read_matrix(path, "agent_vectors", len(self.agents), "agents (agents.jsonl)", vecs,
                                         width=self.tool_vectors.shape[1], width_of="its tool_vectors")
        docs = self.documents() + self.agent_documents()
        stored = torch.cat([self.tool_vectors, self.agent_vectors])
        self._vectors = ({} if stored.shape[-1] == 0 else  # a bm25 index: no vectors
                         {hashlib.sha1(d.encode()).hexdigest(): v for d, v in zip(docs, stored)})
        self._index_structures(docs)


def _read_agents(path: Path) -> list[Agent]:
    agents = []
    for lineno, obj in iter_jsonl(path):
        try:
            agents.append(Agent(**obj))
        except TypeError as e:
            raise DataError(f"not an agent record ({e}); re-save the index", path, lineno) from None
    return agents


@RETRIEVERS.register("t2a")
class ToolToAgentRetriever(AgentRetriever):
    """Tools and agents in one ranking; each hit counts for its owner (Tool-to-Agent retrieval)."""

    name = "t2a"


@RETRIEVERS.register("agent_only")
class AgentOnlyRetriever(AgentRetriever):
    """Agents matched by their own description only."""

    name = "agent_only"
    uses_tools = False


@RETRIEVERS.register("tool_only")
class ToolOnlyRetriever(AgentRetriever):
    """Tools matched alone; agents in order of their best tool."""

    name = "tool_only"
    uses_agents = False

    def tool_scores_from(self, raw: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.fuse(raw, self._mask(True, False))[:, : len(self.tools)]


@RETRIEVERS.register("mcp_zero")
class MCPZeroRetriever(AgentRetriever):
    """Hierarchical routing: servers first, then tools inside the best servers (MCP-Zero style)."""

    name = "mcp_zero"

    def __init__(self, config: AgentRetrieverConfig | None = None, dense: Retriever | None = None):
        super().__init__(config, dense)
        if self.config.scorer != "dense":
            raise ConfigError(f"retriever.scorer: mcp_zero scores with cosine similarity only (scorer: dense), "
                              f"got {self.config.scorer!r}")

    def _combined(self, raw: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = raw["dense"].clamp(min=0)  # [Q, N + A]
        n = len(self.tools)
        server, tool = s[:, n:], s[:, :n]
        kept = topk(server, self.config.servers)[1]  # [Q, S]
        inside = (self.owner.unsqueeze(0).unsqueeze(-1) == kept.unsqueeze(1)).any(-1)  # [Q, N]
        tool_server = server.gather(1, self.owner.clamp(min=0).expand(s.shape[0], -1))  # [Q, N]
        combined = (tool_server * tool) * torch.maximum(tool_server, tool)  # MCP-Zero's ranking formula
        return server, combined.masked_fill(~inside | (self.owner < 0), NONE), tool

    def agent_scores_from(self, raw: dict[str, torch.Tensor]) -> torch.Tensor:
        server, combined, _ = self._combined(raw)
        owned = self.owner >= 0
        best = torch.full_like(server, NONE).scatter_reduce(
            1, self.owner[owned].expand(server.shape[0], -1), combined[:, owned], reduce="amax")
        # kept servers by their best tool; the others after them, by server score
        return torch.where(best > NONE / 2, best + 2.0, server - 2.0)

    def tool_scores_from(self, raw: dict[str, torch.Tensor]) -> torch.Tensor:
        _, combined, tool = self._combined(raw)
        return torch.where(combined > NONE / 2, combined + 2.0, tool - 2.0)
