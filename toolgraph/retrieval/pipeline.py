"""Composed retrievers: a first stage feeding a reranker, and fusion (RRF or normalised scores).

    retriever:
      name: pipeline
      first_stage: runs/mlc_toollens              # a saved retriever / run folder / .ckpt ...
      reranker: runs/refiner_toollens/retriever   # ... or an inline config: {name: bm25}
      depth: 32                                   # candidates handed to the reranker
      first_stage_weight: 0.0                     # > 0: reranker score + w * first-stage score

    retriever:                                    # hybrid: dense + lexical, scores min-max normalised
      name: fusion
      members: [{name: dense}, {name: bm25}]
      method: score                               # sum_m w_m * normalise(score_m); rrf: sum_m w_m / (k + rank_m)
      weights: [1.0, 0.3]                         # learned: model_file: fusion.json (a fitted FusionModel)

A pipeline saves as one folder (``first_stage/``, ``reranker/``) and loads with ``toolgraph.load``.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from toolgraph.config import bounded
from toolgraph.data.schema import ToolDataset
from toolgraph.errors import ConfigError
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Retriever, RetrieverConfig, config_for
from toolgraph.retrieval.fusion_model import FusionModel, normalise
from toolgraph.retrieval.loading import load
from toolgraph.retrieval.manifest import mark_writing

BELOW = -1.0e6  # scores of tools ranked after the reranked candidates


def resolve_retriever(spec: Any, where: str, base: Path | None = None) -> Retriever:
    """A Retriever from a path (saved retriever, run folder, .ckpt), a registry name, or a config dict."""
    if isinstance(spec, Retriever):
        return spec
    if isinstance(spec, str):
        path = base / spec if base is not None and (base / spec).exists() else Path(spec)
        if path.exists():
            return load(path)
        if spec in RETRIEVERS:
            spec = {"name": spec}
        else:
            raise ConfigError(f"{where}: {spec!r} is neither a saved retriever, a checkpoint, a run folder "
                              f"nor a retriever name ({', '.join(RETRIEVERS.names())})")
    if isinstance(spec, dict) or hasattr(spec, "keys"):
        spec = dict(spec)
        name = spec.get("name")
        if name not in RETRIEVERS:
            raise ConfigError(f"{where}.name: {name!r} is not a retriever ({', '.join(RETRIEVERS.names())})")
        cls = RETRIEVERS.get(name)
        return cls(config_for(cls, spec, where))
    raise ConfigError(f"{where}: expected a path or a retriever config, got {type(spec).__name__}")


def _save_with(r: Retriever, folder: Path, **members: Any) -> Path:
    """Save a composed retriever with its member specs replaced by the subfolders they were saved to."""
    spec = r.config
    r.config = type(spec)(**{**vars(spec), **members})
    try:
        return Retriever.save(r, folder)
    finally:
        r.config = spec


class Reranker(Retriever):
    """A retriever that can also score a given candidate list per query (the second stage)."""

    @abstractmethod
    def rerank(self, queries: list[str], candidates: list[list[str]]) -> torch.Tensor:
        """[Q, max N] scores of each query's candidates (padding: BELOW*10)."""

    def score(self, queries: list[str]) -> torch.Tensor:
        ids = [t.id for t in self.tools]
        return self.rerank(queries, [ids] * len(queries))  # [Q, N]: every tool is a candidate


@dataclass
class PipelineConfig(RetrieverConfig):
    name: str = "pipeline"
    first_stage: Any = None  # path or config dict
    reranker: Any = None  # path or config dict (a saved pipeline's reranker is taken)
    depth: int = bounded(32, ge=1)  # first-stage candidates per query handed to the reranker
    first_stage_weight: float = bounded(0.0, ge=0)  # candidate score = reranker + w * first stage (0: reranker alone)


