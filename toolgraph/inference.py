"""Load anything toolgraph saved as a Retriever: an exported folder, a run folder, or a .ckpt.

    retriever = toolgraph.load("runs/bi_encoder_toollens/checkpoints/best-0-475.ckpt")
    retriever.retrieve(["find vegan recipes"], k=5)

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


def load(path: str | Path) -> Retriever:
    """A Retriever from a ``.ckpt``, an exported retriever folder, or a run folder (out_dir)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".ckpt":
        return load_task(path).as_retriever()
    if (path / "retriever.json").is_file():
        return Retriever.load(path)
    if (path / "retriever" / "retriever.json").is_file():
        return Retriever.load(path / "retriever")
    raise DataError("not a checkpoint (.ckpt), a saved retriever (retriever.json) or a run folder", path)
