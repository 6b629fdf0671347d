"""The README's headline table: the main methods on ToolLens test, picked from the results files.

    python benchmarks/headline.py render [--page README.md]

Measures nothing: picks the rows named in ROWS below from benchmarks/results/*.json (figures copied
as they are, rounded to 3 decimals) and writes the ``headline`` block of the page.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import README, RESULTS, ROOT, page_path, write_block  # noqa: E402

PAGE = README
DATASET = "toollens"
# (results file, method, setting, label in the table, page with the details, relative to the repo root);
# method@encoder: the row of that encoder (baselines.json holds a dense row per encoder)
ROWS = [
    ("baselines", "bm25", "zero-shot", "BM25", "docs/dense.md"),
    ("baselines", "dense@all-MiniLM-L6-v2", "zero-shot", "all-MiniLM-L6-v2 (dense)", "docs/dense.md"),
    ("baselines", "tool2vec", "zero-shot", "Tool2Vec over MiniLM", "docs/usage-and-rerank.md"),
    ("usage_rerank", "query_knn", "zero-shot, 10 neighbours", "query neighbours over MiniLM (10 nearest training queries vote)",
     "docs/usage-and-rerank.md"),
    ("training_core", "bi_encoder", "transductive", "bi-encoder (MiniLM, fine-tuned)", "docs/dense.md"),
    ("training_core", "instret", "transductive", "InstRet bi-encoder (MiniLM, fine-tuned)", "docs/dense.md"),
    ("training_core", "bi_encoder_fast", "transductive", "fast bi-encoder (MiniLM, whole catalog, frozen bottom)",
     "docs/dense.md"),
    ("usage_rerank", "mlc", "loss=bce", "MLC (MiniLM + one logit per tool)", "docs/usage-and-rerank.md"),
    ("usage_rerank", "refiner+mlc", "N=32", "ToolRefiner reranking the MLC's top 32", "docs/usage-and-rerank.md"),
    ("usage_rerank", "mlc", "fast loss=bce, top 4 layers from MiniLM (freeze_layers 2)",
     "fast MLC (top 4 layers of MiniLM over a frozen bottom)", "docs/usage-and-rerank.md"),
    ("usage_rerank", "refiner+mlc", "fast, top 4 layers from MiniLM: ToolRefiner + MLC",
     "fast ToolRefiner + MLC (score fusion, weight chosen on val)", "docs/usage-and-rerank.md"),
    ("usage_rerank", "refiner+mlc",
     "fast, top 4 layers from MiniLM: ToolRefiner + (MLC + query neighbours, its own encoder)",
     "fast ToolRefiner + (MLC + query neighbours)", "docs/usage-and-rerank.md"),
]
METRICS = ("recall@3", "recall@5", "ndcg@5", "pass@5", "mrr")


def _row(name: str, method: str, setting: str) -> dict:
    rows = json.loads((RESULTS / f"{name}.json").read_text())["rows"]
    method, _, encoder = method.partition("@")
    found = [r for r in rows if (r["method"], r["dataset"], r["setting"]) == (method, DATASET, setting)
             and (not encoder or r.get("encoder") == encoder)]
    if len(found) != 1:
        raise SystemExit(f"{name}.json: expected one {method} / {DATASET} / {setting} row, found {len(found)}")
    return found[0]


def table(page: str | Path = PAGE) -> str:
    """The block's text; the detail links are relative to ``page``'s folder."""
    base = page_path(page).resolve().parent
    lines = ["| method | training | " + " | ".join(METRICS) + " | details |",
             "|---|---|" + "---|" * len(METRICS) + "---|"]
    queries = set()
    for name, method, setting, label, details in ROWS:
        r = _row(name, method, setting)
        queries.add(r.get("queries"))
        steps = r.get("training_steps")
        trained = f"{steps} steps" if steps else "none (zero-shot)"
        if steps and r.get("train_seconds"):
            trained += f", {r['train_seconds']:,.0f} s"
        link = Path(os.path.relpath(ROOT / details, base)).as_posix()
        cells = " | ".join(f"{r['metrics'][m]:.3f}" for m in METRICS)
        lines.append(f"| {label} | {trained} | {cells} | [{Path(details).stem}]({link}) |")
    if len(queries) != 1:
        raise SystemExit(f"headline rows are on different query sets: {sorted(map(str, queries))}")
    return "\n".join(lines)


def render(page: str | Path = PAGE) -> None:
    write_block(page, "headline", table(page))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render")
    r.add_argument("--page", type=Path, default=PAGE, help="the page holding the headline block (default: README.md)")
    args = ap.parse_args()
    render(args.page)


if __name__ == "__main__":
    main()
