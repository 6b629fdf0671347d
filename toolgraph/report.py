"""``toolgraph report RUN... --html FILE``: one self-contained page that compares runs.

Each RUN is a training run folder or an evaluation folder (``results.json`` + ``rankings.jsonl``;
``logs/metrics.csv`` when it trained). The page holds, side by side: the metrics table (best of
each column in bold; click a header to sort), Recall@K and NDCG@K curves (from the rankings, with
the metric definitions of ``toolgraph.metrics``), training curves (loss and val metrics against the
step), the per-query wins and losses of each run against the first (query text, gold tools, each
run's top tools), the most-missed gold tools and the tools most often ranked above a gold one.
Charts are inline SVG, style and script inline: the page needs no network and no other file.
Query texts and tool names come from the runs' dataset when ``TOOLGRAPH_DATA`` has it, else ids.
"""

from __future__ import annotations

import csv
import html
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from toolgraph.errors import DataError
from toolgraph.files import write_text_atomic
from toolgraph.metrics import METRICS, hit_matrix, intervals, paired_difference, per_query
from toolgraph.runs import read_results

__all__ = ["Run", "format_significance", "load_run", "render_html", "significance", "write_html"]

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
TABLE_METRICS = ["recall", "ndcg", "pass"]
CURVE_DEPTH = 20  # K of the Recall@K / NDCG@K curves
TRAINING_KEYS = ["train/loss", "val/recall@5", "val/ndcg@5"]


@dataclass
class Run:
    name: str
    folder: Path
    results: dict[str, Any]
    queries: list[str] = field(default_factory=list)  # query ids, rankings order
    golds: list[list[str]] = field(default_factory=list)
    tops: list[list[str]] = field(default_factory=list)
    history: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # logged key -> (step, value)

    @property
    def dataset(self) -> str:
        return ((self.results.get("config") or {}).get("data") or {}).get("name", "?")


def _history(folder: Path) -> dict[str, list[tuple[float, float]]]:
    path = folder / "logs" / "metrics.csv"
    if not path.is_file():
        return {}
    out: dict[str, list[tuple[float, float]]] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for n, row in enumerate(csv.DictReader(f), 2):  # line 1 is the header
            step = row.get("step")
            for key in TRAINING_KEYS:
                if step and row.get(key):
                    try:
                        out.setdefault(key, []).append((float(step), float(row[key])))
                    except ValueError:
                        raise DataError(f"line {n}: {key} or step is not a number ({step!r}, {row[key]!r})",
                                        path) from None
    return out


def load_run(folder: str | Path, name: str | None = None) -> Run:
    folder = Path(folder)
    run = Run(name or folder.resolve().name, folder, read_results(folder / "results.json"))
    path = folder / "rankings.jsonl"
    if not path.is_file():
        raise DataError("no rankings.jsonl: evaluate the run first (toolgraph evaluate --out FOLDER)", path)
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                run.queries.append(str(row["query"]))
                run.golds.append([str(g) for g in row["gold"]])
                run.tops.append([str(t["id"]) for t in row["top"]])
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise DataError(f"line {n}: not a rankings row ({type(e).__name__}: {e})", path) from None
    run.history = _history(folder)
    return run


def _texts(runs: list[Run]) -> tuple[dict[str, str], dict[str, str], str]:
    """Query texts and tool names of the runs' dataset (empty, with the reason, when it is not here)."""
    config = runs[0].results.get("config") or {}
    data = config.get("data") or {}
    try:
        from toolgraph.data import load_dataset

        ds = load_dataset(data["name"], data.get("root"), **(data.get("options") or {}))
    except Exception as e:  # noqa: BLE001 - the page still renders, with ids
        return {}, {}, f"query texts and tool names not shown ({type(e).__name__}: {str(e)[:200]})"
    return {q.id: q.text for q in ds.queries}, {t.id: t.name for t in ds.tools}, ""


