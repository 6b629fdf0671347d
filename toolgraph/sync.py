"""Keep a saved index in step with a changing catalog, and write it so a crash never half-writes it.

    toolgraph index sync catalog.json --index runs/mcp_index

The catalog is an MCP servers file (LiveMCPBench layout), a folder of ``tools/list`` responses, or a
canonical dataset folder (``tools.jsonl`` + ``agents.jsonl``). Tools and agents are compared with the
index by content hash (every field); added and changed entries are encoded, unchanged ones keep
their vectors, removed ones go. A missing index is created (a ``t2a`` index over ``toolgraph-general``, MiniLM when
that is not installed, unless a retriever config is given).

Atomic write: the new index is saved complete into a hidden sibling folder, then swapped in with two
renames (old -> ``.NAME.old-PID``, new -> NAME), then the old one is deleted. A crash while saving
leaves the live index untouched (the half-written sibling is ignored and cleaned up by the next
sync); a crash between the two renames leaves the complete old index under ``.NAME.old-PID``, which
:func:`recover` (called by ``toolgraph.load`` and by every sync) moves back.

Never someone else's folder: ``--index`` must be absent, an empty folder, or a saved toolgraph index
(it holds ``retriever.json``); anything else is refused with nothing renamed or deleted.

One writer at a time: a sync holds ``.NAME.lock`` beside the index (``flock``: the kernel releases
it when the process ends, even on kill -9, so it never goes stale) from before it reads the index
until the new one is in place. A second sync of the same index waits for it up to ``wait`` seconds
(``--wait``, default 60; 0: fail at once), then fails with a message naming the lock. Only under
the lock are the ``.NAME.new-*`` folders of earlier failed syncs deleted, so a running sync's folder
is never touched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from toolgraph.data.formats import read_dataset
from toolgraph.data.schema import Agent, Tool
from toolgraph.data.sources.mcp import read_catalog
from toolgraph.errors import ConfigError, DataError
from toolgraph.files import clean_new_copies, swap_folder
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.loading import load, recover
from toolgraph.retrieval.pipeline import resolve_retriever

__all__ = ["index_lock", "read_catalog_any", "recover", "save_atomically", "sync_index"]

LOCK_WAIT = 60.0  # seconds a sync waits for another sync of the same index


def read_catalog_any(path: str | Path, on_duplicate: str = "error") -> tuple[list[Tool], list[Agent]]:
    """Tools and agents from an MCP servers file, a tools/list folder, or a canonical dataset folder;
    ``on_duplicate``: what a tool repeated inside one server (or a repeated query id) does:
    error, keep-first, keep-last."""
    path = Path(path)
    if path.is_dir() and (path / "tools.jsonl").is_file():
        ds = read_dataset(path, on_duplicate=on_duplicate)
        return ds.tools, ds.agents
    if path.is_dir():
        builder = read_catalog(tools_lists=path, on_duplicate=on_duplicate)
    elif path.is_file():
        builder = read_catalog(servers=path, on_duplicate=on_duplicate)
    else:
        raise DataError("catalog not found", path)
    return list(builder.tools.values()), list(builder.agents.values())


def _check_target(path: Path) -> bool:
    """True if ``path`` holds a saved index, False if it is absent or an empty folder; any other
    file or folder is refused (ConfigError), so a sync never replaces what it did not write."""
    if not path.exists() and not path.is_symlink():
        return False
    fix = "give --index a new or empty folder, or an index written by toolgraph index sync; nothing was changed"
    if not path.is_dir():
        raise ConfigError(f"--index {path}: exists and is not a folder; refusing to replace it: {fix}")
    if (path / "retriever.json").is_file():
        return True
    if next(path.iterdir(), None) is None:
        return False
    raise ConfigError(f"--index {path}: the folder exists and is not a toolgraph index (no retriever.json); "
                      f"refusing to replace it: {fix}")


def _lock_path(index: Path) -> Path:
    return index.parent / f".{index.name}.lock"


@contextmanager
def index_lock(index: str | Path, wait: float = LOCK_WAIT) -> Iterator[Path]:
    """Hold ``.NAME.lock`` beside ``index`` (one writer at a time); waits up to ``wait`` seconds
    for another holder, then raises a DataError naming the lock and its holder's pid."""
    import fcntl

    index = Path(index)
    if not wait >= 0:  # NaN too
        raise ConfigError(f"--wait must be >= 0 seconds, got {wait}")
    index.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock_path(index)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        raise DataError(f"cannot open the index lock file ({e.strerror or type(e).__name__}); index sync needs a "
                        "folder it can write beside the index", lock) from None
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise DataError(f"another toolgraph index sync (pid {holder}) is writing {index}; waited "
                                    f"{wait:g} s. Run it again when that one has finished (or wait longer: --wait "
                                    "SECONDS)", lock) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield lock
    finally:
        os.close(fd)  # releases the lock


def _swap_in(retriever: Retriever, path: Path) -> Path:
    """Save into a hidden sibling, then two renames (``files.swap_folder``; the caller holds the lock,
    so the unfinished copies of a sync that died are nobody else's)."""
    _check_target(path)
    clean_new_copies(path)
    swap_folder(path, retriever.save)
    return path


def save_atomically(retriever: Retriever, path: str | Path, wait: float = LOCK_WAIT) -> Path:
    """Save ``retriever`` to ``path`` so that ``path`` is always either the old or the new index.
    ``path`` must be absent, empty or a saved index (anything else: ConfigError, nothing changed);
    the write holds the index lock (see :func:`index_lock`)."""
    path = Path(os.path.abspath(path))  # "." or "idx/" name the folder itself
    with index_lock(path, wait):
        recover(path)
        return _swap_in(retriever, path)


def sync_index(catalog: str | Path, index: str | Path, retriever: Any = None,
               wait: float = LOCK_WAIT, on_duplicate: str = "error") -> dict[str, Any]:
    """Bring ``index`` in line with ``catalog``; returns the counts (added/updated/removed/encoded).
    ``created`` is true when no index was there (an absent or empty folder); a folder that exists
    and is not an index is refused. Holds the index lock for the whole sync (``wait``: see
    :func:`index_lock`)."""
    tools, agents = read_catalog_any(catalog, on_duplicate)
    shown, index = str(index), Path(os.path.abspath(index))
    with index_lock(index, wait):
        recover(index)
        if _check_target(index):
            r = load(index)
            created = False
        else:
            r = resolve_retriever(retriever if retriever is not None else {"name": "t2a"}, "retriever")
            created = True
        if not hasattr(r, "sync"):
            raise ConfigError(f"index sync needs an agent index (t2a, agent_only, tool_only, mcp_zero); "
                              f"{index} holds a {type(r).__name__}")
        counts = r.sync(tools, agents)
        _swap_in(r, index)
    return {**counts, "created": created, "index": shown}
