"""Datasets: canonical schema, JSONL format, adapters for public benchmarks, splits, datamodules.

``load_dataset(name)`` finds an adapter through the dataset registry, which imports the adapters
(data/sources/) by name the first time one is asked for.
"""

from toolgraph.data.loading import data_root, load_dataset, prepare_dataset
from toolgraph.data.schema import Agent, Dependency, Query, Tool, ToolDataset

__all__ = ["Agent", "Dependency", "Query", "Tool", "ToolDataset", "data_root", "load_dataset", "prepare_dataset"]
