"""One adapter per public benchmark, one module each (helpers start with ``_`` or end in ``_read`` /
``_parse``). The dataset registry imports an adapter's module by name the first time its dataset
is asked for (toolgraph/registry.py).

An adapter is ``fn(root: Path, **options) -> ToolDataset`` registered under its dataset name,
reading the benchmark's files in place under ``root`` (``$TOOLGRAPH_DATA``).
"""
