"""Datasets: canonical schema, JSONL format, adapters for public benchmarks, splits."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from toolgraph.data.schema import Agent, Dependency, Query, Tool, ToolDataset
from toolgraph.errors import ConfigError, DataError

__all__ = ["Agent", "Dependency", "Query", "Tool", "ToolDataset", "data_root", "load_dataset"]


def data_root(root: str | Path | None = None) -> Path:
    """The folder that holds the public benchmarks: ``root`` or ``$TOOLGRAPH_DATA``."""
    value = root if root is not None else os.environ.get("TOOLGRAPH_DATA")
    if not value:
        raise DataError("no data folder: set TOOLGRAPH_DATA (e.g. ../shared/datasets) or data.root")
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataError("data folder (TOOLGRAPH_DATA / data.root) does not exist", path)
    return path


def load_dataset(name: str, root: str | Path | None = None, **options: Any) -> ToolDataset:
    """Load a registered benchmark by name, or a canonical JSONL folder given as a path."""
    from toolgraph.data import sources  # noqa: F401  (registers the adapters)
    from toolgraph.data.formats import read_dataset
    from toolgraph.registry import DATASETS

    if name not in DATASETS and ("/" in name or Path(name).is_dir()):
        if options:
            raise DataError(f"options {sorted(options)} are for registered adapters, not JSONL folders", name)
        return read_dataset(name)
    loader = DATASETS.get(name)
    import inspect

    params = inspect.signature(loader).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        allowed = [p for p in params if p != "root"]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ConfigError(f"data.options: unknown option(s) {unknown} for dataset {name!r}; "
                              f"it takes {allowed or 'none'}")
    return loader(data_root(root), **options)
