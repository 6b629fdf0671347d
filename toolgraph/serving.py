"""Serve a saved retriever to agents: an MCP server (official ``mcp`` SDK) and a small HTTP JSON API.

    toolgraph serve --retriever runs/mcp_index                         # MCP over stdio
    toolgraph serve --retriever runs/mcp_index --transport http --port 8000
        # MCP streamable HTTP at http://127.0.0.1:8000/mcp, plus
        # GET /search?q=...&k=5  GET /search_agents?q=...&k=5  POST /search {"query", "k"}  GET /health
    toolgraph mcp-config --retriever runs/mcp_index --client vscode  # the client's config, absolute paths

MCP tools: ``search_tools(query, k)`` -> the k best tools ({rank, id, name, agent, description, score,
input_schema}); ``search_agents(query, k)`` -> the k best agents ({rank, id, name, description, score,
tools: the best tools inside, each {id, name, score}}). The server reports itself as ``toolgraph``
with the package version. Any saved retriever serves tools; agents come from an agent router
(``t2a`` …) or, for other retrievers, from the tool ranking rolled up to owners.

Scores: one scale for both tools, the retriever's own score of an entity. For an agent router (t2a,
agent_only, tool_only, mcp_zero) that is the entity's fused score in the one joint ranking of all tools
and agents of the index (``scorer: score``, the default: dense + bm25_weight x BM25 of the min-max
normalised scores, 0 to 1.3; ``rrf``: sum over the dense and BM25 rankings of 1 / (rrf_k + rank), at
most 2 / 61 ≈ 0.033 with the default ``rrf_k`` 60; ``dense``: cosine; ``bm25``: BM25), and an agent's
score is its best entity's (itself or one of its tools). The order is the retriever's (t2a puts the
tools of the ``route_agents`` best agents first), so ``rank`` is the answer's order and a tool further
down may score higher. For any other retriever a tool's score is the retriever's and an agent's that of
its best tool. (The router's own tool ranking adds a routing offset above 4 to the tools of the routed
agents, and mcp_zero ±2 to its tiers: offsets for ordering, not relevance; they are not served.)

Start: ``serve`` checks the options, binds the HTTP socket and makes the cheap checks of the index
(:func:`check_servable`: the path exists and is a .ckpt / saved retriever / run folder, or exit 2
naming the file), then answers at once: ``initialize`` and ``tools/list`` need no index. The index
(torch, the encoder, a test query) loads in a background thread; a ``tools/call`` or ``/search`` that
comes before it waits for it, up to ``--request-timeout`` seconds, then gets "the index is still
loading" (``/health`` says ``"status": "loading"``, HTTP 503, until then). An index that fails to
load is never served: the error (naming the file) answers every waiting call, is printed on stderr,
and the process stops with exit status 2 a moment later (``LOAD_FAILED_GRACE``), as a start on a bad
index always did. This module imports neither torch nor the retrieval code at its top, so that a
start pays only for Python and the MCP SDK.

The index is reloaded when ``toolgraph index sync`` replaces it (a watcher thread, started after the
first load, checks at most once a second, loads the new index beside the old one and swaps it in
under a lock); a new index that fails to load is not served: a running server keeps the last good
one. Retrieval runs in one worker thread (the tokenizer is not thread-safe), so the event loop keeps
accepting requests, and encodes without the embedding cache: no query vector is ever written to disk.

Bounded requests (:class:`Limits`, every one an option of ``toolgraph serve``): a query longer than
``max_query_chars`` or a body larger than ``max_body_bytes`` is refused (HTTP 413 / an MCP tool
error), a request not answered within ``request_timeout`` seconds gets 503, POST bodies must be
``application/json`` (415), and the Host and Origin headers of every route must name this machine
(421 / 403; DNS-rebinding protection, as the MCP SDK does on ``/mcp``).

Bounded connections (HTTP; each open socket holds a file descriptor, and a server out of them used
to die): at most ``limit_concurrency`` connections (one more: 503, closed), a whole request within
``header_timeout`` seconds (else 408, closed), idle keep-alive connections closed after
``keep_alive_timeout``; a request line or headers over the parser's limit get 414 / 431, and every
refused client reads its answer before the socket closes (no reset). ``--host`` / ``--port`` are
checked and bound before anything loads, and ``ulimit -n`` must hold the connections.

Failures are answers: a NaN / infinite score (a broken vector or model) is HTTP 500 with a JSON
error or an MCP tool error, counted in ``/health`` ``errors``; a client gone mid-body is one log
line; over stdio, a request holding a lone surrogate escape gets a tool error instead of silence.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import gc
import http
import json
import logging
import os
import queue
import sys
import threading
import time
import zipfile
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from toolgraph.errors import ConfigError, DataError, ToolgraphError
from toolgraph.files import recover_folder

if TYPE_CHECKING:  # torch and the retrieval code load with the index, in the background (see above)
    from toolgraph.retrieval.base import Retriever

MAX_K = 100
LOCAL_HOSTS = ("127.0.0.1:*", "localhost:*", "[::1]:*")
LOCAL_ORIGINS = ("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*")
DRAIN_BYTES = 64 * 1024 * 1024  # an oversized body is read and dropped up to this, then the connection is cut
TRIM_EVERY = 1.0  # seconds between two returns of freed heap memory to the OS (release_free_memory)
LINGER = 5.0  # seconds a refused HTTP client has to finish sending before its socket is closed
LOAD_FAILED_GRACE = 1.0  # seconds a server whose index failed to load keeps answering (the error), then exits 2
LOAD_AT_THE_LATEST = 2.0  # stdio: seconds after the start that the index loads even if no client initialized
_LOG = logging.getLogger("uvicorn.error")  # where uvicorn's own warnings go ("Invalid HTTP request received")


def _malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim if hasattr(libc, "malloc_trim") else None  # glibc only (not musl)
    except OSError:
        return None


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Give the heap pages freed since the last call back to the OS (glibc ``malloc_trim``; a no-op
    elsewhere). Batches of every size and length allocate tensors of ever new shapes; glibc keeps the
    freed pages, and a server's resident memory crept up by ~20 MB a minute under 20 clients (measured:
    benchmarks/soak.py, with no growth of Python objects). Costs about a millisecond."""
    if _TRIM is not None:
        _TRIM(0)


