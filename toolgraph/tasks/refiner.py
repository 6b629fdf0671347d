"""ToolRefiner (Moon et al. 2024): rerank N first-stage candidates in one encoder pass.

The encoder reads the query tokens followed by the N candidates' tool vectors (Tool2Vec vectors,
or description vectors), projected to its embedding size; one logit per candidate. ``loss:
softmax`` (the paper) or ``bce`` (its public code). Real runs start from all-MiniLM-L6-v2; the
DeBERTa-v2/v3 path (``model.encoder`` = a DeBERTa folder) is the same code and is tested with a
small random config.

Fast training (docs/usage-and-rerank.md): ``freeze_layers: K`` freezes the embeddings and the first K
layers, which read the query alone (the candidate slots join at layer K, ``ToolRefiner.slot_layer``),
and caches their outputs for every training query (``nn.frozen.FrozenBottom``), so an epoch runs only the layers
where query and candidates meet. ``model.encoder`` and ``model.vectors.encoder`` may be a fine-tuned encoder
folder (a fast bi-encoder run's ``retriever/encoder``): a warm start, and tool vectors that already
separate tools. ``learn_tool_vectors: true`` trains an offset per catalog tool on top of its vector
(``ToolRefiner.learned_tools``, at ``head_lr``): the refiner gets per-tool capacity as the MLC has,
and the exported reranker keeps the offsets (a tool added later gets its plain vector).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from toolgraph.config import TextEncoderSpec, accepts_renamed, to_dict
from toolgraph.data import prepare_dataset
from toolgraph.data.rerank import RerankDataModule
from toolgraph.data.schema import ToolDataset
from toolgraph.nn.encoder import backbone_artifacts, load_or_restore
from toolgraph.nn.frozen import FrozenBottom, FrozenBottomConfig
from toolgraph.nn.rerankers import ToolRefiner
from toolgraph.registry import TASKS
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.pipeline import resolve_retriever
from toolgraph.retrieval.rerankers import RefinerReranker, RefinerRerankerConfig
from toolgraph.tasks.rerank import RerankConfig, RerankTask, first_stage_spec


@dataclass
class VectorsSpec:
    """Where the refiner's tool vectors come from: ``kind`` tool2vec (the mean of a tool's training-query
    vectors) or description (its document's vector), both by the frozen ``encoder``. A plain string is
    the kind."""

    shorthand: ClassVar[str] = "kind"

    kind: Literal["tool2vec", "description"] = "tool2vec"
    encoder: TextEncoderSpec = field(default_factory=TextEncoderSpec)  # cache_dir: its embedding cache


@accepts_renamed
@dataclass
class RefinerConfig(FrozenBottomConfig, RerankConfig):
    # before the first stage and the vectors were nested specs (issue 42): one cache_dir served both
    renamed: ClassVar[dict[str, str | tuple[str, ...]]] = {
        "vector_encoder": "vectors.encoder.name",
        "cache_dir": ("first_stage.encoder.cache_dir", "vectors.encoder.cache_dir")}
    name: str = "refiner"
    vectors: VectorsSpec = field(default_factory=VectorsSpec)
    # freeze_layers (FrozenBottomConfig): the candidate slots join the query at layer K
    learn_tool_vectors: bool = False  # a trainable offset per catalog tool added to its (fixed) vector


@TASKS.register("refiner")
class RefinerTask(RerankTask):
    Config = RefinerConfig

    def build_network(self, artifacts: dict[str, Any] | None) -> None:
        m = self.model_cfg
        self.backbone, self.tokenizer = load_or_restore(m.encoder.name, artifacts and artifacts["query"])
        self.network: ToolRefiner | None = None
        self.vectors: Retriever | None = None
        self.frozen = FrozenBottom(m, self.backbone)
        self._query_texts: list[str] = []  # training queries (frozen bottom: their cached states)
        if artifacts:
            self._make_network(artifacts["vector_dim"], len(self.catalog))

    def _make_network(self, dim: int, n_tools: int) -> None:
        m = self.model_cfg
        self.network = ToolRefiner(self.backbone, dim, m.dropout, slot_layer=m.freeze_layers,
                                   learned_tools=n_tools if m.learn_tool_vectors else 0)
        self.register_buffer("tool_vectors", torch.zeros(n_tools, dim))  # [T, D], saved in checkpoints

    def _vector_spec(self) -> dict[str, Any]:
        m = self.model_cfg
        return {"name": "tool2vec" if m.vectors.kind == "tool2vec" else "dense", "encoder": to_dict(m.vectors.encoder),
                "tool_text": m.tool_text}

    def prepare_tools(self, ds: ToolDataset, dm: RerankDataModule) -> None:
        self._query_texts = [q.text for q in dm.train_queries]
        self.frozen.serve(dm, queries=(self.backbone, self._query_texts, self.cfg.data.max_query_length))
        spec = self._vector_spec()
        same = spec == first_stage_spec(self.model_cfg)
        self.vectors = self.first_stage if same else resolve_retriever(spec, "model.vectors")
        if not same:
            self.vectors.fit(ds)
            self.vectors.index(dm.tools)
        if [t.id for t in self.vectors.tools] != [t.id for t in dm.tools]:
            raise RuntimeError("tool vectors are not in catalog order")
        table = self.vectors.tool_vectors.float()
        if self.network is None:
            self._make_network(table.shape[1], len(dm.tools))
        self.tool_vectors = table.to(self.tool_vectors.device)

    def on_train_start(self) -> None:
        from lightning.pytorch.utilities.rank_zero import rank_zero_info

        self.frozen.build(self.tokenizer, self.cfg.data.eval_batch_size, self.device, rank_zero_info)

    def rerank_logits(self, batch: dict[str, Any], cands: torch.Tensor) -> torch.Tensor:
        mask = cands >= 0
        vecs = self.network.tool_inputs(self.tool_vectors[cands.clamp(min=0)], cands)  # [B, N, D]
        if "query" not in batch:  # a training batch over cached states (freeze_layers > 0)
            states, qmask = self.frozen.batch("queries", batch["index"], self.device)
            return self.network.forward_states(states, qmask, vecs, mask)  # [B, N]
        q = batch["query"]
        return self.network(q["input_ids"], q["attention_mask"], vecs, mask)  # [B, N]

    def encoder_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.network.backbone.parameters())

    def checkpoint_artifacts(self) -> dict[str, Any]:
        return {"query": backbone_artifacts(self.backbone, self.tokenizer), "vector_dim": int(self.tool_vectors.shape[1]),
                "tools": [t.to_dict() for t in self.catalog]}

    def as_reranker(self) -> Any:
        if self.vectors is None:  # from a checkpoint: refit the vector source on the run's training data
            self.vectors = resolve_retriever(self._vector_spec(), "model.vectors")
            self.vectors.fit(prepare_dataset(self.cfg.data))
        learned = [t.id for t in self.catalog] if self.model_cfg.learn_tool_vectors else []
        cfg = RefinerRerankerConfig(tool_text=self.model_cfg.tool_text, max_length=self.cfg.data.eval_max_query_length,
                                    slot_layer=self.model_cfg.freeze_layers, learned_tools=learned)
        return RefinerReranker(cfg, network=copy.deepcopy(self.network).cpu().eval(), tokenizer=self.tokenizer,
                               vectors=self.vectors)
