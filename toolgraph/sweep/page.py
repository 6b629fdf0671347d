"""``report.html`` of a sweep: one self-contained page of inline SVG drawn here (no script from anywhere):
optimisation history, parallel coordinates, parameter importances, the trials with their val curves.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from toolgraph.sweep.trials import (
    _curve,
    _finite,
    _fmt,
    _maximize,
    _one_line,
    _param_keys,
    _point,
    _rows,
    _short,
    _trials,
    best_trial,
    param_importances,
    study_info,
    summary,
)

__all__ = ["render_html"]

COLD, WARM = (198, 219, 239), (8, 48, 107)  # the parallel coordinates' worst and best value colours


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round values from ``lo`` to ``hi``, about ``n`` of them (steps of 1, 2, 2.5 or 5 times a power of 10)."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if m * step >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


@dataclass
class _Axis:
    """One value axis: ``frac`` maps a value to 0 (bottom) .. 1 (top)."""

    label: str
    kind: str  # linear | log | categorical
    lo: float = 0.0
    hi: float = 1.0
    categories: list[str] = field(default_factory=list)

    def frac(self, value: Any) -> float:
        if self.kind == "categorical":
            return self.frac_of(_fmt(value))
        if not self.hi > self.lo:
            return 0.5
        if self.kind == "log":
            return math.log10(value / self.lo) / math.log10(self.hi / self.lo)
        return (value - self.lo) / (self.hi - self.lo)

    def ticks(self) -> list[tuple[float, str]]:
        if self.kind == "categorical":
            return [(self.frac_of(c), c) for c in self.categories]
        if self.kind == "log":
            powers = [10.0 ** k for k in range(math.ceil(math.log10(self.lo) - 1e-9),
                                               math.floor(math.log10(self.hi) + 1e-9) + 1)]
            return [(self.frac(v), f"{v:g}") for v in powers]
        return [(self.frac(v), f"{v:g}") for v in _ticks(self.lo, self.hi, 4)]

    def frac_of(self, category: str) -> float:
        i = self.categories.index(category)
        return i / (len(self.categories) - 1) if len(self.categories) > 1 else 0.5


def _axis(label: str, values: list[Any], dist: Any = None) -> _Axis:
    if values and all(_finite(v) for v in values):
        lo, hi = float(min(values)), float(max(values))
        return _Axis(label, "log" if lo > 0 and hi / lo >= 100 else "linear", lo, hi)
    shown = [_fmt(v) for v in values]
    choices = [_fmt(c) for c in dist.choices] if isinstance(dist, CategoricalDistribution) else []
    return _Axis(label, "categorical", categories=list(dict.fromkeys([*choices, *shown])))


def _color(t: float) -> str:
    """``t`` 0 (worst value) .. 1 (best) as a colour from light blue to dark blue."""
    r, g, b = (round(c + (w - c) * max(0.0, min(1.0, t))) for c, w in zip(COLD, WARM))
    return f"#{r:02x}{g:02x}{b:02x}"


def _svg(id_: str, width: int, height: int, title: str, body: list[str]) -> str:
    t = html.escape(title)
    return (f'<svg id="{id_}" class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{t}"><text x="{width / 2}" y="16" '
            f'text-anchor="middle" class="title">{t}</text>{"".join(body)}</svg>')


def _history(study: optuna.Study, metric: str) -> str:
    trials = _trials(study)
    shown = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and _finite(t.value)]
    if not shown:
        return '<p class="empty" id="history">No trial has a value yet: no optimisation history.</p>'
    width, height, left, top, bottom, right = 640, 300, 60, 28, 44, 130
    pw, ph = width - left - right, height - top - bottom
    ran = [t.number for t in trials if t.state != TrialState.WAITING]  # grid points queued: not on the x axis yet
    x0, x1 = min(ran), max(ran)
    y = _axis(metric, [t.value for t in shown])
    pad = (y.hi - y.lo) * 0.05 or 0.05
    y = _Axis(metric, "linear", y.lo - pad, y.hi + pad)

    def sx(n: float) -> float:
        return left + ((n - x0) / (x1 - x0) if x1 > x0 else 0.5) * pw

    def sy(v: float) -> float:
        return top + (1 - y.frac(v)) * ph

    body = [f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" class="frame"/>']
    for f, label in y.ticks():
        yy = top + (1 - f) * ph
        body.append(f'<line x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}" class="grid"/>'
                    f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{label}</text>')
    for n in _ticks(x0, x1, 8) if x1 > x0 else [x0]:
        if float(n).is_integer():
            body.append(f'<text x="{sx(n):.1f}" y="{top + ph + 16}" text-anchor="middle">{n:g}</text>')
    body.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle">trial</text>'
                f'<text x="14" y="{top + ph / 2}" text-anchor="middle" transform="rotate(-90 14 {top + ph / 2})">'
                f'{html.escape(metric)}</text>')
    better = max if _maximize(study) else min
    best, line = None, []
    for t in trials:
        if t.state == TrialState.COMPLETE and _finite(t.value):
            best = t.value if best is None else better(best, t.value)
        if best is not None:
            line.append(f"{sx(t.number):.1f},{sy(best):.1f}")
    if line:
        body.append(f'<polyline class="best-so-far" fill="none" stroke="#d62728" stroke-width="2" '
                    f'points="{" ".join(line)}"/>')
    for t in shown:
        tip = html.escape(f"trial #{t.number} ({t.state.name.lower()}): {t.value:.4f}; {_point(t.params)}")
        cls, fill = ("complete", "#1f77b4") if t.state == TrialState.COMPLETE else ("pruned", "none")
        body.append(f'<circle class="{cls}" data-trial="{t.number}" cx="{sx(t.number):.1f}" cy="{sy(t.value):.1f}" '
                    f'r="4" fill="{fill}" stroke="#1f77b4" stroke-width="1.5"><title>{tip}</title></circle>')
    for t in trials:
        if t.state == TrialState.FAIL:
            body.append(f'<text class="failed" data-trial="{t.number}" x="{sx(t.number):.1f}" y="{top + ph - 4}" '
                        f'text-anchor="middle" fill="#999"><title>trial #{t.number} failed</title>×</text>')
    lx = left + pw + 14
    for i, (swatch, label) in enumerate((
            ('<circle cx="5" cy="5" r="4" fill="#1f77b4"/>', "complete"),
            ('<circle cx="5" cy="5" r="4" fill="none" stroke="#1f77b4" stroke-width="1.5"/>', "pruned"),
            ('<line x1="0" x2="10" y1="5" y2="5" stroke="#d62728" stroke-width="2"/>', "best so far"),
            ('<text x="5" y="9" text-anchor="middle" fill="#999">×</text>', "failed"))):
        yy = top + 8 + 16 * i
        body.append(f'<g transform="translate({lx} {yy})">{swatch}<text x="16" y="9">{label}</text></g>')
    return _svg("history", width, height, f"Optimisation history ({metric}, {study.direction.name.lower()})", body)


def _parallel(study: optuna.Study, metric: str) -> str:
    finished = [t for t in _trials(study)
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and _finite(t.value)]
    keys = _param_keys(finished)
    drawn = [t for t in finished if all(k in t.params for k in keys)]
    if not drawn or not keys:
        return '<p class="empty" id="parallel">No finished trial yet: no parallel coordinates.</p>'
    axes = [_axis(k, [t.params[k] for t in drawn], drawn[-1].distributions.get(k)) for k in keys]
    vals = [t.value for t in drawn]
    lo, hi = min(vals), max(vals)
    axes.append(_Axis(metric, "linear", lo, hi))
    gap, left, top, bottom = 150, 70, 44, 30
    width, height = left * 2 + gap * (len(axes) - 1) + 90, 340
    ph = height - top - bottom
    maximize = _maximize(study)

    def goodness(v: float) -> float:
        t = (v - lo) / (hi - lo) if hi > lo else 1.0
        return t if maximize else 1 - t

    body = []
    best = best_trial(study)
    for t in sorted(drawn, key=lambda t: (goodness(t.value), best is not None and t.number == best.number)):
        pts = [a.frac(t.params[a.label]) for a in axes[:-1]] + [axes[-1].frac(t.value)]
        points = " ".join(f"{left + i * gap},{top + (1 - f) * ph:.1f}" for i, f in enumerate(pts))
        is_best = best is not None and t.number == best.number
        dash = ' stroke-dasharray="4 3"' if t.state == TrialState.PRUNED else ""
        tip = html.escape(f"trial #{t.number} ({t.state.name.lower()}): {t.value:.4f}; {_point(t.params)}")
        body.append(f'<polyline class="trial{" best" if is_best else ""}" data-trial="{t.number}" fill="none" '
                    f'stroke="{_color(goodness(t.value))}" stroke-width="{3 if is_best else 1.5}"{dash} '
                    f'points="{points}"><title>{tip}</title></polyline>')
    for i, a in enumerate(axes):
        x = left + i * gap
        body.append(f'<g class="axis" data-axis="{html.escape(a.label)}" data-scale="{a.kind}">'
                    f'<line x1="{x}" x2="{x}" y1="{top}" y2="{top + ph}" stroke="#555"/>'
                    f'<text x="{x}" y="{top - 10}" text-anchor="middle" class="label">{html.escape(_short(a.label, 22))}'
                    f'{" (log)" if a.kind == "log" else ""}<title>{html.escape(a.label)}</title></text>')
        for f, label in a.ticks():
            body.append(f'<text x="{x - 5}" y="{top + (1 - f) * ph + 4:.1f}" text-anchor="end">'
                        f'{html.escape(_short(label, 18))}</text>')
        body.append("</g>")
    lx = left + gap * (len(axes) - 1) + 24
    stops = "".join(f'<stop offset="{s}" stop-color="{_color(s)}"/>' for s in (0, 0.5, 1))
    worst, best_v = (lo, hi) if maximize else (hi, lo)
    body.append(f'<defs><linearGradient id="ramp" x1="0" x2="0" y1="1" y2="0">{stops}</linearGradient></defs>'
                f'<rect x="{lx}" y="{top}" width="12" height="{ph}" fill="url(#ramp)"/>'
                f'<text x="{lx + 16}" y="{top + 8}">{best_v:.4g} (best)</text>'
                f'<text x="{lx + 16}" y="{top + ph}">{worst:.4g}</text>')
    left_out = len(finished) - len(drawn)
    title = f"Parallel coordinates: {len(drawn)} finished trials (dashed: pruned)"
    title += f", {left_out} without every param not drawn" if left_out else ""
    return _svg("parallel", width, height, title, body)


def _importances(study: optuna.Study) -> str:
    found, note = param_importances(study)
    note_html = f'<p class="note">{html.escape(note)}</p>' if note else ""
    if not found:
        return f'<p class="empty" id="importances">{html.escape(note)}</p>'
    label_w = min(260, 12 + 7 * max(len(k) for k in found))
    bar_w, row, top = 360, 22, 28
    width, height = label_w + bar_w + 70, top + row * len(found) + 12
    top_v = max(found.values()) or 1.0
    body = []
    for i, (k, v) in enumerate(found.items()):
        y = top + i * row
        w = bar_w * v / top_v
        body.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{html.escape(k)}</text>'
                    f'<rect class="bar" data-param="{html.escape(k)}" x="{label_w}" y="{y + 3}" width="{w:.1f}" '
                    f'height="{row - 6}" fill="#1f77b4"><title>{html.escape(k)}: {v:.3f}</title></rect>'
                    f'<text x="{label_w + w + 6:.1f}" y="{y + 14}">{v:.3f}</text>')
    return _svg("importances", width, height, "Parameter importances (PED-ANOVA)", body) + note_html


def _sparkline(trial: FrozenTrial) -> str:
    curve = _curve(trial)
    if not curve:
        return "-"
    width, height, pad = 120, 26, 3
    vs = [v for _, v in curve]
    lo, hi = min(vs), max(vs)
    n = len(curve)

    def pt(i: int, v: float) -> str:
        x = pad + (i / (n - 1) if n > 1 else 0.5) * (width - 2 * pad)
        y = pad + (1 - ((v - lo) / (hi - lo) if hi > lo else 0.5)) * (height - 2 * pad)
        return f"{x:.1f},{y:.1f}"

    points = [pt(i, v) for i, (_, v) in enumerate(curve)]
    last = points[-1].split(",")
    tip = html.escape(f"{n} validations: first {vs[0]:.4f}, last {vs[-1]:.4f}, range {lo:.4f}..{hi:.4f}")
    return (f'<svg class="spark" data-points="{n}" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
            f'<title>{tip}</title><polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{" ".join(points)}"/>'
            f'<circle cx="{last[0]}" cy="{last[1]}" r="2" fill="#1f77b4"/></svg>')


def _html_table(study: optuna.Study) -> str:
    head, rows, trials = _rows(study)
    cells = "".join(f"<th>{html.escape(c)}</th>" for c in head[:-1])
    body = []
    for t, row in zip(trials, rows):
        cls = ' class="best"' if row[-1] else ""
        tds = "".join(f'<td class="num">{html.escape(c)}</td>' if c[:1].isdigit() or c == "-"
                      else f"<td>{html.escape(c)}</td>" for c in row[:-1])
        error = t.user_attrs.get("error")
        note = html.escape(str(t.user_attrs.get("exit") or ""))
        if error:
            note += f' <span class="error">{html.escape(_short(_one_line(error), 300))}</span>'
        marker = "★ best" if row[-1] else ""
        body.append(f'<tr data-trial="{t.number}" data-state="{t.state.name.lower()}"{cls}>{tds}<td>{marker}</td>'
                    f"<td>{_sparkline(t)}</td><td class=\"note\">{note}</td></tr>")
    return (f'<table id="trials"><thead><tr>{cells}<th>best</th><th>validations curve</th><th>exit</th></tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}th,td{border:1px solid #ddd;padding:3px 8px;vertical-align:middle}
thead th{background:#f4f4f4}td.num{text-align:right}tr.best td{font-weight:bold;background:#fff8e1}
td.note{max-width:420px}.error{color:#b00}.chart{margin:6px 12px 6px 0;display:block}.chart text{font-size:11px;fill:#333}
.chart .title{font-size:13px;font-weight:bold}.chart .label{font-weight:bold}.chart .grid{stroke:#eee}
.chart .frame{fill:none;stroke:#999}p.note,p.empty{color:#555}#errors{color:#b00}pre.config{background:#f7f7f7;
padding:8px;max-height:420px;overflow:auto;font-size:12px}
"""

