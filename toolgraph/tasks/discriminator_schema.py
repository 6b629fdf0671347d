"""The schema discriminator: TGR's 3-class dependency task read from the tools' fields.

A frozen text encoder embeds each tool's description, name, parameter names and return names once
(cached on disk); ``nn.pair_features`` turns a pair into field-match features in both directions
(does b return what a takes?), and ``SchemaPairHead`` reads them in both orders, so swapping a pair
swaps the two dependency classes exactly. Training is the MLP only: seconds per epoch on a CPU,
where the cross-encoder (``model.name: discriminator``) takes half an hour. Everything else —
stages, the category-averaged loss, val model selection, calibration, the test report, ``predict``
for graph construction — is ``DiscriminatorTask``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from toolgraph.config import TextEncoderSpec, accepts_renamed, bounded, encoder_spec, unread_keys
from toolgraph.data.pairs import FeatureCollator, FeaturePairDataModule
from toolgraph.data.tdi import Pair, tool_fields
from toolgraph.errors import ConfigError
from toolgraph.nn.encoder import TextEncoder, backbone_artifacts, load_or_restore
from toolgraph.nn.pair_features import SchemaPairHead, build_views, feature_matrix, pair_vectors
from toolgraph.registry import TASKS
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever
from toolgraph.tasks.discriminator import DiscriminatorConfig, DiscriminatorTask, load_tdi


@accepts_renamed
@dataclass
class SchemaDiscriminatorConfig(DiscriminatorConfig):
    renamed: ClassVar[dict[str, str]] = {"embed_max_length": "encoder.max_length",  # before the encoder was one spec
                                         "cache_dir": "encoder.cache_dir"}
    name: str = "discriminator_schema"
    # the frozen encoder of the field texts: name, pooling, normalize, max_length (tokens per field text,
    # >= 8) and cache_dir (its embedding cache)
    encoder: TextEncoderSpec = field(default_factory=encoder_spec(max_length=128))
    hidden: int = bounded(64, ge=1)
    dropout: float = bounded(0.2, ge=0, lt=1)
    vectors: Literal["none", "symmetric"] = "none"  # also the documents' u*v and |u-v| (order-free)
    head_lr: float | None = None  # one learning rate: the head is all that trains

    def validate(self):
        if self.encoder.max_length < 8:
            yield "encoder.max_length", f"must be >= 8 (tokens per field text), got {self.encoder.max_length}"
        yield from unread_keys(self.encoder, encoder_spec(max_length=128)(),
                               ("max_query_length", "query_prefix", "doc_prefix"),
                               "field texts are encoded as they are, cut at encoder.max_length")


@TASKS.register("discriminator_schema")
class SchemaDiscriminatorTask(DiscriminatorTask):
    Config = SchemaDiscriminatorConfig

    def build(self, artifacts: dict[str, Any] | None) -> None:
        m = self.model_cfg
        backbone, self.tokenizer = load_or_restore(m.encoder.name, artifacts and artifacts["encoder"])
        self.encoder = TextEncoder(backbone, m.encoder.pooling, m.encoder.normalize).requires_grad_(False).eval()
        dim = 2 * self.encoder.dim if m.vectors == "symmetric" else 0
        self.head = SchemaPairHead(dim, m.hidden, m.dropout)
        self.scaled = artifacts is not None  # a checkpoint carries its feature scale
        previous = self.previous_stage(artifacts)
        if previous is not None:
            self.head.load_state_dict(previous.head.state_dict())  # its feature scale too
            self.scaled = True
        self.build_calibration()

    def train(self, mode: bool = True):
        super().train(mode)
        self.encoder.eval()  # frozen: no dropout, ever
        return self

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(inputs["features"], inputs.get("vectors"))  # [B, 3]

    def encoder_parameters(self) -> list[torch.nn.Parameter] | None:
        return None

    def checkpoint_artifacts(self) -> dict[str, Any]:
        return {"encoder": backbone_artifacts(self.encoder.backbone, self.tokenizer)}

    # ---- features -------------------------------------------------------------------------------
    def embed(self, texts: list[str]) -> torch.Tensor:
        """Frozen-encoder vectors [n, H] through the dense retriever's embedding cache (the same
        cache, keys and batching as every other frozen-encoder embedding)."""
        m = self.model_cfg
        dense = DenseRetriever(DenseConfig(encoder=m.encoder, batch_size=self.cfg.data.eval_batch_size,
                                           device="cuda" if self.device.type == "cuda" else "cpu"),
                               self.encoder, self.tokenizer)
        return dense.embed(texts, "embedding tool fields")

    def inputs_of(self, views: dict[str, Any], pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
        inputs = {"features": feature_matrix(views, pairs)}
        if self.model_cfg.vectors == "symmetric":
            inputs["vectors"] = pair_vectors(views, pairs)
        return inputs

    def datamodule_for(self) -> FeaturePairDataModule:
        cfg = self.cfg
        tdi = load_tdi(cfg.data.name, cfg.data.options, cfg.data.root)
        missing = sorted({t for ps in tdi.pairs.values() for p in ps for t in (p.tool_a, p.tool_b)} - set(tdi.fields))
        if missing:
            raise ConfigError(f"data.name={cfg.data.name!r}: no schema fields for {len(missing)} tool(s) (e.g. "
                              f"{missing[0]!r}); the schema discriminator needs fields_a / fields_b on every line: "
                              "rebuild the folder with `toolgraph data tdi build`")
        views = build_views(tdi.fields, tdi.documents, self.embed)
        sets = (self.model_cfg.stage, "val", "test")
        tensors = {name: self.inputs_of(views, [(p.tool_a, p.tool_b) for p in tdi.pairs[name]]) for name in sets}
        if not self.scaled:
            self.head.fit_scale(tensors[self.model_cfg.stage]["features"])
        dm = FeaturePairDataModule(tdi, self.model_cfg.stage, cfg.data, tensors, cfg.seed)
        self.class_counts = torch.tensor(dm.class_counts(), dtype=torch.float)
        return dm

    def pair_loader(self, tools: dict[str, Any], pairs: list[tuple[str, str]], style: str, batch_size: int):
        """Features computed per batch from the tools' fields (any catalog, any size)."""
        used = sorted({t for p in pairs for t in p})
        views = build_views({i: tool_fields(tools[i]) for i in used}, {i: tools[i].document(style) for i in used},
                            self.embed)
        items = [Pair(a, b, "none", "", "candidate") for a, b in pairs]
        collate = FeatureCollator(items, lambda idx: self.inputs_of(views, [pairs[i] for i in idx]))
        return torch.utils.data.DataLoader(list(range(len(pairs))), batch_size=batch_size, shuffle=False,
                                           collate_fn=collate)
