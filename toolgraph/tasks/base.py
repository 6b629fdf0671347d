"""The shared base of every LightningModule: metrics per stage, optimizer, schedule, checkpoints.

A task overrides a few hooks:
    compute_loss(batch) -> scalar        training objective
    prepare_scoring()                    before val/test: e.g. encode every tool once
    score(batch) -> [B, N]               scores of each query in the batch over all N tools
    param_groups() (optional)            parameter groups for AdamW
    make_datamodule(dataset, cfg)        how the task wants its data served
    as_retriever(tools)                  the inference-side Retriever this task becomes
    exported_encoder() (optional)        a text encoder saved beside it as a sentence-transformers folder

Validation is full-corpus retrieval over the val split, scored with the Foundation metrics and
logged as ``val/recall@5`` etc.; the checkpoint carries the resolved config (it describes itself).
"""

from __future__ import annotations

import math
import random
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from toolgraph.cards import write_cards
from toolgraph.config import OptimConfig, TaskConfig, TrainConfig, from_dict, to_saved
from toolgraph.data import prepare_dataset
from toolgraph.errors import ConfigError, DataError, ToolgraphError
from toolgraph.evaluation import evaluate, write_report
from toolgraph.metrics import RetrievalMetrics
from toolgraph.nn.encoder import TextEncoder
from toolgraph.nn.export import export_sentence_transformer
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.topk import topk
from toolgraph.runs import Checkpoint, read_results, replace_folder

__all__ = ["NonFiniteLossError", "OptimConfig", "RetrievalTask", "Task", "TaskConfig", "lr_lambda"]


class NonFiniteLossError(ToolgraphError):
    """The training loss became NaN or infinite; the run stops (the command exits non-zero)."""