@dataclass(frozen=True)
class Limits:
    """What one request may cost (``toolgraph serve --max-query-chars ...``).

    ``allowed_hosts`` / ``allowed_origins``: Host / Origin header values accepted on every route
    (``name:*`` = any port; an absent Origin is accepted); ``("*",)`` turns the check off, e.g.
    behind a reverse proxy that does it."""

    max_query_chars: int = 4096
    max_body_bytes: int = 65536
    request_timeout: float = 30.0
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS
    allowed_origins: tuple[str, ...] = LOCAL_ORIGINS
    limit_concurrency: int = 100  # HTTP connections open at once; one more gets 503 and is closed
    header_timeout: float = 10.0  # seconds a connection has to send a whole request line + headers (+ body), else 408
    keep_alive_timeout: float = 5.0  # seconds an idle keep-alive connection stays open between requests

    def __post_init__(self) -> None:
        for key in ("max_query_chars", "max_body_bytes", "limit_concurrency"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{key.replace('_', '-')} must be an integer >= 1, got {value!r}")
        for key in ("request_timeout", "header_timeout", "keep_alive_timeout"):
            t = getattr(self, key)
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
                raise ConfigError(f"--{key.replace('_', '-')} must be a number of seconds > 0, got {t!r}")
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
        object.__setattr__(self, "allowed_origins", tuple(self.allowed_origins))
        if not self.allowed_hosts:
            raise ConfigError("--allowed-host: give at least one Host value (or '*' for any)")


class RequestError(ToolgraphError, ValueError):
    """A request the server refuses; ``status`` is its HTTP status (MCP: a tool error)."""

    status = 400


class RequestTooLarge(RequestError):
    status = 413


class ServerBusy(RequestError):
    status = 503


class _Served(NamedTuple):
    """One loaded index and its id lookups, swapped as one value."""

    retriever: Retriever
    tool: dict[str, Any]
    agent: dict[str, Any]


def _stamp_of(path: Path) -> tuple | None:
    """Identity of the saved index at ``path``: inode, mtime and size of ``retriever.json`` and of
    ``manifest.json`` (a sync replaces the folder, a save rewrites both); None while it is absent."""
    out = []
    for name in ("retriever.json", "manifest.json"):
        try:
            st = os.stat(path / name)
        except OSError:
            if name == "retriever.json":
                return None
            out.append(None)
            continue
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


SERVABLE = "a folder written by toolgraph index sync, a saved retriever (retriever.json), a run folder or a .ckpt"


def check_servable(path: str | Path) -> Path:
    """The checks that cost nothing (no torch, no model; milliseconds) that ``path`` is something
    :func:`toolgraph.load` reads: it exists and is a ``.ckpt`` (the zip archive torch writes), a saved
    retriever folder (``retriever.json``: a JSON object naming its retriever and config) or a run
    folder holding one under ``retriever/``. A DataError names the file. ``toolgraph serve`` makes
    them before it starts (exit 2), then loads and test-queries the index in the background; an index
    left aside by a crash mid-sync is put back first, as a load does."""
    p = Path(path)
    recover_folder(p)  # a rename, never a delete (toolgraph/files.py)
    if not p.exists():
        raise DataError(f"does not exist; give {SERVABLE} (e.g. toolgraph index sync servers.json --index {p})", p)
    if p.is_file():
        if p.suffix != ".ckpt":
            raise DataError(f"not {SERVABLE}", p)
        if not zipfile.is_zipfile(p):
            raise DataError("not a readable checkpoint (not the zip archive torch.save writes: cut short, or "
                            "another format?); re-train or re-export it", p)
        return p
    for folder in (p, p / "retriever"):
        meta_path = folder / "retriever.json"
        if not meta_path.is_file():
            continue
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise DataError(f"not a readable saved retriever ({type(e).__name__}); rebuild it with toolgraph "
                            "index sync or re-export it", meta_path) from None
        if not isinstance(meta, dict) or not isinstance(meta.get("retriever"), str) \
                or not isinstance(meta.get("config"), dict):
            raise DataError("expected {\"retriever\": <name>, \"config\": {...}, \"tools\": <count>}; the folder is "
                            "damaged: rebuild it with toolgraph index sync or re-export it", meta_path)
        return p
    raise DataError(f"not {SERVABLE} (no retriever.json in it or in its retriever/)", p)


def open_index(path: str | Path) -> _Served:
    """Load the index at ``path`` and answer one query with it, or raise a ``DataError`` saying why
    it cannot be served. Runs without the embedding cache. Imports torch and the retrieval code (the
    first call of a process pays for them)."""
    from toolgraph.retrieval.dense import embedding_cache_off
    from toolgraph.retrieval.loading import load

    path = Path(path)
    with embedding_cache_off():
        try:
            retriever = load(path)
            if retriever.tools:  # a query through every member (encoder, tokenizer, vectors) before serving
                retriever.retrieve(["toolgraph serve check"], 1)
        except ToolgraphError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever the files hold, the message names them
            raise DataError(f"cannot serve this index ({type(e).__name__}: {e}); rebuild it with "
                            "toolgraph index sync or re-export it", path) from e
    return _Served(retriever, {t.id: t for t in retriever.tools}, {a.id: a for a in getattr(retriever, "agents", [])})


def _router_rankings(retriever: Any, queries: list[str], k: int, kind: str) -> tuple:
    """An agent router's ranking of ``kind`` ("tools" / "agents") for ``queries``, with the served
    scores (see the module docstring): the retriever's order, each entity scored by its fused score in
    the joint ranking of all tools and agents, an agent by its best entity's. One scoring of the queries.
    Returns (ids, scores) per query; for agents also the whole tool order and its scores (the tools
    listed inside each agent come from it)."""
    import torch

    from toolgraph.retrieval.topk import topk

    r = retriever
    raw = r.raw_scores(queries)
    n = len(r.tools)
    joint = r.fuse(raw, torch.ones(n + len(r.agents), dtype=torch.bool))  # [Q, N + A]
    tool_order = topk(r.tool_scores_from(raw), n if kind == "agents" else k, r.tools)[1]  # NaN / inf: an error
    tool_ids = [[r.tools[i].id for i in row] for row in tool_order.tolist()]
    tool_scores = joint[:, :n].gather(1, tool_order).tolist()
    if kind == "tools":
        return tool_ids, tool_scores
    best = joint[:, n:].clone()  # [Q, A]: an agent's own entity, then its tools over it
    owned = r.owner >= 0
    if bool(owned.any()):
        best = best.scatter_reduce(1, r.owner[owned].expand(len(queries), -1), joint[:, :n][:, owned], reduce="amax")
    order = topk(r.agent_scores_from(raw), k, r.agents)[1]
    return [[r.agents[i].id for i in row] for row in order.tolist()], best.gather(1, order).tolist(), tool_ids, tool_scores


def _is_router(retriever: Any) -> bool:
    from toolgraph.retrieval.agents import AgentRetriever

    return isinstance(retriever, AgentRetriever)


def _encoder_said(r: Any) -> str:
    """", encoder NAME, scorer S" for the startup line: the text encoder the index was built with (its
    own or its dense member's, as its saved config names it; toolgraph-general is the general model,
    docs/general.md) and an agent router's entity scorer; "" for a retriever with neither."""
    dense = getattr(r, "dense", None) or r
    encoder = getattr(getattr(getattr(dense, "config", None), "encoder", None), "name", None)
    scorer = getattr(getattr(r, "config", None), "scorer", None)
    return (f", encoder {encoder}" if isinstance(encoder, str) else "") + (f", scorer {scorer}" if scorer else "")


class LiveIndex:
    """A retriever loaded from ``path`` and replaced when the folder is replaced.

    ``background=False`` (the default) loads it in the constructor, which raises if it cannot be
    served. ``background=True`` (``toolgraph serve``) loads nothing there: :meth:`start` loads it in a
    thread and returns at once; requests wait for the load (up to ``request_timeout``), ``loaded`` /
    ``load_error`` say how it went, and a line on stderr says when it is served.

    Requests from concurrent clients are micro-batched: one worker thread owns the retriever, takes
    every request waiting (up to ``max_batch``) and answers them with one batched retrieval — one
    encoder call for 8 queries costs far less than 8 calls. ``max_batch=1`` turns this off.

    A watcher thread (every ``check_every`` seconds; 0: never; started once the first load is done)
    loads a replaced index beside the served one and swaps it in under a lock; if it fails to load,
    the last good index stays and ``last_error`` says why. Counters are fixed-size: totals, and the
    last 1,024 batch sizes."""

    def __init__(self, path: str | Path, check_every: float = 1.0, max_batch: int = 32,
                 max_query_chars: int = Limits.max_query_chars, request_timeout: float = Limits.request_timeout,
                 background: bool = False):
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        Limits(max_query_chars=max_query_chars, request_timeout=request_timeout)  # checks both
        self.path = Path(path)
        self.check_every = check_every
        self.max_batch = max_batch
        self.max_query_chars = max_query_chars
        self.request_timeout = request_timeout
        self._lock = threading.Lock()  # guards the swap of the served index and the reload counters
        self._state: _Served | None = None
        self._stamp: tuple | None = None
        self._settled = threading.Event()  # the first load is over, well or not
        self._started = time.monotonic()
        self.load_error: ToolgraphError | None = None  # why the first load failed (then nothing is served)
        self.load_seconds: float | None = None
        self._background = background
        self.reloads = 0
        self.reload_errors = 0
        self.last_error: str | None = None
        self.batches: deque[int] = deque(maxlen=1024)  # sizes of the last batches (for the benchmark)
        self.counts = {"requests": 0, "batches": 0, "batched": 0, "errors": 0, "timeouts": 0, "refused": 0}
        self.last_request_error: str | None = None  # why the index last failed to answer (health says it)
        self._count_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        if not background:
            self._first_load()
            if self.load_error is not None:
                raise self.load_error  # refuses to start on an index that cannot be served

    def start(self) -> LiveIndex:
        """Load the index in a background thread (``background=True``; once); returns at once."""
        if self._background and not hasattr(self, "_loader"):
            self._started = time.monotonic()
            print(f"toolgraph serve: loading {self.path} in the background (calls wait for it)", file=sys.stderr,
                  flush=True)
            self._loader = threading.Thread(target=self._first_load, name="toolgraph-load", daemon=True)
            self._loader.start()
        return self

    def _first_load(self) -> None:
        # the cyclic GC off while torch, transformers and the model load: each of the many collections
        # their allocations trigger walks every object alive, the MCP SDK's ~0.5 million included (a
        # ToolLens / MiniLM load: 7.0 s with it on, 5.6 s off); it is back on (as it was) once the load is over
        collecting = gc.isenabled()
        gc.disable()
        try:
            stamp = _stamp_of(self.path)
            state = open_index(self.path)
        except Exception as e:  # noqa: BLE001 - whatever it is, nothing is served and the message names the file
            self.load_error = e if isinstance(e, ToolgraphError) else DataError(
                f"cannot serve this index ({type(e).__name__}: {e})", self.path)
            self.load_seconds = round(time.monotonic() - self._started, 3)
            self._settled.set()
            return
        finally:
            if collecting:
                gc.enable()
        with self._lock:
            self._state, self._stamp = state, stamp
        self.load_seconds = round(time.monotonic() - self._started, 3)
        threading.Thread(target=self._worker, name="toolgraph-retrieval", daemon=True).start()
        if self.check_every > 0:
            threading.Thread(target=self._watch, name="toolgraph-reload", daemon=True).start()
        self._settled.set()
        if self._background:
            r = state.retriever
            agents = f", {len(getattr(r, 'agents', []))} agents" if getattr(r, "agents", None) else ""
            print(f"toolgraph serve: serving {self.path} ({r.name}{_encoder_said(r)}, {len(r.tools)} tools{agents}; "
                  f"loaded in {self.load_seconds:.1f} s)", file=sys.stderr, flush=True)

    @property
    def loaded(self) -> bool:
        """True once the index is loaded and served (False while loading, or after a failed load)."""
        return self._settled.is_set() and self.load_error is None

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Wait for the first load (up to ``timeout`` seconds); True if it is over, well or not."""
        return self._settled.wait(timeout)

    @property
    def retriever(self) -> Retriever:
        """The served retriever (waits for the first load; raises its error if it failed)."""
        if self._background and not hasattr(self, "_loader"):
            raise RuntimeError("LiveIndex(background=True): call start() to load the index first")
        self._settled.wait()
        if self.load_error is not None:
            raise DataError(str(self.load_error))
        return self._state.retriever

    def close(self) -> None:
        """Stop the worker and the watcher threads (requests still queued get an error), and wait for a
        background load still running: a process that ends in the middle of torch's import or of the
        test query aborts (C++ threads torn down under it)."""
        self._closed.set()
        self._queue.put(None)
        loader = getattr(self, "_loader", None)
        if loader is not None and loader is not threading.current_thread():
            loader.join()

    # ---- reloads ------------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._closed.wait(self.check_every):
            self.reload_if_replaced()

    def reload_if_replaced(self) -> bool:
        """Load and serve the index at ``path`` if it was replaced since the last look; True if swapped.
        A new index that fails to load is not served (and not retried until it changes again). A load
        that fails because the folder was replaced again under it is no error: the next look loads
        the newer folder. Nothing happens before the first load is done."""
        if not self.loaded:
            return False
        stamp = _stamp_of(self.path)
        if stamp is None or stamp == self._stamp:  # absent (the instant of a swap) or unchanged
            return False
        try:
            state = open_index(self.path)
        except Exception as e:  # noqa: BLE001 - a broken new index keeps the old one serving
            if _stamp_of(self.path) != stamp:  # replaced while loading: a torn read, not a broken index
                return False  # the newer one is loaded on the next look
            with self._lock:
                self._stamp = stamp
                self.reload_errors += 1
                self.last_error = str(e)
            print(f"toolgraph serve: reload failed, still serving the previous index: {e}", file=sys.stderr, flush=True)
            return False
        if _stamp_of(self.path) != stamp:  # replaced again while loading: take the newer one next time
            return False
        with self._lock:
            old, self._state, self._stamp = self._state, state, stamp
            self.reloads += 1
            self.last_error = None
        del old, state  # the previous index is freed once the batch in flight lets go of it
        release_free_memory()
        return True

    # ---- the worker: batches of waiting requests, one retrieval per kind ---------------------------
    def _worker(self) -> None:
        from toolgraph.retrieval.dense import embedding_cache_off

        last_trim = time.monotonic()
        with embedding_cache_off():  # query vectors are never cached (on disk or in memory)
            while True:
                item = self._queue.get()
                if item is None:
                    break
                batch = [item]
                while len(batch) < self.max_batch:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        self._queue.put(None)
                        break
                    batch.append(item)
                batch = [b for b in batch if b[3].set_running_or_notify_cancel()]  # callers that gave up: skipped
                if not batch:
                    continue
                self.batches.append(len(batch))
                self._count("batches")
                self._count("batched", len(batch))
                self._answer(batch)
                if time.monotonic() - last_trim >= TRIM_EVERY:
                    release_free_memory()
                    last_trim = time.monotonic()
        while True:  # closed: nobody will answer what is still queued
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[3].set_running_or_notify_cancel():
                item[3].set_exception(ServerBusy("the server is shutting down"))

    def _answer(self, batch: list) -> None:
        for kind in ("tools", "agents"):
            items = [b for b in batch if b[0] == kind]
            if not items:
                continue
            try:
                fn = self._tools if kind == "tools" else self._agents
                results = fn([b[1] for b in items], max(b[2] for b in items))
                for (_, _, k, fut), res in zip(items, results):
                    fut.set_result(res[:k])
            except Exception as e:  # noqa: BLE001 - every waiting caller gets the error
                self._count("errors", len(items))
                self.last_request_error = f"{type(e).__name__}: {e}"[:500]
                for *_, fut in items:
                    fut.set_exception(e)

    def _submit(self, kind: str, query: Any, k: Any) -> list[dict[str, Any]]:
        try:
            k = _check(query, k, self.max_query_chars)
        except ValueError:
            self._count("refused")
            raise
        if self._closed.is_set():
            raise ServerBusy("the server is shutting down")
        self._count("requests")
        deadline = time.monotonic() + self.request_timeout
        if not self._settled.wait(self.request_timeout):  # the first call of a fresh server waits for the load
            self._count("timeouts")
            raise ServerBusy(f"the index is still loading ({time.monotonic() - self._started:.0f} s so far, "
                             f"{self.path}); retry in a moment, or raise --request-timeout") from None
        if self.load_error is not None:
            raise DataError(f"the index cannot be served: {self.load_error}")
        fut: Future = Future()
        self._queue.put((kind, query, k, fut))
        try:
            return fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            fut.cancel()  # still queued: the worker skips it
            self._count("timeouts")
            raise ServerBusy(f"no answer within {self.request_timeout:g} s (the server is busy); "
                             "retry later, or raise --request-timeout") from None

    def _count(self, key: str, n: int = 1) -> None:
        with self._count_lock:
            self.counts[key] += n

    def _tools(self, queries: list[str], k: int) -> list[list[dict[str, Any]]]:
        served = self._state  # one snapshot: a swap in the middle of a batch never mixes two indexes
        if _is_router(served.retriever):
            ids, scores = _router_rankings(served.retriever, queries, k, "tools")
        else:
            ranking = served.retriever.retrieve(queries, k)
            ids, scores = ranking.ids, ranking.scores.tolist()
        tool = served.tool
        return [[{"rank": rank, "id": i, "name": tool[i].name, "agent": tool[i].agent,
                  "description": tool[i].description, "score": round(float(s), 6), "input_schema": tool[i].parameters}
                 for rank, (i, s) in enumerate(zip(row, values), 1)] for row, values in zip(ids, scores)]

    def _agents(self, queries: list[str], k: int, tools_per_agent: int = 3) -> list[list[dict[str, Any]]]:
        served = self._state
        if _is_router(served.retriever):
            ids, scores, tool_ids, tool_scores = _router_rankings(served.retriever, queries, k, "agents")
        else:  # agents in order of their best tool, scored by it
            agents, tools = served.retriever.retrieve_agents_and_tools(queries, k)  # one scoring of the queries
            ids, scores, tool_ids, tool_scores = agents.ids, agents.scores.tolist(), tools.ids, tools.scores.tolist()
        out = []
        for row, values, ranked, ranked_scores in zip(ids, scores, tool_ids, tool_scores):
            inside: dict[str, list[dict]] = {a: [] for a in row}
            for t, s in zip(ranked, ranked_scores):
                best = inside.get(served.tool[t].agent)
                if best is not None and len(best) < tools_per_agent:
                    best.append({"id": t, "name": served.tool[t].name, "score": round(float(s), 6)})
            out.append([{"rank": rank, "id": a, "name": served.agent[a].name if a in served.agent else a,
                         "description": served.agent[a].description if a in served.agent else "",
                         "score": round(float(s), 6), "tools": inside[a]}
                        for rank, (a, s) in enumerate(zip(row, values), 1)])
        return out

    # ---- public -------------------------------------------------------------------------------------
    def search_tools(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """The k best tools for ``query`` (blocks until the worker has answered)."""
        return self._submit("tools", query, k)

    def search_agents(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """The k best agents for ``query``, each with its best tools."""
        return self._submit("agents", query, k)

    def health(self) -> dict[str, Any]:
        """``status``: "loading" (the first load runs), "failed" (it failed: ``error``) or "ok"."""
        with self._count_lock:
            counts = dict(self.counts)
        if not self.loaded:
            failed = self._settled.is_set()
            return {"status": "failed" if failed else "loading", "index": str(self.path),
                    "error": str(self.load_error) if failed else None,
                    "seconds": self.load_seconds if failed else round(time.monotonic() - self._started, 1), **counts}
        with self._lock:
            served, reloads, reload_errors, last_error = self._state, self.reloads, self.reload_errors, self.last_error
        r = served.retriever
        return {"status": "ok", "retriever": r.name, "tools": len(r.tools), "agents": len(getattr(r, "agents", [])),
                "load_seconds": self.load_seconds,
                "reloads": reloads, "reload_errors": reload_errors, "last_reload_error": last_error,
                **counts, "last_request_error": self.last_request_error,
                "mean_batch": round(counts["batched"] / counts["batches"], 2) if counts["batches"] else 0,
                "queued": self._queue.qsize()}


def _check(query: Any, k: Any, max_query_chars: int = Limits.max_query_chars) -> int:
    if not isinstance(query, str) or not query.strip():
        raise RequestError("query must be a non-empty string")
    if len(query) > max_query_chars:
        raise RequestTooLarge(f"query is {len(query)} characters; the limit is {max_query_chars} "
                              "(--max-query-chars): send a shorter request")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON): no encoder or response can hold it
        raise RequestError("query must be valid Unicode text (it holds a lone surrogate escape)") from None
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise RequestError(f"k must be an integer between 1 and {MAX_K}, got {k!r}")
    return k




def _allowed(value: str, patterns: tuple[str, ...]) -> bool:
    """``value`` equals a pattern, or a pattern ``name:*`` names it with any port (the MCP SDK's rule)."""
    return value in patterns or any(p.endswith(":*") and value.startswith(p[:-1]) and value[len(p) - 1:].isdigit()
                                    for p in patterns)


def check_headers(headers: Any, limits: Limits) -> None:
    """Host and Origin must name this machine (DNS-rebinding protection); raises a RequestError."""
    if "*" in limits.allowed_hosts:
        return
    host = headers.get("host")
    if not host or not _allowed(host, limits.allowed_hosts):
        err = RequestError(f"Host {host!r} is not allowed (--allowed-host: {', '.join(limits.allowed_hosts)})")
        err.status = 421
        raise err
    origin = headers.get("origin")
    if origin and not _allowed(origin, limits.allowed_origins):
        err = RequestError(f"Origin {origin!r} is not allowed (--allowed-origin: {', '.join(limits.allowed_origins)})")
        err.status = 403
        raise err


TOOLS_HELP = ("Find the tools of this catalog that fit a request. Returns the k best, best first: rank, id, name, "
              "agent (the MCP server offering it), description, input_schema and score (relevance, higher is "
              "better; the same scale as search_agents' scores).")
AGENTS_HELP = ("Find the agents (MCP servers / tool providers) of this catalog to route a request to. Returns the "
               "k best, best first: rank, id, name, description, score (relevance, higher is better; the same "
               "scale as search_tools' scores) and tools: up to 3 of the agent's best tools for the request "
               "(id, name, score).")


def _arguments(max_query_chars: int) -> dict[str, Any]:
    """The annotations of both MCP tools: ``query`` and ``k`` with their descriptions (the inputSchema)."""
    from typing import Annotated

    from pydantic import Field

    query = Annotated[str, Field(description="What the agent needs to do, in plain words (e.g. 'get tomorrow's "
                                             f"weather in Paris'); at most {max_query_chars} characters.")]
    k = Annotated[int, Field(description=f"How many results to return, best first (1 to {MAX_K}).",
                             json_schema_extra={"minimum": 1, "maximum": MAX_K})]  # checked by _check (clear errors)
    return {"query": query, "k": k, "return": list[dict]}


def build_server(index: LiveIndex, name: str = "toolgraph", limits: Limits | None = None):
    """The MCP server (``mcp.server.mcpserver.MCPServer``, reporting ``name`` and toolgraph's version)
    with both tools and the JSON routes; :func:`http_app` makes its ASGI app with the same limits on
    ``/mcp``. Needs no loaded index: calls wait for it (:class:`LiveIndex`)."""
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from toolgraph import __version__

    limits = limits or Limits(max_query_chars=index.max_query_chars, request_timeout=index.request_timeout)
    server = MCPServer(name, version=__version__,
                       instructions="Search this tool catalog: search_tools(query, k) finds the tools that fit a "
                                    "request; search_agents(query, k) finds the servers (agents) to route to. "
                                    "Results come best first, with a rank and a relevance score on one scale.")
    server.toolgraph_limits = limits

    async def _call(fn, query: str, k: int) -> list[dict]:
        try:
            return await anyio.to_thread.run_sync(fn, query, k)
        except (ValueError, ToolgraphError) as e:  # the caller's mistake, a busy server, a broken index: the
            raise ToolError(str(e)) from None  # model reads the message

    async def search_tools(query, k=5):
        return await _call(index.search_tools, query, k)

    async def search_agents(query, k=5):
        return await _call(index.search_agents, query, k)

    for fn, doc in ((search_tools, TOOLS_HELP), (search_agents, AGENTS_HELP)):
        fn.__annotations__ = _arguments(limits.max_query_chars)  # objects, not strings: the SDK reads them as is
        server.tool(description=doc)(fn)

    async def _json(request: Request, fn) -> JSONResponse:
        try:
            check_headers(request.headers, limits)
            if request.method == "POST":
                ctype = request.headers.get("content-type") or ""
                if not ctype.lower().startswith("application/json"):
                    err = RequestError(f"Content-Type must be application/json, got {ctype or 'none'!r}")
                    err.status = 415
                    raise err
                raw = await request.body()  # at most --max-body-bytes: _WholeBodies refused a larger one
                try:
                    body = json.loads(raw)
                except (ValueError, RecursionError) as e:
                    raise RequestError(f"body is not valid JSON ({type(e).__name__}); send "
                                       "{\"query\": \"...\", \"k\": 5}") from None
                if not isinstance(body, dict):
                    raise RequestError("body must be a JSON object {\"query\": ..., \"k\": ...}")
                query, k = body.get("query"), body.get("k", 5)
            else:
                query, k = request.query_params.get("q"), request.query_params.get("k", "5")
                k = int(k) if str(k).lstrip("-").isdigit() and len(str(k)) < 20 else k
            results = await anyio.to_thread.run_sync(fn, query, k)
        except RequestError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        except ToolgraphError as e:  # the index failed to answer (e.g. NaN scores): counted in /health "errors"
            return JSONResponse({"error": str(e)}, status_code=500)
        return JSONResponse({"query": query, "k": k, "results": results})

    @server.custom_route("/search", methods=["GET", "POST"])
    async def http_search(request: Request) -> JSONResponse:
        return await _json(request, index.search_tools)

    @server.custom_route("/search_agents", methods=["GET", "POST"])
    async def http_search_agents(request: Request) -> JSONResponse:
        return await _json(request, index.search_agents)

    @server.custom_route("/health", methods=["GET"])
    async def health(request: Request) -> JSONResponse:
        try:
            check_headers(request.headers, limits)
        except RequestError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)
        state = index.health()  # 503 while the index loads (or failed to): ready for traffic only when "ok"
        return JSONResponse({**state, "limits": {
            "max_query_chars": limits.max_query_chars, "max_body_bytes": limits.max_body_bytes,
            "request_timeout": limits.request_timeout, "max_k": MAX_K, "limit_concurrency": limits.limit_concurrency,
            "header_timeout": limits.header_timeout, "keep_alive_timeout": limits.keep_alive_timeout}},
            status_code=200 if state["status"] == "ok" else 503)

    return server


class _WholeBodies:
    """ASGI wrapper of every route (``/mcp`` included): a request's body is read in full before the
    route sees it, so the routes never meet a half-sent body.

    - A declared Content-Length over the limit gets 413; the body is read and dropped first, up to
      ``DRAIN_BYTES``, so that a client still sending it reads the 413 instead of a reset connection;
      past that it is cut off. A chunked body that grows over the limit gets 413 too.
    - A client that disconnects (or is cut off by ``header_timeout``) in the middle of its body is
      logged in one line, not with a traceback per request: nobody is left to answer."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.responses import JSONResponse

        declared = dict(scope.get("headers") or []).get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > self.limit:
            drained, more = 0, True
            while more and drained <= DRAIN_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    break
                drained += len(message.get("body", b""))
                more = message.get("more_body", False)
            response = JSONResponse({"error": f"request body is {int(declared)} bytes; the limit is {self.limit} "
                                              "(--max-body-bytes)"}, status_code=413)
            await response(scope, receive, send)
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                client = ":".join(map(str, scope.get("client") or ("?", "?")))
                _LOG.warning("%s - %s %s: the client disconnected after %d of %s body bytes; nothing answered",
                               client, scope["method"], scope["path"], len(body), declared.decode() or "?")
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limit:
                response = JSONResponse({"error": f"request body is over {self.limit} bytes, the limit "
                                                  "(--max-body-bytes)"}, status_code=413)
                await response(scope, receive, send)
                return
        replayed = False

        async def replay() -> dict:  # the whole body once, then the connection's own events (disconnect)
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


def http_app(server: Any, host: str = "127.0.0.1"):
    """The Starlette app of ``server`` (streamable HTTP at ``/mcp`` plus the JSON routes), with the
    server's :class:`Limits` on ``/mcp`` too: body size, Host and Origin."""
    from mcp.server.transport_security import TransportSecuritySettings

    limits: Limits = getattr(server, "toolgraph_limits", None) or Limits()
    security = TransportSecuritySettings(enable_dns_rebinding_protection="*" not in limits.allowed_hosts,
                                         allowed_hosts=list(limits.allowed_hosts),
                                         allowed_origins=list(limits.allowed_origins))
    app = server.streamable_http_app(stateless_http=False, max_request_body_size=limits.max_body_bytes,
                                     transport_security=security, host=host)
    return _WholeBodies(app, limits.max_body_bytes)


def _bounded_protocol(limits: Limits) -> type:
    """uvicorn's h11 protocol with the bounds it lacks. Each open socket holds a file descriptor:
    sockets that never finish their request used to pile up until ``accept`` failed with EMFILE and
    the server died. Here:

    - a connection over ``limit_concurrency`` gets 503 and is closed;
    - a request line + headers (+ body) not complete ``header_timeout`` seconds after the connection
      opened (or after the previous response) gets 408 and is closed;
    - a request line or headers over h11's size limit gets 414 / 431 (uvicorn: a bare 400);
    - a refused client gets its answer before the socket closes: the server stops writing and reads
      (and drops) what the client still sends, for up to ``LINGER`` seconds, instead of closing a
      socket with unread data, which the kernel answers with a reset that loses the response. At
      most ``limit_concurrency`` refused sockets linger at once; more are closed at once."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        lingering = 0  # refused sockets still open (one event loop: no lock needed)

        def connection_made(self, transport: Any) -> None:
            self._timer: Any = None
            self._drained: int | None = None  # bytes dropped since the refusal; None: not refused
            super().connection_made(transport)
            if len(self.connections) > limits.limit_concurrency:
                self._refuse(503, f"over {limits.limit_concurrency} open connections (--limit-concurrency): "
                                  "retry later")
                return
            self._update_timer()

        def data_received(self, data: bytes) -> None:
            if self._drained is not None:  # refused: read and drop until the client closes
                self._drained += len(data)
                if self._drained > DRAIN_BYTES:
                    self.transport.close()
                return
            super().data_received(data)
            self._update_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._update_timer()  # the next request on this connection gets header_timeout too

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timer()
            if self._drained is not None:
                type(self).lingering -= 1
            super().connection_lost(exc)

        def _update_timer(self) -> None:
            """A timer runs while the client owes us (part of) a request, from the moment it began to."""
            waiting = self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing()
            if waiting and self._timer is None:
                self._timer = self.loop.call_later(limits.header_timeout, self._too_slow)
            elif not waiting:
                self._cancel_timer()

        def _cancel_timer(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            if self.cycle is not None and self.cycle.response_started and not self.cycle.response_complete:
                self.transport.close()  # a response is on its way: no room for a 408
            else:
                self._refuse(408, f"the request did not arrive in full within {limits.header_timeout:g} s "
                                  "(--header-timeout)")

        def send_400_response(self, msg: str) -> None:  # uvicorn calls it when h11 refuses the request
            data, limit = self.conn.trailing_data[0], self.config.h11_max_incomplete_event_size
            if limit is not None and len(data) > limit:  # h11's bound on the request line and headers
                status, what = (414, "request line") if b"\n" not in data else (431, "request headers")
                self._refuse(status, f"{what} over {limit} bytes: send a long query in a POST /search body")
            else:
                self._refuse(400, "not a valid HTTP/1.1 request")

        def _refuse(self, status: int, message: str) -> None:
            """Answer ``status`` with a JSON error and close the connection (after lingering, see above)."""
            self._cancel_timer()
            self.connections.discard(self)  # a refused socket no longer counts as a served connection
            if self.transport.is_closing():
                return
            body = json.dumps({"error": message}).encode()
            head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
            self.transport.write(head + body)
            if self._drained is not None or not self.transport.can_write_eof() \
                    or type(self).lingering >= limits.limit_concurrency:
                self.transport.close()
                return
            type(self).lingering += 1
            self._drained = 0
            self.transport.write_eof()  # the client reads the answer, then end of stream
            self.transport.resume_reading()
            self.loop.call_later(LINGER, self.transport.close)

    return BoundedH11Protocol


_FULL = [0.0]  # when "out of file descriptors" was last said


def _loop_error(loop: Any, context: dict) -> None:
    """The event loop's error handler. ``accept`` out of file descriptors (EMFILE; the limits and
    ``_check_descriptors`` make it rare: a burst of connects) is survivable: asyncio stops accepting for a second
    and tries again. Its default handler logs through the logging setup, which may need a file (a lazy
    import) and then fails itself, taking the server down: that case (said at most once a second) and
    any failure to log are one line on stderr instead."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        if time.monotonic() - _FULL[0] >= 1.0:
            _FULL[0] = time.monotonic()
            sys.stderr.write("toolgraph serve: out of file descriptors; not accepting connections for a second "
                             "(lower --limit-concurrency or raise ulimit -n)\n")
        return
    try:
        loop.default_exception_handler(context)
    except Exception as e:  # noqa: BLE001 - logging itself failed: never let that stop the server
        sys.stderr.write(f"toolgraph serve: {context.get('message')} ({exc!r}; logging failed: {e!r})\n")


