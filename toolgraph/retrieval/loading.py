"""Load anything toolgraph saved as a Retriever: an exported folder, a run folder, a .ckpt — or
build one from an evaluation config (YAML file or dict: ``retriever`` + ``data`` sections).

    retriever = toolgraph.load("runs/bi_encoder_toollens/checkpoints/best-0-475.ckpt")
    retriever.retrieve(["find vegan recipes"], k=5)
    router = toolgraph.load("configs/eval/t2a_draft_g2.yaml")   # indexed over the config's dataset
    router.retrieve_agents(["track my parcel"], k=3)

Checkpoints are read with ``torch.load(weights_only=True)``: tensors and plain data only, never
arbitrary pickled objects, so a checkpoint from an unknown source cannot run code on load. The task
that wrote a checkpoint is found by name through the task registry (which imports the training
side only then).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from toolgraph.config import EvaluateConfig, load_config
from toolgraph.data import prepare_dataset
from toolgraph.errors import ConfigError, DataError
from toolgraph.files import recover_folder
from toolgraph.nn.encoder import check_backbones_fit
from toolgraph.registry import TASKS
from toolgraph.retrieval.base import Retriever, build_retriever


def load_task(path: str | Path) -> Any:
    """Rebuild the LightningModule of a toolgraph checkpoint from the file alone."""
    path = Path(path)
    if not path.is_file():
        raise DataError("checkpoint not found", path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - report any refusal of the safe unpickler clearly
        raise DataError(f"cannot load as a weights-only checkpoint ({type(e).__name__}: {str(e)[:200]}); "
                        "refusing to unpickle arbitrary objects", path) from None
    meta = ckpt.get("toolgraph") if isinstance(ckpt, dict) else None
    if not isinstance(meta, dict) or "hyper_parameters" not in ckpt:
        raise DataError("not a toolgraph checkpoint (no 'toolgraph' section)", path)
    hparams = ckpt["hyper_parameters"]
    if not isinstance(meta.get("task"), str) or "artifacts" not in meta or not isinstance(hparams, dict) \
            or "config" not in hparams or not isinstance(ckpt.get("state_dict"), dict):
        raise DataError("incomplete toolgraph checkpoint (needs toolgraph.task, toolgraph.artifacts, "
                        "hyper_parameters.config and state_dict); it was cut short or not written by toolgraph",
                        path)
    try:
        check_backbones_fit(meta["artifacts"], ckpt["state_dict"])  # before any model is allocated
        task = TASKS.get(meta["task"])(hparams["config"], artifacts=meta["artifacts"])
    except DataError as e:
        raise DataError(str(e), path) from None
    try:
        task.load_state_dict(ckpt["state_dict"])
    except RuntimeError as e:  # missing / unexpected keys, other shapes
        raise DataError(f"the weights do not fit the {meta['task']} model its config describes "
                        f"({str(e)[:300]}); the checkpoint is damaged or was edited", path) from None
    return task.eval()


def resolve_checkpoint(path: str | Path, where: str = "checkpoint") -> Path:
    """A .ckpt, or a run folder: its best checkpoint (results.json), else checkpoints/last.ckpt."""
    p = Path(path)
    if p.is_file():
        return p
    results = p / "results.json"
    if results.is_file():
        best = json.loads(results.read_text()).get("training", {}).get("best_checkpoint")
        if best and Path(best).is_file():
            return Path(best)
    last = p / "checkpoints" / "last.ckpt"
    if last.is_file():
        return last
    raise ConfigError(f"{where}: {str(path)!r} is neither a .ckpt nor a run folder with a checkpoint")


def load(path: str | Path | dict) -> Retriever:
    """A Retriever from a ``.ckpt``, an exported retriever folder, a run folder (out_dir), or a config
    (YAML path or dict) whose retriever is fitted and indexed on its ``data`` section."""
    if isinstance(path, dict) or (Path(path).suffix in (".yaml", ".yml") and Path(path).is_file()):
        return from_config(path)
    path = Path(path)
    recover(path)  # an index left aside by a crash mid-sync is put back first (a rename; a load never deletes)
    if path.is_file() and path.suffix == ".ckpt":
        return load_task(path).as_retriever()
    if (path / "retriever.json").is_file():
        return Retriever.load(path)
    if (path / "retriever" / "retriever.json").is_file():
        return Retriever.load(path / "retriever")
    raise DataError("not a checkpoint (.ckpt), a saved retriever (retriever.json) or a run folder", path)


def from_config(config: str | Path | dict) -> Retriever:
    """Build the config's retriever, fit it on the dataset and index the dataset's tools (and agents)."""
    cfg = load_config(EvaluateConfig, [config])
    if cfg.retriever is None:
        raise ConfigError(f"{config if not isinstance(config, dict) else 'config'}: no 'retriever' section")
    ds = prepare_dataset(cfg.data)
    retriever = build_retriever(cfg.retriever)
    retriever.fit(ds)
    retriever.index(ds.tools)
    return retriever


# crash recovery of an index swapped in by ``toolgraph index sync`` or an export: ``files.recover_folder``,
# which only renames the swap's own ``.NAME.old-PID`` back and never deletes anything (stale old copies are
# deleted by the sync, under the index lock)
recover = recover_folder
