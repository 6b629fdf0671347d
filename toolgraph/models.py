"""``toolgraph models build general``: train the general tool retriever and install it by name.

    toolgraph models build general                    # configs/general.yaml, then installed
    toolgraph models build general trainer.max_steps=100 out_dir=runs/general_quick
    toolgraph models install general --run runs/general   # a run trained before

Training is ``toolgraph train`` over the recipe (configs/general.yaml: the mixture of every split of
the 14 public datasets, a full fine-tune of all-MiniLM-L6-v2, WiSE 0.5; docs/general.md), with
Lightning's bar and its ETA; before it starts, the command says what the recipe took where it was
measured. Installing copies the run's exported encoder and its model card to where the name
``toolgraph-general`` resolves (``$TOOLGRAPH_MODELS/toolgraph-general``, default
``~/.cache/toolgraph/models``), swapped in whole, never over a folder that is not an installed model.
From then on ``t2a``, a new ``index sync`` index and ``toolgraph serve`` use it (and say so on stderr),
and ``toolgraph doctor`` lists it.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from toolgraph.errors import ConfigError, DataError

__all__ = ["MODELS", "build_model", "install_model"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Recipe:
    config: Path  # the training config, from the repository root
    measured: str  # what it took where it was measured (docs/general.md)


MODELS = {"general": Recipe(ROOT / "configs" / "general.yaml",
                            "3,577 s (60 min) of training for 300 steps on 2 CPU cores, 3,764 s for the whole "
                            "make general in a fresh clone")}


def _recipe(name: str, config: str | Path | None = None) -> Recipe:
    """Model ``name``'s recipe, checked before an hour of training: a name it could not install after it
    is refused here, and the recipe's own config must be there unless ``config`` replaces it."""
    if name not in MODELS:
        raise ConfigError(f"models: {name!r} is not a model toolgraph builds; known: {', '.join(sorted(MODELS))}")
    recipe = MODELS[name]
    if config is None and not recipe.config.is_file():
        raise ConfigError(f"models build {name}: its recipe {recipe.config} is missing; run it from a toolgraph "
                          "checkout (the configs/ folder), or give --config")
    return recipe


def build_model(name: str, config: str | Path | None = None, overrides: Sequence[str] = ()) -> Path:
    """Train model ``name`` (its recipe, or ``config``; ``overrides``: key=value) and install it; the
    installed folder."""
    from toolgraph.config import load_config
    from toolgraph.training import TrainConfig, train

    recipe = _recipe(name, config)
    cfg = load_config(TrainConfig, [config or recipe.config], overrides)
    what = recipe.measured if config is None else "a config of yours: Lightning's bar shows the ETA"
    steps = cfg.trainer.max_steps if cfg.trainer.max_steps and cfg.trainer.max_steps > 0 else "all"
    print(f"toolgraph models build {name}: training {steps} steps into {cfg.out_dir} (measured: {what})", flush=True)
    train(cfg, callbacks=[_estimate_callback()])
    return install_model(name, Path(cfg.out_dir))


def _estimate_callback():
    import time

    import lightning as L

    class Estimate(L.Callback):
        """The time left on this machine, from the steps so far: after the first ``first`` steps and at
        each tenth of the run (a line in the log, also where no bar is drawn: a batch job)."""

        def __init__(self, first: int = 5) -> None:
            self.first, self.start, self.said = first, None, set()

        def on_train_batch_end(self, trainer, *args) -> None:
            step, total = trainer.global_step, trainer.max_steps
            if not trainer.is_global_zero or total is None or total <= 0:
                return
            if self.start is None:  # the first batch (its set-up included) starts the clock
                self.start = (time.monotonic(), step)
                return
            done, tenth = step - self.start[1], step * 10 // total
            if done < self.first or (self.said and tenth in self.said):
                return  # after the first steps, then once a tenth
            self.said.add(tenth)
            per = (time.monotonic() - self.start[0]) / done
            print(f"step {step}/{total}: {per:.2f} s a step on this machine, about {per * (total - step) / 60:.1f} "
                  "min left", flush=True)

    return Estimate()


def install_model(name: str, run: str | Path) -> Path:
    """``run``/retriever/encoder (a sentence-transformers folder) and its model card, swapped in whole
    where model ``name`` resolves; the installed folder."""
    from toolgraph.files import swap_folder
    from toolgraph.nn.encoder import GENERAL, general_model_dir
    from toolgraph.runs import check_output_folder

    if name not in MODELS:
        raise ConfigError(f"models: {name!r} is not a model toolgraph installs; known: {', '.join(sorted(MODELS))}")
    run = Path(run)
    source = run / "retriever" / "encoder"
    if not (source / "config.json").is_file():
        raise DataError(f"no exported encoder here: train first (toolgraph models build {name}, or python train.py "
                        "--config configs/general.yaml)", source)
    dest = general_model_dir()
    dest.parent.mkdir(parents=True, exist_ok=True)

    def build(tmp: Path) -> None:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        if (run / "retriever" / "README.md").is_file():
            shutil.copy(run / "retriever" / "README.md", tmp / "README.md")

    check_output_folder(dest, GENERAL, ("modules.json",))  # never over someone else's folder
    swap_folder(dest, build)
    print(f"installed {source} as {GENERAL}: {dest}", flush=True)
    return dest