def _listen(host: Any, port: Any) -> Any:
    """The server's socket, bound before the index loads: a bad --host / --port, a port in use or
    not allowed is a ConfigError at once, not a traceback after a long load."""
    import socket

    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"--port must be an integer from 0 to 65535 (0: any free port), got {port!r}")
    if not isinstance(host, str) or not host.strip():
        raise ConfigError(f"--host must be a host name or address such as 127.0.0.1, got {host!r}")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror or e}); choose another "
                          "--port (or --host)") from None
    return sock


def _check_descriptors(limits: Limits) -> None:
    """A ConfigError when ``ulimit -n`` cannot hold ``limit_concurrency`` served connections, as many
    refused ones lingering, and what the process holds now (Linux; elsewhere nothing is checked). A
    burst of connections may still exhaust the rest for a moment: see ``_loop_error``."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        held = len(os.listdir("/proc/self/fd"))
    except (ImportError, OSError):
        return
    need = held + 2 * limits.limit_concurrency + 16
    if soft != resource.RLIM_INFINITY and need > soft:
        raise ConfigError(f"--limit-concurrency {limits.limit_concurrency} needs about {need} file descriptors "
                          f"({held} open now, 2 per allowed connection), but ulimit -n is {soft}: lower "
                          "--limit-concurrency or raise ulimit -n")


async def _stop_if_load_fails(index: LiveIndex, stop: Any) -> None:
    """Once the first load of ``index`` is over: if it failed, ``stop()`` the server after
    ``LOAD_FAILED_GRACE`` seconds (the calls that waited for it get the error first)."""
    import anyio

    while not index.wait_loaded(0):
        await anyio.sleep(0.05)
    if index.load_error is not None:
        await anyio.sleep(LOAD_FAILED_GRACE)
        stop()


async def _run_stdio(server: Any, index: LiveIndex | None = None) -> None:
    """``server.run("stdio")``, except that

    - a request holding a lone surrogate escape (``"\\ud800"``) is answered: the SDK's JSON parser
      refuses such a line and drops it, and the client waits for ever. Such a ``tools/call`` gets a
      tool error, any other request a JSON-RPC error;
    - ``index`` starts loading when the client says it has its ``initialize`` answer
      (``notifications/initialized``; at the latest ``LOAD_AT_THE_LATEST`` seconds after the streams
      opened), so that the load does not slow that answer down;
    - stdin is read by a daemon thread, so the server can stop while a read waits: when ``index``
      fails to load, the lines end as at the end of stdin, and the server returns."""
    import codecs

    import anyio
    from anyio import from_thread
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage

    replies: list = []  # the write stream, once open
    send, receive = anyio.create_memory_object_stream(16)
    token = anyio.lowlevel.current_token()

    def read_stdin() -> None:  # os.read, not sys.stdin: a daemon thread holding an io object's lock when
        decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode  # the process ends aborts it
        pending = ""
        try:
            while chunk := os.read(fd, 65536):
                *lines, pending = (pending + decode(chunk)).split("\n")
                for line in lines:
                    from_thread.run(send.send, line + "\n", token=token)
            pending += decode(b"", final=True)
            if pending:  # a last line without its newline
                from_thread.run(send.send, pending, token=token)
            from_thread.run_sync(send.close, token=token)
        except Exception:  # noqa: BLE001 - the event loop is gone (the server stopped): nothing to pass on
            return

    fd = sys.stdin.fileno()

    threading.Thread(target=read_stdin, name="toolgraph-stdin", daemon=True).start()

    initialized = anyio.Event()  # the client has its initialize answer: the index may start loading

    async def lines():
        async with receive:
            async for line in receive:
                if "notifications/initialized" in line:
                    initialized.set()
                reply = _surrogate_reply(line)
                if reply is None:
                    yield line
                elif reply is not False:
                    await replies[0].send(SessionMessage(reply))

    async def load() -> None:  # a load running beside initialize's answer slows it (one GIL; torch's import)
        with anyio.move_on_after(LOAD_AT_THE_LATEST):
            await initialized.wait()
        index.start()
        await _stop_if_load_fails(index, send.close)  # a failed load ends the lines, as stdin's end does

    async with stdio_server(stdin=lines()) as (read_stream, write_stream):
        replies.append(write_stream)
        low = server._lowlevel_server  # what MCPServer.run_stdio_async runs, on these streams
        async with anyio.create_task_group() as tg:
            async def run() -> None:
                await low.run(read_stream, write_stream, low.create_initialization_options())
                tg.cancel_scope.cancel()  # stdin closed: the client is gone

            tg.start_soon(run)
            if index is not None:
                tg.start_soon(load)


def _surrogate_reply(line: str) -> Any:
    """None for a line to pass on; else the reply to a JSON-RPC line whose strings hold a lone
    surrogate (False: a notification, nothing to answer)."""
    if "\\ud" not in line.lower():  # every surrogate escape starts so (valid pairs too: parsed below)
        return None
    try:
        message = json.loads(line)  # Python's parser keeps a lone surrogate; the SDK's refuses the line
    except ValueError:
        return None
    if not isinstance(message, dict) or not _has_lone_surrogate(message):
        return None
    import mcp_types as types

    text = "query must be valid Unicode text (it holds a lone surrogate escape such as \\ud800)"
    if "id" not in message or not isinstance(message["id"], (int, str)):
        print(f"toolgraph serve: dropped a notification with {text[6:]}", file=sys.stderr, flush=True)
        return False
    if message.get("method") == "tools/call":
        result = types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
        return types.JSONRPCResponse(jsonrpc="2.0", id=message["id"],
                                     result=result.model_dump(by_alias=True, exclude_none=True, mode="json"))
    return types.JSONRPCError(jsonrpc="2.0", id=message["id"],
                              error=types.ErrorData(code=types.INVALID_PARAMS, message="strings must be valid "
                                                    "Unicode text (a lone surrogate escape such as \\ud800)"))


def _has_lone_surrogate(obj: Any) -> bool:
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(obj, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in obj.items())
    return isinstance(obj, list) and any(_has_lone_surrogate(v) for v in obj)


def serve(retriever: str | Path, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8000,
          max_batch: int = 32, max_query_chars: int = Limits.max_query_chars,
          max_body_bytes: int = Limits.max_body_bytes, request_timeout: float = Limits.request_timeout,
          allowed_hosts: tuple[str, ...] | list[str] | None = None,
          allowed_origins: tuple[str, ...] | list[str] | None = None,
          limit_concurrency: int = Limits.limit_concurrency, header_timeout: float = Limits.header_timeout,
          keep_alive_timeout: float = Limits.keep_alive_timeout) -> None:
    """Run the server until interrupted (``toolgraph serve``). Every limit is a :class:`Limits`
    field. The options and (for HTTP) the socket are checked first (a ConfigError naming the option),
    then the index path (:func:`check_servable`, a DataError naming the file); the server then answers
    at once and loads the index in the background. If that load fails, the error answers the calls
    waiting for it, and after ``LOAD_FAILED_GRACE`` seconds the server stops and ``serve`` raises it (a
    ``DataError`` naming the file: ``toolgraph serve`` exits 2)."""
    if transport not in ("stdio", "http"):
        raise ConfigError(f"--transport must be stdio or http, got {transport!r}")
    limits = Limits(max_query_chars=max_query_chars, max_body_bytes=max_body_bytes, request_timeout=request_timeout,
                    allowed_hosts=tuple(allowed_hosts or LOCAL_HOSTS), allowed_origins=tuple(allowed_origins or LOCAL_ORIGINS),
                    limit_concurrency=limit_concurrency, header_timeout=header_timeout,
                    keep_alive_timeout=keep_alive_timeout)
    sock = _listen(host, port) if transport == "http" else None
    logging.getLogger("torch").setLevel(logging.WARNING)  # the SDK logs INFO; torch's exit statistics are noise
    index = None
    try:
        path = check_servable(retriever)
        index = LiveIndex(path, max_batch=max_batch, max_query_chars=max_query_chars, request_timeout=request_timeout,
                          background=True)
        server = build_server(index, limits=limits)
        if sock is None:
            import anyio

            anyio.run(_run_stdio, server, index)
        else:
            _check_descriptors(limits)
            _serve_http(server, limits, sock, host, index)
        if index.load_error is not None:
            raise index.load_error
        if not index.wait_loaded(0):  # the client left (or the server was stopped) while the index loaded
            _end_process_now()
    finally:
        if index is not None:
            index.close()
        if sock is not None:
            sock.close()


def _end_process_now() -> None:
    """Exit 0 at once, without the interpreter's teardown: a load still running in its thread (a
    load writes nothing) would keep the process for the rest of the load, and a process that ends in
    the middle of torch's import or of a query aborts (C++ threads torn down under it)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def _serve_http(server: Any, limits: Limits, sock: Any, host: str, index: LiveIndex | None = None) -> None:
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        async def serve(self, sockets: Any = None) -> None:
            asyncio.get_running_loop().set_exception_handler(_loop_error)
            await super().serve(sockets)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:  # uvicorn says where it listens only for sockets it bound itself
                name = sock.getsockname()
                _LOG.info("toolgraph serve: listening on http://%s:%d (MCP at /mcp)",
                          f"[{name[0]}]" if ":" in name[0] else name[0], name[1])
                if index is not None:  # the index loads now; a failed load stops the server
                    index.start()
                    self._stopper = asyncio.get_running_loop().create_task(
                        _stop_if_load_fails(index, lambda: setattr(self, "should_exit", True)))

    # the request line and headers are bounded by h11 (over it: 414 / 431);
    # room for a query of max_query_chars characters, percent-encoded
    line_limit = max(65536, 9 * limits.max_query_chars + 8192)
    config = uvicorn.Config(http_app(server, host), host=host, log_level=server.settings.log_level.lower(),
                            http=_bounded_protocol(limits), ws="none", h11_max_incomplete_event_size=line_limit,
                            timeout_keep_alive=limits.keep_alive_timeout,
                            # connections are capped by the protocol; uvicorn's own check (at each request)
                            # then bounds requests still running for clients that are gone
                            limit_concurrency=limits.limit_concurrency + 1)
    Server(config).run(sockets=[sock])
