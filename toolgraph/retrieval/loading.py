"""The one resolver of retrievers, and ``toolgraph.load``.

``resolve_retriever(spec)`` turns anything that names a retriever into one: a Retriever, a typed config,
a config dict, a registry name, or a path (saved retriever folder, run folder, ``.ckpt``). ``load(path)``
is its public face for saved things, and also builds one from an evaluation config (YAML file or dict:
``retriever`` + ``data`` sections), fitted and indexed on the config's dataset.

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

import difflib
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

from toolgraph.config import EvaluateConfig, load_config
from toolgraph.data import prepare_dataset
from toolgraph.errors import ConfigError, DataError, ToolgraphError
from toolgraph.files import recover_folder
from toolgraph.nn.encoder import check_backbones_fit
from toolgraph.registry import RETRIEVERS, TASKS
from toolgraph.retrieval.base import Retriever
from toolgraph.runs import read_checkpoint

__all__ = ["from_config", "load", "load_task", "recover", "resolve_retriever"]


def resolve_retriever(spec: Any, where: str = "retriever", base: Path | None = None) -> Retriever:
    """THE way to get a Retriever from what a user or a config holds: a Retriever (returned as is), a typed
    retriever config (``config.name`` picks the class), a config dict (``{"name": "bm25", ...}``, checked by
    that class's schema), a registry name (``"bm25"``), or a path: a saved retriever folder, a run folder or
    a ``.ckpt`` (relative paths are tried under ``base`` first: a saved pipeline's members). Errors name
    ``where`` (the config key the spec came from)."""
    if isinstance(spec, Retriever):
        return spec
    if is_dataclass(spec) and not isinstance(spec, type):
        return RETRIEVERS.get(spec.name)(spec)
    if isinstance(spec, (str, Path)):
        path = base / spec if base is not None and (base / spec).exists() else Path(spec)
        if path.exists():
            return load(path)
        if str(spec) not in RETRIEVERS:
            raise ConfigError(f"{where}: {str(spec)!r} is neither a saved retriever, a checkpoint, a run folder "
                              f"nor a retriever name ({', '.join(RETRIEVERS.names())})")
        spec = {"name": str(spec)}
    if isinstance(spec, dict) or hasattr(spec, "keys"):
        spec = dict(spec)
        name = spec.get("name")
        if name not in RETRIEVERS:
            raise ConfigError(f"{where}.name: {name!r} is not a retriever ({', '.join(RETRIEVERS.names())})")
        cls = RETRIEVERS.get(name)
        return cls(cls.parse_config(spec, where))
    raise ConfigError(f"{where}: expected a path, a retriever name or a retriever config, got {type(spec).__name__}")


def load_task(path: str | Path) -> Any:
    """Rebuild the LightningModule of a toolgraph checkpoint from the file alone (``Task.from_checkpoint``)."""
    def rebuild() -> Any:
        ckpt = read_checkpoint(path)
        try:
            check_backbones_fit(ckpt.artifacts, ckpt.state_dict)  # before any model is allocated
            return TASKS.get(ckpt.task).from_checkpoint(ckpt).eval()
        except DataError as e:
            if e.path == str(ckpt.path):  # already names the file
                raise
            raise DataError(str(e), ckpt.path) from None

    return _named(path, rebuild)


def load(path: str | Path | dict) -> Retriever:
    """A Retriever from a ``.ckpt``, an exported retriever folder, a run folder (out_dir), or a config
    (YAML path or dict) whose retriever is fitted and indexed on its ``data`` section. A file that fails
    to load for any reason is a ToolgraphError naming it, never a bare traceback."""
    if isinstance(path, dict) or (Path(path).suffix in (".yaml", ".yml") and Path(path).is_file()):
        return from_config(path)
    path = Path(path)
    recover(path)  # an index left aside by a crash mid-sync is put back first (a rename; a load never deletes)
    if path.is_file() and path.suffix == ".ckpt":
        return load_task(path).as_retriever()
    for folder in (path, path / "retriever"):  # a saved retriever, or a run folder's export
        if (folder / "retriever.json").is_file():
            return _named(folder, lambda f=folder: Retriever.load(f))
    raise not_loadable(path)


def not_loadable(path: Path) -> DataError:
    """Why ``path`` is nothing ``load`` reads, and what to give instead: a missing path with the close
    names beside it, a run folder that has no export yet with its checkpoints, anything else as such."""
    if not path.exists():
        parent = path.parent
        if not parent.is_dir():
            return DataError(f"no such file or folder (nor {parent}/): give a .ckpt, a saved retriever folder or a "
                             "run folder (out_dir of a training)", path)
        close = difflib.get_close_matches(path.name, [p.name for p in parent.iterdir()], n=3, cutoff=0.6)
        hint = (f"did you mean {' or '.join(str(parent / c) for c in close)}?" if close else
                "give a .ckpt, a saved retriever folder or a run folder (out_dir of a training)")
        return DataError(f"no such file or folder; {hint}", path)
    ckpts = sorted((path / "checkpoints").glob("*.ckpt")) if path.is_dir() else []
    if ckpts:
        best = [c for c in ckpts if c.name.startswith("best-")] or ckpts
        return DataError(f"a run folder with no exported retriever/ yet (the run is still going, was stopped, or "
                         f"ran with export=false); load a checkpoint instead, e.g. {best[-1]}", path)
    return DataError("not a checkpoint (.ckpt), a saved retriever (retriever.json) or a run folder", path)


def _named(path: str | Path, fn: Any) -> Any:
    """``fn()``; a failure that is not already a toolgraph error becomes a DataError naming ``path`` (a
    damaged or foreign checkpoint or folder must not end in a traceback)."""
    try:
        return fn()
    except ToolgraphError:
        raise
    except (OSError, KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError, EOFError) as e:
        raise DataError(f"cannot be loaded ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
                        "is it a toolgraph checkpoint, run folder or saved retriever, complete and from this "
                        "version? Re-export or re-train it", path) from e


def from_config(config: str | Path | dict) -> Retriever:
    """Build the config's retriever, fit it on the dataset and index the dataset's tools (and agents)."""
    cfg = load_config(EvaluateConfig, [config])
    if cfg.retriever is None:
        raise ConfigError(f"{config if not isinstance(config, dict) else 'config'}: no 'retriever' section")
    ds = prepare_dataset(cfg.data)
    retriever = resolve_retriever(cfg.retriever)
    retriever.fit(ds)
    retriever.index(ds.tools)
    return retriever


# crash recovery of an index swapped in by ``toolgraph index sync`` or an export: ``files.recover_folder``,
# which only renames the swap's own ``.NAME.old-PID`` back and never deletes anything (stale old copies are
# deleted by the sync, under the index lock)
recover = recover_folder
