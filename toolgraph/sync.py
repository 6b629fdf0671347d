"""Keep a saved index in step with a changing catalog, and write it so a crash never half-writes it.

    toolgraph index sync catalog.json --index runs/mcp_index

The catalog is an MCP servers file (LiveMCPBench layout), a folder of ``tools/list`` responses, or a
canonical dataset folder (``tools.jsonl`` + ``agents.jsonl``). Tools and agents are compared with the
index field by field (every field). An agent index (t2a, agent_only, tool_only, mcp_zero) encodes
added and changed entries only, unchanged ones keep their vectors, removed ones go; with ``scorer:
bm25`` it encodes nothing and holds no encoder. A dense index does the same (``encoded`` in the counts:
the tools whose fields changed or are new), and a FAISS index of it (``index: faiss-hnsw | faiss-ivf |
auto``) is updated in place. Any other retriever that indexes a catalog (bm25, tgr, tool2vec, ...)
indexes the whole catalog again (``reindexed`` in the counts).

Base + delta: a plain ``dense`` index synced from a dataset folder records the catalog's lines
(``sync-state.json``); the next sync reads only the lines it has not seen and writes the new index as
the old one's files, hard-linked, plus a delta of what changed (retrieval/delta_sync.py; past 10 % of
the base, or whenever the fast read cannot place a line, the full sync runs and writes one base).

Streaming encode: a dense index encodes in resumable chunks (``chunk_size`` tools, retrieval/chunks.py)
under ``.NAME.encode`` beside the index, so a sync killed while encoding a large catalog resumes where
it stopped; the folder is deleted once the new index is in place. Under ``torchrun --nproc_per_node=N``
(or any launcher that sets ``RANK`` / ``WORLD_SIZE``; several nodes need that folder on a shared
filesystem) the chunks are split over the ranks: rank 0 takes the lock, reads the others' chunks,
and swaps the index in; ranks 1.. only encode (their line says ``"helper"``). A missing
index is created (a ``t2a`` index over ``toolgraph-general``, MiniLM when that is not installed,
unless a retriever config is given). A new index that a catalog alone cannot build is refused with
the key named: a trained-only retriever written as a config (``mlc``, ``gnn``, ``refiner``,
``cross_encoder``: give its saved folder instead), or one that learns from labelled queries
(``query_knn``, ``losemb``: it must answer one query before it is saved).

Atomic write: the new index is saved complete into a hidden sibling folder, then swapped in with two
renames (old -> ``.NAME.old-PID``, new -> NAME), then the old one is deleted. A crash while saving
leaves the live index untouched (the half-written sibling is ignored and cleaned up by the next
sync); a crash between the two renames leaves the complete old index under ``.NAME.old-PID``, which
:func:`recover` (called by ``toolgraph.load`` and by every sync) moves back. Loaders only rename it
back; an old copy left by a sync killed after its swap is deleted by the next sync, under the lock.
Only the exact names a swap makes are touched (``.NAME.old-<digits>`` holding an index): a user's
``.NAME.old-nov`` backup is never moved or deleted. A full disk while writing is a DataError naming
the index and saying it was not changed.

Never someone else's folder: ``--index`` must be absent, an empty folder, or a saved toolgraph index
(it holds ``retriever.json``); anything else is refused with nothing renamed or deleted. An
``--index`` that is a symlink stays one: the folder it points to is synced (and locked); a link to
nothing is refused.

Files of the user's inside the index are kept: whatever the old index's ``manifest.json`` does not
list (a README.md, a notes/ folder, a .gitignore; also inside the index's own sub-folders) is carried
into the new folder (hard-linked, else copied), and the folder keeps its permission bits. What the
retriever wrote itself is listed there, so a file the new save no longer writes is not carried as a
stale copy, nor are our own hidden temp files (``.NAME.tmp-PID``). A user file where the new save
writes one of its own, or an index without a manifest (written before manifests existed) that holds
files the new save does not write, is refused with nothing changed. A file put into the index while
a sync runs (after it has carried the others) is not seen by that sync.

No cache outside the index: a sync encodes with the embedding cache off (the index keeps its own
vectors), so nothing is written to a ``cache_dir`` such as ``./.cache/embeddings``.

One writer at a time: a sync holds ``.NAME.lock`` beside the index (``flock``) from before it reads
the index until the new one is in place, and removes the file as it ends, success or failure (while
still holding the lock; a waiter that then gets the lock of the removed file, or of one a newcomer
created since, sees that the path no longer names its file and locks the one there now). A sync
killed with kill -9 leaves the file, but not the lock (the kernel releases it with the process): the
next sync takes it at once and removes it. A second sync of the same index waits for it up to
``wait`` seconds (``--wait``, default 60; 0: fail at once), then fails with a message naming the lock
and its holder's pid. Only under the lock are the ``.NAME.new-*`` folders of earlier failed syncs
deleted, so a running sync's folder is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath
from typing import Any

from toolgraph.data.formats import Duplicates, read_dataset
from toolgraph.data.schema import Agent, Tool
from toolgraph.data.sources.mcp import MAX_TEXT_CHARS, check_size, read_catalog
from toolgraph.errors import ConfigError, DataError, ToolgraphError, no_space_is_a_data_error
from toolgraph.files import FolderPutBack, clean_new_copies, clean_old_copies, is_temp_name, swap_folder
from toolgraph.retrieval import delta_sync
from toolgraph.retrieval.agents import diff_counts
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.chunks import rank_and_world
from toolgraph.retrieval.dense import DenseRetriever, embedding_cache_off, streaming_to
from toolgraph.retrieval.feedback import FeedbackRetriever
from toolgraph.retrieval.loading import load, recover, resolve_retriever
from toolgraph.retrieval.manifest import MANIFEST

__all__ = ["index_lock", "read_catalog_any", "recover", "save_atomically", "sync_index"]

LOCK_WAIT = 60.0  # seconds a sync waits for another sync of the same index


def read_catalog_any(path: str | Path, on_duplicate: str = "error", skipped: Counter | None = None,
                     max_text_chars: int = MAX_TEXT_CHARS) -> tuple[list[Tool], list[Agent]]:
    """Tools and agents from an MCP servers file, a tools/list folder, or a canonical dataset folder;
    ``on_duplicate``: what a tool repeated inside one server (or a repeated query id) does:
    error, keep-first, keep-last (each copy left out is counted into ``skipped``, by reason);
    ``max_text_chars``: the longest name / description / schema of a catalog entry. A catalog
    without tools is a DataError naming it."""
    path = Path(path)
    if path.is_dir() and (path / "tools.jsonl").is_file():
        ds = read_dataset(path, on_duplicate=on_duplicate)
        if not ds.tools:
            raise DataError("the catalog has no tools; nothing to index: give a catalog with at least one tool",
                            path / "tools.jsonl")
        found, tools, agents = ds.skipped, ds.tools, ds.agents
        for kind, rows, fields in (("tool", tools, ("name", "description", "parameters", "returns")),
                                   ("agent", agents, ("name", "description"))):
            where = path / f"{kind}s.jsonl"
            for row in rows:  # the same bound as an MCP catalog's: each text is served in every response
                for field in fields:
                    check_size(getattr(row, field, None), field, f"{kind} {row.id!r}", where, max_text_chars)
    else:
        if path.is_dir():
            builder = read_catalog(tools_lists=path, on_duplicate=on_duplicate, max_text_chars=max_text_chars)
        elif path.is_file():
            builder = read_catalog(servers=path, on_duplicate=on_duplicate, max_text_chars=max_text_chars)
        else:
            raise DataError("catalog not found", path)
        found, tools, agents = builder.skipped, list(builder.tools.values()), list(builder.agents.values())
    if skipped is not None:
        skipped.update(found)
    return tools, agents


def resolve_index(index: str | Path) -> Path:
    """The folder ``--index`` names, absolute and with symlinks resolved: the swap and the lock are
    beside the real folder (a link stays a link, and a sync through the link and one through the
    folder share one lock). A link to nothing is refused."""
    path = Path(os.path.abspath(index))  # "." or "idx/" name the folder itself
    if path.is_symlink() and not path.exists():
        raise ConfigError(f"--index {index}: a symlink to {os.readlink(path)!r}, which does not exist; create that "
                          "folder or give --index a real folder; nothing was changed")
    return Path(os.path.realpath(path))


@contextmanager
def _write_errors(index: Path) -> Iterator[None]:
    """A full disk (or quota) while the new index is written, or a loader that put the old index back
    mid-swap: the swap has removed its unfinished copy and left the old index in place, so say so
    instead of a traceback."""
    try:
        with no_space_is_a_data_error(index, "the new index", "the index was not changed and nothing of the new "
                                      "one was left behind: free some space and run the sync again"):
            yield
    except FolderPutBack:
        raise DataError("a reader put the index back while this sync swapped it (a crash recovery racing the "
                        "swap); the index was not changed: run the sync again", index) from None


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
    for another holder, then raises a DataError naming the lock and its holder's pid. The file is
    removed when the block ends (success or failure), while the lock is still held; so a waiter
    that got the lock on a file already unlinked (or replaced by a newcomer's) opens it again."""
    index = Path(index)
    if not wait >= 0:  # NaN too
        raise ConfigError(f"--wait must be >= 0 seconds, got {wait}")
    index.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock_path(index)
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as e:
            raise DataError(f"cannot open the index lock file ({e.strerror or type(e).__name__}); index sync needs "
                            "a folder it can write beside the index", lock) from None
        try:
            _flock(fd, lock, index, wait, deadline)
        except BaseException:
            os.close(fd)
            raise
        if _names(lock, fd):
            break
        os.close(fd)  # the holder before us removed (or a newcomer re-created) the file: lock the one there now
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield lock
    finally:
        with suppress(OSError):  # under the lock: whoever locks the path next locks a new file
            if _names(lock, fd):
                os.unlink(lock)
        os.close(fd)  # releases the lock


