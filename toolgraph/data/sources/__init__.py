"""One adapter per public benchmark. Importing this package registers them all; the dataset
registry imports it by name the first time a dataset is asked for (toolgraph/registry.py).

An adapter is ``fn(root: Path, **options) -> ToolDataset`` registered under its dataset name,
reading the benchmark's files in place under ``root`` (``$TOOLGRAPH_DATA``).
"""

from toolgraph.data.sources import (  # noqa: F401  (register)
    api_bank,
    beir,
    gorilla,
    mcp,
    metatool,
    nestools,
    seal_tools,
    toolbank,
    toolbench,
    toolbench_retriever,
    toollinkos,
    ultratool,
    ultratool_original,
)
