"""Read/write benchmarks/results/<name>.json ({"rows": [...]}) and render the README table."""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
README = Path(__file__).resolve().parents[1] / "README.md"
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


def write_readme_table(marker: str, text: str) -> None:
    """Replace the block between <!-- {marker}:start --> and <!-- {marker}:end --> in README.md."""
    readme = README.read_text()
    pattern = re.compile(rf"(<!-- {marker}:start -->\n).*?(<!-- {marker}:end -->)", re.S)
    if not pattern.search(readme):
        raise SystemExit(f"README.md has no <!-- {marker}:start --> ... <!-- {marker}:end --> block")
    README.write_text(pattern.sub(lambda m: m.group(1) + text + "\n" + m.group(2), readme))