def lr_lambda(step: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the base learning rate at optimizer step ``step``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ConfigError(f"optim.schedule must be linear, cosine or constant, got {schedule!r}")


class Task(L.LightningModule):
    """What every toolgraph LightningModule shares: config, optimizer, schedule, self-describing
    checkpoints. ``RetrievalTask`` adds retrieval metrics; the discriminator adds classification ones."""

    Config: type = TaskConfig

    def __init__(self, cfg: TrainConfig, artifacts: dict[str, Any] | None = None):
        """``cfg``: the run's typed config, the one object ``load_config`` made (``training.train`` passes
        it as is); it is saved in checkpoints as plain data (``hyper_parameters.config``).
        ``artifacts``: what a checkpoint stores to rebuild the model without downloads."""
        super().__init__()
        if not isinstance(cfg, TrainConfig):
            raise TypeError(f"{type(self).__name__} takes the run's TrainConfig (load_config(TrainConfig, ...)), got "
                            f"{type(cfg).__name__}; a saved config (a dict) is read by Task.from_checkpoint")
        self.save_hyperparameters({"config": to_saved(cfg)})  # saved form: a literal ${ stays one
        self.cfg = cfg
        self.model_cfg = cfg.model
        self.build_metrics()
        self.build(artifacts)
        self.train()  # from_pretrained returns eval-mode modules; Lightning keeps submodule modes as found

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint) -> Task:
        """The task a checkpoint (``runs.read_checkpoint``) describes, with its weights: the one place a saved
        config (plain data) becomes a typed config again."""
        cfg = from_dict(TrainConfig, ckpt.config, f"{ckpt.path}: hyper_parameters.config")
        task = cls(cfg, artifacts=ckpt.artifacts)
        try:
            task.load_state_dict(ckpt.state_dict)
        except RuntimeError as e:  # missing / unexpected keys, other shapes
            raise DataError(f"the weights do not fit the {ckpt.task} model its config describes ({str(e)[:300]}); "
                            "the checkpoint is damaged or was edited", ckpt.path) from None
        return task

    def build_metrics(self) -> None:
        pass

    @abstractmethod
    def build(self, artifacts: dict[str, Any] | None) -> None:
        """Create the modules (from pretrained weights, or from checkpoint ``artifacts``)."""

    # ---- how training.train() drives a task -------------------------------------------------
    @classmethod
    @abstractmethod
    def monitorable(cls, cfg: Any) -> list[str]:
        """Names ``checkpoint.monitor`` may take."""

    @abstractmethod
    def datamodule_for(self) -> L.LightningDataModule:
        """The datamodule this task trains on (from ``self.cfg``)."""

    @abstractmethod
    def finish(self, out: Path, dm: L.LightningDataModule,
               extra: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
        """After fit and test, on rank 0 with the best weights loaded: export, write results (results.json
        last, with ``extra()``'s entries, e.g. the training summary); returns the headline metrics."""

    def param_groups(self) -> list[dict[str, Any]]:
        """AdamW groups: no weight decay on biases and norm weights (1-d parameters)."""
        decay, no_decay = [], []
        for _, p in self.named_parameters():
            if p.requires_grad:
                (no_decay if p.ndim < 2 else decay).append(p)
        groups = [{"params": decay, "weight_decay": self.cfg.optim.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        lr, body = getattr(self.model_cfg, "head_lr", None), self.encoder_parameters()
        if lr is None or body is None:
            return groups
        body_ids = {id(p) for p in body}  # pretrained encoder at optim.lr; new layers on top at head_lr
        out = []
        for g in groups:
            enc = [p for p in g["params"] if id(p) in body_ids]
            top = [p for p in g["params"] if id(p) not in body_ids]
            out += [{**g, "params": enc}] if enc else []
            out += [{**g, "params": top, "lr": lr}] if top else []
        return out

    def encoder_parameters(self) -> list[torch.nn.Parameter] | None:
        """The pretrained part, for tasks whose new head learns at ``model.head_lr`` (None: one lr)."""
        return None

    def checkpoint_artifacts(self) -> dict[str, Any]:
        return {}

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Stop on a non-finite loss, before it reaches the weights: a NaN / inf loss would turn every
        weight into NaN and the run would go on (and export) a model that ranks nothing."""
        bad = not bool(torch.isfinite(loss.detach()).all())
        if self.trainer is not None and self.trainer.world_size > 1:  # every rank stops together
            bad = self.trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad:
            raise NonFiniteLossError(
                f"train/loss is {loss.detach().float().flatten()[0].item()} at step {self.global_step} (epoch "
                f"{self.current_epoch}): training stopped before the weights were changed, and nothing was "
                "exported. Lower optim.lr, raise model.temperature if the task has one, or keep "
                "trainer.gradient_clip_val set; checkpoints saved so far are finite")

    def configure_optimizers(self) -> Any:
        o = self.cfg.optim
        opt = torch.optim.AdamW(self.param_groups(), lr=o.lr, betas=tuple(o.betas), eps=o.eps)
        total = int(self.trainer.estimated_stepping_batches) if self.trainer is not None else 1
        warmup = o.warmup_steps if o.warmup_steps is not None else int(o.warmup_ratio * total)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, total, warmup, o.schedule))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- checkpoints describe themselves; RNG state makes mid-epoch resume exact ------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        py = random.getstate()
        npy = np.random.get_state()
        rng = {"torch": torch.get_rng_state(), "python": [py[0], list(py[1]), py[2]],
               "numpy": [npy[1].tolist(), int(npy[2]), int(npy[3]), float(npy[4])]}
        checkpoint["toolgraph"] = {"task": self.model_cfg.name, "artifacts": self.checkpoint_artifacts(), "rng": rng}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        rng = checkpoint.get("toolgraph", {}).get("rng")
        if rng:
            torch.set_rng_state(rng["torch"])
            version, state, gauss = rng["python"]
            random.setstate((version, tuple(state), gauss))
            keys, pos, has_gauss, cached = rng["numpy"]
            np.random.set_state(("MT19937", np.array(keys, dtype=np.uint32), pos, has_gauss, cached))



class RetrievalTask(Task):
    """A task whose model retrieves tools: val/test are full-corpus retrieval over a query split,
    logged as ``val/recall@5`` etc.; after training it exports a Retriever and evaluates it."""

    def build_metrics(self) -> None:
        ks, names = self.cfg.eval.ks, self.cfg.eval.metrics
        self.val_metrics = RetrievalMetrics(ks, names, prefix="val/")
        self.test_metrics = RetrievalMetrics(ks, names, prefix="test/")

    @classmethod
    def monitorable(cls, cfg: Any) -> list[str]:
        return [f"val/{m}@{k}" for m in cfg.eval.metrics for k in cfg.eval.ks] + ["val/mrr"]

    def datamodule_for(self) -> L.LightningDataModule:
        cfg = self.cfg
        ds = prepare_dataset(cfg.data)
        dm = self.make_datamodule(ds, cfg.data, cfg.seed)
        if not dm.train_queries:
            raise ConfigError(f"data.name: {ds.name!r} has no train queries")
        if not ds.split(cfg.data.val_split):
            raise ConfigError(f"data.val_split: {ds.name!r} has no {cfg.data.val_split!r} queries")
        return dm

    def finish(self, out: Path, dm: L.LightningDataModule,
               extra: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
        retriever = self.export_retriever(out / "retriever", dm.tools)
        report = evaluate(retriever, dm.ds, self.cfg.data.test_split, self.cfg.eval)
        write_report(report, out, self.cfg, dm.ds, extra)
        write_cards(out / "retriever", read_results(out / "results.json"))  # the numbers as written
        return report.metrics

    @abstractmethod
    def compute_loss(self, batch: dict[str, Any]) -> torch.Tensor: ...

    @abstractmethod
    def score(self, batch: dict[str, Any]) -> torch.Tensor: ...

    def prepare_scoring(self) -> None:
        pass

    # ---- Lightning ----------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self.compute_loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["gold"].shape[0])
        return loss

    def on_validation_epoch_start(self) -> None:
        self.prepare_scoring()

    def on_test_epoch_start(self) -> None:
        self.prepare_scoring()

    def _eval_step(self, batch: dict[str, Any], metric: RetrievalMetrics) -> None:
        scores = self.score(batch)  # [B, N]
        depth = min(max(self.cfg.eval.ks), scores.shape[1])
        _, idx = topk(scores.float(), depth)  # [B, depth]
        gold = batch["gold"]  # [B, G], -1 padded
        hits = (idx.unsqueeze(2) == gold.unsqueeze(1)).any(2)  # [B, depth]
        metric.update(hits, (gold >= 0).sum(1))

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics)

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.val_metrics.compute(), prog_bar=False)
        self.val_metrics.reset()

    def on_test_epoch_end(self) -> None:
        self.log_dict(self.test_metrics.compute())
        self.test_metrics.reset()

    # ---- inference side ----------------------------------------------------------------------
    @abstractmethod
    def as_retriever(self, tools: list | None = None) -> Retriever:
        """The trained model as an in-memory Retriever indexed over ``tools`` (default: the catalog)."""

    def exported_encoder(self) -> tuple[TextEncoder, int] | None:
        """(text encoder, max length) to save as a sentence-transformers folder beside the exported
        retriever, so other tools can load the trained encoder; None when there is none."""
        return None

    def exported_prompts(self) -> dict[str, str]:
        """Prompts saved with the exported encoder (sentence-transformers ``prompts``): the text the
        model was trained to see before queries and tool documents."""
        return {}

    def export_retriever(self, folder: str | Path, tools: list | None = None) -> Retriever:
        """Save ``as_retriever(tools)`` to ``folder`` (loads with ``toolgraph.load``), and the trained
        encoder, if any, under ``folder/encoder``. Written into a hidden sibling and swapped in, so an
        interrupted export leaves the previous folder (or none); a ``folder`` that exists and is not a
        saved retriever is refused, never replaced."""
        r = self.as_retriever(tools)

        def build(tmp: Path) -> Retriever:
            exported = self.exported_encoder()
            if exported is not None:
                export_sentence_transformer(exported[0], self.tokenizer, tmp / "encoder", exported[1],
                                            self.exported_prompts())
            r.save(tmp)
            return r

        return replace_folder(folder, build, "export folder")
