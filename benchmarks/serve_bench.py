"""Serving benchmarks.

Throughput (called by ``benchmarks/agents.py serve``): a 10k-tool index of real tools, ``toolgraph
index sync`` of 1,000 changed tools, and ``search_tools`` latency through a real MCP client session
on 127.0.0.1 — 1 client, then 8 concurrent clients — bounded in count and time, with the server's
micro-batching on (``--max-batch 32``) and off (``--max-batch 1``). Catalog: the union of the
ToolBench test catalogs (StableToolBench G1/G2 candidates and COLT's G3 corpus; agent = the RapidAPI
tool), Seal-Tools and NesTools (agent = dataset:category), shuffled with seed 0 and cut at
``--tools``. Index: ``t2a`` over all-MiniLM-L6-v2 with the embedding cache off, so every encode is
real and counted.

Start-up (``python benchmarks/serve_bench.py startup``): ``--spawns`` spawns of ``toolgraph serve
--retriever INDEX`` over stdio, as an MCP client starts it (the venv's absolute ``toolgraph``, raw
JSON-RPC on its pipes), each timed from the spawn to the ``initialize`` reply, to the ``tools/list``
reply and to the first successful ``tools/call`` (``search_tools``, sent right after ``tools/list``;
a "still loading" answer is retried and counted). INDEX: ToolLens's 464 tools and 314 agents,
``toolgraph index sync`` with its default retriever (t2a over all-MiniLM-L6-v2 when the general
retriever is not installed). Settings:

- warm: after one untimed spawn, repeated spawns; the page cache holds the index, the model and the
  Python packages;
- cold: before each spawn, ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every file of the index (its
  encoder included), of the venv's site-packages and of the Python standard library, so their
  pages are read from disk again (``disk_read_mb``: what the server process read from disk). Pages
  that another running process maps stay cached: on a shared machine torch's libraries may stay warm;
- idle / busy: busy = ``--burners`` processes spinning on the CPU for the whole row (2 on a 2-core
  machine: the server gets about a third of the CPU); the 1-minute load average at the row's start
  is in the row (other work on the machine counts too);
- ``--before DIR``: the same, for the toolgraph source tree at DIR (``python -m toolgraph.cli``, that
  tree first on PYTHONPATH), e.g. the commit before the index loaded in the background.

Rows: ``benchmarks/results/agents.json`` (method ``serve/startup``), the table: block
``serve-startup`` of docs/agents-and-serving.md (``python benchmarks/serve_bench.py render``).
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

from results_io import RESULTS, machine, upsert, write_block  # benchmarks/ is on sys.path (script or import)

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


# ---- start-up: spawn to initialize, to tools/list, to the first result (stdio) -----------------------
START_QUERY = "what will the weather be like in Paris tomorrow"
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "serve-bench", "version": "1"}}
PAGE = ROOT / "docs" / "agents-and-serving.md"
KEY = ("method", "dataset", "split", "setting", "encoder")  # benchmarks/agents.py's key of agents.json


def _nearest_rank(values: list[float], q: float) -> float:
    """The q-quantile by the nearest-rank rule (p95 of 20 values: the 19th smallest)."""
    import math

    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(len(ordered) * q) - 1))]


def evict(paths: list[Path]) -> int:
    """``posix_fadvise(DONTNEED)`` on every regular file under ``paths``: the kernel drops their clean,
    unmapped pages from the page cache, so the next read goes to disk. Returns how many files."""
    n = 0
    for root in paths:
        for folder, _, names in os.walk(root):
            for name in names:
                try:
                    fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    n += 1
                except OSError:
                    pass
                finally:
                    os.close(fd)
    return n


class _Pipe:
    """A spawned server spoken to in JSON-RPC lines."""

    def __init__(self, command: list[str], env: dict, log: Path, cwd: Path):
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=cwd,
                                     stderr=log.open("a"))
        self.buffer = b""

    def send(self, message: dict) -> None:
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        self.proc.stdin.flush()

    def reply(self, id_: int, deadline: float) -> dict:
        import select

        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = json.loads(line)
                if message.get("id") == id_:
                    return message
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"no reply to request {id_}")
            if select.select([self.proc.stdout], [], [], min(left, 1.0))[0]:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    raise EOFError(f"the server closed its output (exit {self.proc.wait()})")
                self.buffer += chunk

    def since(self) -> float:
        return time.perf_counter() - self.t0


def _disk_read_mb(pid: int) -> float | None:
    try:
        fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        return round(int(fields["read_bytes"]) / 1e6, 1)
    except (OSError, KeyError, ValueError):
        return None


def spawn_once(command: list[str], env: dict, log: Path, cwd: Path, timeout: float = 300.0) -> dict:
    """One spawn of the server in ``cwd``, timed to initialize, tools/list and the first successful tools/call."""
    pipe = _Pipe(command, env, log, cwd)
    deadline = time.perf_counter() + timeout
    try:
        pipe.send({"id": 1, "method": "initialize", "params": INIT})
        info = pipe.reply(1, deadline)["result"]["serverInfo"]
        t_init = pipe.since()
        pipe.send({"method": "notifications/initialized"})
        pipe.send({"id": 2, "method": "tools/list"})
        tools = [t["name"] for t in pipe.reply(2, deadline)["result"]["tools"]]
        t_list = pipe.since()
        retries = 0
        for id_ in range(3, 10_000):
            pipe.send({"id": id_, "method": "tools/call",
                       "params": {"name": "search_tools", "arguments": {"query": START_QUERY, "k": 5}}})
            result = pipe.reply(id_, deadline)["result"]
            text = result["content"][0]["text"] if result.get("content") else ""
            if not result.get("isError"):
                break
            if "still loading" not in text:
                raise RuntimeError(f"tools/call failed: {text[:300]}")
            retries += 1
        t_first = pipe.since()
        first = result["structuredContent"]["result"][0]
        read_mb = _disk_read_mb(pipe.proc.pid)
    finally:
        if pipe.proc.stdin and not pipe.proc.stdin.closed:
            pipe.proc.stdin.close()
        try:
            pipe.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pipe.proc.kill()
            pipe.proc.wait()
    return {"initialize_s": t_init, "tools_list_s": t_list, "first_result_s": t_first, "retries": retries,
            "disk_read_mb": read_mb, "server": f"{info['name']} {info.get('version', '')}".strip(), "tools": tools,
            "first_tool": first["name"]}


def burners(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning on the CPU (a busy machine)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def toolgraph_exe() -> Path:
    exe = Path(os.path.abspath(sys.executable)).parent / "toolgraph"  # not resolved: the venv's own script
    if not exe.is_file():
        raise SystemExit(f"{exe} not found: run this with the venv's python (make install)")
    return exe


def build_startup_index(work: Path, dataset: str) -> tuple[Path, dict]:
    """ToolLens's tools and agents written as a catalog, and ``toolgraph index sync`` of it (the CLI)."""
    from toolgraph.data import load_dataset
    from toolgraph.data.formats import write_dataset
    from toolgraph.data.schema import ToolDataset

    ds = load_dataset(dataset)
    catalog = write_dataset(ToolDataset(ds.name, ds.tools, [], ds.agents), work / "catalog")
    index = work / "index"
    if index.exists():
        import shutil

        shutil.rmtree(index)
    run = subprocess.run([str(toolgraph_exe()), "index", "sync", str(catalog), "--index", str(index)],
                         capture_output=True, text=True, check=True)
    counts = json.loads(run.stdout.strip().splitlines()[0])
    encoder = "toolgraph-general" if "the general tool retriever at" in run.stderr else "all-MiniLM-L6-v2"
    return index, {"tools": counts["tools"], "agents": counts["agents"], "encoder": encoder}


