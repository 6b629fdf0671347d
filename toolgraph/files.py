"""Writing files and folders so that a reader sees the old version or the new one, never a part.

One home for the two mechanisms every writer of outputs uses (evaluation results, run configs,
manifests, dependency graphs, exports, synced indexes):

* ``atomic_path`` / ``write_text_atomic``: a file written under a hidden temp name beside it, then
  renamed over it (a killed writer leaves the old file, and at most a ``.NAME.tmp-PID`` to clean).
* ``swap_folder``: a folder built complete in a hidden sibling ``.NAME.new-HEX``, then swapped in by
  two renames (the old one moved aside to ``.NAME.old-PID`` first, deleted last). The new folder
  gets the old one's permission bits (a new one: the umask's, like ``mkdir``), and a ``dest`` that is
  a symlink keeps being one: the folder it points to is swapped. For the instant between the renames
  the folder is absent; ``recover_folder`` (called by every loader and writer of such a folder) puts
  the old one back after a crash there. It only renames, never deletes: the old copies of a swap that
  was killed after its second rename are deleted by ``clean_old_copies``, which only a writer holding
  the folder's lock (``toolgraph index sync``) calls.

Only names these functions make are ever touched: ``.NAME.old-`` + digits, ``.NAME.new-`` + ``[a-z0-9_]``,
real folders (never a symlink), and for an old copy only one holding ``retriever.json`` (a saved
index or export). A user's ``.NAME.old-nov`` backup beside the folder is never moved or deleted.

Imports nothing from toolgraph: every layer may use it.
"""

from __future__ import annotations

import errno
import glob
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["TEMP_NAME", "FolderPutBack", "atomic_path", "clean_new_copies", "clean_old_copies", "fsync_folder",
           "is_temp_name", "old_copies", "recover_folder", "swap_folder", "write_text_atomic"]


TEMP_NAME = re.compile(r"\..+\.tmp-\d+")  # the names atomic_path writes to: ``.NAME.tmp-PID``


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is an ``atomic_path`` temp file's (what a killed writer leaves; never a user's)."""
    return TEMP_NAME.fullmatch(name) is not None


def fsync_folder(folder: str | Path) -> None:
    """Flush a folder's entries (a rename into it) to disk. Some filesystems cannot fsync a folder; the
    rename has happened all the same, so that is no error."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
    fsync_folder(Path(path).parent)  # the rename too: after a power cut, the new file or the old one
    return Path(path)


# ---- folders --------------------------------------------------------------------------------------
def _real(path: str | Path) -> Path:
    """``path`` with its symlinks resolved: a swap replaces the folder a link points to, never the link."""
    return Path(os.path.realpath(path))


def old_copies(path: Path) -> list[Path]:
    """The folders ``.NAME.old-PID`` that a swap of ``path`` moved aside, oldest first: exactly that
    name (PID: digits), a real folder (not a symlink) holding ``retriever.json`` (or empty: the empty
    folder an index was first written into). Anything else beside
    ``path`` (``.NAME.old-nov``, a link, a folder of other things) is someone else's and not listed."""
    made = re.compile(rf"\.{re.escape(path.name)}\.old-\d+")
    found = [p for p in path.parent.glob(f".{glob.escape(path.name)}.old-*")
             if made.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
             and ((p / "retriever.json").is_file() or next(p.iterdir(), None) is None)]  # an index, or empty
    return sorted(found, key=lambda p: p.stat().st_mtime)


def recover_folder(path: str | Path) -> bool:
    """Put back a folder that a crash between the two renames of ``swap_folder`` left aside as
    ``.NAME.old-PID`` (True if one was restored). Only renames, never deletes, so any loader may call it.

    Safe without the writer's lock: the rename is atomic and only happens while ``path`` is absent,
    and it loses nothing (the folder keeps its name-to-be, nothing is overwritten: ``os.rename`` of a
    folder onto an existing non-empty one fails). The one writer it can meet is a swap between its
    two renames: then the swap's second rename fails, the swap removes its new copy and raises
    ``FolderPutBack``, and the old folder stays live (the writer says the write did not happen and
    can run again). Two loaders racing: one rename wins, the other finds ``path`` back and carries on.
    Taking the writer's lock here instead would make every read of a read-only index need a
    writable lock file beside it, for a race a few microseconds wide that loses nothing."""
    path = _real(path)
    if path.exists() or path.is_symlink():
        return False
    olds = old_copies(path)
    if not olds:
        return False
    try:
        os.rename(olds[-1], path)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):  # another loader or the writer came first
            return False
        raise
    return True


def clean_old_copies(path: str | Path) -> None:
    """Delete the ``.NAME.old-PID`` copies that a swap killed after its second rename left beside
    ``path`` (only those of :func:`old_copies`). Only while ``path`` is in place (else they are what
    :func:`recover_folder` restores), and only by a writer holding the folder's lock."""
    path = _real(path)
    if path.is_dir():
        for stale in old_copies(path):
            shutil.rmtree(stale, ignore_errors=True)


def clean_new_copies(path: Path) -> None:
    """Delete the ``.NAME.new-*`` folders that a ``swap_folder`` killed while building left beside
    ``path`` (only names it makes; never a symlink). Call it where no other writer of ``path`` runs."""
    made = re.compile(rf"\.{re.escape(path.name)}\.new-[a-z0-9_]+")
    for stale in path.parent.glob(f".{glob.escape(path.name)}.new-*"):
        if made.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file() and not p.is_symlink():  # a link carried into an index is not ours to flush
            with p.open("rb") as f:
                os.fsync(f.fileno())


class FolderPutBack(OSError):
    """``swap_folder``'s ``dest`` came back between its two renames (a loader's ``recover_folder``
    restored the old copy): the old folder stays live, the new one is dropped."""


def _new_sibling(dest: Path) -> Path:
    """An empty hidden ``.NAME.new-HEX`` beside ``dest``, made by ``mkdir`` so that it gets the umask's
    mode like any new folder (``tempfile.mkdtemp`` makes 0700)."""
    while True:
        tmp = dest.with_name(f".{dest.name}.new-{secrets.token_hex(6)}")
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue


def swap_folder(dest: str | Path, build: Callable[[Path], Any]) -> Any:
    """Run ``build(tmp)`` on a new hidden sibling of ``dest``, flush it to disk, then swap it in (old one
    renamed aside, new one renamed in, old one deleted); returns what ``build`` returned. A failure in
    ``build`` leaves ``dest`` as it was; an interruption between the renames puts the old one back (or,
    after kill -9, ``recover_folder`` does). The new folder keeps the old one's mode; a symlink ``dest``
    stays a link (its target is swapped). Checking that ``dest`` may be replaced is the caller's job."""
    dest = _real(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_sibling(dest)
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    try:
        result = build(tmp)
        if dest.is_dir():  # the mode the owner gave the folder (0755, group-shared...) survives the swap
            os.chmod(tmp, stat.S_IMODE(dest.stat().st_mode))
        _fsync_tree(tmp)
        if dest.exists():
            os.rename(dest, old)
        try:
            os.rename(tmp, dest)
        except OSError as e:  # dest is back: a reader's recover_folder restored the old copy just now
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not dest.exists():
                raise
            raise FolderPutBack(e.errno, f"{dest} was put back by a reader while this write replaced it; the old "
                                "folder is in place and nothing new was written: run it again") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not dest.exists():  # interrupted between the renames: the old one back
            os.rename(old, dest)
    shutil.rmtree(old, ignore_errors=True)
    return result
