"""One trial, in its own process: ``python -m toolgraph.sweep.trial --storage URL --study NAME --trial N``.

The worker starts it; it builds the trial's config (the spec's config files, the command's overrides,
the trial's values, ``out_dir`` = the trial's folder, ``resume=auto``, ``test=false`` unless the spec's
command says otherwise: a sweep chooses on val and never looks at test) and runs ``train(cfg)`` with a
callback that reports the spec's metric to the trial at every validation. Each report is one step
(validation 0, 1, 2, ...: aligned across trials whatever their batch size), so Optuna's pruners compare
trials at the same point; a pruned trial stops at once (its folder and checkpoints stay) and exits
``PRUNED``. The callback's history is in the checkpoint, so a trial resumed from ``last.ckpt`` (a re-run
after a kill or a preemption) carries on counting and reports the earlier validations to its new trial.

Exit codes: 0 complete, ``PRUNED`` (3) pruned, 143 SIGTERM (the trial resumes when re-run), 2 a
ConfigError (the message names the key), anything else a failure.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from toolgraph.config import TrainConfig, load_config
from toolgraph.errors import ConfigError, ToolgraphError
from toolgraph.sweep.spec import point_overrides
from toolgraph.sweep.study import Sweep, open_sweep

__all__ = ["PRUNED", "ReportToTrial", "main", "trial_config"]

PRUNED = 3


def trial_config(sweep: Sweep, params: dict[str, Any], out_dir: str, number: int) -> TrainConfig:
    """The config trial ``number`` trains: the spec's recipe with the trial's values."""
    s = sweep.settings
    over = ["test=false", *s["overrides"], *point_overrides(params), f"out_dir={out_dir}", "resume=auto"]
    cfg = load_config(TrainConfig, s["configs"], over)
    cfg.logger.group = sweep.name
    cfg.logger.run_name = f"{sweep.name}-trial-{number}"
    cfg.logger.tags = [*cfg.logger.tags, f"sweep:{sweep.name}", f"trial:{number}"]
    return cfg


class ReportToTrial(Callback):
    """At every validation: the spec's metric to the trial (rank 0), then the pruner's decision on every rank."""

    def __init__(self, trial, metric: str, goal: str, set_attr) -> None:
        self.trial, self.metric, self.goal, self.set_attr = trial, metric, goal, set_attr
        self.history: list[tuple[int, float, int, int]] = []  # (validation, value, epoch, step)
        self.reported = 0  # entries of history told to this trial (a resumed run re-tells the earlier ones)

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = [(int(v), float(x), int(e), int(s)) for v, x, e, s in state.get("history", [])]

    def best(self) -> tuple[int, float, int, int] | None:
        finite = [h for h in self.history if math.isfinite(h[1])]
        if not finite:
            return None
        sign = 1 if self.goal == "maximize" else -1
        return max(finite, key=lambda h: (sign * h[1], -h[0]))  # a tie: the earlier validation

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        import optuna

        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.metric)
        if value is None:
            raise ConfigError(f"metric.name: {self.metric!r} is not logged at validation by "
                              f"model.name={pl_module.__class__.__name__}; it logs "
                              f"{', '.join(sorted(k for k in trainer.callback_metrics if k.startswith('val')))}")
        self.history.append((len(self.history), float(value), trainer.current_epoch, trainer.global_step))
        prune = False
        if trainer.is_global_zero:
            for v, x, _, _ in self.history[self.reported:]:
                self.trial.report(x, v)
            self.reported = len(self.history)
            best = self.best()
            if best is not None:
                for key, val in (("best_value", best[1]), ("best_validation", best[0]), ("best_epoch", best[2]),
                                 ("best_step", best[3])):
                    self.set_attr(key, val)
            self.set_attr("validations", len(self.history))
            prune = bool(self.trial.should_prune())
        if trainer.world_size > 1:
            prune = bool(trainer.strategy.broadcast(prune, src=0))
        if prune:
            raise optuna.TrialPruned(f"pruned at validation {len(self.history) - 1}")


def main(argv: list[str] | None = None) -> int:
    import optuna

    from toolgraph.runs import Terminated, install_signal_handlers
    from toolgraph.training import train

    ap = argparse.ArgumentParser(prog="python -m toolgraph.sweep.trial")
    ap.add_argument("--storage", required=True)
    ap.add_argument("--study", required=True)
    ap.add_argument("--trial", type=int, required=True)
    args = ap.parse_args(argv)
    install_signal_handlers()
    start = time.perf_counter()
    sweep = open_sweep(args.study, args.storage, wait=0)
    trial_id = sweep.trial_id(args.trial)
    frozen = sweep.storage.get_trial(trial_id)

    def set_attr(key: str, value: Any) -> None:
        sweep.storage.set_trial_user_attr(trial_id, key, value)

    reporter = ReportToTrial(optuna.trial.Trial(sweep.study, trial_id), sweep.spec.metric, sweep.spec.goal, set_attr)
    try:
        cfg = trial_config(sweep, frozen.params, frozen.user_attrs["out_dir"], args.trial)
        train(cfg, callbacks=[reporter])
    except optuna.TrialPruned as e:
        print(f"trial {args.trial}: {e}", flush=True)
        return PRUNED
    except Terminated:
        print(f"trial {args.trial}: SIGTERM: stopped; re-run, it resumes from its last.ckpt", flush=True)
        return 143
    except ToolgraphError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        if rank_zero_only.rank == 0:
            set_attr("train_seconds", round(time.perf_counter() - start, 2))  # "seconds": the worker's, whole
    if reporter.best() is None:
        print(f"error: metric.name: no validation reported {sweep.spec.metric!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