def startup_row(index: Path, info: dict, cold: bool, busy: int, spawns: int, work: Path, command: str,
                before: Path | None = None, dataset: str = "toollens") -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    if before is not None:  # run from that tree: -m puts the working folder first on sys.path
        server, cwd = [sys.executable, "-m", "toolgraph.cli", "serve", "--retriever", str(index)], before
        env["PYTHONPATH"] = str(before)
    else:  # as a client spawns it: the absolute executable, from a folder of no importance
        server, cwd = [str(toolgraph_exe()), "serve", "--retriever", str(index)], work
    evicted = [index, Path(sysconfig_path("purelib")), Path(sysconfig_path("stdlib"))]
    log = work / "servers.log"
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    spinning = burners(busy)
    times: list[dict] = []
    try:
        if not cold:
            spawn_once(server, env, log, cwd)  # warm-up, not counted
        else:
            evict(evicted)
        load = max(load, os.getloadavg()[0])
        for i in range(spawns):
            if cold:
                evict(evicted)
            times.append(spawn_once(server, env, log, cwd))
            t = times[-1]
            print(f"  spawn {i + 1}/{spawns}: initialize {t['initialize_s']:.2f} s, tools/list {t['tools_list_s']:.2f} s, "
                  f"first result {t['first_result_s']:.2f} s ({t['retries']} retries, {t['disk_read_mb']} MB read)",
                  flush=True)
    finally:
        for p in spinning:
            p.kill()
            p.wait()
    m: dict = {"spawns": spawns}
    for key in ("initialize_s", "tools_list_s", "first_result_s"):
        values = [t[key] for t in times]
        m[key.replace("_s", "_p50_s")] = round(statistics.median(values), 2)
        m[key.replace("_s", "_p95_s")] = round(_nearest_rank(values, 0.95), 2)
        m[key.replace("_s", "_max_s")] = round(max(values), 2)
    reads = [t["disk_read_mb"] for t in times if t["disk_read_mb"] is not None]
    m.update({"still_loading_retries": sum(t["retries"] for t in times),
              "disk_read_mb_p50": round(statistics.median(reads), 1) if reads else None,
              "burners": busy, "loadavg_1min_at_start": round(load, 2), "tools": info["tools"], "agents": info["agents"],
              "server": times[0]["server"], "first_tool": times[0]["first_tool"]})
    what = "cold" if cold else "warm"
    setting = f"stdio, {what}, " + (f"busy ({busy} CPU burners)" if busy else "idle")
    if before is not None:
        setting += f", before ({before.name})"
    return {"method": "serve/startup", "dataset": dataset, "split": "-", "setting": setting,
            "encoder": info["encoder"], "metrics": m, "command": command,
            "seconds": round(time.perf_counter() - t0, 1), "device": f"{os.cpu_count()} CPU cores"}


