"""Dense bi-encoder (ToolBench-IR, Qin et al. ICLR'24; "EmbSim" in LoSemB) trained with InfoNCE.

* in-batch negatives, gathered across DDP ranks with gradients (``nn.losses.gather_with_grad``),
  labels offset by rank;
* no tool is a negative for a query it serves (mask over each query's whole gold set), and the
  batch sampler never puts one tool twice in a batch;
* optional hard negatives mined by BM25 over the training queries, gold tools filtered out;
* ``instret: true`` — "InstRet": each tool document is augmented with training queries that use it.

Fast training (docs/training.md, "Converge"):
* ``loss: full_catalog`` — every query scored against every tool of the training catalog: the tool
  vectors come from the text tower, held in a bank computed without gradient and refreshed every
  ``refresh_every`` steps, with the batch's own tools re-encoded with gradient so the tool side keeps
  learning; ``multi_positive`` makes every gold tool of a query a positive in the same step.
  Tools a split hides from training (inductive protocol) are never in the bank; in a mixture of
  datasets (``data.name: mixture``) a batch comes from one dataset and only its tools are negatives,
  so only its dataset's rows are re-encoded when due (``refresh_by``: every ``refresh_every`` optimizer
  steps, or every ``refresh_every`` of that dataset's own batches).
* ``freeze_layers: K`` — embeddings and the first K layers frozen; their outputs for every training
  query and tool are computed once (fp16, cached under ``states_dir``) and training runs the layers
  above only (``nn.frozen.FrozenBottom``).
* ``grad_cache: C`` — GradCache (``nn.gradcache.GradCache`` around the loss module): the batch's
  gradient in the memory of C texts, under Lightning's automatic optimization (clipping, AMP and
  gradient accumulation as for any loss). One process only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from toolgraph.config import (
    TaskConfig,
    TextDataConfig,
    TextEncoderSpec,
    ToolText,
    accepts_renamed,
    bounded,
    encoder_spec,
    unread_keys,
)
from toolgraph.data.schema import Tool, ToolDataset
from toolgraph.data.sources.mixture import source_groups
from toolgraph.data.text import ToolTextDataModule
from toolgraph.errors import ConfigError
from toolgraph.nn.encoder import (
    TextEncoder,
    backbone_artifacts,
    backbone_from_artifacts,
    interpolate_weights,
    load_or_restore,
)
from toolgraph.nn.frozen import FrozenBottom, FrozenBottomConfig
from toolgraph.nn.gradcache import GradCache
from toolgraph.nn.losses import ContrastiveLoss, FullCatalogNCE, InBatchNCE
from toolgraph.registry import TASKS
from toolgraph.retrieval.bm25 import BM25Config, BM25Retriever
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever
from toolgraph.retrieval.encode import encode_texts
from toolgraph.retrieval.lexical import CatalogBM25
from toolgraph.retrieval.loading import load
from toolgraph.tasks.base import RetrievalTask

# the encoder a bi-encoder trains: no prefix unless one is given (a model folder's prompts are not read)
TRAINED_ENCODER = encoder_spec(query_prefix="", doc_prefix="")
UNREAD = ("max_length", "max_query_length", "cache_dir")  # a task truncates by data.*; no embedding cache
WHY = "a training task truncates by data.max_query_length, data.max_tool_length and data.eval_max_query_length"


@accepts_renamed
@dataclass
class BiEncoderConfig(FrozenBottomConfig, TaskConfig):
    # the activation cache's older name; the encoder's keys before they became one spec (issue 42)
    renamed: ClassVar[dict[str, str]] = {"cache_dir": "states_dir", "pooling": "encoder.pooling",
                                         "normalize": "encoder.normalize", "query_prefix": "encoder.query_prefix",
                                         "tool_prefix": "encoder.doc_prefix"}
    name: str = "bi_encoder"
    # the encoder trained: name (HF id or local folder), pooling, normalize, and query_prefix / doc_prefix:
    # instruction-style text before every query / tool document (e.g. "query: "), in training and
    # inference, saved as the exported encoder's prompts. Its lengths are data.*'s.
    encoder: TextEncoderSpec = field(default_factory=TRAINED_ENCODER)
    shared: bool = True  # one encoder for queries and tools; false = two towers
    temperature: float = bounded(0.05, gt=0)
    tool_text: ToolText = "default"
    gather: bool = True  # in-batch negatives from every rank
    hard_negatives: bool = False  # one mined hard negative per query
    hard_negative_source: str = "bm25"  # bm25, or a saved retriever / checkpoint / run folder
    hard_negative_depth: int = bounded(20, ge=1)  # mine from the source's top-N (gold tools removed)
    instret: bool = False  # augment tool documents with training queries
    instret_queries: int = bounded(3, ge=1)  # queries appended per tool
    loss: Literal["in_batch", "full_catalog"] = "in_batch"  # negatives: the batch's tools, or the whole catalog
    multi_positive: bool = False  # full_catalog: every gold tool of a query is a positive in the same step
    refresh_every: int = bounded(50, ge=1)  # full_catalog: steps between re-encodings of the tool bank
    # a mixture re-encodes a dataset's rows when its batch comes and they are due; refresh_every counts
    # optimizer steps, or that dataset's own batches (many catalogs: far fewer re-encodings)
    refresh_by: Literal["steps", "dataset_batches"] = "steps"
    grad_tools: int = bounded(0, ge=0)  # full_catalog: at most this many batch tools with gradient a step (0 = all)
    grad_cache: int = bounded(0, ge=0)  # GradCache: chunks of this many texts (0 = off); single process only
    wise: float | None = bounded(None, ge=0, le=1)  # export alpha*trained + (1-alpha)*pretrained weights (WiSE-FT)
    # full_catalog: train the dense side of the hybrid served (dense + w x BM25, min-max scores; t2a scorer
    # score): each query's catalog logits fuse its BM25 at this w, so the encoder learns what BM25 misses
    bm25_fusion: float = bounded(0.0, ge=0)

    def validate(self):
        if self.multi_positive and self.loss != "full_catalog":
            yield "multi_positive", "needs loss: full_catalog (in-batch negatives have one positive column per query)"
        if self.bm25_fusion and self.loss != "full_catalog":
            yield "bm25_fusion", "needs loss: full_catalog (BM25 is fused over the whole catalog)"
        yield from unread_keys(self.encoder, TRAINED_ENCODER(), UNREAD, WHY)

    @property
    def prefixes(self) -> tuple[str, str]:
        """(query prefix, tool document prefix) as trained with ("" for none)."""
        return self.encoder.query_prefix or "", self.encoder.doc_prefix or ""


@TASKS.register("bi_encoder")
class BiEncoderTask(RetrievalTask):
    Config = BiEncoderConfig

    def build(self, artifacts: dict[str, Any] | None) -> None:
        m = self.model_cfg
        backbone, self.tokenizer = load_or_restore(m.encoder.name, artifacts and artifacts["query"])
        self.query_encoder = TextEncoder(backbone, m.encoder.pooling, m.encoder.normalize)
        if m.shared:
            self.doc_encoder = self.query_encoder
        else:
            doc_backbone = backbone_from_artifacts(artifacts["doc"])[0] if artifacts else copy.deepcopy(backbone)
            self.doc_encoder = TextEncoder(doc_backbone, m.encoder.pooling, m.encoder.normalize)
        self.tool_vectors: torch.Tensor | None = None
        self.tool_texts: list[str] = []
        self.catalog: list[Tool] = [Tool(**t) for t in artifacts["tools"]] if artifacts else []
        self.frozen = FrozenBottom(m, self.query_encoder.backbone, self.doc_encoder.backbone)
        # the objective (no weights; its state, e.g. the full-catalog bank, is rebuilt every fit)
        self.contrastive: ContrastiveLoss = (FullCatalogNCE(m.temperature, m.multi_positive, m.grad_tools, m.refresh_by,
                                                            m.bm25_fusion)
                                             if m.loss == "full_catalog" else InBatchNCE(m.temperature, m.gather))
        self.lexical: CatalogBM25 | None = None  # bm25_fusion: the catalog's BM25, per dataset of a mixture
        self._raw_queries: list[str] = []  # bm25_fusion: the training queries' texts as BM25 reads them
        self.loss_fn: torch.nn.Module = GradCache(self.contrastive, m.grad_cache) if m.grad_cache else self.contrastive
        self._query_texts: list[str] = []  # training queries (frozen bottom: their cached states)

    # ---- data -----------------------------------------------------------------------------
    def make_datamodule(self, ds: ToolDataset, data_cfg: TextDataConfig, seed: int) -> ToolTextDataModule:
        m = self.model_cfg
        if m.instret:
            ds = instret_augment(ds, m.instret_queries)
        query_prefix, tool_prefix = m.prefixes
        dm = ToolTextDataModule(ds, data_cfg, self.tokenizer, tool_text_style=m.tool_text, seed=seed,
                                query_prefix=query_prefix, tool_prefix=tool_prefix)
        if m.hard_negatives:
            dm.hard_negatives = mine_hard_negatives(dm, m.hard_negative_source, m.hard_negative_depth, m.tool_text)
        self.tool_texts = dm.tool_texts
        self.catalog = dm.tools
        self._query_texts = dm.train_query_texts
        d = self.cfg.data
        self.frozen.serve(dm, queries=(self.query_encoder.backbone, self._query_texts, d.max_query_length),
                          tools=(self.doc_encoder.backbone, self.tool_texts, d.max_tool_length))
        if isinstance(self.contrastive, FullCatalogNCE):
            hidden = set(ds.notes.get("unseen_tools") or ())  # inductive protocol: never a training negative
            self.contrastive.allowed = torch.tensor([t.id not in hidden for t in dm.tools], dtype=torch.bool)
            groups = source_groups(ds, [t.id for t in dm.tools])  # a mixture batch's negatives: its dataset's tools
            self.contrastive.groups = torch.tensor(groups) if groups is not None else None
            if m.bm25_fusion:
                self.lexical = CatalogBM25(dm.tools, groups, m.tool_text)
                self._raw_queries = [q.text for q in dm.train_queries]  # BM25 reads them without a prefix
        return dm

    def on_train_start(self) -> None:
        """Frozen bottom: the hidden states of every training query and tool, computed once (or read
        from ``states_dir``) on this device, kept in fp16 on the CPU. Built here, inside the training
        time that ``trainer.max_time`` counts, so a budget pays for its cache."""
        from lightning.pytorch.utilities.rank_zero import rank_zero_info

        if isinstance(self.contrastive, FullCatalogNCE):
            self.contrastive.reset()
        if self.model_cfg.grad_cache and self.trainer is not None and self.trainer.world_size > 1:
            raise ConfigError(f"model.grad_cache: runs in one process only (this run has {self.trainer.world_size}); "
                              "under DDP raise data.batch_size per rank or use trainer.accumulate_grad_batches")
        self.frozen.build(self.tokenizer, self.cfg.data.eval_batch_size, self.device, rank_zero_info)

    # ---- training ---------------------------------------------------------------------------
    def compute_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """The contrastive loss module over the batch (GradCache's when ``grad_cache`` is set: a loss whose
        backward re-encodes the batch chunk by chunk; Lightning backpropagates, clips and steps either)."""
        m = self.model_cfg
        c = self.contrastive
        if isinstance(c, FullCatalogNCE):
            if c.groups is None:
                if c.stale(self.global_step, m.refresh_every):
                    self._refresh_bank()
            elif (rows := c.due(batch["gold"], self.global_step, m.refresh_every)) is not None:
                self._refresh_bank(rows)
            if self.lexical is not None:  # the batch's BM25 over its dataset's catalog, fused in the loss
                group = 0 if c.groups is None else int(c.groups[int(batch["gold"][0, 0])])
                texts = [self._raw_queries[i] for i in batch["query_index"].tolist()]
                batch = {**batch, "lexical": self.lexical.scores(texts, group)}
        encode_documents = self._tools if m.loss == "full_catalog" else partial(self._batch_documents, batch)
        return self.loss_fn(partial(self._queries, batch), encode_documents, batch)

    def _queries(self, batch: dict[str, Any], rows: torch.Tensor) -> torch.Tensor:
        """Vectors [n, H] of the batch's queries ``rows``."""
        if self.frozen:
            return self.frozen.encode("queries", self.query_encoder, batch["query_index"][rows], self.device)
        return self.query_encoder(**{n: v[rows.to(v.device)] for n, v in batch["query"].items()})

    def _batch_documents(self, batch: dict[str, Any], cols: torch.Tensor) -> torch.Tensor:
        """Vectors [n, H] of the batch's document columns ``cols`` (in-batch negatives)."""
        if self.frozen:
            doc_tools = batch["doc_tools"]
            return self._tools(doc_tools[cols.to(doc_tools.device)])
        return self.doc_encoder(**{n: v[cols.to(v.device)] for n, v in batch["doc"].items()})

    def _tools(self, index: torch.Tensor) -> torch.Tensor:
        """Vectors [M, H] of the tools ``index`` (catalog rows), with gradient unless under no_grad."""
        if self.frozen:
            return self.frozen.encode("tools", self.doc_encoder, index, self.device)
        t = self.tokenizer([self.tool_texts[i] for i in index.tolist()], padding=True, truncation=True,
                           max_length=self.cfg.data.max_tool_length, return_tensors="pt")
        return self.doc_encoder(input_ids=t["input_ids"].to(self.device), attention_mask=t["attention_mask"].to(self.device))

    def _refresh_bank(self, rows: torch.Tensor | None = None) -> None:
        """The vectors of the tools ``rows`` (default: every tool) without gradient (eval mode: no
        dropout) -> the bank [N, H] (a mixture refreshes one dataset's rows at a time)."""
        was = self.doc_encoder.training
        self.doc_encoder.eval()
        index = torch.arange(len(self.tool_texts)) if rows is None else rows.cpu()
        step = self.cfg.data.eval_batch_size
        try:
            with torch.no_grad():
                vectors = torch.cat([self._tools(index[s:s + step]).float() for s in range(0, len(index), step)])
        finally:
            self.doc_encoder.train(was)
        self.contrastive.refresh(vectors, self.global_step, rows)

    def finish(self, out: Path, dm: Any, extra: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
        """``wise: alpha``: the weights exported (and tested) are ``alpha * trained + (1 - alpha) *
        model.encoder``'s (WiSE-FT, Wortsman et al., CVPR'22): closer to the pretrained encoder, so
        better on catalogs unlike the training data (benchmarks/general.py chooses alpha on val).
        Checkpoints keep the trained weights."""
        alpha = self.model_cfg.wise
        if alpha is not None and alpha != 1:
            for enc in {id(e): e for e in (self.query_encoder, self.doc_encoder)}.values():
                interpolate_weights(enc.backbone, self.model_cfg.encoder.name, alpha)
        return super().finish(out, dm, extra)

    # ---- retrieval ----------------------------------------------------------------------------
    def prepare_scoring(self) -> None:
        texts = self.tool_texts or self.trainer.datamodule.tool_texts
        cfg = self.cfg.data
        self.tool_vectors = encode_texts(self.doc_encoder, self.tokenizer, texts, cfg.eval_batch_size,
                                         cfg.max_tool_length, self.device).to(self.device)  # [N, H]

    def score(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.query_encoder(**batch["query"]) @ self.tool_vectors.T  # [B, N]

    # ---- export -------------------------------------------------------------------------------
    def checkpoint_artifacts(self) -> dict[str, Any]:
        out = {"query": backbone_artifacts(self.query_encoder.backbone, self.tokenizer),
               "tools": [t.to_dict() for t in self.catalog]}
        if not self.model_cfg.shared:
            out["doc"] = backbone_artifacts(self.doc_encoder.backbone, self.tokenizer)
        return out

    def as_retriever(self, tools: list[Tool] | None = None) -> Any:
        """The trained encoder as an in-memory DenseRetriever over ``tools`` (default: the catalog)."""
        m = self.model_cfg
        if not m.shared:
            raise ConfigError("two-tower bi-encoders cannot become a single-encoder DenseRetriever; use shared: true")
        cfg = DenseConfig(encoder=self.retriever_encoder(), tool_text=m.tool_text)
        r = DenseRetriever(cfg, encoder=copy.deepcopy(self.query_encoder).cpu().eval(), tokenizer=self.tokenizer)
        r.index(self.catalog if tools is None else tools)
        return r

    def exported_encoder(self) -> tuple[TextEncoder, int]:
        return self.query_encoder, self.cfg.data.max_tool_length

    def exported_prompts(self) -> dict[str, str]:
        query_prefix, tool_prefix = self.model_cfg.prefixes
        return {"query": query_prefix, "document": tool_prefix}

    def retriever_encoder(self) -> TextEncoderSpec:
        """The trained encoder's spec in the exported retriever: its folder ``encoder``, the run's
        lengths (tool documents: data.max_tool_length; queries kept long: data.eval_max_query_length),
        the prefixes trained with, no embedding cache (the vectors are saved)."""
        d = self.cfg.data
        query_prefix, tool_prefix = self.model_cfg.prefixes
        return replace(self.model_cfg.encoder, name="encoder", max_length=d.max_tool_length,
                       max_query_length=d.eval_max_query_length, query_prefix=query_prefix, doc_prefix=tool_prefix,
                       cache_dir=None)


def instret_augment(ds: ToolDataset, n: int) -> ToolDataset:
    """InstRet: append up to ``n`` training queries that use a tool to its description."""
    examples: dict[str, list[str]] = {}
    for q in ds.split("train"):
        for t in q.tools:
            if len(examples.setdefault(t, [])) < n:
                examples[t].append(q.text)
    tools = [Tool(t.id, t.name, f"{t.description} Example requests: " + " | ".join(examples[t.id]), t.agent,
                  t.category, t.parameters, t.returns) if t.id in examples else t for t in ds.tools]
    notes = {**ds.notes, "instret_queries": n, "instret_tools": len(examples)}
    return ToolDataset(ds.name, tools, ds.queries, ds.agents, ds.dependencies, ds.skipped, notes)


def mine_hard_negatives(dm: ToolTextDataModule, source: str, depth: int, tool_text: str) -> list[list[int]]:
    """Per training query, the source's top-``depth`` tools minus its gold tools (false negatives).
    ``source``: "bm25", or anything ``toolgraph.load`` reads (a saved retriever, a checkpoint)."""
    r = BM25Retriever(BM25Config(tool_text=tool_text)) if source == "bm25" else load(source)
    r.index(dm.tools)
    ranking = r.retrieve([q.text for q in dm.train_queries], depth + 8, progress="mining hard negatives")
    out = []
    n = len(dm.tools)
    for ids, gold in zip(ranking.ids, dm.train_gold):
        gold_set = set(gold)
        negs = [dm.tool_index[i] for i in ids if dm.tool_index[i] not in gold_set][:depth]
        out.append(negs or [next(j for j in range(n) if j not in gold_set)])
    return out
