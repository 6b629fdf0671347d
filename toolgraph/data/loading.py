"""Datasets by name: a registered benchmark adapter (data/sources/) or a canonical JSONL folder,
and the evaluation protocol applied on top (``data.setting``)."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any

from toolgraph.config import DataConfig
from toolgraph.data.formats import read_dataset
from toolgraph.data.schema import ToolDataset
from toolgraph.data.splits import crossfit, inductive, inject_noise, transductive
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS

CHECKOUT_DATA = Path(__file__).resolve().parents[3] / "shared" / "datasets"  # ../shared/datasets of a checkout


def data_root(root: str | Path | None = None) -> Path:
    """The folder that holds the public benchmarks: ``root``, else ``$TOOLGRAPH_DATA``, else
    ``../shared/datasets`` beside the repository checkout (where the Makefile points too) if it exists."""
    value = root if root is not None else os.environ.get("TOOLGRAPH_DATA")
    if not value and CHECKOUT_DATA.is_dir():
        return CHECKOUT_DATA
    if not value:
        raise DataError(f"no data folder: set TOOLGRAPH_DATA=/path/to/datasets (or data.root=...); it is not at "
                        f"{CHECKOUT_DATA} either, where a checkout beside ../shared finds it")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataError("data folder (TOOLGRAPH_DATA / data.root) does not exist", path)
    return path


def load_dataset(name: str, root: str | Path | None = None, **options: Any) -> ToolDataset:
    """Load a registered benchmark by name, or a canonical JSONL folder given as a path."""
    if name not in DATASETS and ("/" in name or Path(name).is_dir()):
        unknown = sorted(set(options) - {"on_duplicate"})
        if unknown:
            raise ConfigError(f"data.options: {unknown} are for registered adapters; a JSONL folder ({name}) "
                              "takes only on_duplicate (error, keep-first, keep-last)")
        return read_dataset(name, on_duplicate=options.get("on_duplicate", "error"))
    loader = DATASETS.get(name)
    params = inspect.signature(loader).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        allowed = [p for p in params if p != "root"]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ConfigError(f"data.options: unknown option(s) {unknown} for dataset {name!r}; "
                              f"it takes {allowed or 'none'}")
    return loader(data_root(root), **options)


def prepare_dataset(cfg: DataConfig) -> ToolDataset:
    """Load ``cfg.name`` and apply the protocol in ``cfg.setting``."""
    ds = load_dataset(cfg.name, cfg.root, **cfg.options)
    setting = cfg.setting
    if setting == "standard":
        return ds
    if setting == "transductive":
        return transductive(ds)
    cf = re.fullmatch(r"crossfit-(\d+)-(\d+)", setting)
    if cf:
        return crossfit(ds, int(cf.group(1)), int(cf.group(2)), cfg.seed)
    m = re.fullmatch(r"(inductive|noise)-(\d+)", setting)
    if not m:
        raise ConfigError(f"data.setting: {setting!r} is not standard, transductive, inductive-<pct>, noise-<pct> "
                          "or crossfit-<k>-<fold>")
    ratio = int(m.group(2)) / 100
    if m.group(1) == "inductive":
        return inductive(ds, ratio, cfg.seed)[0]
    return inject_noise(ds, ratio, cfg.seed)