@RETRIEVERS.register("pipeline")
class PipelineRetriever(Retriever):
    Config = PipelineConfig
    name = "pipeline"

    def __init__(self, config: PipelineConfig | None = None, first_stage: Retriever | None = None,
                 reranker: Reranker | None = None):
        super().__init__(config)
        if self.config.depth < 1:
            raise ConfigError(f"retriever.depth must be >= 1, got {self.config.depth}")
        self.first_stage, self.reranker = first_stage, reranker
        self._base: Path | None = None

    def _members(self) -> tuple[Retriever, Reranker]:
        if self.first_stage is None:
            if self.config.first_stage is None:
                raise ConfigError("retriever.first_stage is required for a pipeline")
            self.first_stage = resolve_retriever(self.config.first_stage, "retriever.first_stage", self._base)
        if self.reranker is None:
            if self.config.reranker is None:
                raise ConfigError("retriever.reranker is required for a pipeline")
            r = resolve_retriever(self.config.reranker, "retriever.reranker", self._base)
            r = r.reranker if isinstance(r, PipelineRetriever) else r
            if not isinstance(r, Reranker):
                raise ConfigError(f"retriever.reranker: a {type(r).__name__} cannot rerank candidates")
            self.reranker = r
        return self.first_stage, self.reranker

    def fit(self, dataset: ToolDataset) -> None:
        first, rerank = self._members()
        first.fit(dataset)
        rerank.fit(dataset)

    def _build(self) -> None:
        first, rerank = self._members()
        first.index(self.tools)
        rerank.index(self.tools)

    def _search(self, queries: list[str], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        first, rerank = self._members()
        depth = self.config.depth
        ranking = first.retrieve(queries, max(k, depth), batch_size=len(queries))
        cands = [ids[:depth] for ids in ranking.ids]
        scores = rerank.rerank(queries, cands)  # [Q, depth]
        w = self.config.first_stage_weight
        pos = {t.id: i for i, t in enumerate(self.tools)}
        out_idx, out_val = [], []
        for row, ids in enumerate(ranking.ids):
            n = len(cands[row])
            s = scores[row, :n] + w * ranking.scores[row, :n].to(scores.dtype) if w else scores[row, :n]
            order = sorted(range(n), key=lambda i: (-float(s[i]), i))  # ties: first-stage order
            top = [cands[row][i] for i in order] + ids[depth:]
            vals = [float(s[i]) for i in order] + [BELOW - j for j in range(len(ids) - n)]
            out_idx.append([pos[t] for t in top[:k]])
            out_val.append(vals[:k])
        return torch.tensor(out_val), torch.tensor(out_idx, dtype=torch.long)

    def score(self, queries: list[str]) -> torch.Tensor:
        values, idx = self._search(queries, len(self.tools))
        return torch.full((len(queries), len(self.tools)), BELOW * 10).scatter_(1, idx, values)

    def save(self, folder: str | Path) -> Path:
        first, rerank = self._members()
        folder = Path(folder)
        mark_writing(folder)  # until the manifest is written, the folder does not load
        first.save(folder / "first_stage")
        rerank.save(folder / "reranker")
        return _save_with(self, folder, first_stage="first_stage", reranker="reranker")

    def _load_state(self, folder: Path) -> None:
        self._base = folder
        self.first_stage = self.reranker = None
        self._members()


FUSION_METHODS = ("rrf", "score", "learned")
NORMALISERS = ("minmax", "max", "none")


@dataclass
class FusionConfig(RetrieverConfig):
    name: str = "fusion"
    members: list[Any] = field(default_factory=list)  # paths or config dicts
    weights: list[float] | None = bounded(None, ge=0)  # one per member (default: equal)
    method: str = "rrf"  # rrf: sum_m w_m / (rrf_k + rank_m); score: sum_m w_m * normalise(score_m)
    rrf_k: int = bounded(60, ge=0)
    depth: int = bounded(100, ge=1)  # rrf: each member's ranking depth
    # score: each member's scores per query over the catalog, minmax -> [0, 1], max -> divided by the
    # query's best score (for scores >= 0, e.g. BM25), none -> as they are; one name, or one per member
    normalize: Any = "minmax"
    # learned: a fitted fusion model (toolgraph/retrieval/fusion_model.py; JSON), members in its order
    model_file: str | None = None


@RETRIEVERS.register("fusion")
class FusionRetriever(Retriever):
    """Fusion of several retrievers over one catalog: reciprocal rank fusion of their rankings
    (``method: rrf``), a weighted sum of their per-query normalised scores (``method: score``, e.g.
    a dense + BM25 hybrid), or a fusion model fitted on other catalogs (``method: learned``,
    toolgraph/retrieval/fusion_model.py). Ties: tool id."""

    Config = FusionConfig
    name = "fusion"

    def __init__(self, config: FusionConfig | None = None, members: list[Retriever] | None = None):
        super().__init__(config)
        c = self.config
        self.members = members
        self._base: Path | None = None
        n = len(members) if members is not None else len(c.members)
        if n < 2:
            raise ConfigError(f"retriever.members: fusion needs at least 2 retrievers, got {n}")
        if c.weights is not None and len(c.weights) != n:
            raise ConfigError(f"retriever.weights: {len(c.weights)} weights for {n} members")
        if c.method not in FUSION_METHODS:
            raise ConfigError(f"retriever.method: {c.method!r} is not one of {', '.join(FUSION_METHODS)}")
        norms = [c.normalize] * n if isinstance(c.normalize, str) else list(c.normalize)
        if len(norms) != n or any(x not in NORMALISERS for x in norms):
            raise ConfigError(f"retriever.normalize: {c.normalize!r} is not one of {', '.join(NORMALISERS)} "
                              f"(one name, or one per member: {n})")
        self._norms = norms
        self.fusion_model: FusionModel | None = None
        if c.method == "learned" and c.weights is not None:
            raise ConfigError("retriever.weights: method 'learned' takes its weights from retriever.model_file; "
                              "leave weights unset")
        if c.method == "learned" and not c.model_file:
            raise ConfigError("retriever.model_file: method 'learned' needs a fitted fusion model (a JSON file)")
        if c.method == "learned" and Path(c.model_file).is_file():  # else: a saved folder's own file (_load_state)
            self._load_fusion_model(Path(c.model_file), n)

    def _load_fusion_model(self, path: Path, n: int) -> None:
        self.fusion_model = FusionModel.load(path)
        if self.fusion_model.members != n:
            raise ConfigError(f"retriever.model_file: {path} was fitted on {self.fusion_model.members} "
                              f"members, retriever.members has {n}")

    def _members(self) -> list[Retriever]:
        if self.members is None:
            self.members = [resolve_retriever(s, f"retriever.members[{i}]", self._base)
                            for i, s in enumerate(self.config.members)]
        return self.members

    def fit(self, dataset: ToolDataset) -> None:
        for m in self._members():
            m.fit(dataset)

    def _build(self) -> None:
        for m in self._members():
            m.index(self.tools)

    def score(self, queries: list[str]) -> torch.Tensor:
        members = self._members()
        weights = self.config.weights or [1.0] * len(members)
        pos = {t.id: i for i, t in enumerate(self.tools)}
        out = torch.zeros(len(queries), len(self.tools))
        if self.config.method in ("score", "learned"):
            scores = []
            for m in members:
                s = m.score(queries).float()
                if [t.id for t in m.tools] != [t.id for t in self.tools]:  # a member that orders its catalog its own way
                    order = torch.tensor([pos[t.id] for t in m.tools])
                    s = torch.zeros_like(out).index_copy_(1, order, s)
                scores.append(s)
            if self.config.method == "learned":
                if self.fusion_model is None:
                    self._load_fusion_model(Path(self.config.model_file), len(members))  # fails naming the file
                return self.fusion_model.score(scores)  # [Q, N]
            for s, w, how in zip(scores, weights, self._norms, strict=True):
                out += w * normalise(s, how)
            return out  # [Q, N]
        depth = min(self.config.depth, len(self.tools))
        for m, w in zip(members, weights, strict=True):
            ranking = m.retrieve(queries, depth, batch_size=len(queries))
            for row, ids in enumerate(ranking.ids):
                for rank, t in enumerate(ids, start=1):
                    out[row, pos[t]] += w / (self.config.rrf_k + rank)
        return out  # [Q, N]

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        mark_writing(folder)  # until the manifest is written, the folder does not load
        names = []
        for i, m in enumerate(self._members()):
            m.save(folder / f"member_{i}")
            names.append(f"member_{i}")
        if self.fusion_model is not None:  # the folder holds its fusion model: it loads anywhere
            self.fusion_model.save(folder / "fusion_model.json")
            return _save_with(self, folder, members=names, model_file="fusion_model.json")
        return _save_with(self, folder, members=names)

    def _load_state(self, folder: Path) -> None:
        self._base = folder
        self.members = None
        self._members()
        if self.config.method == "learned" and (folder / self.config.model_file).is_file():
            self._load_fusion_model(folder / self.config.model_file, len(self.members))
