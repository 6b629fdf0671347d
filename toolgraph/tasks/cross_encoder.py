"""Cross-encoder reranker ("RerankRet" in the LoSemB paper): each (query, tool document) pair is
read jointly and scored from [CLS]. Trained on first-stage candidates (data/rerank.py protocol)
with a softmax over each query's candidates (or BCE). Accurate, but one full encoder pass per pair:
compare its latency with the ToolRefiner's in benchmarks/usage_rerank.py.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from toolgraph.config import accepts_renamed, bounded
from toolgraph.nn.encoder import backbone_artifacts, load_or_restore
from toolgraph.nn.rerankers import PairScorer
from toolgraph.registry import TASKS
from toolgraph.retrieval.pipeline import BELOW
from toolgraph.retrieval.rerankers import CrossEncoderReranker, CrossEncoderRerankerConfig
from toolgraph.tasks.rerank import RerankConfig, RerankTask


@accepts_renamed
@dataclass
class CrossEncoderConfig(RerankConfig):
    name: str = "cross_encoder"
    candidates: int = bounded(8, ge=1)  # pairs per training query (each one a full encoder pass)
    eval_candidates: int | None = bounded(32, ge=1)
    max_pair_length: int = bounded(160, ge=1)  # query + tool document tokens


@TASKS.register("cross_encoder")
class CrossEncoderTask(RerankTask):
    Config = CrossEncoderConfig

    def build_network(self, artifacts: dict[str, Any] | None) -> None:
        backbone, self.tokenizer = load_or_restore(self.model_cfg.encoder.name, artifacts and artifacts["query"])
        self.network = PairScorer(backbone, self.model_cfg.dropout)
        self._docs: list[str] = []

    def rerank_logits(self, batch: dict[str, Any], cands: torch.Tensor) -> torch.Tensor:
        if len(self._docs) != len(self.catalog):
            self._docs = [t.document(self.model_cfg.tool_text) for t in self.catalog]
        valid = cands >= 0
        rows, cols = valid.nonzero(as_tuple=True)
        texts = batch["texts"]
        tok = self.tokenizer([texts[i] for i in rows.tolist()], [self._docs[j] for j in cands[valid].tolist()],
                             padding=True, truncation="longest_first", max_length=self.model_cfg.max_pair_length,
                             return_tensors="pt")
        tok = {k: v.to(self.device) for k, v in tok.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        logits = self.network(**tok)  # [P]
        out = torch.full(cands.shape, BELOW * 10, device=self.device, dtype=logits.dtype)
        out[rows, cols] = logits
        return out  # [B, N]

    def encoder_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.network.backbone.parameters())

    def checkpoint_artifacts(self) -> dict[str, Any]:
        return {"query": backbone_artifacts(self.network.backbone, self.tokenizer),
                "tools": [t.to_dict() for t in self.catalog]}

    def as_reranker(self) -> Any:
        cfg = CrossEncoderRerankerConfig(tool_text=self.model_cfg.tool_text, max_length=self.model_cfg.max_pair_length,
                                         batch_size=64)
        return CrossEncoderReranker(cfg, network=copy.deepcopy(self.network).cpu().eval(), tokenizer=self.tokenizer)
