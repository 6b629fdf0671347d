"""Tool2Vec with query-to-query fine-tuning (Moon et al. 2024, Sec. 3).

Tool vectors are means of training-query vectors, so the encoder is tuned to make queries that
share a tool close: each training query's positive is another training query that uses one of its
gold tools (InfoNCE over the batch, gathered across ranks; a batch-mate whose tool is in the
query's gold set is masked, never a negative). Validation builds the Tool2Vec index with the
current encoder; the export is a ``tool2vec`` retriever (usage kept, so new tools fall back to
their description vector).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any

import torch

from toolgraph.config import TextDataConfig, accepts_renamed, bounded
from toolgraph.data.schema import Tool, ToolDataset
from toolgraph.data.text import (
    ContrastiveBatchSampler,
    ContrastiveCollator,
    ToolTextDataModule,
    pad_gold,
)
from toolgraph.registry import TASKS
from toolgraph.tasks.bi_encoder import BiEncoderConfig, BiEncoderTask


@accepts_renamed
@dataclass
class Tool2VecTaskConfig(BiEncoderConfig):
    name: str = "tool2vec"
    usage_weight: float = bounded(1.0, ge=0, le=1)  # the exported index: usage mean vs description vector mix


class QueryPairSampler(ContrastiveBatchSampler):
    """(query, shared tool, partner query) triples: the contrastive plan (no tool twice in a batch),
    with a partner drawn among the other training queries that use the pair's tool."""

    def __init__(self, gold, users: dict[int, list[int]], batch_size: int, seed: int = 0, rank: int = 0, world: int = 1):
        super().__init__(gold, batch_size, seed, rank, world)
        self.users = users
        self._pairs: tuple[int, list] | None = None

    def plan(self) -> list[list[tuple[int, int, int]]]:
        if self._pairs is not None and self._pairs[0] == self.epoch:
            return self._pairs[1]
        rng = random.Random((self.seed + 7) * 1_000_003 + self.epoch)
        out = []
        for batch in super().plan():
            row = []
            for q, t, _ in batch:
                others = [u for u in self.users[t] if u != q]
                row.append((q, t, rng.choice(others) if others else q))  # alone: its own text (dropout views)
            out.append(row)
        self._pairs = (self.epoch, out)
        return out


class QueryPairCollator(ContrastiveCollator):
    def __call__(self, triples: list[tuple[int, int, int]]) -> dict[str, Any]:
        queries = [q for q, _, _ in triples]
        partners = [p for _, _, p in triples]
        q = self.tok([self.query_texts[i] for i in queries], padding=True, truncation=True, max_length=self.max_q,
                     return_tensors="pt")
        d = self.tok([self.query_texts[i] for i in partners], padding=True, truncation=True, max_length=self.max_q,
                     return_tensors="pt")
        return {"query": {k: v for k, v in q.items() if k in ("input_ids", "attention_mask")},
                "doc": {k: v for k, v in d.items() if k in ("input_ids", "attention_mask")},
                "doc_tools": torch.tensor([t for _, t, _ in triples], dtype=torch.long),  # [B] the shared tool
                "positive": torch.arange(len(triples), dtype=torch.long),
                "gold": pad_gold([self.gold[i] for i in queries])}


class QueryPairDataModule(ToolTextDataModule):
    def train_sampler(self, rank: int, world: int):
        users: dict[int, list[int]] = {}
        for i, g in enumerate(self.train_gold):
            for t in g:
                users.setdefault(t, []).append(i)
        return QueryPairSampler(self.train_gold, users, self.cfg.batch_size, self.seed, rank, world)

    def train_collator(self) -> Any:
        return QueryPairCollator(self.tok, self.train_query_texts, self.tool_texts, self.train_gold,
                                 self.cfg.max_query_length, self.cfg.max_query_length)


@TASKS.register("tool2vec")
class Tool2VecTask(BiEncoderTask):
    Config = Tool2VecTaskConfig

    def build(self, artifacts: dict[str, Any] | None) -> None:
        m = self.model_cfg
        if not m.shared or m.instret or m.hard_negatives or m.freeze_layers:
            raise ValueError("model.name=tool2vec trains one shared query encoder on query pairs: shared=true, "
                             "instret=false, hard_negatives=false, freeze_layers=0 (no cached frozen bottom)")
        super().build(artifacts)
        self.usage: dict[str, list[str]] = artifacts.get("usage", {}) if artifacts else {}

    def make_datamodule(self, ds: ToolDataset, data_cfg: TextDataConfig, seed: int) -> QueryPairDataModule:
        m = self.model_cfg
        query_prefix, tool_prefix = m.prefixes
        dm = QueryPairDataModule(ds, data_cfg, self.tokenizer, tool_text_style=m.tool_text, seed=seed,
                                 query_prefix=query_prefix, tool_prefix=tool_prefix)
        self.catalog, self.tool_texts = dm.tools, dm.tool_texts
        self.usage = {}
        for q in dm.train_queries:
            for t in q.tools:
                self.usage.setdefault(t, []).append(q.text)
        return dm

    def prepare_scoring(self) -> None:
        r = self.as_retriever(encoder=self.query_encoder, progress=False)  # inside Lightning's val/test bar
        self.tool_vectors = r.tool_vectors.to(self.device)  # [N, H] in catalog order

    def checkpoint_artifacts(self) -> dict[str, Any]:
        return {**super().checkpoint_artifacts(), "usage": self.usage}

    def as_retriever(self, tools: list[Tool] | None = None, encoder=None, progress: bool = True) -> Any:
        from toolgraph.retrieval.tool2vec import Tool2VecConfig, Tool2VecRetriever

        m, d = self.model_cfg, self.cfg.data
        cfg = Tool2VecConfig(encoder=self.retriever_encoder(), tool_text=m.tool_text, progress=progress,
                             usage_weight=m.usage_weight, batch_size=d.eval_batch_size)
        enc = encoder if encoder is not None else copy.deepcopy(self.query_encoder).cpu().eval()
        was_training = enc.training
        r = Tool2VecRetriever(cfg, encoder=enc, tokenizer=self.tokenizer)
        r.usage = self.usage
        r.index(self.catalog if tools is None else tools)
        enc.train(was_training)
        return r
