"""MLC (multi-label classification, Moon et al. 2024): encoder + one logit per training tool.

``loss: bce`` trains independent sigmoids (the paper's text); ``loss: softmax`` trains a softmax
over all tools against the multi-hot target spread evenly over the gold tools (the paper's
public code, through DeBERTa's default head). The head learns with its own ``head_lr``: it starts
from zero knowledge while the encoder is pretrained. The exported retriever ranks by logit; tools
outside the training catalog cannot be scored (see ``retrieval/classifier.py``).

Fast training (docs/dense.md, "Fast training"): ``freeze_layers: K`` freezes the embeddings and the
first K layers and caches their outputs for every training query (``nn.frozen.FrozenBottom``, as the
bi-encoder, under ``states_dir``);
``model.encoder`` may be a fine-tuned encoder folder (a bi-encoder run's ``retriever/encoder``): a
warm start, so the head is learnt over vectors that already separate tools.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import torch

from toolgraph.config import (
    TaskConfig,
    TextDataConfig,
    TextEncoderSpec,
    accepts_renamed,
    bounded,
    encoder_spec,
    unread_keys,
)
from toolgraph.data.schema import Tool, ToolDataset
from toolgraph.data.text import LabelDataModule
from toolgraph.nn.encoder import TextEncoder, backbone_artifacts, load_or_restore
from toolgraph.nn.frozen import FrozenBottom, FrozenBottomConfig
from toolgraph.nn.heads import ToolClassifier, multi_hot
from toolgraph.nn.losses import multilabel_loss
from toolgraph.registry import TASKS
from toolgraph.retrieval.classifier import ClassifierRetriever, ClassifierRetrieverConfig
from toolgraph.tasks.base import RetrievalTask

# the head reads unnormalised vectors; no prefixes
CLASSIFIER_ENCODER = encoder_spec(normalize=False)


@accepts_renamed
@dataclass
class ClassifierConfig(FrozenBottomConfig, TaskConfig):
    # the activation cache's older name; the encoder's keys before they became one spec (issue 42)
    renamed: ClassVar[dict[str, str]] = {"cache_dir": "states_dir", "pooling": "encoder.pooling"}
    name: str = "mlc"
    encoder: TextEncoderSpec = field(default_factory=CLASSIFIER_ENCODER)  # name, pooling, normalize (lengths: data.*)
    loss: Literal["bce", "softmax"] = "bce"  # see module docstring
    head_lr: float | None = bounded(1.0e-3, gt=0)  # null: optim.lr
    dropout: float = bounded(0.1, ge=0, lt=1)

    def validate(self):
        yield from unread_keys(self.encoder, CLASSIFIER_ENCODER(),
                               ("max_length", "max_query_length", "cache_dir", "query_prefix", "doc_prefix"),
                               "the classifier reads queries alone, truncated by data.max_query_length and "
                               "data.eval_max_query_length, without a prefix")


@TASKS.register("mlc")
class ClassifierTask(RetrievalTask):
    Config = ClassifierConfig

    def build(self, artifacts: dict[str, Any] | None) -> None:
        m = self.model_cfg
        backbone, self.tokenizer = load_or_restore(m.encoder.name, artifacts and artifacts["query"])
        self.encoder = TextEncoder(backbone, m.encoder.pooling, m.encoder.normalize)
        self.catalog: list[Tool] = []
        self.model: ToolClassifier | None = None
        self.frozen = FrozenBottom(m, self.encoder.backbone)
        self._query_texts: list[str] = []  # training queries (frozen bottom: their cached states)
        if artifacts:
            self._set_catalog([Tool(**t) for t in artifacts["tools"]])

    def _set_catalog(self, tools: list[Tool]) -> None:
        """The head has one output per catalog tool; it is sized once the dataset is known."""
        self.catalog = tools
        self.model = ToolClassifier(self.encoder, len(tools), self.model_cfg.dropout)

    def make_datamodule(self, ds: ToolDataset, data_cfg: TextDataConfig, seed: int) -> LabelDataModule:
        dm = LabelDataModule(ds, data_cfg, self.tokenizer, seed=seed)
        self._query_texts = [q.text for q in dm.train_queries]
        self.frozen.serve(dm, queries=(self.encoder.backbone, self._query_texts, self.cfg.data.max_query_length))
        self._set_catalog(dm.tools)
        if self.model_cfg.loss == "bce":  # start every sigmoid at the average label rate, not 0.5:
            # with hundreds of tools, early BCE gradients otherwise go into pushing all logits down
            rate = sum(len(g) for g in dm.train_gold) / (len(dm.train_gold) * len(dm.tools))
            torch.nn.init.constant_(self.model.head.bias, float(torch.logit(torch.tensor(rate))))
        return dm

    def on_train_start(self) -> None:
        from lightning.pytorch.utilities.rank_zero import rank_zero_info

        self.frozen.build(self.tokenizer, self.cfg.data.eval_batch_size, self.device, rank_zero_info)

    def encoder_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.encoder.parameters())

    def compute_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        if self.frozen:  # the top layers over cached states, then the same dropout and head as ToolClassifier.forward
            pooled = self.frozen.encode("queries", self.encoder, batch["index"], self.device)  # [B, H]
            logits = self.model.head(self.model.dropout(pooled))
        else:
            logits = self.model(**batch["query"])  # [B, T]
        return multilabel_loss(logits, multi_hot(batch["gold"], logits.shape[1]), self.model_cfg.loss)

    def score(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.model(**batch["query"])  # [B, T]

    def checkpoint_artifacts(self) -> dict[str, Any]:
        return {"query": backbone_artifacts(self.encoder.backbone, self.tokenizer),
                "tools": [t.to_dict() for t in self.catalog]}

    def as_retriever(self, tools: list[Tool] | None = None) -> Any:
        m, d = self.model_cfg, self.cfg.data
        cfg = ClassifierRetrieverConfig(encoder=replace(m.encoder, name="encoder", max_length=d.eval_max_query_length,
                                                        max_query_length=d.eval_max_query_length, cache_dir=None))
        r = ClassifierRetriever(cfg, encoder=copy.deepcopy(self.encoder).cpu().eval(), tokenizer=self.tokenizer,
                                head=self.model.head, head_tools=[t.id for t in self.catalog])
        r.index(self.catalog if tools is None else tools)
        return r

    def exported_encoder(self) -> tuple[TextEncoder, int]:
        return self.encoder, self.cfg.data.eval_max_query_length