SCRIPT = """
window.__errors = [];
window.addEventListener('error', function (e) {
  window.__errors.push(String(e.message));
  document.getElementById('errors').textContent = window.__errors.join('\\n');
});
document.body.dataset.ready = '1';
"""


def render_html(study: optuna.Study, best_yaml: str | None = None, note: str = "") -> str:
    """The report page of a study (module docstring); ``best_yaml``: the best config's text, shown folded."""
    info = study_info(study)
    metric = info.get("metric") or "value"
    pruner = (info.get("pruner") or {}).get("name", "none")
    facts = (f"{metric} ({study.direction.name.lower()}), method {info.get('method', '?')}, pruner {pruner}, "
             f"budget {info.get('budget') if info.get('budget') is not None else 'none'}; folder {info.get('folder')}")
    sections = [f'<p class="facts">{html.escape(facts)}</p>', f'<p class="summary">{html.escape(summary(study))}</p>']
    if note:
        sections.append(f'<p class="note">{html.escape(note)}</p>')
    if best_yaml is not None:
        sections.append(f'<details><summary>best.yaml</summary><pre class="config">{html.escape(best_yaml)}</pre>'
                        "</details>")
    sections += ["<h2>Optimisation history</h2>", _history(study, metric), "<h2>Parallel coordinates</h2>",
                 _parallel(study, metric), "<h2>Parameter importances</h2>", _importances(study),
                 "<h2>Trials</h2>", _html_table(study)]
    title = html.escape(study.study_name)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f'<style>{STYLE}</style></head><body><h1>{title}</h1><pre id="errors"></pre>{"".join(sections)}'
            f"<script>{SCRIPT}</script></body></html>\n")


