"""`toolgraph data stats` for every registered dataset -> benchmarks/results/datasets.json and the
``datasets`` table on docs/data.md.

    python benchmarks/datasets.py [--page docs/data.md]
    python benchmarks/datasets.py --render-only     # only the table, from the results file
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import DOCS, RESULTS, write_block  # noqa: E402

from toolgraph.data import load_dataset, sources  # noqa: E402, F401
from toolgraph.registry import DATASETS  # noqa: E402

NEEDS_PATH = {"beir", "catalog-pairs", "mixture"}  # generic readers (no default location), views and mixtures of the others
PAGE = DOCS / "data.md"  # where the datasets block lives


def render(page: str | Path = PAGE) -> None:
    """The datasets table of ``page`` from benchmarks/results/datasets.json."""
    rows = json.loads((RESULTS / "datasets.json").read_text())["rows"]
    lines = ["| dataset | tools | agents | train | val | test | gold/query | dependencies | skipped (by reason) | load s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in rows:
        skipped = "; ".join(f"{k}: {v}" for k, v in s["skipped"].items()) or "–"
        q = s["queries"]
        lines.append(f"| {s['name']} | {s['tools']} | {s['agents']} | {q['train']} | {q['val']} | {q['test']} | "
                     f"{s['labels_per_query']:.2f} | {s['dependencies']} | {skipped} | {s['load_seconds']:.1f} |")
    write_block(page, "datasets", "\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", type=Path, default=PAGE, help="page with the datasets block")
    ap.add_argument("--render-only", action="store_true", help="only rewrite the table from the results file")
    args = ap.parse_args()
    if not args.render_only:
        rows = []
        for name in DATASETS.names():
            if name in NEEDS_PATH:
                continue
            t0 = time.perf_counter()
            s = load_dataset(name).stats()
            rows.append({**s, "load_seconds": round(time.perf_counter() - t0, 2)})
            print(json.dumps(rows[-1]), flush=True)
        (RESULTS / "datasets.json").write_text(json.dumps({"rows": rows, "command": "python benchmarks/datasets.py"},
                                                          indent=1) + "\n")
    render(args.page)


if __name__ == "__main__":
    main()
