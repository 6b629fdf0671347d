"""Read/write benchmarks/results/<name>.json ({"rows": [...]}) and write generated tables into pages.

A generated table lives in a markdown page (README.md or a docs/ page) between two markers:

    <!-- name:start -->
    ...generated text...
    <!-- name:end -->

``write_block(page, name, text)`` replaces only what lies between the markers of ``name`` on
``page``; everything else on the page is hand-written and kept. Each benchmarks/*.py script has a
``render(page=...)`` step whose default page is the one its blocks live on today.
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
_KEY = ("method", "dataset", "split", "setting")


def machine() -> str:
    return f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}"


def upsert(name: str, rows: list[dict], key: tuple[str, ...] = _KEY) -> Path:
    """Replace rows with the same (method, dataset, split, setting) — or ``key`` — and keep the others."""
    path = RESULTS / f"{name}.json"
    old = json.loads(path.read_text())["rows"] if path.exists() else []
    new_keys = {tuple(r.get(k) for k in key) for r in rows}
    merged = [r for r in old if tuple(r.get(k) for k in key) not in new_keys] + rows
    merged.sort(key=lambda r: tuple(str(r.get(k)) for k in key))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": merged}, indent=1) + "\n")
    return path


def quality_table(rows: list[dict], extra: tuple[str, ...] = ()) -> str:
    """Markdown table of the quality rows; ``extra`` adds row fields (e.g. training_steps, seconds)."""
    cols = ["recall@3", "recall@5", "recall@7", "ndcg@5", "pass@5", "mrr"]
    lines = ["| dataset | split | setting | method | encoder | queries | " + " | ".join(cols + list(extra)) + " |",
             "|---|---|---|---|---|---|" + "---|" * (len(cols) + len(extra))]
    for r in rows:
        if not any(c in r["metrics"] for c in cols):
            continue
        cells = [f"{r['metrics'][c]:.3f}" if c in r["metrics"] else "–" for c in cols]
        cells += [str(r.get(e, "–")) for e in extra]
        lines.append(f"| {r['dataset']} | {r['split']} | {r['setting']} | {r['method']} | {r.get('encoder') or '–'} "
                     f"| {r.get('queries', '–')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def page_path(page: str | Path) -> Path:
    """``page`` as given, or relative to the repository root when it is a relative path that does
    not exist from the current directory (so ``docs/results.md`` works from anywhere)."""
    path = Path(page)
    if path.is_absolute() or path.exists():
        return path
    return ROOT / path


def block_pattern(marker: str) -> re.Pattern:
    return re.compile(rf"(<!-- {re.escape(marker)}:start -->\n)(.*?)(<!-- {re.escape(marker)}:end -->)", re.S)


def read_block(page: str | Path, marker: str) -> str:
    """The text between ``<!-- marker:start -->`` and ``<!-- marker:end -->`` on ``page``."""
    path = page_path(page)
    found = block_pattern(marker).findall(path.read_text())
    if len(found) != 1:
        raise SystemExit(f"{path}: expected one <!-- {marker}:start --> ... <!-- {marker}:end --> block, "
                         f"found {len(found)}")
    return found[0][1]


def write_block(page: str | Path, marker: str, text: str) -> Path:
    """Replace the block between <!-- {marker}:start --> and <!-- {marker}:end --> on ``page``
    (README.md or a docs/ page); the rest of the page is left as it is. Returns the page's path."""
    path = page_path(page)
    read_block(path, marker)  # exactly one such block, or a clear error
    old = path.read_text()
    new = block_pattern(marker).sub(lambda m: m.group(1) + text.rstrip("\n") + "\n" + m.group(3), old)
    if new != old:
        path.write_text(new)
    return path
