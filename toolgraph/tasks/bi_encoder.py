"""Dense bi-encoder (ToolBench-IR, Qin et al. ICLR'24; "EmbSim" in LoSemB) trained with InfoNCE.

* in-batch negatives, gathered across DDP ranks with gradients (``nn.losses.gather_with_grad``),
  labels offset by rank;
* no tool is a negative for a query it serves (mask over each query's whole gold set), and the
  batch sampler never puts one tool twice in a batch;
* optional hard negatives mined by BM25 over the training queries, gold tools filtered out;
* ``instret: true`` — "InstRet": each tool document is augmented with training queries that use it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

import torch

from toolgraph.config import TaskConfig, TextDataConfig, ToolText, bounded
from toolgraph.data.schema import Tool, ToolDataset
from toolgraph.data.text import ToolTextDataModule
from toolgraph.errors import ConfigError
from toolgraph.nn.encoder import TextEncoder, backbone_artifacts, backbone_from_artifacts, load_or_restore
from toolgraph.nn.losses import false_negative_mask, gather_no_grad, gather_with_grad, info_nce
from toolgraph.registry import TASKS
from toolgraph.retrieval.bm25 import BM25Config, BM25Retriever
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever
from toolgraph.retrieval.encode import encode_texts
from toolgraph.retrieval.loading import load
from toolgraph.tasks.base import RetrievalTask


@dataclass
class BiEncoderConfig(TaskConfig):
    name: str = "bi_encoder"
    encoder: str = "all-MiniLM-L6-v2"  # HF id or local folder
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True
    shared: bool = True  # one encoder for queries and tools; false = two towers
    temperature: float = bounded(0.05, gt=0)
    tool_text: ToolText = "default"
    gather: bool = True  # in-batch negatives from every rank
    hard_negatives: bool = False  # one mined hard negative per query
    hard_negative_source: str = "bm25"  # bm25, or a saved retriever / checkpoint / run folder
    hard_negative_depth: int = bounded(20, ge=1)  # mine from the source's top-N (gold tools removed)
    instret: bool = False  # augment tool documents with training queries
    instret_queries: int = bounded(3, ge=1)  # queries appended per tool


@TASKS.register("bi_encoder")
class BiEncoderTask(RetrievalTask):
    Config = BiEncoderConfig

    def build(self, artifacts: dict[str, Any] | None) -> None:
        m = self.model_cfg
        backbone, self.tokenizer = load_or_restore(m.encoder, artifacts and artifacts["query"])
        self.query_encoder = TextEncoder(backbone, m.pooling, m.normalize)
        if m.shared:
            self.doc_encoder = self.query_encoder
        else:
            doc_backbone = backbone_from_artifacts(artifacts["doc"])[0] if artifacts else copy.deepcopy(backbone)
            self.doc_encoder = TextEncoder(doc_backbone, m.pooling, m.normalize)
        self.tool_vectors: torch.Tensor | None = None
        self.tool_texts: list[str] = []
        self.catalog: list[Tool] = [Tool(**t) for t in artifacts["tools"]] if artifacts else []

    # ---- data -----------------------------------------------------------------------------
    def make_datamodule(self, ds: ToolDataset, data_cfg: TextDataConfig, seed: int) -> ToolTextDataModule:
        m = self.model_cfg
        if m.instret:
            ds = instret_augment(ds, m.instret_queries)
        dm = ToolTextDataModule(ds, data_cfg, self.tokenizer, tool_text_style=m.tool_text, seed=seed)
        if m.hard_negatives:
            dm.hard_negatives = mine_hard_negatives(dm, m.hard_negative_source, m.hard_negative_depth, m.tool_text)
        self.tool_texts = dm.tool_texts
        self.catalog = dm.tools
        return dm

    # ---- training ---------------------------------------------------------------------------
    def compute_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        q = self.query_encoder(**batch["query"])  # [B, H]
        d = self.doc_encoder(**batch["doc"])  # [M, H]
        doc_tools, positive = batch["doc_tools"], batch["positive"]
        if self.model_cfg.gather and self.trainer is not None and self.trainer.world_size > 1:
            offset = self.trainer.global_rank * d.shape[0]
            d = gather_with_grad(d)  # [W*M, H]
            doc_tools = gather_no_grad(doc_tools)  # [W*M]
            positive = positive + offset  # this rank's positives sit at its slice
        mask = false_negative_mask(batch["gold"], doc_tools, positive)  # [B, W*M]
        return info_nce(q, d, positive, self.model_cfg.temperature, mask)

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
               "tools": [{k: v for k, v in vars(t).items() if v is not None} for t in self.catalog]}
        if not self.model_cfg.shared:
            out["doc"] = backbone_artifacts(self.doc_encoder.backbone, self.tokenizer)
        return out

    def as_retriever(self, tools: list[Tool] | None = None) -> Any:
        """The trained encoder as an in-memory DenseRetriever over ``tools`` (default: the catalog)."""
        m, d = self.model_cfg, self.cfg.data
        if not m.shared:
            raise ConfigError("two-tower bi-encoders cannot become a single-encoder DenseRetriever; use shared: true")
        cfg = DenseConfig(model="encoder", pooling=m.pooling, normalize=m.normalize, max_length=d.max_tool_length,
                          query_max_length=d.eval_max_query_length, tool_text=m.tool_text, cache_dir=None,
                          progress=False)
        r = DenseRetriever(cfg, encoder=copy.deepcopy(self.query_encoder).cpu().eval(), tokenizer=self.tokenizer)
        r.index(self.catalog if tools is None else tools)
        return r

    def exported_encoder(self) -> tuple[TextEncoder, int]:
        return self.query_encoder, self.cfg.data.max_tool_length


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
    ranking = r.retrieve([q.text for q in dm.train_queries], depth + 8)
    out = []
    n = len(dm.tools)
    for ids, gold in zip(ranking.ids, dm.train_gold):
        gold_set = set(gold)
        negs = [dm.tool_index[i] for i in ids if dm.tool_index[i] not in gold_set][:depth]
        out.append(negs or [next(j for j in range(n) if j not in gold_set)])
    return out
