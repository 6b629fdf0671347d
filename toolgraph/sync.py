"""Keep a saved index in step with a changing catalog, and write it so a crash never half-writes it.

    toolgraph index sync catalog.json --index runs/mcp_index

The catalog is an MCP servers file (LiveMCPBench layout), a folder of ``tools/list`` responses, or a
canonical dataset folder (``tools.jsonl`` + ``agents.jsonl``). Tools and agents are compared with the
index by content hash (every field); added and changed entries are encoded, unchanged ones keep
their vectors, removed ones go. A missing index is created (a ``t2a`` index over MiniLM unless a
retriever config is given).

Atomic write: the new index is saved complete into a hidden sibling folder, then swapped in with two
renames (old -> ``.NAME.old-PID``, new -> NAME), then the old one is deleted. A crash while saving
leaves the live index untouched (the half-written sibling is ignored and cleaned up by the next
sync); a crash between the two renames leaves the complete old index under ``.NAME.old-PID``, which
:func:`recover` (called by ``toolgraph.load`` and by every sync) moves back.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from toolgraph.data.formats import read_dataset
from toolgraph.data.schema import Agent, Tool
from toolgraph.data.sources.mcp import read_catalog
from toolgraph.errors import ConfigError, DataError
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.loading import load, recover
from toolgraph.retrieval.pipeline import resolve_retriever

__all__ = ["read_catalog_any", "recover", "save_atomically", "sync_index"]


def read_catalog_any(path: str | Path) -> tuple[list[Tool], list[Agent]]:
    """Tools and agents from an MCP servers file, a tools/list folder, or a canonical dataset folder."""
    path = Path(path)
    if path.is_dir() and (path / "tools.jsonl").is_file():
        ds = read_dataset(path)
        return ds.tools, ds.agents
    if path.is_dir():
        builder = read_catalog(tools_lists=path)
    elif path.is_file():
        builder = read_catalog(servers=path)
    else:
        raise DataError("catalog not found", path)
    return list(builder.tools.values()), list(builder.agents.values())


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with p.open("rb") as f:
                os.fsync(f.fileno())


def save_atomically(retriever: Retriever, path: str | Path) -> Path:
    """Save ``retriever`` to ``path`` so that ``path`` is always either the old or the new index."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.new-*"):  # left by a crash while saving
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.new-", dir=path.parent))
    try:
        retriever.save(tmp)
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.parent / f".{path.name}.old-{os.getpid()}"
    if path.exists():
        os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


def sync_index(catalog: str | Path, index: str | Path, retriever: Any = None) -> dict[str, Any]:
    """Bring ``index`` in line with ``catalog``; returns the counts (added/updated/removed/encoded)."""
    tools, agents = read_catalog_any(catalog)
    index = Path(index)
    recover(index)
    if (index / "retriever.json").is_file():
        r = load(index)
        created = False
    else:
        r = resolve_retriever(retriever if retriever is not None else {"name": "t2a"}, "retriever")
        created = True
    if not hasattr(r, "sync"):
        raise ConfigError(f"index sync needs an agent index (t2a, agent_only, tool_only, mcp_zero); "
                          f"{index} holds a {type(r).__name__}")
    counts = r.sync(tools, agents)
    save_atomically(r, index)
    return {**counts, "created": created, "index": str(index)}