def _flock(fd: int, lock: Path, index: Path, wait: float, deadline: float) -> None:
    """``flock(fd)``, polling until ``deadline``; then a DataError naming the holder's pid."""
    import fcntl

    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                raise DataError(f"another toolgraph index sync (pid {holder}) is writing {index}; waited "
                                f"{wait:g} s. Run it again when that one has finished (or wait longer: --wait "
                                "SECONDS)", lock) from None
            time.sleep(0.05)


def _names(lock: Path, fd: int) -> bool:
    """True if the path ``lock`` still names the file open as ``fd`` (same device and inode)."""
    try:
        path = os.stat(lock, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (path.st_dev, path.st_ino) == (held.st_dev, held.st_ino)


def _written_by_us(index: Path) -> set[str] | None:
    """The paths (relative, posix) the retriever wrote into ``index``: its manifest's list and the
    manifest itself; None when it has no manifest (an index saved before manifests existed)."""
    try:
        files = json.loads((index / MANIFEST).read_text(encoding="utf-8")).get("files")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
        raise DataError(f"not readable ({type(e).__name__}): cannot tell the index's files from yours; nothing was "
                        "changed", index / MANIFEST) from None
    return set(files or ()) | {MANIFEST}


def _link_or_copy(src: str, dst: str) -> None:
    """A hard link (instant, no space; the old index is deleted after the swap), else a copy."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def carry_user_files(old: Path, new: Path, ours: set[str] | None) -> list[str]:
    """Put into the freshly saved ``new`` everything of ``old`` (the live index) that the retriever did
    not write (not in ``ours``, the old manifest's list), keeping modes and symlinks as they are; the
    carried paths. A user's entry where the new save wrote a file, or (``ours`` None: no manifest)
    any entry the new save did not write, is refused: ConfigError, and the swap does not happen."""
    carried, unknown = [], []

    def walk(rel: PurePosixPath) -> None:
        for entry in sorted(os.scandir(old / rel), key=lambda e: e.name):
            r = (rel / entry.name).as_posix()
            if is_temp_name(entry.name) or (ours is not None and r in ours):
                continue
            target = new / r
            if entry.is_dir(follow_symlinks=False) and ((target.is_dir() and not target.is_symlink())
                                                        or any(o.startswith(r + "/") for o in ours or ())):
                walk(rel / entry.name)  # a folder of the retriever's that may hold something of the user's
                continue
            if ours is None:
                if not (target.exists() or target.is_symlink()):
                    unknown.append(r)
                continue
            if target.exists() or target.is_symlink():
                raise ConfigError(f"--index {old}: {r!r} is not a file of the index (its {MANIFEST} does not list "
                                  "it), but the new index writes a file of that name; move it out of the index "
                                  "and sync again; nothing was changed")
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry.is_dir(follow_symlinks=False):
                shutil.copytree(entry.path, target, symlinks=True, copy_function=_link_or_copy)
            else:
                _link_or_copy(entry.path, str(target))
            carried.append(r)

    walk(PurePosixPath("."))
    if unknown:
        raise ConfigError(f"--index {old}: the index has no {MANIFEST} (saved by an older toolgraph), so its own "
                          f"old files cannot be told from yours: {', '.join(unknown[:5])}"
                          f"{' ...' if len(unknown) > 5 else ''}. Move your files out (or delete what is an old "
                          "index file) and sync again; nothing was changed")
    return carried


def _swap_in(retriever: Retriever, path: Path, state: dict | None = None) -> Path:
    """Save into a hidden sibling, carry the user's files over, then two renames (``files.swap_folder``;
    the caller holds the lock, so the unfinished and old copies of a sync that died are nobody else's).
    ``state``: the catalog's lines for the next sync's fast path (retrieval/delta_sync.py)."""
    exists = _check_target(path)
    clean_new_copies(path)
    clean_old_copies(path)
    ours = _written_by_us(path) if exists else set()

    def build(tmp: Path) -> None:
        retriever.save(tmp)
        if state is not None:
            delta_sync.write_state(tmp, state)
        if exists:  # after the save: the new manifest does not list the carried files, so they stay the user's
            carry_user_files(path, tmp, ours)

    swap_folder(path, build)
    return path


def save_atomically(retriever: Retriever, path: str | Path, wait: float = LOCK_WAIT) -> Path:
    """Save ``retriever`` to ``path`` so that ``path`` is always either the old or the new index.
    ``path`` must be absent, empty or a saved index (anything else: ConfigError, nothing changed);
    the write holds the index lock (see :func:`index_lock`); files of the user's in it are kept."""
    path = resolve_index(path)
    with _write_errors(path), index_lock(path, wait):
        recover(path)
        return _swap_in(retriever, path)


def sync_index(catalog: str | Path, index: str | Path, retriever: Any = None,
               wait: float = LOCK_WAIT, on_duplicate: str = "error",
               max_text_chars: int = MAX_TEXT_CHARS) -> dict[str, Any]:
    """Bring ``index`` in line with ``catalog``; returns the counts (added/updated/removed, and
    ``skipped``: catalog entries left out by ``on_duplicate``, by reason). ``created`` is true when no
    index was there (an absent or empty folder; ``retriever``: the spec of the new one, default t2a);
    a folder that exists and is not an index is refused. An agent index (t2a, agent_only, tool_only,
    mcp_zero) encodes only new or changed texts (``encoded``); any other retriever (bm25, dense, ...)
    indexes the whole catalog again (``reindexed``: its tool count). Holds the index lock for the whole
    sync (``wait``: see :func:`index_lock`)."""
    skipped: Counter = Counter()
    shown, index = str(index), resolve_index(index)
    rank, world = rank_and_world()
    if rank > 0:  # under torchrun: help rank 0 encode, then leave the index to it
        tools, agents = read_catalog_any(catalog, on_duplicate, skipped, max_text_chars)
        return {**_help_encode(tools, index, retriever, rank, world), "skipped": dict(skipped), "index": shown}
    Duplicates("query id", on_duplicate, Counter())  # a bad option fails before anything is read
    with _write_errors(index), index_lock(index, wait):
        recover(index)
        created = not _check_target(index)
        fast = None if created or world > 1 else delta_sync.plan(catalog, index, max_text_chars)
        if fast is not None:  # a dense index synced from a dataset folder before: only what changed
            counts = _fast_sync(fast, index)
            return {**counts, "skipped": delta_sync.skipped_of(catalog), "created": False, "index": shown}
        tools, agents = read_catalog_any(catalog, on_duplicate, skipped, max_text_chars)
        if created:
            spec = retriever if retriever is not None else {"name": "t2a"}
            _refuse_untrained(spec)
            r = resolve_retriever(spec, "retriever")
        else:
            r = load(index)
        chunks = encode_folder(index)  # a dense index encodes its new tools here in chunks: a killed sync resumes
        # no cache_dir (./.cache/embeddings) is written
        with _chunks_kept_if_interrupted(chunks), embedding_cache_off(), streaming_to(chunks):
            counts = _sync_retriever(r, tools, agents, created)
        state = delta_sync.catalog_state(catalog, tools, agents, max_text_chars) if type(r) is DenseRetriever else None
        _swap_in(r, index, state)
        shutil.rmtree(chunks, ignore_errors=True)
    return {**counts, "skipped": dict(skipped), "created": created, "index": shown}


def _fast_sync(fast: delta_sync.FastSync, index: Path) -> dict[str, Any]:
    """Encode what changed, then swap in the old index's files plus a delta (retrieval/delta_sync.py)."""
    chunks = encode_folder(index)
    with _chunks_kept_if_interrupted(chunks), embedding_cache_off(), streaming_to(chunks):
        vectors = fast.encode()
    if not fast.todo and not fast.leaving and not fast.lines_changed:
        shutil.rmtree(chunks, ignore_errors=True)
        return fast.counts  # nothing to write: the served index stays as it is
    ours = _written_by_us(index)
    clean_new_copies(index)
    clean_old_copies(index)

    def build(tmp: Path) -> None:
        fast.write(vectors, tmp)
        carry_user_files(index, tmp, ours)

    swap_folder(index, build)
    shutil.rmtree(chunks, ignore_errors=True)
    return fast.counts


@contextmanager
def _chunks_kept_if_interrupted(chunks: Path) -> Iterator[None]:
    """A refused sync (a bad catalog or spec) leaves nothing beside the index; an interrupted one
    (SIGTERM, Ctrl-C) keeps the chunks it encoded for the next sync to resume from."""
    try:
        yield
    except ToolgraphError:
        shutil.rmtree(chunks, ignore_errors=True)
        raise
    except BaseException:
        if chunks.is_dir() and not any(chunks.glob("chunk-*.safetensors")):
            shutil.rmtree(chunks, ignore_errors=True)
        raise


def _help_encode(tools: list[Tool], index: Path, retriever: Any, rank: int, world: int) -> dict[str, Any]:
    """Rank ``rank`` > 0 of a ``torchrun`` sync: encode this rank's chunks of the tools rank 0's sync will
    encode (the same plan, from the same catalog and index) into the index's encode folder, and return;
    rank 0 holds the lock, reads these chunks, and swaps the index in. Only a dense index (or a feedback
    index over one) splits its encoding; for any other the helper does nothing."""
    r = load(index) if _check_target(index) else resolve_retriever(retriever or {"name": "t2a"}, "retriever")
    r = r.base if isinstance(r, FeedbackRetriever) else r
    if not isinstance(r, DenseRetriever):
        return {"helper": rank, "encoded_chunks": 0}
    with embedding_cache_off():
        r.encode_share(tools, encode_folder(index), rank, world)
    return {"helper": rank, "world": world}


def encode_folder(index: Path) -> Path:
    """``.NAME.encode`` beside the index: the chunks (retrieval/chunks.py) of a sync's new tool vectors,
    kept when a sync dies so that the next one reads what was encoded, deleted once the index is swapped."""
    return index.parent / f".{index.name}.encode"


# retrievers whose weights come from training (a task's export): given by name in a config they would be
# built untrained (a random head, graph encoder or reranker network); given by their saved folder they work
TRAINED_ONLY = {"mlc": "a classifier head", "gnn": "a graph encoder", "refiner": "a refiner network",
                "cross_encoder": "a cross-encoder head"}


def _refuse_untrained(spec: Any, where: str = "retriever") -> None:
    """A ConfigError naming the key (``retriever.name``, ``retriever.reranker.name``, ...) of a trained-only
    retriever written as a config in ``spec`` (dicts and lists walked; paths are saved retrievers: fine)."""
    if isinstance(spec, dict):
        name = spec.get("name")
        if isinstance(name, str) and name in TRAINED_ONLY:
            raise ConfigError(f"{where}.name: {name!r} is a trained retriever ({TRAINED_ONLY[name]} learned by "
                              f"toolgraph train): a new index cannot build one from a catalog. Give the retriever "
                              f"folder a training run exported ({where}: runs/NAME/retriever), or a retriever that "
                              "indexes any catalog: bm25, dense, t2a, agent_only, tool_only, mcp_zero")
        for key, value in spec.items():
            _refuse_untrained(value, f"{where}.{key}")
    elif isinstance(spec, list):
        for i, value in enumerate(spec):
            _refuse_untrained(value, f"{where}[{i}]")
    elif where == "retriever" and isinstance(spec, str) and spec in TRAINED_ONLY and not Path(spec).exists():
        _refuse_untrained({"name": spec}, where)  # a bare name (a path to a saved one exists)


def _sync_retriever(r: Retriever, tools: list[Tool], agents: list[Agent], created: bool) -> dict[str, Any]:
    """Put the catalog into ``r``: an agent index through its own ``sync``; any other retriever through
    ``index`` (counted here, entries compared field by field). A new index that cannot be built from a catalog alone
    (one that learns from labelled queries: query_knn, losemb) is a ConfigError naming
    ``retriever.name`` and saying what to give instead."""
    if isinstance(r, FeedbackRetriever):  # the catalog is its base's; the store stays (tools gone stop voting)
        counts = _sync_retriever(r.base, tools, agents, created)
        r.refresh()
        return counts
    if hasattr(r, "sync"):
        return r.sync(tools, agents)
    old = {t.id: t for t in r.tools}
    try:
        r.index(tools)
        if created and r.tools:  # one query: a retriever that needs labelled queries fails here, not in serve
            r.retrieve([tools[0].name], 1)
    except (ToolgraphError, RuntimeError) as e:
        if not created:
            raise
        raise ConfigError(f"retriever.name: a new {r.name!r} index cannot be built from a catalog alone ({e}). "
                          "Give a retriever that indexes any catalog (bm25, dense, t2a, agent_only, tool_only, "
                          "mcp_zero), or one saved by evaluate or train (retriever: runs/NAME/retriever)") from None
    return {**diff_counts(old, {t.id: t for t in tools}), "reindexed": len(r.tools),
            **({"encoded": r.encoded} if isinstance(getattr(r, "encoded", None), int) else {}),
            "tools": len(r.tools), "agents": len({t.agent for t in r.tools if t.agent is not None})}
