"""`toolgraph data stats` for every registered dataset -> the README dataset table.

    python benchmarks/datasets.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import RESULTS, write_readme_table  # noqa: E402

from toolgraph.data import load_dataset, sources  # noqa: E402, F401
from toolgraph.registry import DATASETS  # noqa: E402

NEEDS_PATH = {"beir"}  # generic readers: no default location


def main() -> None:
    rows, lines = [], ["| dataset | tools | agents | train | val | test | gold/query | dependencies | skipped (by reason) | load s |",
                       "|---|---|---|---|---|---|---|---|---|---|"]
    for name in DATASETS.names():
        if name in NEEDS_PATH:
            continue
        t0 = time.perf_counter()
        s = load_dataset(name).stats()
        sec = time.perf_counter() - t0
        rows.append({**s, "load_seconds": round(sec, 2)})
        skipped = "; ".join(f"{k}: {v}" for k, v in s["skipped"].items()) or "–"
        q = s["queries"]
        lines.append(f"| {name} | {s['tools']} | {s['agents']} | {q['train']} | {q['val']} | {q['test']} | "
                     f"{s['labels_per_query']:.2f} | {s['dependencies']} | {skipped} | {sec:.1f} |")
        print(json.dumps({**s, "load_seconds": round(sec, 2)}), flush=True)
    (RESULTS / "datasets.json").write_text(json.dumps({"rows": rows, "command": "python benchmarks/datasets.py"},
                                                      indent=1) + "\n")
    write_readme_table("datasets", "\n".join(lines))


if __name__ == "__main__":
    main()