def sysconfig_path(name: str) -> str:
    import sysconfig

    return sysconfig.get_paths()[name]


def render(page: str | Path = PAGE) -> None:
    """The start-up table (block ``serve-startup`` on ``page``) from the serve/startup rows of agents.json."""
    rows = [r for r in json.loads((RESULTS / "agents.json").read_text())["rows"] if r["method"] == "serve/startup"]
    order = {"warm, idle": 0, "cold, idle": 1, "warm, busy": 2, "cold, busy": 3}
    rows.sort(key=lambda r: ("before" in r["setting"],
                             next((v for k, v in order.items() if k in r["setting"].replace(" (2 CPU burners)", "")), 9)))
    lines = ["| server | setting | spawns | initialize p50 / p95 s | tools/list p50 / p95 s "
             "| first result p50 / p95 s | \"still loading\" retries | MB read from disk (p50) | load avg at start |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["metrics"]
        server = "before (index loaded first)" if "before" in r["setting"] else "background load"
        setting = r["setting"].split(", before")[0].removeprefix("stdio, ")
        lines.append(f"| {server} | {setting} | {m['spawns']} | {m['initialize_p50_s']} / {m['initialize_p95_s']} "
                     f"| {m['tools_list_p50_s']} / {m['tools_list_p95_s']} | {m['first_result_p50_s']} / "
                     f"{m['first_result_p95_s']} | {m['still_loading_retries']} | {m['disk_read_mb_p50']} "
                     f"| {m['loadavg_1min_at_start']} |")
    write_block(page, "serve-startup", "\n".join(lines))


def main(argv: list[str] | None = None) -> list[dict]:
    import argparse
    import shlex

    p = argparse.ArgumentParser(description="Serving start-up: spawn to initialize and to the first result (stdio)")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("startup", help="time --spawns spawns of toolgraph serve over stdio, per setting")
    s.add_argument("--spawns", type=int, default=20)
    s.add_argument("--settings", nargs="+", default=["warm", "cold"], choices=["warm", "cold"])
    s.add_argument("--burners", type=int, nargs="+", default=[0, 2], help="CPU-spinning processes (0: idle)")
    s.add_argument("--dataset", default="toollens", help="the catalog: a registered dataset or canonical folder")
    s.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temp folder)")
    s.add_argument("--index", type=Path, default=None, help="an existing index (default: built with index sync)")
    s.add_argument("--before", type=Path, default=None, help="a toolgraph source tree to time instead (its toolgraph/)")
    s.add_argument("--no-save", action="store_true", help="print the rows, do not write benchmarks/results/agents.json")
    sub.add_parser("render", help="the serve-startup table of docs/agents-and-serving.md from agents.json")
    args = p.parse_args(argv)
    if args.cmd == "render":
        render()
        return []
    command = "python benchmarks/serve_bench.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="serve-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.index is None:
        index, info = build_startup_index(work, args.dataset)
    else:
        index = args.index
        saved = json.loads((index / "retriever.json").read_text())
        agents = sum(1 for _ in (index / "agents.jsonl").open()) if (index / "agents.jsonl").exists() else 0
        info = {"tools": saved["tools"], "agents": agents, "encoder": "all-MiniLM-L6-v2"}
    print("index", index, info, flush=True)
    rows = []
    for busy in args.burners:
        for setting in args.settings:
            print(f"{setting}, {busy} burners:", flush=True)
            rows.append(startup_row(index, info, setting == "cold", busy, args.spawns, work, command, args.before,
                                    Path(args.dataset).name))
            print(json.dumps(rows[-1]["metrics"]), flush=True)
    if not args.no_save:
        for r in rows:
            r["machine"] = machine()
        print("wrote", upsert("agents", rows, KEY))
        render()
    return rows


if __name__ == "__main__":
    main()
