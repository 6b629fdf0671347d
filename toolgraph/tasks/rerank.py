"""The shared base of reranker tasks (ToolRefiner, cross-encoder): first-stage candidates.

``make_datamodule`` runs the first stage (any Retriever: ``bm25``, ``dense``, ``tool2vec``, or a
saved retriever / run folder / checkpoint) over the train, val and test queries once. Training
follows the protocol in ``data/rerank.py``; val/test rerank the first stage's top
``eval_candidates`` and keep the first stage's order below them, exactly as the exported
``pipeline`` retriever does, so Lightning's test metrics equal evaluate.py's.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from omegaconf import OmegaConf

from toolgraph.config import (
    TaskConfig,
    TextDataConfig,
    TextEncoderSpec,
    ToolText,
    accepts_renamed,
    bounded,
    to_dict,
    unread_keys,
)
from toolgraph.data import prepare_dataset
from toolgraph.data.rerank import RerankDataModule
from toolgraph.data.schema import Tool, ToolDataset
from toolgraph.data.splits import crossfit, crossfit_folds
from toolgraph.errors import ConfigError
from toolgraph.nn.losses import multilabel_loss
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.pipeline import BELOW, PipelineConfig, PipelineRetriever, resolve_retriever
from toolgraph.tasks.base import RetrievalTask


@dataclass
class FirstStageSpec:
    """The first stage whose candidates a reranker reorders: ``source`` is ``bm25``, ``dense`` or
    ``tool2vec`` (built over ``encoder``, fitted on the run's training data), or a saved retriever, run
    folder or .ckpt (used as it is; ``encoder`` is then not read). A plain string is the source:
    ``model.first_stage=runs/mlc_toollens_fast``."""

    shorthand: ClassVar[str] = "source"

    source: str = "tool2vec"
    encoder: TextEncoderSpec = field(default_factory=TextEncoderSpec)  # a first stage by name; cache_dir: its cache

    def spec(self, tool_text: str) -> Any:
        """What ``resolve_retriever`` builds the first stage from (a retriever config dict, or the path)."""
        if self.source in ("tool2vec", "dense"):
            return {"name": self.source, "encoder": to_dict(self.encoder), "tool_text": tool_text}
        if self.source == "bm25":
            return {"name": "bm25", "tool_text": tool_text}
        return self.source


@accepts_renamed
@dataclass
class RerankConfig(TaskConfig):
    # the keys before the first stage became one nested spec (issue 42): cache_dir was its embedding cache
    renamed: ClassVar[dict[str, str | tuple[str, ...]]] = {"first_stage_encoder": "first_stage.encoder.name",
                                                           "cache_dir": "first_stage.encoder.cache_dir"}
    encoder: TextEncoderSpec = field(default_factory=TextEncoderSpec)  # the reranker's backbone (its name)
    first_stage: FirstStageSpec = field(default_factory=FirstStageSpec)
    tool_text: ToolText = "default"
    candidates: int = bounded(32, ge=1)  # N: candidates per training query
    eval_candidates: int | None = bounded(None, ge=1)  # N at val/test/export (default: candidates)
    first_stage_weight: float = bounded(0.0, ge=0)  # val/test/export: reranker + w * first-stage score per candidate
    inject_gold: bool = True  # training only: gold tools missing from the top N replace the worst negatives
    shuffle: bool = True  # training only: candidate order shuffled
    loss: Literal["softmax", "bce"] = "softmax"  # softmax over candidates with a multi-hot target | bce per candidate
    head_lr: float | None = bounded(1.0e-3, gt=0)  # layers on top of the encoder (null: optim.lr)
    dropout: float = bounded(0.1, ge=0, lt=1)
    # Cross-fitted training candidates: k saved retrievers, the i-th trained with data.setting
    # crossfit-<k>-<i> (same data.seed), so each training query's candidates come from a first stage
    # that never saw it, as at test time. Empty: first_stage gives the training candidates too.
    train_first_stages: list[Any] = field(default_factory=list)
    train_with_first_stage: bool = False  # training logits + first_stage_weight * first-stage score (learn the residual)

    def validate(self):
        if self.train_with_first_stage and not self.first_stage_weight:
            yield "train_with_first_stage", "needs first_stage_weight > 0 (the weight trained with is the one scored with)"
        if len(self.train_first_stages) == 1:
            yield "train_first_stages", "needs k >= 2 cross-fitted first stages (or none)"
        yield from unread_keys(self.encoder, TextEncoderSpec(), ("pooling", "normalize", "max_length",
                               "max_query_length", "query_prefix", "doc_prefix", "cache_dir"),
                               "a reranker reads only encoder.name, its backbone; texts are cut at data.*'s lengths")


def first_stage_spec(m: RerankConfig) -> Any:
    return m.first_stage.spec(m.tool_text)


def _check_crossfit_run(spec: Any, where: str, k: int, fold: int, seed: int) -> None:
    """A cross-fitted stage given as a run folder (or its ``retriever/``) must have been trained with
    data.setting crossfit-<k>-<fold> and this data.seed: otherwise its candidates leak the query."""
    if not isinstance(spec, str):
        return
    path = Path(spec)
    run = next((p for p in (path, path.parent) if (p / "config.yaml").is_file()), None)
    if run is None:
        return
    try:
        data = OmegaConf.to_container(OmegaConf.load(run / "config.yaml")).get("data")
    except Exception as e:  # yaml's message names the line
        raise ConfigError(f"{where}: {run / 'config.yaml'} does not read as a run config: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {run / 'config.yaml'} has no data: mapping, so its fold cannot be checked")
    want = f"crossfit-{k}-{fold}"
    if data.get("setting") != want or data.get("seed", 0) != seed:
        raise ConfigError(f"{where}: {run} was trained with data.setting={data.get('setting')!r}, "
                          f"data.seed={data.get('seed', 0)}; fold {fold} of {k} needs setting {want!r} and seed {seed} "
                          "(else its training queries' candidates come from a model that saw them)")


class RerankTask(RetrievalTask):
    Config = RerankConfig

    def build(self, artifacts: dict[str, Any] | None) -> None:
        m = self.model_cfg
        if m.candidates < 1:
            raise ConfigError(f"model.candidates must be >= 1, got {m.candidates}")
        self.catalog: list[Tool] = [Tool(**t) for t in artifacts["tools"]] if artifacts else []
        self.first_stage: Retriever | None = None
        self.build_network(artifacts)

    @abstractmethod
    def build_network(self, artifacts: dict[str, Any] | None) -> None: ...

    @abstractmethod
    def rerank_logits(self, batch: dict[str, Any], cands: torch.Tensor) -> torch.Tensor:
        """Logits [B, N] of the candidate tool indices ``cands`` [B, N] (-1 = padding)."""

    @abstractmethod
    def as_reranker(self) -> Any: ...

    @property
    def n_eval(self) -> int:
        return self.model_cfg.eval_candidates or self.model_cfg.candidates

    # ---- data -------------------------------------------------------------------------------
    def prepare_tools(self, ds: ToolDataset, dm: RerankDataModule) -> None:
        """Hook: per-tool inputs the network needs (the refiner's tool vectors)."""

    def make_datamodule(self, ds: ToolDataset, data_cfg: TextDataConfig, seed: int) -> RerankDataModule:
        m = self.model_cfg
        dm = RerankDataModule(ds, data_cfg, self.tokenizer, tool_text_style=m.tool_text, seed=seed)
        dm.candidates, dm.inject_gold, dm.shuffle = m.candidates, m.inject_gold, m.shuffle
        self.catalog = dm.tools
        self.first_stage = resolve_retriever(first_stage_spec(m), "model.first_stage")
        self.first_stage.fit(ds)
        self.first_stage.index(dm.tools)
        pos = dm.tool_index
        ranked, scores = self._train_candidates(ds, dm, data_cfg.seed)
        dm.train_ranked = [[pos[t] for t in ids] for ids in ranked]
        dm.train_scores = scores if m.train_with_first_stage else None
        depth = max(self.n_eval, max(self.cfg.eval.ks))
        texts = sorted({q.text for s in (data_cfg.val_split, data_cfg.test_split) for q in ds.split(s)})
        ranked = self.first_stage.retrieve(texts, depth, progress="first-stage candidates (val, test)")
        dm.eval_ranked = {t: [pos[i] for i in ids] for t, ids in zip(texts, ranked.ids, strict=True)}
        dm.eval_scores = {t: ranked.scores[i, :len(ids)].float() for i, (t, ids) in enumerate(zip(texts, ranked.ids))}
        self.prepare_tools(ds, dm)
        return dm

    def _train_candidates(self, ds: ToolDataset, dm: RerankDataModule, seed: int) -> tuple[list, list]:
        """Each training query's top ``candidates`` tool ids and their first-stage scores: from
        ``first_stage``, or from the cross-fitted first stage that did not train on the query."""
        m, queries = self.model_cfg, dm.train_queries
        if not m.train_first_stages:
            r = self.first_stage.retrieve([q.text for q in queries], m.candidates, progress="first-stage candidates (train)")
            return r.ids, list(r.scores.float())
        k = len(m.train_first_stages)
        folds = crossfit_folds(ds, k, seed)
        ranked: list = [None] * len(queries)
        scores: list = [None] * len(queries)
        for i, spec in enumerate(m.train_first_stages):  # all checked before any is loaded
            _check_crossfit_run(spec, f"model.train_first_stages[{i}]", k, i, seed)
        for i, spec in enumerate(m.train_first_stages):
            stage = resolve_retriever(spec, f"model.train_first_stages[{i}]")
            stage.fit(crossfit(ds, k, i, seed))
            stage.index(dm.tools)
            rows = [j for j, q in enumerate(queries) if folds[q.id] == i]
            r = stage.retrieve([queries[j].text for j in rows], m.candidates,
                               progress=f"cross-fitted candidates (train, fold {i}/{k})")
            for j, ids, sc in zip(rows, r.ids, r.scores.float(), strict=True):
                ranked[j], scores[j] = ids, sc
        return ranked, scores

    # ---- training and scoring -----------------------------------------------------------------
    def compute_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        cands = batch["cands"]
        logits = self.rerank_logits(batch, cands)  # [B, N]
        if self.model_cfg.train_with_first_stage:
            logits = logits + self.model_cfg.first_stage_weight * batch["first"].to(logits.dtype)
        return multilabel_loss(logits, batch["target"], self.model_cfg.loss, valid=cands >= 0)

    def score(self, batch: dict[str, Any]) -> torch.Tensor:
        ranked = [self.trainer.datamodule.eval_ranked[t] for t in batch["texts"]]
        n = self.n_eval
        cands = torch.full((len(ranked), min(n, max(len(r) for r in ranked))), -1, dtype=torch.long)
        for i, r in enumerate(ranked):
            cands[i, : min(n, len(r))] = torch.tensor(r[:n], dtype=torch.long)
        cands = cands.to(self.device)
        logits = self.rerank_logits(batch, cands).float()  # [B, n]
        w = self.model_cfg.first_stage_weight
        if w:  # as the exported pipeline: reranker + w * first-stage score
            first = torch.zeros_like(logits)
            for i, t in enumerate(batch["texts"]):
                m = min(n, len(ranked[i]))
                first[i, :m] = self.trainer.datamodule.eval_scores[t][:m].to(logits.device)
            logits = logits + w * first
        full = torch.full((len(ranked), len(self.catalog)), BELOW * 10, device=self.device)
        for i, r in enumerate(ranked):  # below the candidates: the first stage's order
            rest = r[n:]
            if rest:
                full[i, torch.tensor(rest, device=self.device)] = BELOW - torch.arange(len(rest), device=self.device,
                                                                                       dtype=full.dtype)
        valid = cands >= 0
        rows = torch.arange(len(ranked), device=self.device).unsqueeze(1).expand_as(cands)
        full[rows[valid], cands[valid]] = logits[valid]
        return full  # [B, T]

    @abstractmethod
    def encoder_parameters(self) -> list[torch.nn.Parameter]: ...

    # ---- export ---------------------------------------------------------------------------------
    def _first_stage_for_inference(self) -> Retriever:
        if self.first_stage is None:  # rebuilt from a checkpoint: the config names the first stage and data
            self.first_stage = resolve_retriever(first_stage_spec(self.model_cfg), "model.first_stage")
            self.first_stage.fit(prepare_dataset(self.cfg.data))
        return self.first_stage

    def as_retriever(self, tools: list[Tool] | None = None) -> PipelineRetriever:
        r = PipelineRetriever(PipelineConfig(depth=self.n_eval, first_stage_weight=self.model_cfg.first_stage_weight),
                              first_stage=self._first_stage_for_inference(),
                              reranker=self.as_reranker())
        r.index(self.catalog if tools is None else tools)
        return r
