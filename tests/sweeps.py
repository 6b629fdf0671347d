"""Tiny sweeps for the tests: a base recipe (the tiny BERT on the synthetic data, a few seconds a trial), a
W&B-format spec over it, the study read back, and the processes ``toolgraph sweep`` starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from conftest import tiny_train_overrides
from omegaconf import OmegaConf

ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")


def tiny_spec(tmp: Path, data_dir: Path, model_dir: Path, parameters: dict, *, steps: int = 14,
              method: str = "grid", extra: dict | None = None, command_extra: list[str] | None = None) -> Path:
    """``tmp/spec.yaml`` sweeping ``parameters`` over a recipe of ``steps`` steps validated every 7."""
    over = [o for o in tiny_train_overrides(data_dir, model_dir, tmp / "unused", steps=steps)
            if not o.startswith("out_dir=")]
    base = tmp / "base.yaml"
    base.write_text(OmegaConf.to_yaml(OmegaConf.from_dotlist(over)))
    spec = {"program": "train.py", "method": method, "metric": {"name": "val/recall@3", "goal": "maximize"},
            "parameters": parameters,
            "command": ["${env}", "python", "${program}", "--config", str(base), "export=false",
                        *(command_extra or []), "${args_no_hyphens}"], **(extra or {})}
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def toolgraph(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "toolgraph.cli", *args], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def load(folder: Path, storage: str | None = None, name: str | None = None):
    import optuna

    from toolgraph.sweep.study import open_storage, storage_url

    store = open_storage(storage_url(storage, folder))
    if name is None:
        (name,) = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
    return optuna.load_study(study_name=name, storage=store)


def trials_so_far(folder: Path) -> list:
    """The trials of the sweep folder's study, [] before the study exists (a sweep starting up)."""
    if not (folder / "study.journal").is_file():
        return []
    try:
        return load(folder).get_trials()
    except ValueError:  # the journal is there, the study not yet
        return []


def wait_for(predicate, timeout: float = 120, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def trial_processes(number: int) -> list[int]:
    """Pids of running ``toolgraph.sweep.trial`` processes of trial ``number``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"toolgraph.sweep.trial" in argv and b"--trial" in argv and \
                argv[argv.index(b"--trial") + 1] == str(number).encode():
            pids.append(int(proc.name))
    return pids
