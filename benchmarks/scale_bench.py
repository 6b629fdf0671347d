"""Registry scale: one dense index over 1k -> 1M tools (toolgraph/data/scale.py), measured.

    python benchmarks/scale_bench.py encode --size 100000      # MiniLM vectors, resumable chunks
    python benchmarks/scale_bench.py ladder --sizes 1000 10000 100000
    python benchmarks/scale_bench.py serve --size 100000       # toolgraph serve + index sync while serving
    python benchmarks/scale_bench.py render                    # table + plot in docs/agents-and-serving.md

``encode`` writes the vectors of the first N tools of the scale catalog (ToolLens' 464 tools first,
then real distractors, then recombinations) in 8,192-text chunks under ``runs/scale/<encoder>/``
(retrieval/chunks.py: a kill resumes; each chunk records its encoding seconds). Every size is a prefix
of the catalog, so one encode serves every rung at or below it.

``ladder``, for each size: build seconds (encoding, from the chunks' seconds, plus the FAISS build),
bytes per tool of the saved index, single-query search latency p50/p95 over pre-encoded ToolLens test
queries (exact: the retriever's torch matmul + top-k; faiss-hnsw; faiss-ivf), the needle test's
recall@5 on ToolLens' real labels for each, and each ANN's recall@10 against exact; then the fitted
growth exponents (log-log slope) over the sizes. Query encoding (MiniLM, one query) is timed apart:
it is the same at every size.

``serve``: the index saved (the ANN setting the ladder found best at this size: ``served_ann``), the
catalog written as a dataset folder and a first ``index sync`` from it (the full sync, which records
the catalog's lines); ``toolgraph serve`` over HTTP: start-up seconds and RSS, p50/p95/p99 at 1/8/32
clients; then ``index sync`` of the catalog plus 1,000 new tools (a delta) while 8 clients keep
searching, until 10 s after the server serves the new index: sync seconds, failed requests, latency
during the swap, and how long after the sync the server served the new index.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from results_io import DOCS, RESULTS, ROOT, machine, upsert, write_block  # noqa: E402

from toolgraph.data.formats import write_dataset  # noqa: E402
from toolgraph.data.scale import scale_catalog  # noqa: E402
from toolgraph.data.schema import ToolDataset  # noqa: E402
from toolgraph.metrics import compute  # noqa: E402
from toolgraph.retrieval.ann import AnnConfig  # noqa: E402
from toolgraph.retrieval.chunks import chunk_seconds, encode_in_chunks  # noqa: E402
from toolgraph.retrieval.dense import DenseConfig, DenseRetriever  # noqa: E402
from toolgraph.retrieval.encode import encode_texts  # noqa: E402
from toolgraph.retrieval.topk import topk  # noqa: E402

WORK = ROOT / "runs" / "scale"
PAGE = DOCS / "agents-and-serving.md"
KEY = ("method", "dataset", "split", "setting", "encoder")
KINDS = ("exact", "faiss-hnsw", "faiss-ivf")
# --encoder: the model, its chunk folder, the name in the rows
ENCODERS = {"minilm": ("all-MiniLM-L6-v2", "minilm", "all-MiniLM-L6-v2"),
            "static": (str(WORK / "minilm-static"), "static", "all-MiniLM-L6-v2 static (toolgraph encoder static)")}
ENCODER = ENCODERS["minilm"][0]


def use_encoder(name: str) -> Path:
    """Make ``name`` the encoder of this run (the static one is built first if missing); its chunk folder."""
    global ENCODER, LABEL
    ENCODER, folder, LABEL = ENCODERS[name]
    if name == "static" and not (WORK / "minilm-static" / "config.json").is_file():
        from toolgraph.retrieval.static import build_static

        build_static(WORK / "minilm-static")
    return WORK / folder


LABEL = ENCODERS["minilm"][2]


def rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def retriever(kind: str) -> DenseRetriever:
    return DenseRetriever(DenseConfig(encoder={"name": ENCODER, "cache_dir": None}, index=kind, progress=False))


def catalog_vectors(size: int, folder: Path) -> tuple[list, ToolDataset, torch.Tensor, float]:
    """(the first ``size`` tools, the needle dataset, their vectors, encoding seconds) through the chunks
    in ``folder`` (encoded where missing)."""
    tools, needle = scale_catalog(size)
    r = retriever("exact")
    docs = [r.prefix("document") + t.document() for t in tools]
    length = r.config.encoder.max_length
    enc, tok = r.encoder, r._tokenizer
    batch = 64 if ENCODER == ENCODERS["minilm"][0] else 1024  # a table lookup: large batches
    vectors = encode_in_chunks(docs, lambda part: encode_texts(enc, tok, part, batch, length), folder,
                               f"{enc.fingerprint()}:{length}", progress="encoding the scale catalog")
    return tools, needle, vectors, chunk_seconds(folder)


def encoded_size(folder: Path) -> int:
    """How many catalog rows the chunks in ``folder`` hold (whole chunks from the start)."""
    from safetensors import safe_open

    rows = 0
    for path in sorted(folder.glob("chunk-*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            rows += f.get_slice("vectors").get_shape()[0]
    return rows


def folder_bytes(folder: Path) -> int:
    """The saved index's bytes, its copy of the encoder (``encoder/``: the static table, 47 MB) left out."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and "encoder" not in p.relative_to(folder).parts)


