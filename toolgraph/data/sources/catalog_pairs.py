"""``catalog-pairs``: one catalog's self-supervised pairs as a dataset, to adapt an encoder to a catalog
that has no labelled queries (a user's own MCP servers or APIs, or a held-out dataset in
leave-one-dataset-out: only its tools' text is read, never a query).

Every kind of :mod:`toolgraph.data.pseudo_queries` over the catalog gives (pseudo-query, view of the
tool) pairs; each view is a tool of its own (``KIND::tool id``), so a pair's gold tool is the view its
query was taken out of. A seeded ``val_fraction`` of the pairs is val (what the checkpoint is chosen
on); there is no test split: the adapted encoder is tested on the catalog's real requests, elsewhere.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from toolgraph.data import pseudo_queries
from toolgraph.data.loading import load_dataset
from toolgraph.data.schema import MIXTURE_SEP, Query, ToolDataset
from toolgraph.data.splits import carve_val
from toolgraph.errors import ConfigError, DataError
from toolgraph.registry import DATASETS


@DATASETS.register("catalog-pairs")
def load_catalog_pairs(root: Path, dataset: str | None = None, kinds: list[str] | None = None,
                       max_tools: int | None = 300, seed: int = 0, val_fraction: float = 0.1,
                       catalog_options: dict[str, Any] | None = None) -> ToolDataset:
    """``dataset``: the catalog, a registered dataset's name or a JSONL folder (its tools only are read),
    loaded with ``catalog_options`` (an MCP catalog: ``dataset: mcp``, ``catalog_options: {servers: FILE}``).
    ``kinds``: the pseudo-query kinds (default all of :data:`pseudo_queries.KINDS`); ``max_tools``: at
    most this many pairs of each kind (a seeded sample); ``val_fraction``: the share of pairs in val."""
    if not dataset or not isinstance(dataset, str):
        raise ConfigError("data.options.dataset: name the catalog to adapt to (a dataset name or a JSONL folder "
                          f"with tools.jsonl), got {dataset!r}")
    kinds = list(pseudo_queries.KINDS) if kinds is None else kinds
    if (not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) for k in kinds)
            or set(kinds) - set(pseudo_queries.KINDS)):
        raise ConfigError(f"data.options.kinds: {kinds!r}; expected a non-empty list of {list(pseudo_queries.KINDS)}")
    kinds = list(dict.fromkeys(kinds))  # a kind named twice gives its pairs once
    if max_tools is not None and (isinstance(max_tools, bool) or not isinstance(max_tools, int) or max_tools < 1):
        raise ConfigError(f"data.options.max_tools: {max_tools!r} must be a whole number of at least 1 (or null)")
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise ConfigError(f"data.options.val_fraction: {val_fraction!r} is not a fraction in (0, 1)")
    if not isinstance(catalog_options or {}, dict):
        raise ConfigError(f"data.options.catalog_options: {catalog_options!r} is not a mapping of the catalog's "
                          "own options (e.g. {servers: path/to/servers.json} for dataset: mcp)")
    catalog = load_dataset(dataset, root, **(catalog_options or {})).tools
    views, queries = [], []
    for kind in kinds:
        for i, (text, view) in enumerate(pseudo_queries.pairs(catalog, kind, max_tools, seed)):
            view = replace(view, id=f"{kind}{MIXTURE_SEP}{view.id}")
            views.append(view)
            queries.append(Query(f"{kind}{MIXTURE_SEP}{i}", text, (view.id,), "train"))
    if len(queries) < 2:
        raise DataError(f"{len(queries)} self-supervised pair(s) from {len(catalog)} tools: too little text to adapt "
                        f"to (kinds {kinds}; a pair needs a description of {pseudo_queries.MIN_WORDS}+ words, a "
                        "name of two words or more, or two parameters)", dataset)
    queries = carve_val(queries, val_fraction, seed)
    return ToolDataset(f"catalog-pairs:{Path(dataset).name}", views, queries, [],
                       notes={"catalog": dataset, "catalog_tools": len(catalog), "kinds": kinds,
                              "pairs": len(queries)})

