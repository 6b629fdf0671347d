"""Serve a saved retriever to agents: an MCP server (official ``mcp`` SDK) and a small HTTP JSON API.

    toolgraph serve --retriever runs/mcp_index                         # MCP over stdio
    toolgraph serve --retriever runs/mcp_index --transport http --port 8000
        # MCP streamable HTTP at http://127.0.0.1:8000/mcp, plus
        # GET /search?q=...&k=5  GET /search_agents?q=...&k=5  POST /search {"query", "k"}  GET /health

MCP tools: ``search_tools(query, k)`` -> the k best tools ({id, name, agent, description, score,
input_schema}); ``search_agents(query, k)`` -> the k best agents ({id, name, description, score,
tools: the best tools inside}). Any saved retriever serves tools; agents come from an agent router
(``t2a`` …) or, for other retrievers, from the tool ranking rolled up to owners.

The index is reloaded when ``toolgraph index sync`` replaces it (checked at most once a second),
so a running server follows a changing catalog. Retrieval runs in a worker thread under a lock (the
tokenizer is not thread-safe), so the event loop keeps accepting requests.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from toolgraph.errors import ConfigError
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.loading import load

MAX_K = 100


class LiveIndex:
    """A retriever loaded from ``path`` and reloaded when the folder is replaced (new inode).

    Requests from concurrent clients are micro-batched: one worker thread owns the retriever, takes
    every request waiting (up to ``max_batch``) and answers them with one batched retrieval — one
    encoder call for 8 queries costs far less than 8 calls. ``max_batch=1`` turns this off."""

    def __init__(self, path: str | Path, check_every: float = 1.0, max_batch: int = 32):
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        self.path = Path(path)
        self.check_every = check_every
        self.max_batch = max_batch
        self._last_check = time.monotonic()
        self._stamp = self._current_stamp()
        self._use(load(self.path))
        self.reloads = 0
        self.batches: list[int] = []  # sizes of the batches served (for the benchmark)
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._worker, name="toolgraph-retrieval", daemon=True).start()

    def _use(self, retriever: Retriever) -> None:
        """Serve ``retriever``; the id lookups are built once per loaded index, not per request."""
        self.retriever = retriever
        self._tool = {t.id: t for t in retriever.tools}
        self._agent = {a.id: a for a in getattr(retriever, "agents", [])}

    def _current_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path / "retriever.json")
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._last_check < self.check_every:
            return
        self._last_check = now
        stamp = self._current_stamp()
        if stamp is not None and stamp != self._stamp:
            self._use(load(self.path))
            self._stamp = stamp
            self.reloads += 1

    # ---- the worker: batches of waiting requests, one retrieval per kind ---------------------------
    def _worker(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self.batches.append(len(batch))
            try:
                self._maybe_reload()
            except Exception as e:  # noqa: BLE001 - a broken new index keeps the old one serving
                self._stamp = self._current_stamp()
                print(f"toolgraph serve: reload failed, still serving the previous index: {e}", flush=True)
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
                    for *_, fut in items:
                        fut.set_exception(e)

    def _submit(self, kind: str, query: Any, k: Any) -> list[dict[str, Any]]:
        k = _check(query, k)
        fut: Future = Future()
        self._queue.put((kind, query, k, fut))
        return fut.result()

    def _tools(self, queries: list[str], k: int) -> list[list[dict[str, Any]]]:
        ranking = self.retriever.retrieve(queries, k)
        tool = self._tool
        return [[{"id": i, "name": tool[i].name, "agent": tool[i].agent, "description": tool[i].description,
                  "score": round(float(s), 6), "input_schema": tool[i].parameters}
                 for i, s in zip(ids, scores)] for ids, scores in zip(ranking.ids, ranking.scores.tolist())]

    def _agents(self, queries: list[str], k: int, tools_per_agent: int = 3) -> list[list[dict[str, Any]]]:
        agents, tools = self.retriever.retrieve_agents_and_tools(queries, k)  # one scoring of the queries
        out = []
        for ids, scores, ranked in zip(agents.ids, agents.scores.tolist(), tools.ids):
            inside: dict[str, list[str]] = {a: [] for a in ids}
            for t in ranked:
                best = inside.get(self._tool[t].agent)
                if best is not None and len(best) < tools_per_agent:
                    best.append(t)
            out.append([{"id": a, "name": self._agent[a].name if a in self._agent else a,
                         "description": self._agent[a].description if a in self._agent else "",
                         "score": round(float(s), 6), "tools": inside[a]} for a, s in zip(ids, scores)])
        return out

    # ---- public -------------------------------------------------------------------------------------
    def search_tools(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """The k best tools for ``query`` (blocks until the worker has answered)."""
        return self._submit("tools", query, k)

    def search_agents(self, query: str, k: int = 5) -> list[dict[str, Any]]:
        """The k best agents for ``query``, each with its best tools."""
        return self._submit("agents", query, k)


def _check(query: Any, k: Any) -> int:
    if not isinstance(query, str) or not query.strip():
        raise ValueError("query must be a non-empty string")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"k must be an integer between 1 and {MAX_K}, got {k!r}")
    return k


def build_server(index: LiveIndex, name: str = "toolgraph"):
    """The MCP server (``mcp.server.mcpserver.MCPServer``) with both tools and the JSON routes."""
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    server = MCPServer(name, instructions="Search this tool catalog: search_tools(query, k) finds the tools that fit "
                                          "a request; search_agents(query, k) finds the servers (agents) to route to.")

    async def _call(fn, query: str, k: int) -> list[dict]:
        try:
            return await anyio.to_thread.run_sync(fn, query, k)
        except ValueError as e:  # the caller's mistake: the model reads the message and retries
            raise ToolError(str(e)) from None

    @server.tool()
    async def search_tools(query: str, k: int = 5) -> list[dict]:
        """The k tools that best fit the request (id, name, agent, description, score, input_schema)."""
        return await _call(index.search_tools, query, k)

    @server.tool()
    async def search_agents(query: str, k: int = 5) -> list[dict]:
        """The k agents (MCP servers / tool providers) that best fit the request, each with its best tools."""
        return await _call(index.search_agents, query, k)

    async def _json(request: Request, fn) -> JSONResponse:
        try:
            if request.method == "POST":
                body = await request.json()
                if not isinstance(body, dict):
                    raise ValueError("body must be a JSON object {\"query\": ..., \"k\": ...}")
                query, k = body.get("query"), body.get("k", 5)
            else:
                query, k = request.query_params.get("q"), request.query_params.get("k", "5")
                k = int(k) if str(k).lstrip("-").isdigit() else k
            results = await anyio.to_thread.run_sync(fn, query, k)
        except ValueError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return JSONResponse({"query": query, "k": k, "results": results})

    @server.custom_route("/search", methods=["GET", "POST"])
    async def http_search(request: Request) -> JSONResponse:
        return await _json(request, index.search_tools)

    @server.custom_route("/search_agents", methods=["GET", "POST"])
    async def http_search_agents(request: Request) -> JSONResponse:
        return await _json(request, index.search_agents)

    @server.custom_route("/health", methods=["GET"])
    async def health(request: Request) -> JSONResponse:
        r = index.retriever
        sizes = index.batches
        return JSONResponse({"status": "ok", "retriever": r.name, "tools": len(r.tools),
                             "agents": len(getattr(r, "agents", [])), "reloads": index.reloads,
                             "batches": len(sizes), "mean_batch": round(sum(sizes) / len(sizes), 2) if sizes else 0})

    return server


def serve(retriever: str | Path, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8000,
          max_batch: int = 32) -> None:
    if transport not in ("stdio", "http"):
        raise ConfigError(f"--transport must be stdio or http, got {transport!r}")
    server = build_server(LiveIndex(retriever, max_batch=max_batch))
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=host, port=port, stateless_http=False)
