"""Evaluate any Retriever on a dataset split: metrics, per-query rankings, curves, timings."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgraph import metrics as M
from toolgraph.config import EvalConfig, to_dict
from toolgraph.data.schema import Query, ToolDataset
from toolgraph.errors import ConfigError
from toolgraph.retrieval.base import Ranking, Retriever
from toolgraph.retrieval.steps import sentences


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
    if steps is None:
        ranking = retriever.retrieve(texts, depth, cfg.batch_size)
    else:
        ranking = retriever.retrieve_steps(steps, depth, cfg.step_merge, cfg.batch_size)
    timings["retrieve_s"] = time.perf_counter() - t0
    timings["queries_per_s"] = len(queries) / max(timings["retrieve_s"], 1e-9)
    golds = [list(q.tools) for q in queries]

    hits, n_rel = M.hit_matrix(ranking.ids, golds, depth)
    values = M.per_query(hits, n_rel, cfg.ks, cfg.metrics)
    metrics = {k: float(v.mean()) for k, v in values.items()}
    curve_ks = list(range(1, depth + 1))
    curve = M.per_query(hits, n_rel, curve_ks, ["recall", "pass"])
    curves = {"k": curve_ks, "recall": [float(curve[f"recall@{k}"].mean()) for k in curve_ks],
              "pass": [float(curve[f"pass@{k}"].mean()) for k in curve_ks]}

    agent_metrics: dict[str, float] = {}
    owner = ds.agent_of()
    if cfg.agent_level and owner:
        if getattr(retriever, "ranks_agents", False):  # agent routers rank agents themselves
            agent_rank = retriever.retrieve_agents(texts, depth, steps, cfg.batch_size, cfg.step_merge).ids
        else:
            agent_rank = [M.roll_up(r, owner) for r in ranking.ids]
        agent_gold = [sorted({owner[t] for t in g if t in owner}) for g in golds]
        agent_metrics = M.compute(agent_rank, agent_gold, cfg.ks, cfg.metrics)
    return Report(metrics, agent_metrics, ranking, golds, [q.id for q in queries], timings, curves, notes)


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


def write_report(report: Report, out: str | Path, config: Any, ds: ToolDataset) -> Path:
    """results.json, rankings.jsonl and curves.png in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"metrics": report.metrics, "agent_metrics": report.agent_metrics, "config": to_dict(config),
               "dataset": ds.stats(), "timings": report.timings, "curves": report.curves, "notes": report.notes}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    with (out / "rankings.jsonl").open("w", encoding="utf-8") as f:
        for qid, gold, ids, scores in zip(report.query_ids, report.golds, report.ranking.ids,
                                          report.ranking.scores.tolist(), strict=True):
            top = [{"id": i, "score": round(s, 6)} for i, s in zip(ids, scores, strict=True)]
            f.write(json.dumps({"query": qid, "gold": gold, "top": top}) + "\n")
    plot_curves(report.curves, out / "curves.png", title=f"{ds.name}")
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
    fig.savefig(path, dpi=100)
    plt.close(fig)