# ---- charts ------------------------------------------------------------------------------------
def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if m * step >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def svg_lines(series: list[tuple[str, list[float], list[float]]], title: str, xlabel: str, ylabel: str,
              width: int = 520, height: int = 300) -> str:
    """A line chart as inline SVG; ``series``: (label, xs, ys)."""
    pts = [(x, y) for _, xs, ys in series for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    pad = (y1 - y0) * 0.05 or 0.05
    y0, y1 = y0 - pad, y1 + pad
    x1 = x1 if x1 > x0 else x0 + 1
    legend = min(200, 12 + 7 * max(len(label) for label, _, _ in series))  # the legend sits right of the plot
    width += legend
    left, right, top, bottom = 56, 12 + legend, 28, 44
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{left + pw / 2}" y="16" text-anchor="middle" class="title">{html.escape(title)}</text>']
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in _ticks(x0, x1, 6):
        out.append(f'<text x="{sx(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{t:g}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="frame"/>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">{html.escape(xlabel)}</text>')
    out.append(f'<text x="14" y="{top + ph / 2}" text-anchor="middle" transform="rotate(-90 14 {top + ph / 2})">'
               f'{html.escape(ylabel)}</text>')
    for i, (label, xs, ys) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys, strict=True) if math.isfinite(y))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}" '
                   f'data-series="{html.escape(label)}"/>')
        lx = left + pw + 12
        out.append(f'<rect x="{lx}" y="{top + 8 + 16 * i}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="{top + 17 + 16 * i}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "".join(out)


# ---- sections ------------------------------------------------------------------------------------
def _metrics_table(runs: list[Run]) -> str:
    ks = sorted({int(k.split("@")[1]) for r in runs for k in r.results.get("metrics", {}) if "@" in k})
    cols = [f"recall@{k}" for k in ks] + [f"{m}@{k}" for m in TABLE_METRICS[1:] for k in ks if k in (3, 5, 10)]
    cols += ["mrr"]  # the columns of `toolgraph report`'s text table
    cols = [c for c in cols if any(c in r.results.get("metrics", {}) for r in runs)]
    best = {c: max((r.results.get("metrics", {}).get(c, -1) for r in runs), default=-1) for c in cols}
    head = "".join(f'<th data-col="{i + 1}">{html.escape(c)}</th>' for i, c in enumerate(cols))
    rows = []
    for r in runs:
        m = r.results.get("metrics", {})
        cells = []
        for c in cols:
            v = m.get(c)
            txt = "" if v is None else f"{v:.4f}"
            bold = ' class="best"' if v is not None and len(runs) > 1 and v == best[c] else ""
            ci = (r.results.get("intervals") or {}).get(c)  # evaluations since eval.bootstrap: 95 % interval
            tip = f' title="95 % interval [{ci[0]:.4f}, {ci[1]:.4f}]"' if ci and len(ci) == 2 else ""
            cells.append(f'<td data-run="{html.escape(r.name)}" data-metric="{c}"{bold}{tip}>{txt}</td>')
        rows.append(f'<tr><th scope="row">{html.escape(r.name)}</th>{"".join(cells)}</tr>')
    return (f'<table id="metrics" class="sortable"><thead><tr><th data-col="0">run</th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def _per_query(run: Run, ks: list[int]) -> dict[str, Any]:
    hits, n_rel = hit_matrix(run.tops, run.golds)
    return per_query(hits, n_rel, ks, ("recall", "ndcg"))


def _curves(runs: list[Run]) -> str:
    ks = list(range(1, CURVE_DEPTH + 1))
    charts = []
    for metric, label in (("recall", "Recall@K"), ("ndcg", "NDCG@K")):
        series = []
        for r in runs:
            pq = _per_query(r, ks)
            series.append((r.name, [float(k) for k in ks], [float(pq[f"{metric}@{k}"].mean()) for k in ks]))
        charts.append(svg_lines(series, f"{label} on {runs[0].dataset} (test)", "K", label))
    return "".join(charts)


def _training(runs: list[Run]) -> str:
    charts = []
    for key in TRAINING_KEYS:
        series = [(r.name, [s for s, _ in r.history[key]], [v for _, v in r.history[key]]) for r in runs
                  if r.history.get(key)]
        if series:
            charts.append(svg_lines(series, key, "step", key))
    return "".join(charts) or "<p>No training logs (evaluation folders only).</p>"


def _tools(ids: list[str], gold: set[str], names: dict[str, str]) -> str:
    items = []
    for t in ids:
        cls = ' class="gold"' if t in gold else ""
        items.append(f"<li{cls}>{html.escape(names.get(t, t))}</li>")
    return f'<ol>{"".join(items)}</ol>'


def _wins_losses(base: Run, other: Run, texts: dict[str, str], names: dict[str, str], k: int = 5,
                 limit: int = 25) -> str:
    a = dict(zip(base.queries, _per_query(base, [k])[f"recall@{k}"].tolist(), strict=True))
    rows_b = {q: i for i, q in enumerate(other.queries)}
    rec_b = _per_query(other, [k])[f"recall@{k}"].tolist()
    rows_a = {q: i for i, q in enumerate(base.queries)}
    diffs = [(rec_b[rows_b[q]] - a[q], q) for q in base.queries if q in rows_b]
    wins = sorted((d for d in diffs if d[0] > 0), key=lambda d: (-d[0], d[1]))
    losses = sorted((d for d in diffs if d[0] < 0), key=lambda d: (d[0], d[1]))
    paired = ""
    if diffs:  # the mean difference over the common queries, and how sure it is (toolgraph.metrics)
        common = [q for _, q in diffs]
        d = paired_difference(torch.tensor([a[q] for q in common]), torch.tensor([rec_b[rows_b[q]] for q in common]),
                              samples=2000)
        paired = (f' Mean difference <b>{d["difference"]:+.4f}</b> (95 % interval [{d["low"]:+.4f}, '
                  f'{d["high"]:+.4f}], paired bootstrap p = {d["p"]:.3f}).')
    out = [f'<p class="summary" data-wins="{len(wins)}" data-losses="{len(losses)}" data-common="{len(diffs)}">'
           f'<b>{html.escape(other.name)}</b> against <b>{html.escape(base.name)}</b> on {len(diffs)} common queries '
           f'(Recall@{k}): better on <b>{len(wins)}</b>, worse on <b>{len(losses)}</b>.{paired}</p>']
    for title, items in (("wins", wins), ("losses", losses)):
        if not items:
            continue
        rows = []
        for d, q in items[:limit]:
            i, j = rows_a[q], rows_b[q]
            gold = set(base.golds[i])
            rows.append(f'<tr data-query="{html.escape(q)}"><td>{html.escape(texts.get(q, q))}</td>'
                        f'<td>{_tools(base.golds[i], gold, names)}</td><td class="num">{d:+.2f}</td>'
                        f'<td>{_tools(base.tops[i][:k], gold, names)}</td><td>{_tools(other.tops[j][:k], gold, names)}</td></tr>')
        out.append(f'<h4>{title} ({len(items)}{", first " + str(limit) if len(items) > limit else ""})</h4>'
                   f'<table class="queries {title}"><thead><tr><th>query</th><th>gold</th><th>Δ R@{k}</th>'
                   f'<th>{html.escape(base.name)} top {k}</th><th>{html.escape(other.name)} top {k}</th></tr></thead>'
                   f'<tbody>{"".join(rows)}</tbody></table>')
    return "".join(out)


def missed_and_above(run: Run, k: int = 5) -> tuple[Counter, Counter]:
    """(gold tools missing from the top K, counted; tools ranked above a gold tool, counted)."""
    missed, above = Counter(), Counter()
    for gold, top in zip(run.golds, run.tops, strict=True):
        g = set(gold)
        missed.update(t for t in gold if t not in top[:k])
        ranks = [i for i, t in enumerate(top) if t in g]
        last = ranks[-1] if ranks else len(top)  # everything listed above the last gold one found
        above.update(t for t in top[:last] if t not in g)
    return missed, above


def _counts(runs: list[Run], names: dict[str, str], k: int = 5, limit: int = 15) -> str:
    out = []
    for r in runs:
        missed, above = missed_and_above(r, k)
        cells = []
        for title, counter in ((f"gold tools most often missing from the top {k}", missed),
                               ("tools most often ranked above a gold tool", above)):
            rows = "".join(f"<tr><td>{html.escape(names.get(t, t))}</td><td class=\"num\">{n}</td></tr>"
                           for t, n in counter.most_common(limit))
            cells.append(f'<div><h4>{title}</h4><table class="counts"><tbody>{rows}</tbody></table></div>')
        out.append(f'<h3>{html.escape(r.name)}</h3><div class="pair">{"".join(cells)}</div>')
    return "".join(out)


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 8px;vertical-align:top}
thead th{background:#f4f4f4;cursor:pointer}td.best{font-weight:bold}td.num,td[data-metric]{text-align:right}
li.gold{color:#1a7f37;font-weight:bold}ol{margin:0;padding-left:20px}.chart{margin:6px 12px 6px 0}
.chart text{font-size:11px;fill:#333}.chart .title{font-size:13px;font-weight:bold}.chart .grid{stroke:#eee}
.chart .frame{fill:none;stroke:#999}.pair{display:flex;gap:32px;flex-wrap:wrap}#errors{color:#b00}
"""

SCRIPT = """
window.__errors = [];
window.addEventListener('error', function (e) {
  window.__errors.push(String(e.message));
  document.getElementById('errors').textContent = window.__errors.join('\\n');
});
document.querySelectorAll('table.sortable').forEach(function (table) {
  table.querySelectorAll('thead th').forEach(function (th) {
    th.addEventListener('click', function () {
      var col = Number(th.dataset.col), body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var key = function (r) { var v = r.cells[col].textContent; var n = parseFloat(v); return isNaN(n) ? v : -n; };
      rows.sort(function (a, b) { var x = key(a), y = key(b); return x < y ? -1 : x > y ? 1 : 0; });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
document.body.dataset.ready = '1';
"""


def _metric_values(run: Run, metric: str) -> dict[str, float]:
    """Query id -> the per-query value of ``metric`` (``recall@5``, ``mrr``, ...) from the run's rankings."""
    name, _, k = metric.partition("@")
    if name not in METRICS or (name == "mrr") != (not k) or (k and not k.isdigit()):
        raise DataError(f"--metric {metric!r}: expected one of {', '.join(m for m in METRICS if m != 'mrr')} with @K "
                        "(recall@5), or mrr")
    hits, n_rel = hit_matrix(run.tops, run.golds)
    values = per_query(hits, n_rel, [int(k)] if k else [1], [name])[metric]
    return dict(zip(run.queries, values.tolist(), strict=True))


def significance(runs: list[Run], metric: str = "recall@5", samples: int = 10000) -> list[dict[str, Any]]:
    """Each run's ``metric`` with its 95 % bootstrap interval over its queries, and for every run after
    the first the paired difference from the first over the queries both ranked (interval, p-value:
    ``toolgraph.metrics.paired_difference``). Runs that share no query with the first are an error."""
    values = [_metric_values(r, metric) for r in runs]
    rows = []
    for i, (run, v) in enumerate(zip(runs, values, strict=True)):
        series = torch.tensor(list(v.values()), dtype=torch.float64)
        lo, hi = intervals({metric: series}, samples)[metric]
        row: dict[str, Any] = {"run": run.name, metric: float(series.mean()), "low": lo, "high": hi,
                               "queries": len(v)}
        if i:
            common = [q for q in values[0] if q in v]
            if not common:
                raise DataError(f"no query in common with {runs[0].folder}/rankings.jsonl: runs on different "
                                "splits or datasets cannot be compared", run.folder / "rankings.jsonl")
            a = torch.tensor([values[0][q] for q in common], dtype=torch.float64)
            b = torch.tensor([v[q] for q in common], dtype=torch.float64)
            row["paired"] = {**paired_difference(a, b, samples), "queries": len(common)}
        rows.append(row)
    return rows


def format_significance(rows: list[dict[str, Any]], metric: str, samples: int) -> str:
    head = (f"{metric} with 95 % bootstrap intervals over queries ({samples} resamples); "
            f"paired difference from {rows[0]['run']} on the queries both ranked:")
    width = max(len(r["run"]) for r in rows) + 2
    lines = [head, f"{'run'.ljust(width)}{metric:>10}  {'interval':<18}  {'difference':>10}  {'interval':<20}"
                   f"  {'p':>6}  queries"]
    for r in rows:
        line = f"{r['run'].ljust(width)}{r[metric]:>10.4f}  [{r['low']:.4f}, {r['high']:.4f}]"
        p = r.get("paired")
        if p:
            line += (f"  {p['difference']:>+10.4f}  [{p['low']:+.4f}, {p['high']:+.4f}]  {p['p']:>6.3f}"
                     f"  {p['queries']}")
        else:
            line += f"  {'':>10}  {'':<20}  {'':>6}  {r['queries']}"
        lines.append(line.rstrip())
    return "\n".join(lines)


def render_html(runs: list[Run], k: int = 5) -> str:
    if not runs:
        raise ValueError("report: no runs")
    texts, names, note = _texts(runs)
    sections = [f"<h2>Metrics ({html.escape(runs[0].dataset)}, test)</h2>", _metrics_table(runs),
                "<h2>Recall@K and NDCG@K</h2>", _curves(runs), "<h2>Training</h2>", _training(runs)]
    if len(runs) > 1:
        sections.append(f"<h2>Per-query wins and losses against {html.escape(runs[0].name)}</h2>")
        sections += [_wins_losses(runs[0], r, texts, names, k) for r in runs[1:]]
    sections += ["<h2>Misses</h2>", _counts(runs, names, k)]
    if note:
        sections.insert(0, f'<p class="note">{html.escape(note)}</p>')
    title = "toolgraph report: " + ", ".join(r.name for r in runs)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1><pre id=\"errors\"></pre>"
            f'{"".join(sections)}<script>{SCRIPT}</script></body></html>\n')


def write_html(folders: list[str | Path], path: str | Path, k: int = 5) -> Path:
    runs = [load_run(f) for f in folders]
    names = [r.name for r in runs]
    for i, r in enumerate(runs):  # two folders with the same name: keep them apart
        if names.count(r.name) > 1:
            r.name = f"{r.name} ({Path(r.folder).parent.name or i})"
    return write_text_atomic(path, render_html(runs, k))
