"""Speed figures for the Foundation (medians and ratios from one run on this machine).

    python benchmarks/speed.py

1. end-to-end BM25 evaluation on ToolLens test (load, index, retrieve 1,877 queries, metrics);
2. dense re-evaluation with a warm embedding cache vs cold (all-MiniLM-L6-v2, ToolLens test);
3. exact top-k (matmul + deterministic top-k in torch) vs FAISS IndexFlatIP over 50k random
   384-d unit vectors, 256 queries, k=100.
Rows go to benchmarks/results/baselines.json (setting "speed:*") and the ``speed`` table on docs/results.md.

    python benchmarks/speed.py --render-only [--page docs/results.md]   # only the table, from the file
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from results_io import DOCS, RESULTS, machine, upsert, write_block  # noqa: E402

from toolgraph.config import EvaluateConfig, load_config  # noqa: E402
from toolgraph.data import prepare_dataset  # noqa: E402
from toolgraph.evaluation import run  # noqa: E402
from toolgraph.retrieval.topk import topk  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CMD = "python benchmarks/speed.py"
PAGE = DOCS / "results.md"  # where the speed block lives
ORDER = ("speed:e2e-eval", "speed:topk-vs-faiss", "speed:embedding-cache")  # table rows, in this order


def timed(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def bm25_end_to_end() -> dict:
    cfg = load_config(EvaluateConfig, [ROOT / "configs/eval/bm25_toollens.yaml"])

    times = timed(lambda: run(cfg), repeats=7)
    return {"method": "bm25", "dataset": "toollens", "split": "test", "setting": "speed:e2e-eval",
            "metrics": {"seconds_median": round(statistics.median(times), 3), "runs": len(times)},
            "note": "load dataset + index 464 tools + retrieve 1,877 queries (depth 100) + metrics"}


def dense_cache() -> dict:
    cache = Path(tempfile.mkdtemp(prefix="tg-cache-"))
    cfg = load_config(EvaluateConfig, [ROOT / "configs/eval/minilm_toollens.yaml"],
                      [f"retriever.cache_dir={cache}", "retriever.progress=false"])
    ds = prepare_dataset(cfg.data)

    def evaluate_once():
        run(cfg, ds=ds)

    cold = []
    for _ in range(2):
        shutil.rmtree(cache, ignore_errors=True)
        cold += timed(evaluate_once, repeats=1, warmup=0)
    warm = timed(evaluate_once, repeats=5, warmup=0)
    shutil.rmtree(cache, ignore_errors=True)
    c, w = statistics.median(cold), statistics.median(warm)
    return {"method": "dense", "dataset": "toollens", "split": "test", "setting": "speed:embedding-cache",
            "encoder": "all-MiniLM-L6-v2",
            "metrics": {"cold_s_median": round(c, 2), "cached_s_median": round(w, 3), "speedup": round(c / w, 1),
                        "cold_runs": len(cold), "cached_runs": len(warm)},
            "note": "full re-evaluation (new retriever, model load, 464 tools + 1,877 queries); cached run reads "
                    "vectors from disk"}


def exact_vs_faiss() -> dict:
    import faiss

    torch.manual_seed(0)
    n, d, q, k = 50_000, 384, 256, 100
    tools = torch.nn.functional.normalize(torch.randn(n, d), dim=1)
    queries = torch.nn.functional.normalize(torch.randn(q, d), dim=1)
    index = faiss.IndexFlatIP(d)
    index.add(tools.numpy())
    ours = timed(lambda: topk(queries @ tools.T, k), repeats=15)
    theirs = timed(lambda: index.search(queries.numpy(), k), repeats=15)
    o, f = statistics.median(ours), statistics.median(theirs)
    # same answers (random floats: no ties)
    _, a = topk(queries @ tools.T, k)
    _, b = index.search(queries.numpy(), k)
    agree = float((a.numpy() == b).mean())
    return {"method": "exact-topk", "dataset": "random-50k-384d", "split": "-", "setting": "speed:topk-vs-faiss",
            "metrics": {"ours_s_median": round(o, 4), "faiss_flatip_s_median": round(f, 4), "ratio": round(o / f, 3),
                        "same_ids": agree, "runs": len(ours)},
            "note": f"256 queries, k=100, {machine()}, faiss threads {faiss.omp_get_max_threads()}"}


def render(page: str | Path = PAGE) -> None:
    """The speed table of ``page``: the ``speed:*`` rows this script writes to baselines.json."""
    rows = json.loads((RESULTS / "baselines.json").read_text())["rows"]
    rows = sorted((r for r in rows if r["setting"] in ORDER), key=lambda r: ORDER.index(r["setting"]))
    lines = ["| what | figures (medians, one run) |", "|---|---|"]
    for r in rows:
        lines.append(f"| {r['setting']} ({r['dataset']}) | "
                     + ", ".join(f"{k}={v}" for k, v in r["metrics"].items()) + " |")
    write_block(page, "speed", "\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", type=Path, default=PAGE, help="page with the speed block")
    ap.add_argument("--render-only", action="store_true", help="only rewrite the table from the results file")
    args = ap.parse_args()
    if not args.render_only:
        rows = []
        for fn in (bm25_end_to_end, exact_vs_faiss, dense_cache):
            row = fn()
            row.setdefault("encoder", None)
            row["command"] = CMD
            rows.append(row)
            print(row["setting"], row["metrics"], flush=True)
        print(f"wrote {upsert('baselines', rows)}")
    render(args.page)


if __name__ == "__main__":
    main()
