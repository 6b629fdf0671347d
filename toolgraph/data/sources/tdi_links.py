"""``tdi-links``: the TDI dependency edges as a retrieval dataset (dependent tool -> prerequisites),
built from the real sources in place. Options are ``TDIConfig`` keys (seed, tool_text, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolgraph.data.schema import ToolDataset
from toolgraph.errors import ConfigError
from toolgraph.registry import DATASETS


@DATASETS.register("tdi-links")
def load_tdi_links(root: Path, **options: Any) -> ToolDataset:
    """TDI dependency edges as queries (a dependent tool) and gold tools (its prerequisites)."""
    from toolgraph.data.tdi import TDIConfig, build_tdi, links_dataset

    unknown = sorted(set(options) - set(TDIConfig.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"data.options: unknown option(s) {unknown} for dataset 'tdi-links'; "
                          f"it takes {sorted(TDIConfig.__dataclass_fields__)}")
    return links_dataset(build_tdi(TDIConfig(**options), root))
