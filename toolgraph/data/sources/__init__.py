"""One adapter per public benchmark. Importing this package registers them all.

An adapter is ``fn(root: Path, **options) -> ToolDataset`` registered under its dataset name,
reading the benchmark's files in place under ``root`` (``$TOOLGRAPH_DATA``).
"""

import importlib
import pkgutil

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")
