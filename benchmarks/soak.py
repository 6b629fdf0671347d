"""Soak test of ``toolgraph serve`` over HTTP on 127.0.0.1: many clients for a long time, the index
swapped under them, oversized requests thrown in; is it still the same server at the end?

    python benchmarks/soak.py                              # 20 clients, 10 minutes (the committed row)
    python benchmarks/soak.py --minutes 1 --clients 4 --no-save   # a quick look
    python benchmarks/soak.py render                       # the table in docs/agents-and-serving.md

Index: ``t2a`` over all-MiniLM-L6-v2 on the ToolLens catalog (464 RapidAPI APIs, 314 tools as
agents; builds in well under a minute on a laptop CPU). A second index (the same catalog with 20
APIs dropped and 10 descriptions changed, made by ``toolgraph index sync``) is swapped in with
``save_atomically`` every ``--swap-every`` seconds, alternating with the first. Clients: ToolLens
test queries, each client a loop of requests with no pause — ``POST /search`` (k=5) and ``GET
/search_agents`` (k=3) over keep-alive HTTP connections, and ``--mcp-clients`` of them calling
``search_tools`` through real MCP sessions (reopened every 25 calls). Every ``--big-every`` seconds a
5 MB query is posted; it must be refused with 413. Recorded: requests served, errors (anything but
a 200, or the 413 of an oversized one), latency percentiles of the served requests, the server's
resident memory, open file descriptors and threads at the start (after warm-up) and end, index
reloads, and files written under the server's working folder (the embedding cache: must stay 0).
Results: one row in ``benchmarks/results/serve.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import RESULTS, machine, upsert, write_block  # noqa: E402

PAGE = "docs/agents-and-serving.md"
SPEC = {"name": "t2a", "scorer": "rrf",
        "dense": {"name": "dense", "model": "all-MiniLM-L6-v2", "max_length": 128, "cache_dir": None, "progress": False}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stats(pid: int) -> dict:
    """Resident memory (MB), open file descriptors and threads of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(fields["Threads"])}


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(1000 * values[min(len(values) - 1, int(q * len(values)))], 1)


