"""Writing files and folders so that a reader sees the old version or the new one, never a part.

One home for the two mechanisms every writer of outputs uses (evaluation results, run configs,
manifests, dependency graphs, exports, synced indexes):

* ``atomic_path`` / ``write_text_atomic``: a file written under a hidden temp name beside it, then
  renamed over it (a killed writer leaves the old file, and at most a ``.NAME.tmp-PID`` to clean).
* ``swap_folder``: a folder built complete in a hidden sibling ``.NAME.new-*``, then swapped in by
  two renames (the old one moved aside to ``.NAME.old-PID`` first, deleted last). For the instant
  between the renames the folder is absent; ``recover_folder`` (called by every loader and writer
  of such a folder) puts the old one back after a crash there.

Imports nothing from toolgraph: every layer may use it.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "clean_new_copies", "old_copies", "recover_folder", "swap_folder", "write_text_atomic"]


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A hidden temp name beside ``path`` to write to; renamed over ``path`` when the block ends, removed
    if it raises (SIGTERM / Ctrl-C included). Readers see the old file or the new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists() or tmp.is_symlink():
            tmp.unlink()


def write_text_atomic(path: str | Path, text: str) -> Path:
    """``path.write_text(text)`` that never leaves a partial file (temp name, fsync, rename)."""
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return Path(path)


# ---- folders --------------------------------------------------------------------------------------
def old_copies(path: Path) -> list[Path]:
    """Folders ``.NAME.old-PID`` that a swap moved aside, oldest first."""
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.old-*"), key=lambda p: p.stat().st_mtime)


def recover_folder(path: str | Path) -> bool:
    """Put back a folder left aside by a crash between the two renames of ``swap_folder`` (True if one
    was restored); when the swap had finished and only the delete was interrupted, drop the old copy."""
    path = Path(path)
    if path.exists():
        for stale in old_copies(path):
            shutil.rmtree(stale, ignore_errors=True)
        return False
    olds = old_copies(path)
    if not olds:
        return False
    os.rename(olds[-1], path)
    return True


def clean_new_copies(path: Path) -> None:
    """Delete the ``.NAME.new-*`` folders that a ``swap_folder`` killed while building left beside
    ``path`` (only names it makes; never a symlink). Call it where no other writer of ``path`` runs."""
    made = re.compile(rf"\.{re.escape(path.name)}\.new-[a-z0-9_]+")
    for stale in path.parent.glob(f".{glob.escape(path.name)}.new-*"):
        if made.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with p.open("rb") as f:
                os.fsync(f.fileno())


def swap_folder(dest: str | Path, build: Callable[[Path], Any]) -> Any:
    """Run ``build(tmp)`` on a new hidden sibling of ``dest``, flush it to disk, then swap it in (old one
    renamed aside, new one renamed in, old one deleted); returns what ``build`` returned. A failure in
    ``build`` leaves ``dest`` as it was; an interruption between the renames puts the old one back (or,
    after kill -9, ``recover_folder`` does). Checking that ``dest`` may be replaced is the caller's job."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.new-", dir=dest.parent))
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    try:
        result = build(tmp)
        _fsync_tree(tmp)
        if dest.exists():
            os.rename(dest, old)
        os.rename(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not dest.exists():  # interrupted between the renames: the old one back
            os.rename(old, dest)
    shutil.rmtree(old, ignore_errors=True)
    return result
