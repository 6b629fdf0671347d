"""Evaluate any Retriever on a dataset split: metrics, per-query rankings, curves, timings.

    report = run(load_config(EvaluateConfig, ["configs/eval/bm25_toollens.yaml"]))   # = toolgraph evaluate
    report = evaluate(retriever, ds, "test", cfg.eval)                               # a retriever you hold

``run(cfg)`` is the library entry of an evaluation, beside ``training.train(cfg)``: the retriever
(built from ``cfg.retriever``, or loaded from ``cfg.checkpoint``), the dataset (``cfg.data``), the
metrics on ``cfg.data.split``, and, with ``cfg.out``, the run folder. Outputs are written so that an
interrupted run never leaves a half-written or mismatched folder (``toolgraph/runs.py``): every file
goes to a hidden temp name and is renamed over the old one, and ``results.json`` is removed when a run
starts writing and written last, so it is the mark of a complete run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from toolgraph import data
from toolgraph import metrics as M
from toolgraph.config import EvalConfig, EvaluateConfig, to_dict, to_yaml
from toolgraph.data.request_pieces import sentences
from toolgraph.data.schema import Query, ToolDataset
from toolgraph.errors import ConfigError
from toolgraph.files import atomic_path, write_text_atomic
from toolgraph.retrieval.base import Ranking, Retriever
from toolgraph.retrieval.loading import load, resolve_retriever
from toolgraph.runs import (
    check_output_folder,
    disk_full_is_an_error,
    replace_folder,
    retire_results,
    run_config,
    write_results,
)


@dataclass
class Report:
    metrics: dict[str, float]
    agent_metrics: dict[str, float]
    ranking: Ranking
    golds: list[list[str]]
    query_ids: list[str]
    timings: dict[str, float]
    curves: dict[str, list[float]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    intervals: dict[str, list[float]] = field(default_factory=dict)  # metric -> [low, high] (95 %, bootstrap)
    label: str = ""  # what ran on what: "bm25 on toollens/test (1877 queries)" (set by run())


def query_steps(queries: list[Query], mode: str) -> tuple[list[list[str]], dict[str, int]]:
    """Step texts per query for step-wise querying, and how many came from where."""
    if mode not in ("annotated", "sentences", "auto"):
        raise ConfigError(f"eval.steps: {mode!r} is not annotated, sentences or auto")
    out, counts = [], {"annotated": 0, "sentences": 0}
    for q in queries:
        if q.steps and mode != "sentences":
            out.append(list(q.steps))
            counts["annotated"] += 1
        elif mode == "annotated":
            raise ConfigError(f"eval.steps: annotated, but query {q.id!r} has no steps (use auto or sentences)")
        else:
            out.append(sentences(q.text))
            counts["sentences"] += 1
    counts["steps_per_query"] = round(sum(map(len, out)) / max(len(out), 1), 3)
    return out, counts


def evaluate(retriever: Retriever, ds: ToolDataset, split: str, cfg: EvalConfig) -> Report:
    queries = ds.split(split)
    if cfg.max_queries is not None:
        queries = queries[: cfg.max_queries]
    if not queries:
        raise ConfigError(f"data.split: {ds.name!r} has no {split!r} queries")
    depth = max(cfg.depth, max(cfg.ks))
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    retriever.fit(ds)  # usage-driven retrievers read the train split here; others ignore it
    retriever.index(ds.tools)
    timings["index_s"] = time.perf_counter() - t0
    if cfg.query_mode not in ("direct", "step-wise"):
        raise ConfigError(f"eval.query_mode: {cfg.query_mode!r} is not direct or step-wise")
    texts = [q.text for q in queries]
    steps, notes = None, {"query_mode": cfg.query_mode}
    if cfg.query_mode == "step-wise":
        steps, counts = query_steps(queries, cfg.steps)
        notes.update(steps=counts, step_merge=cfg.step_merge)
    t0 = time.perf_counter()
    label = f"ranking {split}"  # a progress bar over the queries, with an ETA
    if steps is None:
        ranking = retriever.retrieve(texts, depth, cfg.batch_size, label)
    else:
        ranking = retriever.retrieve_steps(steps, depth, cfg.step_merge, cfg.batch_size, label)
    timings["retrieve_s"] = time.perf_counter() - t0
    timings["queries_per_s"] = len(queries) / max(timings["retrieve_s"], 1e-9)
    golds = [list(q.tools) for q in queries]

    hits, n_rel = M.hit_matrix(ranking.ids, golds, depth)
    values = M.per_query(hits, n_rel, cfg.ks, cfg.metrics)
    metrics = {k: float(v.mean()) for k, v in values.items()}
    intervals = {k: [round(lo, 6), round(hi, 6)] for k, (lo, hi) in
                 (M.intervals(values, cfg.bootstrap) if cfg.bootstrap else {}).items()}
    curve_ks = list(range(1, depth + 1))
    curve = M.per_query(hits, n_rel, curve_ks, ["recall", "pass"])
    curves = {"k": curve_ks, "recall": [float(curve[f"recall@{k}"].mean()) for k in curve_ks],
              "pass": [float(curve[f"pass@{k}"].mean()) for k in curve_ks]}

    agent_metrics: dict[str, float] = {}
    owner = ds.agent_of()
    if cfg.agent_level and owner:
        if getattr(retriever, "ranks_agents", False):  # agent routers rank agents themselves
            agent_rank = retriever.retrieve_agents(texts, depth, steps, cfg.batch_size, cfg.step_merge,
                                                   f"ranking agents {split}").ids
        else:
            agent_rank = [M.roll_up(r, owner) for r in ranking.ids]
        agent_gold = [sorted({owner[t] for t in g if t in owner}) for g in golds]
        agent_metrics = M.compute(agent_rank, agent_gold, cfg.ks, cfg.metrics)
    return Report(metrics, agent_metrics, ranking, golds, [q.id for q in queries], timings, curves, notes, intervals)


def format_table(rows: dict[str, dict[str, float]], ks: list[int]) -> str:
    """One row per system: Recall@K for every K, NDCG and Pass at K in {3, 5, 10}, and MRR."""
    cols = [f"recall@{k}" for k in ks] + [f"{n}@{k}" for n in ("ndcg", "pass") for k in ks if k in (3, 5, 10)]
    cols += ["mrr"]
    width = max([len("system")] + [len(r) for r in rows]) + 2
    head = "system".ljust(width) + "".join(c.rjust(max(len(c), 6) + 2) for c in cols)
    lines = [head, "-" * len(head)]
    for system, m in rows.items():
        lines.append(system.ljust(width) + "".join((f"{m[c]:.4f}" if c in m else "-").rjust(max(len(c), 6) + 2) for c in cols))
    return "\n".join(lines)


def write_report(report: Report, out: str | Path, config: Any, ds: ToolDataset,
                 extra: Callable[[], dict[str, Any]] | None = None) -> Path:
    """rankings.jsonl, curves.png, then results.json (last: it marks the folder complete) in ``out``,
    each written to a temp name and renamed. ``extra()`` adds top-level entries to results.json."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    retire_results(out)
    with atomic_path(out / "rankings.jsonl") as tmp, tmp.open("w", encoding="utf-8") as f:
        for qid, gold, ids, scores in zip(report.query_ids, report.golds, report.ranking.ids,
                                          report.ranking.scores.tolist(), strict=True):
            top = [{"id": i, "score": round(s, 6)} for i, s in zip(ids, scores, strict=True)]
            f.write(json.dumps({"query": qid, "gold": gold, "top": top}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    plot_curves(report.curves, out / "curves.png", title=f"{ds.name}")
    results = {"metrics": report.metrics, "intervals": report.intervals, "agent_metrics": report.agent_metrics,
               "config": to_dict(config),
               "dataset": ds.stats(), "timings": report.timings, "curves": report.curves, "notes": report.notes}
    write_results(out, {**results, **(extra() if extra is not None else {})})
    return out


def plot_curves(curves: dict[str, list[float]], path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = curves["k"][:50]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ks, curves["recall"][: len(ks)], label="Recall@K")
    ax.plot(ks, curves["pass"][: len(ks)], label="Pass@K")
    ax.set_xlabel("K")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100, format=Path(path).suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)


def run(cfg: EvaluateConfig, retriever: Retriever | None = None, ds: ToolDataset | None = None) -> Report:
    """One evaluation run, as ``toolgraph evaluate`` does it: the retriever (``retriever``, else loaded from
    ``cfg.checkpoint``, else built from ``cfg.retriever``) fitted and indexed on the dataset (``ds``, else
    ``cfg.data`` prepared), scored on ``cfg.data.split``; with ``cfg.out``, that folder gets config.yaml,
    the built retriever (``retriever/``: what ``fit`` learned loads with ``toolgraph.load``), rankings.jsonl,
    curves.png and results.json (last). A loaded checkpoint's own config is recorded under ``retriever``."""
    if cfg.out:  # before any work: never write into someone else's folder
        check_output_folder(cfg.out, "out")
    ds = ds if ds is not None else data.prepare_dataset(cfg.data)  # looked up here: tests stop it there
    loaded = retriever is None and bool(cfg.checkpoint)
    if retriever is None:
        retriever = load(cfg.checkpoint) if loaded else resolve_retriever(cfg.retriever, "retriever")
    cfg = replace(cfg, retriever=retriever.config)  # what ran, not the section's defaults
    report = evaluate(retriever, ds, cfg.data.split, cfg.eval)
    system = f"{retriever.name} from {cfg.checkpoint}" if loaded else retriever.name
    report.label = f"{system} on {ds.name}/{cfg.data.split} ({len(report.query_ids)} queries)"
    if cfg.out:
        write_run(cfg.out, cfg, report, ds, None if cfg.checkpoint else retriever)
    return report


def write_run(out: str | Path, cfg: Any, report: Report, ds: ToolDataset, retriever: Retriever | None = None,
              extra: Callable[[], dict[str, Any]] | None = None) -> Path:
    """An evaluation folder: config.yaml, ``retriever`` saved under retriever/ (what ``fit`` learned loads
    with ``toolgraph.load``; None: a loaded checkpoint, not saved again), rankings.jsonl, curves.png and
    results.json (last, with ``extra()``'s entries). The old results.json goes first and the new one comes
    last: never a mix of two runs; a full disk is a DataError naming the folder, not a traceback."""
    out = Path(out)
    with disk_full_is_an_error(out):
        out.mkdir(parents=True, exist_ok=True)
        retire_results(out)
        write_text_atomic(out / "config.yaml", to_yaml(cfg))
        if retriever is not None:
            replace_folder(out / "retriever", retriever.save, "out retriever/")
        write_report(report, out, cfg, ds, extra)
    return out


def trained_on(checkpoint: str | Path) -> dict[str, Any]:
    """The ``data`` (its test split) and ``eval`` sections a checkpoint or run folder was trained with,
    as an evaluation config source: evaluate a model where it was trained unless told otherwise."""
    values = run_config(checkpoint)
    if not isinstance(values, dict) or not isinstance(values.get("data"), dict):
        return {}
    d, ev = values["data"], values.get("eval")
    keep = {k: d[k] for k in ("name", "root", "setting", "seed", "options") if k in d}
    return {"data": {**keep, "split": d.get("test_split", "test")}, "eval": ev if isinstance(ev, dict) else {}}