# ---- indexes ---------------------------------------------------------------------------------------
def catalogs(dataset: str, work: Path):
    """(catalog v1 folder, catalog v2 folder, query texts): the dataset's tools and agents, and an
    alternate with 20 tools dropped and 10 descriptions changed."""
    from toolgraph.data import load_dataset
    from toolgraph.data.formats import write_dataset
    from toolgraph.data.schema import ToolDataset

    ds = load_dataset(dataset)
    texts = [q.text for q in ds.queries if q.split == "test"] or [q.text for q in ds.queries] \
        or [t.description or t.name for t in ds.tools]
    rng = random.Random(0)
    ids = [t.id for t in ds.tools]
    dropped = set(rng.sample(ids, min(20, len(ids) // 4)))
    changed = set(rng.sample([i for i in ids if i not in dropped], min(10, len(ids) // 4)))
    v2 = [replace(t, description=(t.description or "") + " (updated)") if t.id in changed else t
          for t in ds.tools if t.id not in dropped]
    v1 = write_dataset(ToolDataset(ds.name, ds.tools, [], ds.agents), work / "catalog_v1")
    owners = {t.agent for t in v2}
    v2 = write_dataset(ToolDataset(ds.name, v2, [], [a for a in ds.agents if a.id in owners]), work / "catalog_v2")
    return v1, v2, texts


def build(v1: Path, v2: Path, work: Path, spec: dict) -> tuple[Path, object, object, dict]:
    """The served index (v1) and the two retrievers the swaps alternate between."""
    from toolgraph.retrieval.loading import load
    from toolgraph.sync import sync_index

    t0 = time.perf_counter()
    built = sync_index(v1, work / "index", spec)
    build_s = time.perf_counter() - t0
    shutil.copytree(work / "index", work / "index_b")
    synced = sync_index(v2, work / "index_b")
    a, b = load(work / "index"), load(work / "index_b")
    return work / "index", a, b, {"tools": built["tools"], "agents": built["agents"], "build_s": round(build_s, 1),
                                  "alternate_tools": synced["tools"]}


# ---- clients ---------------------------------------------------------------------------------------
class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.latency: list[float] = []
        self.errors: list[str] = []
        self.by_route: dict[str, int] = {}
        self.big_sent = self.big_refused = 0

    def ok(self, route: str, seconds: float) -> None:
        with self.lock:
            self.latency.append(seconds)
            self.by_route[route] = self.by_route.get(route, 0) + 1

    def error(self, what: str) -> None:
        with self.lock:
            self.errors.append(what[:300])


def http_client(port: int, texts: list[str], stop: threading.Event, tally: Tally, seed: int) -> None:
    """Requests with no pause over one keep-alive connection (reopened after an error)."""
    rng = random.Random(seed)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while not stop.is_set():
        q = rng.choice(texts)
        t0 = time.perf_counter()
        try:
            if rng.random() < 0.7:
                route = "POST /search"
                conn.request("POST", "/search", json.dumps({"query": q, "k": 5}),
                             {"Content-Type": "application/json"})
                want = 5
            else:
                from urllib.parse import urlencode

                route = "GET /search_agents"
                conn.request("GET", "/search_agents?" + urlencode({"q": q, "k": 3}))
                want = 3
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                tally.error(f"{route}: {r.status} {body[:200]!r}")
                continue
            results = json.loads(body)["results"]
            if not 1 <= len(results) <= want:  # k, or every entry of a smaller index
                tally.error(f"{route}: {len(results)} results, expected 1 to {want}")
                continue
            tally.ok(route, time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - every failure is counted, none is hidden
            tally.error(f"{type(e).__name__}: {e}")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.close()


def mcp_client(port: int, texts: list[str], stop: threading.Event, tally: Tally, seed: int) -> None:
    """search_tools through MCP sessions over streamable HTTP, a new session every 25 calls."""
    import anyio
    from mcp import Client

    rng = random.Random(seed)

    async def session() -> None:
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            for _ in range(25):
                if stop.is_set():
                    return
                t0 = time.perf_counter()
                try:
                    r = await client.call_tool("search_tools", {"query": rng.choice(texts), "k": 5})
                except Exception as e:  # noqa: BLE001
                    tally.error(f"mcp: {type(e).__name__}: {e}")
                    return
                if r.is_error or not 1 <= len(r.structured_content["result"]) <= 5:
                    tally.error(f"mcp: {r.content[0].text if r.content else 'bad result'}")
                else:
                    tally.ok("MCP search_tools", time.perf_counter() - t0)

    while not stop.is_set():
        try:
            anyio.run(session)
        except Exception as e:  # noqa: BLE001
            tally.error(f"mcp session: {type(e).__name__}: {e}")
            time.sleep(0.5)


def big_query(port: int, size: int, tally: Tally) -> None:
    """One oversized query (a JSON body of ``size`` bytes): a clean 413 is right, anything else an error."""
    body = json.dumps({"query": "x" * size, "k": 5})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/search", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        with tally.lock:
            tally.big_sent += 1
            tally.big_refused += r.status == 413
        if r.status != 413:
            tally.error(f"oversized query: {r.status}, expected 413")
    except Exception as e:  # noqa: BLE001
        with tally.lock:
            tally.big_sent += 1
        tally.error(f"oversized query: {type(e).__name__}: {e}")
    finally:
        conn.close()


def health(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def files_under(folder: Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


# ---- the soak --------------------------------------------------------------------------------------
def soak(index: Path, alternates: list, texts: list[str], work: Path, clients: int, mcp_clients: int,
         seconds: float, swap_every: float, big_every: float, big_bytes: int) -> dict:
    from toolgraph.sync import save_atomically

    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    served_dir = work / "server_cwd"  # the server's working folder: the default embedding cache would land here
    served_dir.mkdir(exist_ok=True)
    log = (work / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "toolgraph.cli", "serve", "--retriever", str(index),
                             "--transport", "http", "--port", str(port)], env=env, cwd=served_dir,
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited: {(work / 'server.log').read_text()[-2000:]}")
            try:
                health(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("server did not start within 300 s") from None
                time.sleep(0.5)
        for q in texts[:20]:  # warm-up: first allocations, the first batch shapes
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/search", json.dumps({"query": q, "k": 5}), {"Content-Type": "application/json"})
            conn.getresponse().read()
            conn.close()
        start = proc_stats(proc.pid)
        cache_files = files_under(served_dir)
        h0 = health(port)
        print("start", start, flush=True)

        tally, stop = Tally(), threading.Event()
        threads = [threading.Thread(target=mcp_client if c < mcp_clients else http_client,
                                    args=(port, texts, stop, tally, c), daemon=True) for c in range(clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        swaps, samples = 0, [start]
        next_swap, next_big, next_sample = t0 + swap_every, t0 + big_every / 2, t0 + 30  # oversized: mid-interval
        while (now := time.monotonic()) < t0 + seconds:
            if now >= next_swap:
                save_atomically(alternates[swaps % 2], index)
                swaps += 1
                next_swap += swap_every
            if now >= next_big:
                big_query(port, big_bytes, tally)
                next_big += big_every
            if now >= next_sample:
                samples.append(proc_stats(proc.pid))
                print(f"{now - t0:6.0f}s served {len(tally.latency)} errors {len(tally.errors)} "
                      f"swaps {swaps} {samples[-1]}", flush=True)
                next_sample += 30
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(timeout=150)
        wall = time.monotonic() - t0
        time.sleep(2.0)  # closed connections and sessions released
        end = proc_stats(proc.pid)
        h1 = health(port)
        alive = proc.poll() is None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    lat = tally.latency
    return {
        "clients": clients, "mcp_clients": mcp_clients, "seconds": round(wall, 1),
        "requests": len(lat) + len(tally.errors), "served": len(lat), "errors": len(tally.errors),
        "requests_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
        "p95_ms": _pct(lat, 0.95) if lat else None, "p99_ms": _pct(lat, 0.99) if lat else None,
        "max_ms": round(1000 * max(lat), 1) if lat else None,
        "served_by_route": dict(sorted(tally.by_route.items())),
        "oversized_sent": tally.big_sent, "oversized_refused_413": tally.big_refused,
        "swaps": swaps, "reloads": h1["reloads"] - h0["reloads"], "reload_errors": h1["reload_errors"],
        "server_timeouts": h1["timeouts"], "server_alive": alive,
        "rss_mb_start": start["rss_mb"], "rss_mb_end": end["rss_mb"], "rss_mb_max": max(s["rss_mb"] for s in samples + [end]),
        "fds_start": start["fds"], "fds_end": end["fds"], "fds_max": max(s["fds"] for s in samples + [end]),
        "threads_start": start["threads"], "threads_end": end["threads"],
        "rss_mb_every_30s": [s["rss_mb"] for s in samples + [end]],
        "files_written_by_server": files_under(served_dir) - cache_files,
        "errors_sample": tally.errors[:5],
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--mcp-clients", type=int, default=2, help="how many of the clients use MCP sessions")
    p.add_argument("--swap-every", type=float, default=30.0, help="seconds between index swaps")
    p.add_argument("--big-every", type=float, default=60.0, help="seconds between oversized queries")
    p.add_argument("--big-bytes", type=int, default=5_000_000)
    p.add_argument("--dataset", default="toollens", help="registered dataset or canonical folder (its tools and agents)")
    p.add_argument("--retriever", default=None, help="retriever spec as JSON (default: t2a over all-MiniLM-L6-v2)")
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temp folder)")
    p.add_argument("--no-save", action="store_true", help="print the row, do not write benchmarks/results/serve.json")
    args = p.parse_args(argv)
    command = "python benchmarks/soak.py" + ("" if argv is None and len(sys.argv) == 1 else
                                             " " + shlex.join(sys.argv[1:] if argv is None else argv))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    work = args.work or Path(tempfile.mkdtemp(prefix="soak-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = json.loads(args.retriever) if args.retriever else SPEC
    t0 = time.perf_counter()
    v1, v2, texts = catalogs(args.dataset, work)
    index, a, b, info = build(v1, v2, work, spec)
    print("built", info, flush=True)
    m = soak(index, [b, a], texts, work, args.clients, min(args.mcp_clients, args.clients), 60 * args.minutes,
             args.swap_every, args.big_every, args.big_bytes)
    m = {**m, **{k: v for k, v in info.items() if k != "build_s"}, "index_build_s": info["build_s"]}
    print(json.dumps(m, indent=1), flush=True)
    dense = spec.get("dense") or {}
    row = {"method": "serve/soak", "dataset": Path(args.dataset).name, "split": "test",
           "setting": f"{args.clients} clients, {args.minutes:g} min, swap every {args.swap_every:g} s, "
                      f"{args.big_bytes / 1e6:g} MB query every {args.big_every:g} s",
           "encoder": dense.get("model", spec.get("model", "-")), "retriever": spec.get("name"),
           "metrics": {k: v for k, v in m.items() if k != "errors_sample"}, "errors_sample": m["errors_sample"],
           "command": command, "seconds": round(time.perf_counter() - t0, 1), "device": "cpu"}
    if not args.no_save:
        row["machine"] = machine()
        print("wrote", upsert("serve", [row]))
        render()
    return row


def render(page: str | Path = PAGE) -> None:
    """The soak table on ``page`` (block ``serve-soak``) from ``benchmarks/results/serve.json``."""
    rows = [r for r in json.loads((RESULTS / "serve.json").read_text())["rows"] if r["method"] == "serve/soak"]
    lines = ["| index | clients (MCP) | minutes | swaps / reloads | requests served | errors | 5 MB queries refused (413) "
             "| p50 / p95 / p99 ms | RSS MB start → end (max) | open fds start → end | threads start → end "
             "| files written |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["metrics"]
        lines.append(
            f"| {r['dataset']} {r.get('retriever', '')}, {m['tools']} tools / {m['agents']} agents | {m['clients']} "
            f"({m['mcp_clients']}) | {m['seconds'] / 60:.0f} | {m['swaps']} / {m['reloads']} | {m['served']:,} "
            f"({m['requests_per_s']}/s) | {m['errors']} | {m['oversized_refused_413']} of {m['oversized_sent']} "
            f"| {m['p50_ms']} / {m['p95_ms']} / {m['p99_ms']} | {m['rss_mb_start']:.0f} → {m['rss_mb_end']:.0f} "
            f"({m['rss_mb_max']:.0f}) | {m['fds_start']} → {m['fds_end']} | {m['threads_start']} → {m['threads_end']} "
            f"| {m['files_written_by_server']} |")
    write_block(page, "serve-soak", "\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:] == ["render"]:
        render()
    else:
        main()