def _search(r: DenseRetriever, q: torch.Tensor, k: int) -> torch.Tensor:
    """Positions [Q, k] of the best k tools for query vectors q [Q, H]: exact (the retriever's matmul +
    deterministic top-k) or through its FAISS index."""
    if r._ann is None:
        return topk(q @ r.tool_vectors.T, k, r.tools)[1]
    return r._ann.search(q, k)[1]


# search-time settings tried on each built index (no rebuild): HNSW's ef_search, IVF's nprobe
VARIANTS = {"exact": [{}], "faiss-hnsw": [{"ef_search": 128}, {"ef_search": 256}, {"ef_search": 512},
                                        {"ef_search": 1024}],
            "faiss-ivf": [{"nprobe": 32}, {"nprobe": 64}, {"nprobe": 128}, {"nprobe": 256}, {"nprobe": 512}]}


def measure(size: int, tools: list, needle: ToolDataset, vectors: torch.Tensor, encode_s_per_text: float,
            qvecs: torch.Tensor, test: list, command: str, repeats: int) -> list[dict]:
    rows, exact = [], None
    for kind in KINDS:
        r = retriever(kind)
        t0 = time.perf_counter()
        r.index_vectors(tools[:size], vectors[:size])
        index_s = time.perf_counter() - t0
        with tempfile.TemporaryDirectory(dir=WORK) as tmp:
            r.save(tmp)
            per_tool = folder_bytes(Path(tmp)) / size
        for variant in VARIANTS[kind]:
            for key, value in variant.items():
                setattr(r.config.ann, key, value)
            for q in qvecs[:5]:  # warm-up
                _search(r, q[None], 10)
            lat = []
            for _ in range(repeats if size <= 100_000 else 1):
                for q in qvecs[:200]:  # one query at a time, as a server answers it
                    t0 = time.perf_counter()
                    _search(r, q[None], 10)
                    lat.append(time.perf_counter() - t0)
            found = [[r.tools[i].id for i in row] for part in qvecs.split(256) for row in _search(r, part, 10).tolist()]
            exact = found if kind == "exact" else exact
            lat.sort()
            m = {"tools": size, "build_s": round(encode_s_per_text * size + index_s, 1),
                 "encode_s": round(encode_s_per_text * size, 1), "index_s": round(index_s, 2),
                 "bytes_per_tool": round(per_tool), "p50_ms": round(1000 * statistics.median(lat), 3),
                 "p95_ms": round(1000 * lat[int(0.95 * len(lat))], 3), "searches": len(lat),
                 **{f"needle_{k}": round(v, 4) for k, v in compute(found, [q.tools for q in test], [5, 10],
                                                                   ["recall"]).items()},
                 "rss_mb": rss_mb()}
            if kind != "exact":
                m["recall@10_vs_exact"] = round(sum(len(set(a) & set(b)) for a, b in zip(found, exact, strict=True))
                                                / (10 * len(found)), 4)
                m["ann"] = dict(variant)
                if kind == "faiss-hnsw":
                    m["ann"].update(hnsw_m=r.config.ann.hnsw_m, ef_construction=r.config.ann.ef_construction)
                else:
                    m["ann"]["ivf_lists"] = r._ann.index.nlist
            label = ", ".join(f"{k} {v}" for k, v in variant.items())
            print(kind, label, size, m, flush=True)
            rows.append({"method": f"scale/{kind}", "dataset": f"scale-{size}", "split": "test",
                         "setting": f"needle toollens, {size} tools" + (f", {label}" if label else ""),
                         "encoder": LABEL, "metrics": m, "command": command, "device": machine(),
                         "seconds": round(index_s, 1)})
        del r
    return rows


def slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def ladder(args, command: str) -> list[dict]:
    folder = use_encoder(args.encoder)
    have = encoded_size(folder)
    top = max(args.sizes)
    if have < top:
        raise SystemExit(f"{folder} holds {have} rows; run `encode --size {top}` first")
    tools, needle, vectors, _ = catalog_vectors(have, folder)
    rate = chunk_seconds(folder) / have  # encoding seconds per text on this machine (2 cores, contended)
    test = [q for q in needle.queries if q.split == "test"]
    r = retriever("exact")
    prefix = r.prefix("query")
    qtexts = [prefix + q.text for q in test]
    enc, tok = r.encoder, r._tokenizer
    single = []
    for t in qtexts[:100]:
        t0 = time.perf_counter()
        encode_texts(enc, tok, [t], 1, r.config.encoder.max_query_length or r.config.encoder.max_length)
        single.append(time.perf_counter() - t0)
    qvecs = encode_texts(enc, tok, qtexts, 64, r.config.encoder.max_query_length or r.config.encoder.max_length)
    rows = []
    for size in sorted(args.sizes):
        rows += measure(size, tools, needle, vectors, rate, qvecs, test, command, args.repeats)
    sizes = sorted(args.sizes)
    growth = {}
    for kind in KINDS:
        first = VARIANTS[kind][0]
        mine = sorted((r for r in rows if r["method"] == f"scale/{kind}" and all(r["metrics"].get("ann", {}).get(k) == v
                                                                                  for k, v in first.items())),
                      key=lambda r: r["metrics"]["tools"])
        growth[kind] = {"build_s": round(slope(sizes, [r["metrics"]["build_s"] for r in mine]), 3),
                        "p95_ms": round(slope(sizes, [r["metrics"]["p95_ms"] for r in mine]), 3)}
    rows.append({"method": "scale/growth", "dataset": f"scale-{sizes[0]}-{sizes[-1]}", "split": "test",
                 "setting": "log-log slope over " + ", ".join(map(str, sizes)), "encoder": LABEL,
                 "metrics": {"exponent": growth, "query_encode_p50_ms": round(1000 * statistics.median(single), 2),
                             "encode_texts_per_s": round(1 / rate, 1)},
                 "command": command, "device": machine(), "seconds": None})
    upsert("scale", rows, KEY)
    return rows


