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

Both are ``ComposedRetriever``s. A tuner (toolgraph/tuning.py) trying several settings of the same
members calls ``reconfigure(config)`` (the new combination: a fusion weight, the depth; members whose spec
is unchanged are kept) and ``remember(True)``: then each member is fitted and indexed once, and its output
for a batch of queries (a first-stage ranking, reranker scores, a member's scores) is computed once and
reused by every setting, so a grid of fusion weights costs one re-sort per weight, not a re-score.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from toolgraph.config import bounded, check_values
from toolgraph.data.schema import Tool, ToolDataset
from toolgraph.errors import ConfigError
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Retriever, RetrieverConfig
from toolgraph.retrieval.fusion_model import FusionModel, normalise
from toolgraph.retrieval.loading import resolve_retriever
from toolgraph.retrieval.manifest import mark_writing

BELOW = -1.0e6  # scores of tools ranked after the reranked candidates


def _save_with(r: Retriever, folder: Path, **members: Any) -> Path:
    """Save a composed retriever with its member specs replaced by the subfolders they were saved to."""
    spec = r.config
    r.config = type(spec)(**{**vars(spec), **members})
    try:
        return Retriever.save(r, folder)
    finally:
        r.config = spec


class MemberMemo:
    """What the members of a composed retriever computed while a tuner tries several settings of them:
    the dataset each was fitted on, the tools each was indexed on, and each output (``kind`` and key, e.g.
    a first-stage ranking of one batch of queries). A member fitted or indexed anew loses its outputs."""

    def __init__(self) -> None:
        self._fitted: dict[int, tuple[Retriever, ToolDataset]] = {}  # id(member) -> (member, dataset)
        self._indexed: dict[int, tuple[Retriever, list[Tool]]] = {}
        self._outputs: dict[tuple, tuple[Retriever, Any]] = {}  # (id(member), kind, key) -> (member, value)

    def fit(self, member: Retriever, dataset: ToolDataset) -> None:
        got = self._fitted.get(id(member))
        if got is not None and got[1] is dataset:
            return
        self.forget(member)
        member.fit(dataset)
        self._fitted[id(member)] = (member, dataset)

    def index(self, member: Retriever, tools: list[Tool]) -> None:
        got = self._indexed.get(id(member))
        if got is not None and got[1] == tools:  # the same tool records (ids and texts)
            return
        self._outputs = {k: v for k, v in self._outputs.items() if k[0] != id(member)}
        member.index(tools)
        self._indexed[id(member)] = (member, list(tools))

    def output(self, member: Retriever, kind: str, key: Any, compute: Callable[[], Any]) -> Any:
        k = (id(member), kind, key)
        if k not in self._outputs:
            self._outputs[k] = (member, compute())
        return self._outputs[k][1]

    def forget(self, member: Retriever) -> None:
        """Everything known of ``member``: it is fitted, indexed and asked again."""
        self._fitted.pop(id(member), None)
        self._indexed.pop(id(member), None)
        self._outputs = {k: v for k, v in self._outputs.items() if k[0] != id(member)}


class ComposedRetriever(Retriever):
    """A retriever made of member retrievers (``PipelineRetriever``, ``FusionRetriever``)."""

    _memo: MemberMemo | None = None  # on while a tuner tries settings (remember)

    def remember(self, on: bool = True) -> None:
        """Keep what the members computed (``MemberMemo``) until ``remember(False)``, here and in composed
        members. For a tuner only: the outputs of every batch of queries are kept in memory."""
        if not on:
            self._memo = None
        elif self._memo is None:
            self._memo = MemberMemo()
        for m in self._resolved():
            if isinstance(m, ComposedRetriever):
                m.remember(on)

    def reconfigure(self, config: Any) -> bool:
        """Take ``config`` (this class's config) in place of the current one, keeping each member whose spec
        it leaves unchanged, and what is remembered of it; a changed member is reconfigured when it is composed
        itself and its class stays, else resolved again from its new spec on the next ``fit`` / ``index``.
        False (nothing changed): ``config`` is another class's. Then ``fit`` and ``index`` again (``evaluate``
        does); with ``remember`` on, only the members that changed do work."""
        if type(config) is not type(self.config):
            return False
        config = check_values(config, "retriever.")
        self._reconfigure(config)
        return True

    @abstractmethod
    def _reconfigure(self, config: Any) -> None:
        """Take ``config`` (checked, of this class): keep the members it leaves unchanged, drop the others."""

    def _resolved(self) -> list[Retriever]:
        """The members built so far (none resolved here)."""
        return []

    def _keep_member(self, member: Retriever | None, spec: Any, where: str) -> bool:
        """Whether ``member`` can serve ``spec`` (its new spec): reconfigured in place when both are composed
        of the same class. Its remembered outputs go either way."""
        if member is None:
            return False
        if self._memo is not None:
            self._memo.forget(member)
        if (isinstance(member, ComposedRetriever) and isinstance(spec, Mapping)
                and spec.get("name") == member.name):
            return member.reconfigure(type(member).parse_config(dict(spec), where))
        return False

    def _adopt(self, member: Retriever) -> Retriever:
        """A newly resolved member: it remembers too while this retriever does."""
        if self._memo is not None and isinstance(member, ComposedRetriever):
            member.remember(True)
        return member

    def _fit_member(self, member: Retriever, dataset: ToolDataset) -> None:
        if self._memo is None:
            member.fit(dataset)
        else:
            self._memo.fit(member, dataset)

    def _index_member(self, member: Retriever) -> None:
        if self._memo is None:
            member.index(self.tools)
        else:
            self._memo.index(member, self.tools)

    def _output(self, member: Retriever, kind: str, key: Any, compute: Callable[[], Any]) -> Any:
        return compute() if self._memo is None else self._memo.output(member, kind, key, compute)


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

    retriever_slots: ClassVar[tuple[str, ...]] = ("first_stage", "reranker")  # inline configs: renamed keys by name


@RETRIEVERS.register("pipeline")
class PipelineRetriever(ComposedRetriever):
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
            self.first_stage = self._adopt(resolve_retriever(self.config.first_stage, "retriever.first_stage",
                                                             self._base))
        if self.reranker is None:
            if self.config.reranker is None:
                raise ConfigError("retriever.reranker is required for a pipeline")
            r = resolve_retriever(self.config.reranker, "retriever.reranker", self._base)
            r = r.reranker if isinstance(r, PipelineRetriever) else r
            if not isinstance(r, Reranker):
                raise ConfigError(f"retriever.reranker: a {type(r).__name__} cannot rerank candidates")
            self.reranker = self._adopt(r)
        return self.first_stage, self.reranker

    def _resolved(self) -> list[Retriever]:
        return [m for m in (self.first_stage, self.reranker) if m is not None]

    def _reconfigure(self, config: PipelineConfig) -> None:
        for key in ("first_stage", "reranker"):
            spec = getattr(config, key)
            if spec != getattr(self.config, key) and not self._keep_member(getattr(self, key), spec, f"retriever.{key}"):
                setattr(self, key, None)  # resolved from the new spec when next needed
        self.config = config

    def fit(self, dataset: ToolDataset) -> None:
        first, rerank = self._members()
        self._fit_member(first, dataset)
        self._fit_member(rerank, dataset)

    def _build(self) -> None:
        first, rerank = self._members()
        self._index_member(first)
        self._index_member(rerank)

    def _search(self, queries: list[str], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        first, rerank = self._members()
        depth, kk = self.config.depth, max(k, self.config.depth)
        ranking = self._output(first, "retrieve", (tuple(queries), kk),
                               lambda: first.retrieve(queries, kk, batch_size=len(queries)))
        cands = [ids[:depth] for ids in ranking.ids]
        scores = self._output(rerank, "rerank", (tuple(queries), tuple(map(tuple, cands))),
                              lambda: rerank.rerank(queries, cands))  # [Q, depth]
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
class FusionRetriever(ComposedRetriever):
    """Fusion of several retrievers over one catalog: reciprocal rank fusion of their rankings
    (``method: rrf``), a weighted sum of their per-query normalised scores (``method: score``, e.g.
    a dense + BM25 hybrid), or a fusion model fitted on other catalogs (``method: learned``,
    toolgraph/retrieval/fusion_model.py). Ties: tool id."""

    Config = FusionConfig
    name = "fusion"

    def __init__(self, config: FusionConfig | None = None, members: list[Retriever] | None = None):
        super().__init__(config)
        self.members: list[Retriever | None] | None = list(members) if members is not None else None
        self._base: Path | None = None
        self._norms, self.fusion_model = self._checked(self.config, self._count(self.config))

    def _count(self, c: FusionConfig) -> int:
        return len(self.members) if self.members is not None else len(c.members)

    def _checked(self, c: FusionConfig, n: int) -> tuple[list[str], FusionModel | None]:
        """``c`` checked against ``n`` members: the normaliser of each member, and the fusion model of
        ``method: learned`` (None until a saved folder's own file is read in ``_load_state``)."""
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
        if c.method == "learned" and c.weights is not None:
            raise ConfigError("retriever.weights: method 'learned' takes its weights from retriever.model_file; "
                              "leave weights unset")
        if c.method == "learned" and not c.model_file:
            raise ConfigError("retriever.model_file: method 'learned' needs a fitted fusion model (a JSON file)")
        if c.method == "learned" and Path(c.model_file).is_file():  # else: a saved folder's own file (_load_state)
            return norms, self._read_fusion_model(Path(c.model_file), n)
        if c.method == "learned" and c.model_file == self.config.model_file:
            return norms, getattr(self, "fusion_model", None)
        return norms, None

    @staticmethod
    def _read_fusion_model(path: Path, n: int) -> FusionModel:
        model = FusionModel.load(path)
        if model.members != n:
            raise ConfigError(f"retriever.model_file: {path} was fitted on {model.members} "
                              f"members, retriever.members has {n}")
        return model

    def _load_fusion_model(self, path: Path, n: int) -> None:
        self.fusion_model = self._read_fusion_model(path, n)

    def _members(self) -> list[Retriever]:
        if self.members is None:
            self.members = [None] * len(self.config.members)
        for i, m in enumerate(self.members):
            if m is None:
                self.members[i] = self._adopt(resolve_retriever(self.config.members[i], f"retriever.members[{i}]",
                                                                self._base))
        return self.members

    def _resolved(self) -> list[Retriever]:
        return [m for m in self.members or [] if m is not None]

    def _reconfigure(self, config: FusionConfig) -> None:
        old = self.config.members
        if config.members != old and self.members is not None and len(config.members) != len(self.members):
            self.members = None  # another number of members: every one resolved from its new spec
        norms, model = self._checked(config, self._count(config))  # raises before anything changed
        if config.members != old and self.members is not None:
            for i, spec in enumerate(config.members):
                if spec != old[i] and not self._keep_member(self.members[i], spec, f"retriever.members[{i}]"):
                    self.members[i] = None
        self.config, self._norms, self.fusion_model = config, norms, model

    def fit(self, dataset: ToolDataset) -> None:
        for m in self._members():
            self._fit_member(m, dataset)

    def _build(self) -> None:
        for m in self._members():
            self._index_member(m)

    def score(self, queries: list[str]) -> torch.Tensor:
        members = self._members()
        weights = self.config.weights or [1.0] * len(members)
        pos = {t.id: i for i, t in enumerate(self.tools)}
        out = torch.zeros(len(queries), len(self.tools))
        if self.config.method in ("score", "learned"):
            scores = []
            for m in members:
                s = self._output(m, "score", tuple(queries), lambda m=m: m.score(queries).float())
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
            ranking = self._output(m, "retrieve", (tuple(queries), depth),
                                   lambda m=m: m.retrieve(queries, depth, batch_size=len(queries)))
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
