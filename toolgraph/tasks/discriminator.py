"""The tool-dependency discriminator of TGR (Tool Graph Retriever): a cross-encoder reads
``[CLS] doc_a [SEP] doc_b`` and a 3-way head says a_needs_b / none / b_needs_a.

Two stages, as in the paper: ``pretrain`` on the class-balanced set with cross-entropy, then
``finetune`` on the imbalanced set (the real class ratio) with the category-averaged loss
(``nn.losses.category_averaged_ce``), starting from the pretrain checkpoint (``init_from``).
Validation is the held-out 20 % of the finetuning pairs; the best checkpoint is chosen by the
macro-F1 of the two dependency classes; test reports per-class P/R/F1 and the confusion matrix
on the tool-disjoint test set. ``predict`` scores any pair list (graph construction).

Calibration: after every validation the task fits a temperature on the val logits of the sources
the test set draws on (``nn.calibration``) and picks the graph's edge threshold there (best val F1
of directed edges); both are
buffers, so the checkpoint chosen by val carries its own. ``predict`` returns the calibrated
probabilities; the test report gives the expected calibration error before and after, with the
reliability bins. ``DiscriminatorTask`` is the cross-encoder; ``discriminator_schema`` reads
schema features instead (``tasks/discriminator_schema.py``) and shares everything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassConfusionMatrix

from toolgraph.config import TaskConfig, TextEncoderSpec, accepts_renamed, bounded, unread_keys
from toolgraph.data.tdi import LABEL_INDEX, LABELS, TDIConfig, build_tdi, read_tdi
from toolgraph.errors import ConfigError
from toolgraph.nn.calibration import edge_threshold, fit_temperature, reliability
from toolgraph.nn.encoder import backbone_artifacts, load_or_restore
from toolgraph.nn.losses import category_averaged_ce
from toolgraph.nn.rerankers import PairScorer
from toolgraph.registry import TASKS
from toolgraph.retrieval.loading import load_task
from toolgraph.runs import resolve_checkpoint, write_results
from toolgraph.tasks.base import Task

DEPENDENCY_CLASSES = ("a_needs_b", "b_needs_a")


@accepts_renamed
@dataclass
class DiscriminatorConfig(TaskConfig):
    name: str = "discriminator"
    # the cross-encoder's backbone (its name; a pair of documents is cut at max_pair_length)
    encoder: TextEncoderSpec = field(default_factory=TextEncoderSpec)
    stage: Literal["pretrain", "finetune"] = "finetune"  # balanced set | real class ratio
    init_from: str | None = None  # a pretrain-stage .ckpt or run folder; None: start from the encoder
    loss: Literal["ce", "category_avg"] | None = None  # default: ce for pretrain, category_avg for finetune
    class_count: Literal["batch", "dataset"] = "batch"  # N_k of the category-averaged loss
    max_pair_length: int = bounded(128, ge=1)  # both documents together (longest truncated first)
    dropout: float = bounded(0.1, ge=0, lt=1)
    head_lr: float | None = bounded(1.0e-3, gt=0)

    def validate(self):
        yield from unread_keys(self.encoder, TextEncoderSpec(), ("pooling", "normalize", "max_length",
                               "max_query_length", "query_prefix", "doc_prefix", "cache_dir"),
                               "the cross-encoder reads only encoder.name; pairs are cut at max_pair_length")


def classification_report(confusion: torch.Tensor) -> dict[str, float]:
    """Per-class precision/recall/F1, accuracy, and ``macro_f1`` over the two dependency classes
    (TGR's headline) plus ``macro_f1_all`` over the three. ``confusion[i, j]``: true i, predicted j."""
    c = confusion.double()
    tp = c.diag()
    precision = tp / c.sum(0).clamp(min=1)  # [K]
    recall = tp / c.sum(1).clamp(min=1)  # [K]
    f1 = torch.where(precision + recall > 0, 2 * precision * recall / (precision + recall), torch.zeros_like(tp))
    out = {"accuracy": float(tp.sum() / c.sum().clamp(min=1))}
    for i, name in enumerate(LABELS):
        out[f"precision_{name}"] = float(precision[i])
        out[f"recall_{name}"] = float(recall[i])
        out[f"f1_{name}"] = float(f1[i])
    dep = [LABELS.index(n) for n in DEPENDENCY_CLASSES]
    out["macro_f1"] = float(f1[dep].mean())
    out["macro_f1_all"] = float(f1.mean())
    return out


@TASKS.register("discriminator")
class DiscriminatorTask(Task):
    Config = DiscriminatorConfig

    def build_metrics(self) -> None:
        self.val_confusion = MulticlassConfusionMatrix(len(LABELS))
        self.test_confusion = MulticlassConfusionMatrix(len(LABELS))
        self.test_report: dict[str, Any] = {}

    def build(self, artifacts: dict[str, Any] | None) -> None:
        m = self.model_cfg
        backbone, self.tokenizer = load_or_restore(m.encoder.name, artifacts and artifacts["encoder"])
        self.network = PairScorer(backbone, m.dropout, outputs=len(LABELS))
        previous = self.previous_stage(artifacts)
        if previous is not None:
            self.network.load_state_dict(previous.network.state_dict())
            self.tokenizer = previous.tokenizer
        self.build_calibration()

    def previous_stage(self, artifacts: dict[str, Any] | None) -> DiscriminatorTask | None:
        """The task of ``model.init_from`` (a pretrain-stage run of the same model), or None; a
        checkpoint being restored (``artifacts``) carries its weights itself."""
        m = self.model_cfg
        if not m.init_from or artifacts:
            return None
        start = resolve_checkpoint(m.init_from, "model.init_from")
        previous = load_task(start)
        if type(previous) is not type(self):
            raise ConfigError(f"model.init_from: {start} is a {previous.model_cfg.name!r} checkpoint, "
                              f"not a {m.name!r} one")
        return previous

    def build_calibration(self) -> None:
        self.register_buffer("class_counts", torch.ones(len(LABELS)), persistent=False)
        self.register_buffer("temperature", torch.ones(()))  # fitted on val: in the checkpoint
        self.register_buffer("edge_threshold", torch.tensor(0.5))

    def loss_name(self) -> str:
        m = self.model_cfg
        return m.loss or ("ce" if m.stage == "pretrain" else "category_avg")

    # ---- data -----------------------------------------------------------------------------------
    @classmethod
    def monitorable(cls, cfg: Any) -> list[str]:
        return ["val/macro_f1", "val/macro_f1_all", "val/accuracy", "val/nll"] + [f"val/f1_{n}" for n in LABELS]

    def datamodule_for(self):
        from toolgraph.data.pairs import PairDataModule

        cfg = self.cfg
        tdi = load_tdi(cfg.data.name, cfg.data.options, cfg.data.root)
        dm = PairDataModule(tdi, self.model_cfg.stage, cfg.data, self.tokenizer, self.model_cfg.max_pair_length,
                            cfg.seed)
        self.class_counts = torch.tensor(dm.class_counts(), dtype=torch.float)
        return dm

    # ---- training -------------------------------------------------------------------------------
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.network(**inputs)  # [B, 3]

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        logits = self(batch["inputs"])
        labels, weights = batch["labels"], batch["weights"]
        if self.loss_name() == "ce":
            loss = (F.cross_entropy(logits.float(), labels, reduction="none") * weights).sum() / weights.sum()
        else:
            counts = self.class_counts if self.model_cfg.class_count == "dataset" else None
            loss = category_averaged_ce(logits, labels, weights, counts)
        self.log("train/loss", loss, prog_bar=True, batch_size=labels.shape[0])
        return loss

    def encoder_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.network.backbone.parameters())

    # ---- evaluation -----------------------------------------------------------------------------
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        logits = self(batch["inputs"]).float()
        self.val_confusion.update(logits.argmax(1), batch["labels"])
        self._val_logits.append((logits.detach().cpu(), batch["labels"].cpu(), batch["index"].cpu()))

    def on_validation_epoch_start(self) -> None:
        self._val_logits: list[tuple[torch.Tensor, ...]] = []

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        logits = self(batch["inputs"]).float()
        pred = logits.argmax(1)
        self.test_confusion.update(pred, batch["labels"])
        self._test_predictions += list(zip(batch["index"].tolist(), pred.tolist(), strict=True))
        self._test_logits.append((logits.detach().cpu(), batch["labels"].cpu()))

    def on_test_epoch_start(self) -> None:
        self._test_predictions: list[tuple[int, int]] = []
        self._test_logits: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _gathered(self, parts: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        """(logits [N, 3], labels [N], ...) of this epoch from every rank."""
        if self.trainer is not None and self.trainer.world_size > 1:
            everyone: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(everyone, parts)
            parts = [p for part in everyone for p in part]
        if not parts:
            return torch.zeros(0, len(LABELS)), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        return tuple(torch.cat([p[k] for p in parts]) for k in range(len(parts[0])))

    def calibration_pairs(self, index: torch.Tensor) -> torch.Tensor:
        """Which val pairs (by position) fit the temperature and the edge threshold: those of the
        sources the test set draws on. A source kept out of test (UltraTool's call orders, not always
        dependencies) is rightly uncertain, and would teach the calibration to doubt the others."""
        dm = getattr(self.trainer, "datamodule", None) if self.trainer is not None else None
        tdi = getattr(dm, "tdi", None)
        if tdi is None or not tdi.pairs.get("test"):
            return torch.ones(len(index), dtype=torch.bool)
        tested = {p.source for p in tdi.pairs["test"]}
        keep = torch.tensor([tdi.pairs["val"][i].source in tested for i in index.tolist()], dtype=torch.bool)
        return keep if keep.any() else torch.ones(len(index), dtype=torch.bool)

    def on_validation_epoch_end(self) -> None:
        report = classification_report(self.val_confusion.compute())
        logits, labels, index = self._gathered(self._val_logits)
        keep = self.calibration_pairs(index)
        t = fit_temperature(logits[keep], labels[keep])  # the same on every rank: all hold all logits
        probs = (logits / t).softmax(-1)
        threshold, edge_f1 = edge_threshold(probs[keep], labels[keep])
        self.temperature.fill_(t)
        self.edge_threshold.fill_(threshold)
        nll = float(F.cross_entropy(logits, labels)) if len(labels) else 0.0
        self.log_dict({f"val/{k}": v for k, v in report.items()} | {
            "val/nll": nll, "val/temperature": t, "val/edge_threshold": threshold, "val/edge_f1": edge_f1,
            "val/ece": reliability(probs[keep], labels[keep])["ece"] if int(keep.sum()) else 0.0})
        self.val_confusion.reset()

    def on_test_epoch_end(self) -> None:
        confusion = self.test_confusion.compute()
        report = classification_report(confusion)
        logits, labels = self._gathered(self._test_logits)[:2]
        before, after = reliability(logits.softmax(-1), labels), reliability((logits / self.temperature).softmax(-1), labels)
        calibration = {"temperature": float(self.temperature), "ece_before": before["ece"], "ece_after": after["ece"],
                       "edge_threshold": float(self.edge_threshold), "reliability_before": before["bins"],
                       "reliability_after": after["bins"]}
        self.log_dict({f"test/{k}": v for k, v in report.items()} | {
            "test/ece_before": before["ece"], "test/ece_after": after["ece"]})
        self.test_report = {**report, "confusion": confusion.long().tolist(), "labels": list(LABELS),
                            "per_source": self._per_source(), "calibration": calibration}
        self.test_confusion.reset()

    def _per_source(self) -> dict[str, Any]:
        """The test report of each source dataset (predictions gathered from every rank)."""
        preds = self._test_predictions
        if self.trainer.world_size > 1:
            parts: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(parts, preds)
            preds = [p for part in parts for p in part]
        pairs = self.trainer.datamodule.tdi.pairs["test"]
        confusion: dict[str, torch.Tensor] = {}
        for index, pred in dict(preds).items():  # a pair repeated to even out ranks counts once
            p = pairs[index]
            c = confusion.setdefault(p.source, torch.zeros(len(LABELS), len(LABELS), dtype=torch.long))
            c[LABEL_INDEX[p.label], pred] += 1
        return {src: {"macro_f1": classification_report(c)["macro_f1"], "pairs": int(c.sum()),
                      "confusion": c.tolist()} for src, c in sorted(confusion.items())}

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, torch.Tensor]:
        logits = self(batch["inputs"]).float() / self.temperature  # calibrated on val
        return {"index": batch["index"], "probs": logits.softmax(-1)}  # [B], [B, 3]

    def pair_loader(self, tools: dict[str, Any], pairs: list[tuple[str, str]], style: str, batch_size: int):
        """A loader over (a, b) tool-id pairs for ``predict`` (graph construction); ``tools``: id -> Tool."""
        from toolgraph.data.pairs import length_sorted_loader
        from toolgraph.data.tdi import Pair

        documents = {i: tools[i].document(style) for i in {t for p in pairs for t in p}}
        items = [Pair(a, b, "none", "", "candidate") for a, b in pairs]  # label unused by predict
        return length_sorted_loader(self.tokenizer, items, documents, self.model_cfg.max_pair_length, batch_size)

    # ---- checkpoints and results ------------------------------------------------------------
    def checkpoint_artifacts(self) -> dict[str, Any]:
        return {"encoder": backbone_artifacts(self.network.backbone, self.tokenizer)}

    def finish(self, out: Path, dm: Any, extra: Any = None) -> dict[str, Any]:
        """results.json: the test report (per-class P/R/F1, confusion matrix) and the pair counts."""
        results = {"task": "discriminator", "stage": self.model_cfg.stage, "loss": self.loss_name(),
                   "class_count": self.model_cfg.class_count, "test": self.test_report,
                   "pairs": dm.tdi.counts(), "config": self.cfg.data.name}
        write_results(out, {**results, **(extra() if extra is not None else {})})
        return {k: v for k, v in self.test_report.items() if isinstance(v, float)}


def load_tdi(name: str, options: dict[str, Any], root: str | None):
    """``data.name: tdi`` builds the pair sets from the real sources (``data.options`` are
    TDIConfig keys); any other value is a folder written by ``toolgraph data tdi build``."""
    if name == "tdi":
        allowed = set(TDIConfig.__dataclass_fields__)
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ConfigError(f"data.options: unknown TDI option(s) {unknown}; expected some of {sorted(allowed)}")
        return build_tdi(TDIConfig(**options), root)
    if options:
        raise ConfigError("data.options apply when data.name is 'tdi' (built in memory), not to a TDI folder")
    return read_tdi(name)