# ---- serving ------------------------------------------------------------------------------------
def _rss_of(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def served_ann(size: int) -> tuple[str, dict]:
    """The index the server uses at ``size`` tools (this encoder): of the ANN settings the ladder measured
    there with R@10 vs exact >= 0.98, the one of lowest search p95 (else the highest recall); ``auto``
    with the defaults when the ladder has not run at this size."""
    path = RESULTS / "scale.json"
    rows = json.loads(path.read_text())["rows"] if path.is_file() else []
    tried = [r for r in rows if r["method"] in ("scale/faiss-hnsw", "scale/faiss-ivf") and r["encoder"] == LABEL
             and r["metrics"]["tools"] == size]
    if not tried:
        return "auto", {}
    good = [r for r in tried if r["metrics"]["recall@10_vs_exact"] >= 0.98]
    best = (min(good, key=lambda r: r["metrics"]["p95_ms"]) if good
            else max(tried, key=lambda r: r["metrics"]["recall@10_vs_exact"]))
    ann = {k: v for k, v in best["metrics"]["ann"].items() if k in ("ef_search", "nprobe", "hnsw_m", "ef_construction")}
    return best["method"].removeprefix("scale/"), ann


def _sync(catalog: Path, index: Path, env: dict) -> dict:
    """``toolgraph index sync`` in its own process, as a user runs it: its counts and wall seconds."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "toolgraph.cli", "index", "sync", str(catalog), "--index", str(index)],
                         env=env, capture_output=True, text=True, check=True)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "sync_s": time.perf_counter() - t}


def serve(args, command: str) -> list[dict]:
    import anyio
    from serve_bench import _free_port, _load

    folder = use_encoder(args.encoder)
    tools, needle, vectors, _ = catalog_vectors(args.size, folder)
    work = WORK / f"serve-{args.size}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    kind, ann = served_ann(args.size)
    r = DenseRetriever(DenseConfig(encoder={"name": ENCODER, "cache_dir": None}, index=kind, progress=False,
                                   ann=AnnConfig(**ann)))
    t0 = time.perf_counter()
    r.index_vectors(tools, vectors)
    index = work / "index"
    r.save(index)
    print("index", r.index_kind(), f"{time.perf_counter() - t0:.1f}s", flush=True)
    kind = r.index_kind()
    del r
    texts = [q.text for q in needle.queries if q.split == "test"]
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    # the catalog as a user keeps it (a dataset folder) and a first index sync from it: the full sync,
    # which also records the catalog's lines (sync-state.json) so that the next sync reads only what changed
    catalog = write_dataset(ToolDataset("scale", tools, []), work / "catalog")
    first = _sync(catalog, index, env)
    print("first sync", first, flush=True)
    rows = [{"method": "scale/sync-full", "dataset": f"scale-{args.size}", "split": "-",
             "setting": "first sync of the saved index (full: every tool read, compared, saved)", "encoder": LABEL,
             "metrics": {"tools": args.size, "sync_s": round(first["sync_s"], 1), "encoded": first.get("encoded"),
                         "unchanged": first.get("unchanged")},
             "command": command, "device": machine(), "seconds": round(first["sync_s"], 1)}]
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "toolgraph.cli", "serve", "--retriever", str(index),
                             "--transport", "http", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(work / "server.log", "w"))
    try:
        while True:
            try:
                health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).read())
                if health.get("ready", True) and health.get("status", "ok") != "loading":
                    break
            except OSError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"the server died; see {work / 'server.log'}")
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/mcp"
        anyio.run(_load, url, texts[:10], 1, 120.0)  # warm-up: the first search loads the model
        startup_s = time.perf_counter() - t0
        base = {"tools": args.size, "index": kind, "ann": ann, "startup_s": round(startup_s, 1), "rss_mb": _rss_of(proc.pid)}
        print("up", base, flush=True)
        for clients in args.clients:
            lat, errors, wall = anyio.run(_load, url, texts, clients, args.seconds)
            lat.sort()
            m = {**base, "clients": clients, "requests": len(lat) + len(errors), "errors": len(errors),
                 "p50_ms": round(1000 * statistics.median(lat), 1), "p95_ms": round(1000 * lat[int(0.95 * len(lat))], 1),
                 "p99_ms": round(1000 * lat[int(0.99 * len(lat))], 1), "requests_per_s": round(len(lat) / wall, 1),
                 "rss_mb": _rss_of(proc.pid)}
            print(m, errors[:3], flush=True)
            rows.append({"method": "scale/serve", "dataset": f"scale-{args.size}", "split": "-",
                         "setting": f"{clients}-client" + ("s" if clients > 1 else ""), "encoder": LABEL,
                         "metrics": m, "command": command, "device": machine(), "seconds": round(wall, 1),
                         "errors_sample": errors[:3]})
        # index sync of the catalog plus 1,000 new tools while 8 clients search
        extra, _ = scale_catalog(args.size + args.add)
        catalog = write_dataset(ToolDataset("scale", extra, []), work / "catalog")  # the user's catalog grows
        result: dict = {}

        def do_sync() -> None:  # its own process, as a user runs it (and off this process's GIL)
            out = _sync(catalog, index, env)
            result["counts"], result["sync_s"], result["done"] = out, out["sync_s"], time.monotonic()
            for _ in range(1200):  # the server loads the new index beside the served one, then swaps it in
                h = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read())
                if h.get("tools") == args.size + args.add:
                    result["served_after_s"] = time.monotonic() - result["done"]
                    break
                time.sleep(0.25)
            result["polled"] = True

        async def during() -> tuple:
            lat: list[float] = []
            errors: list[str] = []

            async def clients() -> None:
                from serve_bench import _client

                deadline = time.monotonic() + args.seconds + 600
                async with anyio.create_task_group() as inner:
                    for c in range(8):
                        inner.start_soon(_client, url, (texts * 50)[c::8], deadline, lat, errors)
                    # through the server's reload: until 10 s after it serves the new index (or 20 s after the
                    # sync when it never does), so the latencies cover the swap
                    while "polled" not in result or time.monotonic() < result["done"] + 20 or (
                            "served_after_s" in result and time.monotonic() < result["done"] + result["served_after_s"] + 10):
                        await anyio.sleep(0.5)
                    inner.cancel_scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(clients)
                await anyio.to_thread.run_sync(do_sync)
            return lat, errors

        lat, errors = anyio.run(during)
        picked = 0
        for _ in range(240):  # the server swaps the new index in when it sees it
            h = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).read())
            if h.get("tools") == args.size + args.add:
                picked = 1
                break
            time.sleep(0.5)
        lat.sort()
        m = {"tools": args.size, "added": args.add, "sync_s": round(result["sync_s"], 1),
             "encoded": result["counts"].get("encoded"), "delta": result["counts"].get("delta"), "requests": len(lat) + len(errors), "errors": len(errors),
             "p50_ms": round(1000 * statistics.median(lat), 1), "p95_ms": round(1000 * lat[int(0.95 * len(lat))], 1),
             "p99_ms": round(1000 * lat[int(0.99 * len(lat))], 1), "max_ms": round(1000 * lat[-1], 1),
             "server_sees_new_index": bool(picked), "served_after_s": round(result.get("served_after_s", -1), 1), "rss_mb": _rss_of(proc.pid)}
        print("sync while serving", m, errors[:3], flush=True)
        rows.append({"method": "scale/sync-while-serving", "dataset": f"scale-{args.size}", "split": "-",
                     "setting": f"+{args.add} tools, 8 clients", "encoder": LABEL, "metrics": m,
                     "command": command, "device": machine(), "seconds": round(result["sync_s"], 1),
                     "errors_sample": errors[:3]})
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    upsert("scale", rows, KEY)
    return rows


# ---- the page -----------------------------------------------------------------------------------
def _short(label: str) -> str:
    return "static" if "static" in label else "MiniLM"


def _variant(r: dict) -> str:
    ann = r["metrics"].get("ann", {})
    return ", ".join(f"{k} {ann[k]}" for k in ("ef_search", "nprobe", "ivf_lists") if k in ann) or "–"


def render(page: Path = PAGE, plot: bool = False) -> None:
    rows = json.loads((RESULTS / "scale.json").read_text())["rows"]
    lines = ["| encoder | tools | index | search setting | build s | bytes / tool | search p50 / p95 ms | needle R@5 "
             "| R@10 vs exact |", "|---|---|---|---|---|---|---|---|---|"]
    ladder_rows = sorted((r for r in rows if r["method"].removeprefix("scale/") in KINDS),
                         key=lambda r: (_short(r["encoder"]), r["metrics"]["tools"],
                                        KINDS.index(r["method"].removeprefix("scale/")),
                                        r["metrics"].get("ann", {}).get("ef_search", r["metrics"].get("ann", {}).get("nprobe", 0))))
    for r in ladder_rows:
        m = r["metrics"]
        lines.append(f"| {_short(r['encoder'])} | {m['tools']:,} | {r['method'].removeprefix('scale/')} | {_variant(r)} "
                     f"| {m['build_s']:,} | {m['bytes_per_tool']:,} | {m['p50_ms']} / {m['p95_ms']} "
                     f"| {m['needle_recall@5']:.3f} | {m.get('recall@10_vs_exact', 1.0):.3f} |")
    for r in sorted((r for r in rows if r["method"] == "scale/growth"), key=lambda r: _short(r["encoder"])):
        g = r["metrics"]["exponent"]
        lines.append("")
        lines.append(f"Growth exponents, {_short(r['encoder'])} (log-log slope over " + r["setting"].split("over ")[1]
                     + " tools): " + "; ".join(f"{k} build {v['build_s']}, p95 {v['p95_ms']}" for k, v in g.items())
                     + f". One query encoding: {r['metrics']['query_encode_p50_ms']} ms (p50); documents encoded "
                     f"{r['metrics']['encode_texts_per_s']} a second.")
    serve_rows = [r for r in rows if r["method"] in ("scale/serve", "scale/sync-while-serving")]
    if serve_rows:
        lines += ["", "| encoder | served | setting | p50 / p95 / p99 ms | requests | errors | RSS MB | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in sorted(serve_rows, key=lambda r: (_short(r["encoder"]), r["metrics"]["tools"], r["method"],
                                                   r["metrics"].get("clients", 99))):
            m = r["metrics"]
            note = (f"start-up {m['startup_s']} s, {m['index']} ({', '.join(f'{k} {v}' for k, v in m['ann'].items())})" if r["method"] == "scale/serve" else
                    f"sync {m['sync_s']} s ({m['encoded']} encoded"
                    + (f"; written as a delta of {m['delta']['tools']} tools" if m.get("delta") else "; full save")
                    + f"), max {m['max_ms']} ms, new index served: {m['server_sees_new_index']}"
                    + (f", {m['served_after_s']} s after the sync" if m.get("served_after_s", -1) >= 0 else ""))
            lines.append(f"| {_short(r['encoder'])} | {m['tools']:,} | {r['setting']} | {m['p50_ms']} / {m['p95_ms']} / "
                         f"{m['p99_ms']} | {m['requests']} | {m['errors']} | {m['rss_mb']:,} | {note} |")
    for r in sorted((r for r in rows if r["method"] == "scale/sync-full"), key=lambda r: r["metrics"]["tools"]):
        m = r["metrics"]
        lines += ["", f"First `index sync` of the saved {m['tools']:,}-tool index ({_short(r['encoder'])}): {m['sync_s']} s, "
                  f"the full sync ({m['unchanged']:,} unchanged, {m['encoded']} encoded; it records the catalog's "
                  "lines, so later syncs read only what changed)."]
    write_block(page, "scale", "\n".join(lines))
    if plot:
        _plot(ladder_rows)


def _plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for enc, style in (("MiniLM", "-"), ("static", ":")):
        for kind in KINDS:
            first = VARIANTS[kind][0]
            mine = [r["metrics"] for r in rows if r["method"] == f"scale/{kind}" and _short(r["encoder"]) == enc
                    and all(r["metrics"].get("ann", {}).get(k) == v for k, v in first.items())]
            if not mine:
                continue
            xs = [m["tools"] for m in mine]
            a.plot(xs, [m["p95_ms"] for m in mine], marker="o", linestyle=style, label=f"{enc} {kind}")
            if kind == "exact":
                b.plot(xs, [m["needle_recall@5"] for m in mine], marker="o", linestyle=style, label=f"{enc} needle R@5")
            else:
                b.plot(xs, [m["recall@10_vs_exact"] for m in mine], marker="x", linestyle=style,
                       label=f"{enc} {kind} R@10 vs exact")
    for ax in (a, b):
        ax.set_xscale("log")
        ax.set_xlabel("tools in the index")
        ax.grid(alpha=0.3)
    a.set_yscale("log")
    a.set_ylabel("search p95 (ms, one query)")
    b.set_ylabel("recall")
    a.legend(fontsize=7)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(DOCS / "img" / "scale.png", dpi=110)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode", help="vectors of the first --size catalog tools, in resumable chunks")
    e.add_argument("--size", type=int, default=100_000)
    e.add_argument("--encoder", choices=sorted(ENCODERS), default="minilm")
    lad = sub.add_parser("ladder", help="build, bytes, latency and recall per size and index")
    lad.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    lad.add_argument("--repeats", type=int, default=3)
    lad.add_argument("--encoder", choices=sorted(ENCODERS), default="minilm")
    s = sub.add_parser("serve", help="toolgraph serve over the index, then index sync of --add tools while serving")
    s.add_argument("--size", type=int, default=100_000)
    s.add_argument("--add", type=int, default=1000)
    s.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    s.add_argument("--seconds", type=float, default=60.0)
    s.add_argument("--encoder", choices=sorted(ENCODERS), default="minilm")
    sub.add_parser("render", help="the scale block and plot of docs/agents-and-serving.md")
    args = p.parse_args(argv)
    command = "python benchmarks/scale_bench.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    WORK.mkdir(parents=True, exist_ok=True)
    if args.cmd == "encode":
        t0 = time.perf_counter()
        folder = use_encoder(args.encoder)
        catalog_vectors(args.size, folder)
        print(f"encoded {args.size} in {time.perf_counter() - t0:.0f}s; chunks: {chunk_seconds(folder):.0f}s")
    elif args.cmd == "ladder":
        ladder(args, command)
    elif args.cmd == "serve":
        serve(args, command)
    else:
        render(plot=True)


if __name__ == "__main__":
    main()
