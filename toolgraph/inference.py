"""Load anything toolgraph saved as a Retriever: an exported folder, a run folder, a .ckpt — or
build one from an evaluation config (YAML file or dict: ``retriever`` + ``data`` sections).

    retriever = toolgraph.load("runs/bi_encoder_toollens/checkpoints/best-0-475.ckpt")
    retriever.retrieve(["find vegan recipes"], k=5)
    router = toolgraph.load("configs/eval/t2a_draft_g2.yaml")   # indexed over the config's dataset
    router.retrieve_agents(["track my parcel"], k=3)

Checkpoints are read with ``torch.load(weights_only=True)``: tensors and plain data only, never
arbitrary pickled objects, so a checkpoint from an unknown source cannot run code on load.
"""

from __future__ import annotations

from pathlib import Path

import torch

from toolgraph.errors import DataError
from toolgraph.retrieval.base import Retriever


def load_task(path: str | Path):
    """Rebuild the LightningModule of a toolgraph checkpoint from the file alone."""
    from toolgraph.registry import TASKS
    from toolgraph.tasks import bi_encoder  # noqa: F401  (register tasks)

    path = Path(path)
    if not path.is_file():
        raise DataError("checkpoint not found", path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - report any refusal of the safe unpickler clearly
        raise DataError(f"cannot load as a weights-only checkpoint ({type(e).__name__}: {str(e)[:200]}); "
                        "refusing to unpickle arbitrary objects", path) from None
    meta = ckpt.get("toolgraph")
    if meta is None or "hyper_parameters" not in ckpt:
        raise DataError("not a toolgraph checkpoint (no 'toolgraph' section)", path)
    task = TASKS.get(meta["task"])(ckpt["hyper_parameters"]["config"], artifacts=meta["artifacts"])
    task.load_state_dict(ckpt["state_dict"])
    return task.eval()


def load(path: str | Path | dict) -> Retriever:
    """A Retriever from a ``.ckpt``, an exported retriever folder, a run folder (out_dir), or a config
    (YAML path or dict) whose retriever is fitted and indexed on its ``data`` section."""
    if isinstance(path, dict) or (Path(path).suffix in (".yaml", ".yml") and Path(path).is_file()):
        return from_config(path)
    from toolgraph.sync import recover

    path = Path(path)
    recover(path)  # an index left aside by a crash mid-sync is put back first
    if path.is_file() and path.suffix == ".ckpt":
        return load_task(path).as_retriever()
    if (path / "retriever.json").is_file():
        return Retriever.load(path)
    if (path / "retriever" / "retriever.json").is_file():
        return Retriever.load(path / "retriever")
    raise DataError("not a checkpoint (.ckpt), a saved retriever (retriever.json) or a run folder", path)


def from_config(config: str | Path | dict) -> Retriever:
    """Build the config's retriever, fit it on the dataset and index the dataset's tools (and agents)."""
    from toolgraph.config import EvaluateConfig, load_config
    from toolgraph.errors import ConfigError
    from toolgraph.evaluation import prepare_dataset
    from toolgraph.retrieval import build_retriever

    cfg = load_config(EvaluateConfig, [config])
    if cfg.retriever is None:
        raise ConfigError(f"{config if not isinstance(config, dict) else 'config'}: no 'retriever' section")
    ds = prepare_dataset(cfg.data)
    retriever = build_retriever(cfg.retriever)
    retriever.fit(ds)
    retriever.index(ds.tools)
    return retriever
