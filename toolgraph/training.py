"""Config -> datamodule, task, trainer -> fit -> test with the best checkpoint -> export.

    python train.py --config configs/bi_encoder_toollens.yaml [--config configs/cluster/2nodes.yaml] optim.lr=1e-5

Everything lands in ``out_dir``: checkpoints/, config.yaml (resolved), logs/ (CSV, W&B),
retriever/ (exported, loads with ``toolgraph.load``), results.json (test metrics, the same shape
as evaluate.py writes), rankings.jsonl and curves.png.

Safe to interrupt and to re-run: ``out_dir`` must be new, empty or an earlier run's folder (anything
else is refused); a run first removes an earlier results.json, writes every file under a temp name
and renames it, and writes results.json last. Checkpoints too (``AtomicCheckpointIO``, below): each
is written to ``.NAME.tmp-PID`` inside checkpoints/, fsynced and renamed, so a kill -9 or a full disk
leaves the earlier checkpoint whole and never a cut file under its name (Lightning's own save goes
through $TMPDIR, and its "move" is a copy into the final name when out_dir is on another filesystem).

A new run into an earlier run's folder (``resume`` unset, or ``resume=auto`` with nothing to resume)
moves the old checkpoints/ aside to ``checkpoints.old-<time>/`` (nothing is deleted), so its last.ckpt
and best-*.ckpt are the only ones there. ``resume=auto`` continues from the newest ``last*.ckpt``
(an older folder may hold a ``last-v1.ckpt`` beside ``last.ckpt``). ``resume`` checks that the
checkpoint was written by the same task with the same ``model`` section, and loads it weights-only.

A run that would train nothing is refused before it writes anything, with a ConfigError naming the
key: ``trainer.max_epochs`` / ``max_steps`` / ``limit_train_batches`` of 0, a ``data.batch_size``
(or ``data.max_queries_per_tool``) that leaves no full training batch, an int ``trainer.val_check_interval``
longer than an epoch (a ``seed`` outside 0..2^32-1 already fails at config load). The last training step is
always validated (``ValidateTheLastStep``), so a run cut short by ``trainer.max_steps`` keeps a best checkpoint. A run
in which no validation ran all the same (``trainer.limit_val_batches=0``, ``save_top_k=0``: so there
is no best checkpoint and the test and export use the last weights) says so on stderr and in
results.json (``training.warnings``).
A NaN / inf loss stops the run (tasks/base.py); SIGTERM stops it at the end of the batch (exit 143).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EMAWeightAveraging, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn

from toolgraph.config import TrainConfig, from_dict, to_dict, to_yaml
from toolgraph.errors import ConfigError, DataError, ToolgraphError
from toolgraph.files import atomic_path, fsync_folder, is_temp_name, write_text_atomic
from toolgraph.registry import TASKS
from toolgraph.retrieval.progress import progress_enabled
from toolgraph.runs import check_output_folder, read_checkpoint, retire_results, sigterm_deferred

__all__ = ["AtomicCheckpointIO", "CheckpointWriteError", "TrainConfig", "build_trainer", "check_resume",
           "check_training_batches", "check_trains_something", "newest_last_checkpoint",
           "resolve_resume", "set_aside_checkpoints", "train"]


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. a container's or Slurm's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ThreadsPerRank(Callback):
    """CPU training: torch threads = the cores available, split between the ranks of this node so
    that 2 ranks do not oversubscribe (and a 2-core container does not run 64 threads)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not torch.cuda.is_available():
            torch.set_num_threads(max(1, available_cores() // max(1, trainer.num_devices)))


class ElapsedTime(Callback):
    """Logs ``time/seconds`` (since the fit started) with every validation, so quality can be read
    against wall-clock time (benchmarks/convergence.py)."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.perf_counter()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and hasattr(self, "start"):
            pl_module.log("time/seconds", time.perf_counter() - self.start, rank_zero_only=True)


class ValidateTheLastStep(Callback):
    """Training ends with a validation: the batch that reaches ``trainer.max_steps`` (or the last batch
    of the last epoch) is validated even when ``trainer.val_check_interval`` would not fall on it, so a
    shortened run (``trainer.max_steps=40`` on a recipe validating every quarter epoch) still keeps a
    best checkpoint of the weights it ends with. Lightning validates a batch after which the trainer
    was asked to stop; one validation per batch, never two."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        last_step = 0 < trainer.max_steps <= trainer.global_step
        epochs = trainer.max_epochs
        last_epoch = (epochs is not None and epochs > 0 and trainer.current_epoch + 1 >= epochs
                      and batch_idx + 1 >= trainer.num_training_batches)
        if last_step or last_epoch:
            trainer.should_stop = True


def device_name(trainer: L.Trainer) -> str:
    """What the run trained on, in words: GPU model and count, or CPU cores and threads."""
    root = trainer.strategy.root_device
    if root.type == "cuda":
        return f"{trainer.world_size} x {torch.cuda.get_device_name(root)}"
    return (f"cpu: {trainer.world_size} process(es) x {torch.get_num_threads()} threads, "
            f"{available_cores()} cores available")


def throughput(trainer: L.Trainer, cfg: TrainConfig, seconds: float) -> dict[str, Any]:
    """``train_seconds`` (the whole fit: caches, training, validation), optimizer ``steps``,
    ``examples_per_second`` (training queries over all ranks), and the ``device``."""
    batch = getattr(cfg.data, "batch_size", None)
    examples = (trainer.global_step * batch * trainer.world_size * cfg.trainer.accumulate_grad_batches
                if batch else None)
    return {"train_seconds": round(seconds, 1), "steps": trainer.global_step,
            "examples_per_second": round(examples / seconds, 2) if examples and seconds > 0 else None,
            "device": device_name(trainer), "world_size": trainer.world_size}


WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")  # W&B's own (dryrun: offline, run: online)


def wandb_mode(enabled: bool, environ: Mapping[str, str] | None = None) -> str | None:
    """The one decision of how a run logs to W&B (build_loggers and toolgraph doctor): None, no W&B
    logger, when ``logger.wandb`` is false or ``WANDB_MODE=disabled``; otherwise ``WANDB_MODE``, and
    ``offline`` when it is unset or empty (a run never reaches for the network unless asked). A value
    W&B does not know is a ConfigError naming it (wandb.init would fail on it after the data loaded)."""
    if not enabled:
        return None
    mode = (os.environ if environ is None else environ).get("WANDB_MODE") or "offline"
    if mode == "disabled":
        return None
    if mode not in WANDB_MODES:
        raise ConfigError(f"WANDB_MODE={mode!r} is not a W&B mode ({', '.join(WANDB_MODES)}); set one, or "
                          "logger.wandb=false")
    return mode


def build_loggers(cfg: TrainConfig, out: Path) -> list:
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    loggers: list = []
    if cfg.logger.csv:
        loggers.append(CSVLogger(str(out), name="logs", version=""))
    mode = wandb_mode(cfg.logger.wandb)
    if mode is not None:
        os.environ["WANDB_MODE"] = mode  # unset or empty: offline, never the network unless asked
        loggers.append(WandbLogger(project=cfg.logger.project, name=cfg.logger.run_name, save_dir=str(out),
                                   tags=cfg.logger.tags or None, group=cfg.logger.group, config=to_dict(cfg)))
    return loggers


class EMAWeights(EMAWeightAveraging):
    """Lightning's EMA callback, except that a checkpoint loaded to test keeps its state_dict, the
    average: Lightning's own puts the raw weights (``current_model_state``) back whenever the trainer
    that fitted loads a checkpoint, which is right for resuming and wrong for testing the best one."""

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)


# ---- checkpoint files: whole or absent ----------------------------------------------------------


class CheckpointWriteError(ToolgraphError, OSError):
    """A checkpoint could not be written (e.g. the disk is full); the earlier file of that name is intact."""


def _errnos(e: BaseException | None) -> set[int]:
    """The errno of ``e`` and of the exceptions it came from (torch wraps a failed write in a RuntimeError)."""
    seen: set[int] = set()
    while e is not None:
        if isinstance(e, OSError) and e.errno is not None:
            seen.add(e.errno)
        e = e.__cause__ or e.__context__
    return seen


def stale_temp_files(folder: Path) -> list[Path]:
    """Temp files ``.NAME.ckpt.tmp-PID`` that a killed save left in ``folder`` (only names we make, no links)."""
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if is_temp_name(p.name) and p.name.split(".tmp-")[0].endswith(".ckpt")
            and p.is_file() and not p.is_symlink()]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO``, except that a save serialises into ``.NAME.tmp-PID`` in the
    checkpoint's own folder (``files.atomic_path``), fsyncs it, renames it over NAME (one filesystem:
    atomic) and fsyncs the folder. A failed write removes the temp file and raises
    ``CheckpointWriteError``, the earlier NAME untouched; a kill -9 leaves the earlier NAME (and a temp
    file, which the next run into the folder removes)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if "://" in str(path):  # a remote URL (s3://...): fsspec's transaction is the right tool there
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # streamed into the temp file: no second copy of the checkpoint in memory
            with atomic_path(path) as tmp, tmp.open("wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
        except (OSError, RuntimeError) as e:
            codes = _errnos(e)
            if not codes:  # not a failed write (e.g. torch refusing an object): not ours to reword
                raise
            free = shutil.disk_usage(path.parent).free / 2**20
            why = ("the disk is full" if codes & {errno.ENOSPC, errno.EDQUOT}
                   else f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            raise CheckpointWriteError(
                f"checkpoint {path}: not written, {why} ({free:.0f} MiB free there). The earlier {path.name}, if "
                "any, is unchanged and no partial file was left. Free space (or point out_dir at a larger "
                "disk) and continue with resume=auto") from e
        fsync_folder(path.parent)
        return None


def build_trainer(cfg: TrainConfig, out: Path, callbacks: Sequence[Callback] = ()) -> L.Trainer:
    """The run's Trainer; ``callbacks`` are added to toolgraph's own (a sweep's trial reporter)."""
    extra = list(callbacks)
    t = cfg.trainer
    logged = TASKS.get(cfg.model.name).monitorable(cfg)
    if cfg.checkpoint.monitor not in logged:
        raise ConfigError(f"checkpoint.monitor: {cfg.checkpoint.monitor!r} is not logged by "
                          f"model.name={cfg.model.name!r} (it logs e.g. {', '.join(logged[:4])})")
    every = cfg.checkpoint.every_n_train_steps
    ckpt = ModelCheckpoint(dirpath=str(out / "checkpoints"), monitor=cfg.checkpoint.monitor, mode=cfg.checkpoint.mode,
                           save_top_k=cfg.checkpoint.save_top_k, save_last=not every,
                           filename="best-{epoch}-{step}", auto_insert_metric_name=False)
    callbacks: list[Callback] = [ckpt, ThreadsPerRank(), ElapsedTime(), ValidateTheLastStep(), *extra]
    if every:  # last.ckpt every N steps, so a crash loses at most N steps
        callbacks.append(ModelCheckpoint(dirpath=str(out / "checkpoints"), every_n_train_steps=every,
                                         save_top_k=0, save_last=True))
    if t.ema_decay:  # Lightning saves the average as the checkpoint's state_dict
        callbacks.append(EMAWeights(decay=t.ema_decay))
    loggers = build_loggers(cfg, out)
    if loggers:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    return L.Trainer(
        accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
        precision=t.precision, max_epochs=t.max_epochs, max_steps=t.max_steps, max_time=t.max_time,
        accumulate_grad_batches=t.accumulate_grad_batches,
        gradient_clip_val=t.gradient_clip_val,
        val_check_interval=t.val_check_interval, check_val_every_n_epoch=t.check_val_every_n_epoch,
        limit_train_batches=t.limit_train_batches, limit_val_batches=t.limit_val_batches,
        log_every_n_steps=t.log_every_n_steps, deterministic=t.deterministic,
        enable_progress_bar=progress_enabled(t.enable_progress_bar), num_sanity_val_steps=t.num_sanity_val_steps,
        logger=loggers or False, callbacks=callbacks, default_root_dir=str(out),
        use_distributed_sampler=False,  # our batch sampler shards by rank itself
        # checkpoints written whole or not at all; Lightning hands the plugin to the strategy (DDP too).
        # XLA needs its own CheckpointIO (tensors leave the TPU first)
        plugins=[] if t.accelerator == "tpu" else [AtomicCheckpointIO()],
    )


_LAST = re.compile(r"last(-v\d+)?\.ckpt")  # last.ckpt, and last-vN.ckpt: Lightning's name when last.ckpt exists


def newest_last_checkpoint(folder: Path) -> Path | None:
    """The last checkpoint written most recently in ``folder``. Usually ``last.ckpt``; a folder that an
    earlier version re-ran a run into also holds ``last-v1.ckpt`` (the re-run's progress), which is newer.
    By modification time: the step a checkpoint records says nothing about which run wrote it."""
    found = [p for p in folder.glob("last*.ckpt") if _LAST.fullmatch(p.name) and p.is_file()] if folder.is_dir() else []
    return max(found, key=lambda p: (p.stat().st_mtime_ns, p.name), default=None)


def resolve_resume(cfg: TrainConfig, out: Path) -> str | None:
    """The checkpoint to resume from (``check_resume``-ed), or None."""
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":
        last = newest_last_checkpoint(out / "checkpoints")
        if last is None:
            return None
        path = str(last)
    elif not Path(cfg.resume).is_file():
        raise ConfigError(f"resume: checkpoint {cfg.resume!r} not found")
    else:
        path = cfg.resume
    check_resume(path, cfg)
    return path


def _differences(saved: Any, now: Any, key: str) -> list[str]:
    if isinstance(saved, dict) and isinstance(now, dict):
        return [d for k in sorted(set(saved) | set(now), key=str)
                for d in _differences(saved.get(k), now.get(k), f"{key}.{k}")]
    return [] if saved == now else [f"{key}: {saved!r} in the checkpoint, {now!r} in this run"]


def check_resume(path: str | Path, cfg: TrainConfig) -> None:
    """Refuse (ConfigError naming ``resume``) a checkpoint this run cannot continue: unreadable as a
    weights-only toolgraph checkpoint, written by another task, or trained with another ``model``
    section (the architecture and objective; data, optimiser and trainer settings may change)."""
    try:
        ckpt = read_checkpoint(path)
    except DataError as e:
        raise ConfigError(f"resume: {e}. Resume from another checkpoint or start a new out_dir") from None
    task = ckpt.task
    if task != cfg.model.name:
        raise ConfigError(f"resume: {path} was written by model.name={task!r}, and this run is model.name="
                          f"{cfg.model.name!r}: a run resumes only its own task. Start a new out_dir (or resume "
                          "from a checkpoint of this task)")
    try:
        saved_model = to_dict(from_dict(TrainConfig, ckpt.config, f"{path}: hyper_parameters.config").model)
    except ConfigError as e:
        raise ConfigError(f"resume: {path}: its saved config does not load: {e}") from None
    diff = _differences(saved_model, to_dict(cfg.model), "model")
    if diff:
        raise ConfigError(f"resume: {path} was trained with another model section ({'; '.join(diff[:4])}). "
                          "Resuming continues the same model: use the checkpoint's model settings, or start a "
                          "new out_dir")


def _inside(path: str | Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def set_aside_checkpoints(out: Path, resumed: str | None) -> Path | None:
    """Before a run that does not continue this folder's checkpoints (``resumed`` is None or elsewhere):
    an earlier run's ``checkpoints/`` renamed to ``checkpoints.old-<time>/`` (returned; nothing is
    deleted). Left there, Lightning would save ``last-v1.ckpt`` beside the old ``last.ckpt`` (which
    ``resume=auto`` would then continue) and keep the old ``best-*.ckpt`` beside the new ones."""
    folder = out / "checkpoints"
    if (resumed is not None and _inside(resumed, folder)) or not folder.is_dir() or not any(folder.iterdir()):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = out / f"checkpoints.old-{stamp}", 1
    while dest.exists() or dest.is_symlink():
        dest, n = out / f"checkpoints.old-{stamp}-{n}", n + 1
    os.rename(folder, dest)
    print(f"out_dir: {out} held an earlier run's checkpoints/: moved to {dest.name}/ (nothing deleted), so this "
          "new run starts with none; to continue that run instead, give resume=auto", file=sys.stderr)
    return dest


def check_trains_something(cfg: TrainConfig) -> None:
    """Refuse, before anything is built, settings under which fit runs no training step: Lightning then
    skips fit quietly and the run would test and export the untrained model with exit 0."""
    t = cfg.trainer
    for key, value, fix in [("max_epochs", t.max_epochs, "1 or more (or -1: no limit, with trainer.max_steps)"),
                            ("max_steps", t.max_steps, "1 or more (or -1: no limit, with trainer.max_epochs)"),
                            ("limit_train_batches", t.limit_train_batches, "null (all), a count >= 1 or a share > 0")]:
        if value is not None and value == 0:
            raise ConfigError(f"trainer.{key}: {value!r} trains nothing (the export would be the untrained model); "
                              f"give {fix}")


def check_training_batches(cfg: TrainConfig, dm: L.LightningDataModule, world: int) -> int | None:
    """The training batches of one epoch on each of ``world`` ranks, after ``trainer.limit_train_batches``
    (None when the datamodule has no ``train_sampler`` to count). Refuses 0 batches (naming
    ``data.batch_size`` or ``trainer.limit_train_batches``) and an int ``trainer.val_check_interval``
    longer than an epoch (Lightning stops with a ValueError deep inside fit). Counted before fit from
    the datamodule's own batch sampler: the one fit will use."""
    if not callable(getattr(dm, "train_sampler", None)):
        return None
    t, size = cfg.trainer, dm.train_size()
    sampler = dm.train_sampler(0, world)
    per_rank = len(sampler)  # every rank gets as many batches (DDP needs equal counts)
    batch = getattr(cfg.data, "batch_size", None)
    cap = getattr(cfg.data, "max_queries_per_tool", None)
    if per_rank == 0 and cap is not None and getattr(sampler, "kept", size) < size:
        raise ConfigError(f"data.max_queries_per_tool: {cap} keeps {sampler.kept} of {size} training examples a "
                          f"pass, fewer than one batch of data.batch_size={batch}, so nothing would train. Give a "
                          "larger data.max_queries_per_tool, null, or data.batch_size <= "
                          f"{max(1, sampler.kept // world)}")
    if per_rank == 0:
        ranks = f" over {world} ranks" if world > 1 else ""
        raise ConfigError(f"data.batch_size: {batch} leaves no full training batch for {size} training examples"
                          f"{ranks} (an incomplete last batch is dropped), so nothing would train. Give "
                          f"data.batch_size <= {max(1, size // world)}")
    limit = t.limit_train_batches
    batches = per_rank if limit is None else min(per_rank, limit) if isinstance(limit, int) else int(per_rank * limit)
    if batches == 0:
        raise ConfigError(f"trainer.limit_train_batches: {limit!r} of {per_rank} training batches is none, so "
                          f"nothing would train; give at least {1 / per_rank:.3g} (or a count >= 1, or null)")
    v = t.val_check_interval
    validates = t.check_val_every_n_epoch is not None and t.limit_val_batches != 0
    if isinstance(v, int) and not isinstance(v, bool) and validates and v > batches:
        raise ConfigError(f"trainer.val_check_interval: {v} batches is longer than an epoch ({batches} training "
                          f"batches of data.batch_size={batch}), so no validation could run in it. Give at most "
                          f"{batches}, a share of the epoch (e.g. 1.0), or trainer.check_val_every_n_epoch=null to "
                          "count batches across epochs")
    return batches


def _no_best_warning(cfg: TrainConfig, trainer: L.Trainer) -> str:
    if cfg.checkpoint.save_top_k == 0:
        return ("checkpoint.save_top_k=0 keeps no best checkpoint: the test and the export use the last "
                "weights")
    if cfg.checkpoint.monitor in trainer.callback_metrics:
        return (f"no best checkpoint was saved for {cfg.checkpoint.monitor}: the test and the export use the "
                "last weights")
    return (f"no validation ran ({trainer.global_step} steps; see trainer.val_check_interval, "
            "trainer.check_val_every_n_epoch, trainer.limit_val_batches, trainer.max_steps), so there is no best "
            "checkpoint: the test and the export use the last weights, unvalidated")


def train(cfg: TrainConfig, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Train ``cfg`` (the module docstring); ``callbacks`` join the Trainer's (toolgraph.sweep reports each
    validation to its Optuna trial through one)."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    start = time.perf_counter()
    out = Path(cfg.out_dir)
    if rank_zero_only.rank == 0:  # before anything is built: never write into someone else's folder
        check_output_folder(out, "out_dir")
    check_trains_something(cfg)
    ckpt_path = resolve_resume(cfg, out)
    L.seed_everything(cfg.seed, workers=True)
    task = TASKS.get(cfg.model.name)(cfg)  # the one config object of the run
    dm = task.datamodule_for()
    trainer = build_trainer(cfg, out, callbacks)
    check_training_batches(cfg, dm, trainer.world_size)  # before anything is written or moved
    if trainer.is_global_zero:
        out.mkdir(parents=True, exist_ok=True)
        for stale in stale_temp_files(out / "checkpoints"):  # what a save killed mid-write left: never whole
            stale.unlink()
        set_aside_checkpoints(out, ckpt_path)
        retire_results(out)  # an earlier run's results never sit beside this run's config
        write_text_atomic(out / "config.yaml", to_yaml(cfg))
    with sigterm_deferred():  # Lightning ends the batch, then stops; exit 143
        trainer.fit(task, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    fit_seconds = time.perf_counter() - start
    summary: dict[str, Any] = {"fit_seconds": fit_seconds, "global_step": trainer.global_step,
                               **throughput(trainer, cfg, fit_seconds)}
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if not best:  # loud: an export that looks like any other but was never validated
        summary["warnings"] = [_no_best_warning(cfg, trainer)]
        if trainer.is_global_zero:
            print(f"warning: {summary['warnings'][0]}", file=sys.stderr)
    if cfg.test:
        with sigterm_deferred():
            tested = trainer.test(task, datamodule=dm, ckpt_path=best or None, verbose=trainer.is_global_zero,
                                  weights_only=True)
        summary["test"] = tested[0] if tested else {}
    summary["best_checkpoint"] = best
    if cfg.export and trainer.is_global_zero:
        if best:  # export the best weights, not the last
            task.load_state_dict(read_checkpoint(best).state_dict)
        # export, rankings, curves, then results.json (last) with this run's summary in it
        summary["metrics"] = task.cpu().finish(
            out, dm, lambda: {"training": {**summary, "seconds": time.perf_counter() - start}})
    _finish_wandb(trainer)
    return summary


def _finish_wandb(trainer: L.Trainer) -> None:
    """Close the W&B run so its file is complete (and a sweep agent can start the next run)."""
    from lightning.pytorch.loggers import WandbLogger

    if any(isinstance(lg, WandbLogger) for lg in trainer.loggers):
        import wandb

        wandb.finish()
