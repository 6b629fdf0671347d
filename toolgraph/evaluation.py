"""Evaluate any Retriever on a dataset split: metrics, per-query rankings, curves, timings.

Outputs are written so that an interrupted run never leaves a half-written or mismatched folder:
every file goes to a hidden temp name in its folder and is renamed over the old one (``atomic_path``),
and ``results.json`` is removed when a run starts writing and written last, so it is the mark of a
complete run (a folder without it was interrupted: re-run). A full disk while writing is a DataError
naming the folder (``disk_full_is_an_error``), with the same guarantee. SIGTERM / SIGINT unwind like an error
(temp files removed) and the command exits 143 / 130 (``install_signal_handlers``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolgraph import metrics as M
from toolgraph.config import EvalConfig, to_dict
from toolgraph.data.schema import Query, ToolDataset
from toolgraph.errors import ConfigError, DataError, no_space_is_a_data_error
from toolgraph.files import (
    atomic_path,
    clean_new_copies,
    clean_old_copies,
    recover_folder,
    swap_folder,
    write_text_atomic,
)
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
    intervals: dict[str, list[float]] = field(default_factory=dict)  # metric -> [low, high] (95 %, bootstrap)


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


# ---- outputs: atomic files, the results.json commit mark, output folders, signals ---------------
RESULTS = "results.json"
OUTPUT_MARKERS = ("config.yaml", RESULTS, "retriever.json")  # a folder holding one of these is ours


_TEMP = re.compile(r"\.(config\.yaml|results\.json|rankings\.jsonl|curves\.png)\.tmp-\d+")


def retire_results(out: str | Path) -> None:
    """Remove ``out/results.json`` before a run writes anything else there, so an interrupted re-run
    never leaves the previous results beside the new config or rankings; temp files that a killed run
    (kill -9) left behind go too."""
    out = Path(out)
    (out / RESULTS).unlink(missing_ok=True)
    for stale in out.glob(".*.tmp-*"):
        if _TEMP.fullmatch(stale.name) and stale.is_file():
            stale.unlink(missing_ok=True)


def write_results(out: str | Path, results: dict[str, Any]) -> Path:
    """``out/results.json``, atomically; call it last (it marks the run complete)."""
    return write_text_atomic(Path(out) / RESULTS, json.dumps(results, indent=2, default=str) + "\n")


def read_results(path: str | Path) -> dict[str, Any]:
    """A results.json (or the folder holding it); a missing, cut or malformed file is a DataError that
    names it and says to re-run."""
    path = Path(path)
    if path.is_dir() or not path.name.endswith(".json"):
        path = path / RESULTS
    if not path.is_file():
        raise DataError("not found: the run did not finish (or was interrupted); re-run it to write it", path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DataError(f"not a readable results file ({type(e).__name__}: {str(e)[:120]}); it was cut or "
                        "edited: re-run the evaluation (or training) that wrote it", path) from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics", {}), dict):
        raise DataError("not a toolgraph results file (expected a JSON object with 'metrics'); re-run the "
                        "evaluation that wrote it", path)
    return data


def disk_full_is_an_error(out: str | Path) -> Any:
    """A full disk (or quota) while writing ``out``: a DataError naming the folder, not a traceback.
    What is left is what an interrupted run leaves (temp files removed, no results.json, a swapped
    folder as it was), so the message says that and to re-run."""
    return no_space_is_a_data_error(out, "the results", "nothing was half-written (every file there is a whole "
                                    "one), but the folder has no results.json: this run is not saved. Free some "
                                    "space and re-run")


def check_output_folder(path: str | Path, what: str, markers: tuple[str, ...] = OUTPUT_MARKERS) -> Path:
    """``path`` if toolgraph may write there: absent, an empty folder, or a folder holding one of
    ``markers`` (one of our outputs). Anything else (a file, someone else's folder) is refused with a
    ConfigError naming ``what``; nothing is deleted or overwritten."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return path
    if not path.is_dir():
        raise ConfigError(f"{what}: {str(path)!r} exists and is not a folder; give a new or empty folder "
                          "(nothing was written)")
    if any((path / m).exists() for m in markers) or next(path.iterdir(), None) is None:
        return path
    raise ConfigError(f"{what}: {str(path)!r} is a folder that toolgraph did not write (it holds none of "
                      f"{', '.join(markers)}); refusing to write into it. Give a new or empty folder, or a "
                      "previous output folder (nothing was written)")


def replace_folder(dest: str | Path, build: Callable[[Path], Any], what: str = "output") -> Any:
    """``build(tmp)`` swapped in at ``dest`` (``files.swap_folder``): an interrupted export leaves the old
    folder, never a mix. ``dest`` must be absent, empty, or a saved retriever (retriever.json)."""
    dest = Path(dest)
    recover_folder(dest)  # what a killed (kill -9) export left: the old folder back (a rename) ...
    clean_old_copies(dest)  # ... or, killed after its swap, the old copy: deleted by this writer, not a reader
    clean_new_copies(dest)
    check_output_folder(dest, what, ("retriever.json", "manifest.json"))
    return swap_folder(dest, build)


class Terminated(BaseException):  # noqa: N818 - like KeyboardInterrupt: not an Exception, nothing swallows it
    """SIGTERM received: unwinds the stack (temp files removed); the command exits 143."""


_SIGNALS: dict[str, Any] = {"received": [], "defer": 0}


def _on_signal(signum: int, frame: Any) -> None:
    _SIGNALS["received"].append(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if not _SIGNALS["defer"]:
        raise Terminated


def install_signal_handlers() -> None:
    """SIGTERM raises ``Terminated`` and SIGINT ``KeyboardInterrupt`` (main thread only), and both are
    remembered so the command can exit 128 + signal even when a library turned them into SystemExit."""
    import threading

    if threading.current_thread() is threading.main_thread():
        _SIGNALS["received"].clear()
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)


def received_signal() -> int | None:
    """The first SIGTERM / SIGINT received since ``install_signal_handlers`` (None: none)."""
    return _SIGNALS["received"][0] if _SIGNALS["received"] else None


@contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Inside Lightning's fit / test: a SIGTERM is only recorded (Lightning's own handler stops the loop at
    the end of the batch); after the block, a recorded SIGTERM raises ``Terminated``."""
    _SIGNALS["defer"] += 1
    try:
        yield
    finally:
        _SIGNALS["defer"] -= 1
    if signal.SIGTERM in _SIGNALS["received"]:
        raise Terminated
