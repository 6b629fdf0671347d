"""Serving benchmark (called by ``benchmarks/agents.py serve``): a 10k-tool index of real tools,
``toolgraph index sync`` of 1,000 changed tools, and ``search_tools`` latency through a real MCP
client session on 127.0.0.1 — 1 client, then 8 concurrent clients — bounded in count and time,
with the server's micro-batching on (``--max-batch 32``) and off (``--max-batch 1``).

Catalog: the union of the ToolBench test catalogs (StableToolBench G1/G2 candidates and COLT's G3
corpus; agent = the RapidAPI tool), Seal-Tools and NesTools (agent = dataset:category), shuffled
with seed 0 and cut at ``--tools``. Index: ``t2a`` over all-MiniLM-L6-v2 with the embedding cache
off, so every encode is real and counted.
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = {"name": "t2a", "scorer": "rrf", "dense": {"name": "dense", "max_length": 128, "cache_dir": None,
                                                  "progress": False}}


def real_catalog(n: int):
    from toolgraph.data import load_dataset
    from toolgraph.data.schema import Agent, ToolDataset

    tools, agents = {}, {}
    for adapter, opts in [("toolbench-g1", {}), ("toolbench-g2", {}), ("toolbench-g3", {"corpus": "colt"})]:
        ds = load_dataset(adapter, **opts)
        for a in ds.agents:
            agents.setdefault(a.id, a)
        for t in ds.tools:
            tools.setdefault(t.id, t)
    for name in ("seal-tools", "nestools"):
        ds = load_dataset(name)
        for t in ds.tools:
            aid = f"{name}:{t.category or 'misc'}"
            agents.setdefault(aid, Agent(aid, t.category or "misc", f"{name} tools", t.category))
            tid = f"{name}::{t.id}"
            tools.setdefault(tid, replace(t, id=tid, agent=aid))
    ids = sorted(tools)
    random.Random(0).shuffle(ids)
    keep = [tools[i] for i in ids[:n]]
    owners = {t.agent for t in keep}
    return ToolDataset("serve-bench", keep, [], [a for a in agents.values() if a.id in owners])


def queries(n: int) -> list[str]:
    from toolgraph.data import load_dataset

    out = []
    for adapter, opts in [("toolbench-g1", {}), ("toolbench-g2", {}), ("toolbench-g3", {"corpus": "colt"})]:
        out += [q.text for q in load_dataset(adapter, **opts).queries]
    random.Random(1).shuffle(out)
    return (out * (n // len(out) + 1))[:n]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pcts(lat: list[float]) -> dict:
    lat = sorted(lat)
    return {"p50_ms": round(1000 * statistics.median(lat), 1),
            "p95_ms": round(1000 * lat[min(len(lat) - 1, int(0.95 * len(lat)))], 1)}


async def _client(url: str, texts: list[str], deadline: float, lat: list[float], errors: list[str]) -> None:
    from mcp import Client

    async with Client(url) as c:
        for q in texts:
            if time.monotonic() > deadline:
                return
            t0 = time.perf_counter()
            try:
                r = await c.call_tool("search_tools", {"query": q, "k": 5})
                if r.is_error or len(r.structured_content["result"]) != 5:
                    errors.append(r.content[0].text if r.content else "bad result")
                else:
                    lat.append(time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - every failure is counted, none is hidden
                errors.append(f"{type(e).__name__}: {e}")


async def _load(url: str, texts: list[str], clients: int, seconds: float) -> tuple[list[float], list[str], float]:
    import anyio

    lat: list[float] = []
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for c in range(clients):
            tg.start_soon(_client, url, texts[c::clients], deadline, lat, errors)
    return lat, errors, time.perf_counter() - t0


def _latency(index: Path, texts: list[str], clients_list: list[int], max_batch: int, n_tools: int, work: Path,
             command: str) -> list[dict]:
    """Start ``toolgraph serve`` over HTTP on 127.0.0.1 and time search_tools through MCP sessions."""
    import anyio

    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "toolgraph.cli", "serve", "--retriever", str(index),
                             "--transport", "http", "--port", str(port), "--max-batch", str(max_batch)], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(work / f"server-{max_batch}.log", "w"))
    rows = []
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/mcp"
        anyio.run(_load, url, texts[:10], 1, 60.0)  # warm-up (model load, first allocations)
        for clients in clients_list:
            before = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health").read())
            lat, errors, wall = anyio.run(_load, url, texts, clients, 180.0)
            after = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health").read())
            served = after["batches"] - before["batches"]
            m = {"clients": clients, "requests": len(lat) + len(errors), "errors": len(errors), **_pcts(lat),
                 "requests_per_s": round(len(lat) / wall, 1), "tools": n_tools, "max_batch": max_batch,
                 "mean_batch": round((len(lat) + len(errors)) / served, 2) if served else None}
            print(m, errors[:3], flush=True)
            setting = f"{clients}-client" + ("s" if clients > 1 else "") + ("" if max_batch > 1 else ", no batching")
            rows.append({"method": "serve/search_tools", "dataset": f"real-{n_tools}", "split": "-",
                         "setting": setting, "encoder": "all-MiniLM-L6-v2", "metrics": m, "command": command,
                         "errors_sample": errors[:3]})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return rows


def run(args, command: str) -> list[dict]:
    from toolgraph.data.formats import write_dataset
    from toolgraph.sync import sync_index

    ds = real_catalog(args.tools)
    work = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    v1 = write_dataset(ds, work / "catalog_v1")
    index = args.index
    if index.exists():
        import shutil

        shutil.rmtree(index)
    t0 = time.perf_counter()
    built = sync_index(v1, index, SPEC)
    build_s = time.perf_counter() - t0
    print("built", built, f"{build_s:.1f}s", flush=True)

    rng = random.Random(2)
    changed = set(rng.sample([t.id for t in ds.tools], args.changed))
    ds.tools = [replace(t, description=t.description + " (updated)") if t.id in changed else t for t in ds.tools]
    v2 = write_dataset(ds, work / "catalog_v2")
    t0 = time.perf_counter()
    synced = sync_index(v2, index)
    sync_s = time.perf_counter() - t0
    print("synced", synced, f"{sync_s:.1f}s", flush=True)
    rows = [{"method": "serve/sync", "dataset": f"real-{len(ds.tools)}", "split": "-", "setting": "sync",
             "encoder": "all-MiniLM-L6-v2",
             "metrics": {"tools": synced["tools"], "agents": synced["agents"], "changed_tools": args.changed,
                         "updated": synced["updated"], "encoded": synced["encoded"],
                         "build_encoded": built["encoded"], "build_s": round(build_s, 1), "sync_s": round(sync_s, 1),
                         "speedup_vs_rebuild": round(build_s / sync_s, 1)},
             "command": command}]

    texts = queries(args.requests)
    for max_batch in args.max_batches:
        rows += _latency(index, texts, args.clients, max_batch, synced["tools"], work, command)
    (work / "rows.json").write_text(json.dumps(rows, indent=1))
    return rows
