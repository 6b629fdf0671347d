"""Issue "Tool Graph Retriever": discriminator test, graph construction, TGR vs its base encoder.

    # the discriminator's test report (train.py out_dir) -> method discriminator, dataset tdi
    python benchmarks/tgr.py discriminator RUN --command "python train.py --config configs/discriminator.yaml ..."
    # an evaluate.py --out folder -> a retrieval row (method dense or tgr)
    python benchmarks/tgr.py retrieval EVAL_DIR --method tgr --setting tgr-d --command "python evaluate.py ..."
    # a `toolgraph graph build` folder -> a graph-construction row (pairs scored vs N^2, gold recovered)
    python benchmarks/tgr.py graph GRAPH_DIR --command "toolgraph graph build ..."
    # candidate coverage only (no discriminator): link retriever vs plain embedding, several M
    python benchmarks/tgr.py candidates --dataset seal-tools --links RUN_OR_RETRIEVER --ms 10 20 50 100
    # the tables again, from the results file
    python benchmarks/tgr.py render [--page docs/dependencies.md]

Rows go to benchmarks/results/tgr.json and the tables on docs/dependencies.md (markers ``tgr-discriminator``,
``tgr-retrieval``, ``tgr-graph``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from results_io import DOCS, RESULTS, machine, upsert, write_block  # noqa: E402

NAME = "tgr"
PAGE = DOCS / "dependencies.md"  # where the tgr-* blocks live
RETRIEVAL_METRICS = ("recall@5", "recall@10", "ndcg@5", "ndcg@10", "pass@5", "pass@10")
GRAPH_METRICS = ("tools", "pairs_scored", "fraction_of_n_squared", "gold_edges", "gold_pairs_in_candidates",
                 "gold_edges_recovered", "edges_kept", "edge_precision", "seconds_candidates", "seconds_scoring",
                 "pairs_per_second")


def discriminator(args: argparse.Namespace) -> None:
    res = json.loads((args.run / "results.json").read_text())
    test = res["test"]
    if "per_source" not in test:  # a run from before the per-source report: test its best checkpoint again
        test = {**test, "per_source": retest(res["training"]["best_checkpoint"])["per_source"]}
    metrics = {k: round(v, 4) for k, v in test.items() if isinstance(v, float)}
    counts = res["pairs"]
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(args.run / "config.yaml"))
    row = {"method": "discriminator", "dataset": "tdi", "split": "test", "setting": args.setting or res["stage"],
           "model": cfg["model"]["name"], "val_split": (cfg["data"].get("options") or {}).get("val_split", "pairs"),
           "encoder": "all-MiniLM-L6-v2", "metrics": metrics, "confusion": test["confusion"], "labels": test["labels"],
           "loss": res["loss"], "class_count": res["class_count"],
           "per_source": {k: {"macro_f1": round(v["macro_f1"], 4), "pairs": v["pairs"]} for k, v in
                          test["per_source"].items()},
           "pairs": {name: counts[name]["per_class"] for name in ("pretrain", "finetune", "val", "test") if name in counts},
           "training_steps": res["training"]["global_step"], "seconds": round(res["training"]["seconds"]),
           "device": res["training"].get("device", "cpu"), "machine": machine(), "command": args.command}
    if "calibration" in test:
        cal = test["calibration"]
        row["calibration"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in cal.items()}
    if (args.run / "logs" / "metrics.csv").is_file():
        row["val_curve"] = _val_curve(args.run)
    upsert(NAME, [row])
    if args.plot and "calibration" in row:
        reliability_plot(row, args.plot)
    render(page=args.page)
    print(json.dumps({k: row[k] for k in ("setting", "metrics", "training_steps")}))


def reliability_plot(row: dict, path: Path) -> None:
    """The reliability diagram of a discriminator row: accuracy against confidence per bin, before
    and after temperature scaling, bar width = the bin, dot size = its share of the pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cal = row["calibration"]
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect")
    for key, label in (("reliability_before", f"T = 1 (ECE {cal['ece_before']:.3f})"),
                       ("reliability_after", f"T = {cal['temperature']:.2f} (ECE {cal['ece_after']:.3f})")):
        bins = cal[key]
        total = sum(b["count"] for b in bins)
        ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], marker="o", label=label)
        ax.scatter([b["confidence"] for b in bins], [b["accuracy"] for b in bins],
                   s=[400 * b["count"] / total for b in bins], alpha=0.3)
    ax.set(xlabel="confidence (top class)", ylabel="accuracy", xlim=(0.3, 1), ylim=(0.3, 1),
           title=f"discriminator {row['setting']}: tool-disjoint test")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def retest(checkpoint: str) -> dict:
    """The discriminator test report of a checkpoint (Lightning test on its own TDI test set)."""
    import lightning as L

    from toolgraph.retrieval.loading import load_task

    task = load_task(checkpoint)
    dm = task.datamodule_for()
    L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False).test(task, datamodule=dm)
    return task.test_report


def _val_curve(run: Path) -> list[dict]:
    import csv

    with (run / "logs" / "metrics.csv").open() as f:
        return [{"step": int(r["step"]), "macro_f1": round(float(r["val/macro_f1"]), 4)}
                for r in csv.DictReader(f) if r.get("val/macro_f1")]


def retrieval(args: argparse.Namespace) -> None:
    res = json.loads((args.run / "results.json").read_text())
    cfg = res["config"]
    row = {"method": args.method, "dataset": cfg["data"]["name"], "split": cfg["data"]["split"],
           "setting": args.setting, "encoder": args.encoder, "queries": res["dataset"]["queries"][cfg["data"]["split"]],
           "metrics": {k: round(v, 4) for k, v in res["metrics"].items() if k in RETRIEVAL_METRICS
                       or k in ("recall@20", "recall@50")},
           "retriever": {k: v for k, v in (cfg.get("retriever") or {}).items()
                         if k in ("graph", "threshold", "layers", "direction", "alpha", "boost")},
           "command": args.command}
    if "training" in res:
        row["training_steps"], row["seconds"] = res["training"]["global_step"], round(res["training"]["seconds"])
    if args.note:
        row["note"] = args.note
    upsert(NAME, [row])
    render(page=args.page)
    print(json.dumps({k: row[k] for k in ("method", "dataset", "setting", "metrics")}))


def graph(args: argparse.Namespace) -> None:
    stats = json.loads((args.run / "stats.json").read_text())
    c = stats["config"]
    setting = args.setting or (f"links-m={c['links_m']}" if c.get("links") else f"embedding-m={c['top_m']}")
    row = {"method": "graph_build", "dataset": stats["dataset"], "split": "all", "setting": setting,
           "encoder": "all-MiniLM-L6-v2", "metrics": {k: stats[k] for k in GRAPH_METRICS},
           "threshold": stats.get("edge_threshold", c["threshold"]), "machine": machine(), "command": args.command}
    upsert(NAME, [row])
    render(page=args.page)
    print(json.dumps(row["metrics"]))


def candidates(args: argparse.Namespace) -> None:
    """Coverage of the gold dependencies by the candidate pairs alone, for several M."""
    import toolgraph  # noqa: F401
    from toolgraph.data import load_dataset
    from toolgraph.data.schema import natural_key
    from toolgraph.depgraph import GraphConfig, candidate_pairs, gold_coverage, io_candidates, propose_links
    from toolgraph.retrieval.dense import DenseConfig, DenseRetriever

    ds = load_dataset(args.dataset)
    tools = sorted(ds.tools, key=lambda t: natural_key(t.id))
    ids = [t.id for t in tools]
    gold_edges = len({frozenset((d.source, d.target)) for d in ds.dependencies if d.source != d.target})
    n = len(tools)
    docs = {t.id: t.document(args.tool_text) for t in tools}
    rows = []
    t0 = time.perf_counter()
    top = max(args.ms)
    proposed = propose_links(tools, docs, GraphConfig(links=str(args.links), links_m=top)) if args.links else None
    link_s = time.perf_counter() - t0
    dense = DenseRetriever(DenseConfig(tool_text=args.tool_text, progress=False))
    dense.index(tools)
    for m in args.ms:
        for kind in (["links"] if args.links else []) + ["embedding", "io"]:
            cfg = GraphConfig(top_m=m if kind == "embedding" else 0, same_category=False, same_agent=False)
            extra = None  # embedding: the nearest tools by document vector
            if kind == "links":
                extra = [p[:m] for p in proposed]
            elif kind == "io":
                extra = io_candidates(tools, dense.embed, m, style=args.tool_text)
            cand = candidate_pairs(tools, dense.tool_vectors if kind == "embedding" else None, cfg, extra)
            metrics = {"pairs": len(cand), "fraction_of_n_squared": round(len(cand) / (n * n), 5),
                       "gold_pairs_in_candidates": round(gold_coverage(ds, ids, cand), 4)}
            if kind == "links":
                metrics["seconds_proposing_top_m"] = round(link_s, 1)
            rows.append({"method": "candidates", "dataset": ds.name, "split": "all", "setting": f"{kind}-m={m}",
                         "encoder": "all-MiniLM-L6-v2", "metrics": metrics, "gold_edges": gold_edges,
                         "command": args.command})
            print(kind, m, metrics, flush=True)
    upsert(NAME, rows)
    render(page=args.page)


SCALE_SOURCES = ("api-bank", "gorilla-huggingface", "nestools", "seal-tools", "toolbench-g1", "toolbench-g2",
                 "toollens", "toollinkos", "ultratool-original")  # the catalogs with parameter schemas


def scale(args: argparse.Namespace) -> None:
    """Cost of schema blocking against catalog size: merged real catalogs (random subsets; beyond the
    ~13k distinct tools, renamed copies), seconds, peak traced memory, pairs; fitted exponent."""
    import dataclasses
    import math
    import random
    import tracemalloc

    import toolgraph  # noqa: F401
    from toolgraph.data import load_dataset
    from toolgraph.depgraph import schema_candidates

    pool = [dataclasses.replace(t, id=f"{name}:{t.id}") for name in SCALE_SOURCES for t in load_dataset(name).tools]
    print(f"{len(pool)} distinct tools from {len(SCALE_SOURCES)} catalogs", flush=True)
    rng = random.Random(0)
    rows, points = [], []
    for n in args.sizes:
        tools = rng.sample(pool, n) if n <= len(pool) else [
            dataclasses.replace(t, id=f"{t.id}#copy{k}") for k in range(math.ceil(n / len(pool))) for t in pool][:n]
        tracemalloc.start()
        t0 = time.perf_counter()
        proposed = schema_candidates(tools, args.m, args.max_df)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        pairs = len({(min(i, j), max(i, j)) for i, js in enumerate(proposed) for j in js})
        points.append((n, seconds, peak))
        metrics = {"tools": n, "pairs": pairs, "fraction_of_n_squared": round(pairs / (n * n), 6),
                   "seconds": round(seconds, 2), "peak_mib": round(peak / 2**20, 1),
                   "copies": n > len(pool)}
        rows.append({"method": "candidate_cost", "dataset": "merged", "split": "all", "setting": f"schema-m={args.m}:n={n}",
                     "metrics": metrics, "machine": machine(), "command": args.command})
        print(metrics, flush=True)

    def slope(k: int) -> float:
        xs = [math.log(p[0]) for p in points]
        ys = [math.log(max(p[k], 1e-9)) for p in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)

    for r in rows:
        r["fitted_exponent"] = {"seconds": round(slope(1), 2), "memory": round(slope(2), 2)}
    print("fitted exponent: time", round(slope(1), 2), "memory", round(slope(2), 2))
    upsert(NAME, rows)
    render(page=args.page)


def sweep(args: argparse.Namespace) -> None:
    """A W&B grid spec run locally, one training per grid point (no test, no export, no checkpoint
    files): each point's best val metric and its epoch; the best point is the recipe's choice."""
    import csv

    import yaml

    from toolgraph.config import load_config
    from toolgraph.training import TrainConfig, train

    spec = yaml.safe_load(args.spec.read_text())
    if spec.get("method") != "grid":
        raise SystemExit(f"{args.spec}: only method: grid runs locally")
    config = spec["command"][spec["command"].index("--config") + 1]
    metric = spec["metric"]["name"]
    keys = list(spec["parameters"])
    rows = []
    for values in itertools.product(*(spec["parameters"][k]["values"] for k in keys)):
        point = dict(zip(keys, values, strict=True))
        name = ",".join(f"{k.split('.')[-1]}={v}" for k, v in point.items())
        out = args.out / name.replace("=", "").replace(",", "_")
        over = [f"{k}={v}" for k, v in point.items()] + [
            f"out_dir={out}", "test=false", "export=false", "checkpoint.save_top_k=0", "logger.wandb=false",
            "trainer.enable_progress_bar=false"]
        t0 = time.perf_counter()
        train(load_config(TrainConfig, [config], over))
        with (out / "logs" / "metrics.csv").open() as f:
            curve = [(int(r["epoch"]), float(r[metric])) for r in csv.DictReader(f) if r.get(metric)]
        epoch, best = max(curve, key=lambda c: c[1])
        rows.append({"method": "discriminator_sweep", "dataset": "tdi", "split": "val", "setting": name,
                     "model": "discriminator_schema", "metrics": {metric: round(best, 4), "best_epoch": epoch},
                     "seconds": round(time.perf_counter() - t0), "machine": machine(),
                     "command": args.command})
        print(name, metric, round(best, 4), "epoch", epoch, flush=True)
    chosen = max(rows, key=lambda r: r["metrics"][metric])
    for r in rows:
        r["chosen"] = r is chosen
    print("chosen:", chosen["setting"])
    upsert(NAME, rows)


def prerequisite_cap(value: str) -> int | None:
    """``--max-prerequisites`` item: ``all`` (no cap) or a positive integer."""
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected 'all' or a positive integer, got {value!r}")
    return int(value)


def tune(args: argparse.Namespace) -> None:
    """TGR settings chosen on the val split by ``toolgraph.tuning.choose_on_val`` (best Pass@5, then R@5,
    then NDCG@5, then the point listed first), then the chosen one and its base encoder on test: graph
    (gold, or a `toolgraph graph build` folder at several thresholds), direction, alpha and layers."""
    from dataclasses import replace

    from toolgraph.config import EvaluateConfig, load_config, parse_options
    from toolgraph.data import prepare_dataset
    from toolgraph.evaluation import run
    from toolgraph.tuning import choose_on_val

    base = load_config(EvaluateConfig, [f"configs/eval/tgr_{args.dataset}.yaml"],
                       [f"retriever.model={args.encoder}", "retriever.progress=false",
                        "retriever.cache_dir=.cache/embeddings"])
    options = {**(base.data.options or {}), **parse_options(args.data_option, "--data-option")}
    base = replace(base, data=replace(base.data, options=options, split="test"))
    ds = prepare_dataset(base.data)
    dense = load_config(EvaluateConfig, [{"retriever": {"name": "dense", "model": args.encoder, "max_length": 256,
                                                        "progress": False, "cache_dir": ".cache/embeddings"}}]).retriever
    graphs = ([] if args.no_gold else [("gold", None, None)]) + [
        (str(g), t, k) for g in args.graph for t in args.thresholds for k in args.max_prerequisites]
    if not graphs:
        raise SystemExit("tune: --no-gold needs at least one --graph")
    grid = []
    for (graph, thr, k), direction, alpha, boost in itertools.product(
            graphs, ("to_prerequisite",), (0.0, 0.25, 0.5, 1.0), (0.0, 0.3, 0.6)):
        if alpha == 0 and boost == 0:
            continue  # the base encoder itself
        settings = {"graph": graph, "direction": direction, "alpha": alpha, "layers": 1, "boost": boost}
        if thr is not None:
            settings["threshold"] = thr
        if k is not None:
            settings["max_prerequisites"] = k
        grid.append({f"retriever.{key}": v for key, v in settings.items()})
    tuned = choose_on_val(base, grid, ["pass@5", "recall@5", "ndcg@5"], ds=ds, log=print)
    chosen = {key.removeprefix("retriever."): v for key, v in tuned.winner.items()}
    best = next(p.metrics for p in tuned.table if p.overrides == tuned.winner)
    base_val = run(replace(base, retriever=dense, data=replace(base.data, split="val")), ds=ds).metrics
    if (best["pass@5"], best["recall@5"], best["ndcg@5"]) <= (base_val["pass@5"], base_val["recall@5"], base_val["ndcg@5"]):
        print("no TGR setting beats the base encoder on val; the chosen one is reported anyway")
    rows = []
    for method, settings, m in (("dense", {}, run(replace(base, retriever=dense), ds=ds).metrics),
                                ("tgr", chosen, tuned.report.metrics)):
        kind = "tgr-m" if settings.get("graph") == "gold" else "tgr-d"
        rows.append({"method": method, "dataset": ds.name, "split": "test",
                     "setting": f"{args.label}:tune-base" if method == "dense" else f"{kind}:val-tuned:{args.label}",
                     "encoder": args.encoder_label or args.encoder, "queries": len(ds.split("test")),
                     "metrics": {k: round(v, 4) for k, v in m.items() if k in RETRIEVAL_METRICS},
                     "retriever": settings, "val": {"pass@5": round(best["pass@5"], 4),
                                                    "recall@5": round(best["recall@5"], 4),
                                                    "base_pass@5": round(base_val["pass@5"], 4)},
                     "grid_size": len(grid), "data_options": options, "val_queries": len(ds.split("val")),
                     "machine": machine(), "command": args.command})
        print("test", method, settings, {k: round(m[k], 4) for k in ("pass@5", "recall@5")}, flush=True)
    upsert(NAME, rows)
    render(page=args.page)


def render(page: str | Path = PAGE) -> None:
    """The tgr-* tables of ``page`` from the results file."""
    path = RESULTS / f"{NAME}.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    disc = [r for r in rows if r["method"] == "discriminator"]
    lines = ["| setting | model | val | macro-F1 (dependency classes) | F1 a_needs_b | F1 b_needs_a | F1 none "
             "| P a_needs_b | R a_needs_b | P b_needs_a | R b_needs_a | ECE before → after | steps | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in disc:
        m, cal = r["metrics"], r.get("calibration")
        ece = f"{cal['ece_before']:.3f} → {cal['ece_after']:.3f} (T={cal['temperature']:.2f})" if cal else "–"
        lines.append(f"| {r['setting']} | {r.get('model', 'discriminator')} | {r.get('val_split', 'pairs')} | "
                     f"**{m['macro_f1']:.3f}** | {m['f1_a_needs_b']:.3f} | "
                     f"{m['f1_b_needs_a']:.3f} | {m['f1_none']:.3f} | {m['precision_a_needs_b']:.3f} | "
                     f"{m['recall_a_needs_b']:.3f} | {m['precision_b_needs_a']:.3f} | {m['recall_b_needs_a']:.3f} | "
                     f"{ece} | {r['training_steps']} | {r.get('seconds', '–')} |")
    for r in disc:
        if r.get("per_source"):
            parts = ", ".join(f"{k} {v['macro_f1']:.3f} ({v['pairs']} pairs)" for k, v in r["per_source"].items())
            lines.append(f"\n{r['setting']}: macro-F1 per source — {parts}.")
    sweep_rows = sorted((r for r in rows if r["method"] == "discriminator_sweep"), key=lambda r: r["setting"])
    if sweep_rows:
        lines += ["", "Sweep (`configs/sweeps/discriminator.yaml`, val only; the best epoch of each point):", "",
                  "| point | val macro-F1 | best epoch | chosen |", "|---|---|---|---|"]
        for r in sweep_rows:
            lines.append(f"| {r['setting']} | {r['metrics']['val/macro_f1']:.4f} | {r['metrics']['best_epoch']} | "
                         f"{'**yes**' if r.get('chosen') else ''} |")
    write_block(page, "tgr-discriminator", "\n".join(lines))
    ret = sorted((r for r in rows if r["method"] in ("dense", "tgr")),
                 key=lambda r: (r["dataset"], r["encoder"], r["method"] != "dense", r["setting"]))
    lines = ["| dataset | encoder | method | setting | " + " | ".join(RETRIEVAL_METRICS) + " |",
             "|---|---|---|---|" + "---|" * len(RETRIEVAL_METRICS)]
    for r in ret:
        cells = " | ".join(f"{r['metrics'][k]:.3f}" for k in RETRIEVAL_METRICS)
        lines.append(f"| {r['dataset']} | {r['encoder']} | {r['method']} | {r['setting']} | {cells} |")
    write_block(page, "tgr-retrieval", "\n".join(lines))
    lines = ["| dataset | candidates | pairs scored | % of N² | gold pairs among candidates | gold edges recovered "
             "(p≥thr) | edges kept | edge precision | seconds (candidates + scoring) |", "|---|---|---|---|---|---|---|---|---|"]
    def order(r: dict) -> tuple:
        kind, _, m = r["setting"].partition("-m=")
        return r["method"] != "graph_build", r["dataset"], kind, int(m) if m.isdigit() else 0

    for r in sorted((r for r in rows if r["method"] in ("graph_build", "candidates")), key=order):
        m = r["metrics"]
        if r["method"] == "graph_build":
            lines.append(f"| {r['dataset']} ({m['tools']} tools) | {r['setting']} | {m['pairs_scored']} | "
                         f"{100 * m['fraction_of_n_squared']:.2f} | {m['gold_pairs_in_candidates']:.3f} | "
                         f"{m['gold_edges_recovered']:.3f} | {m['edges_kept']} | {m['edge_precision']:.3f} | "
                         f"{m['seconds_candidates']} + {m['seconds_scoring']} |")
        elif r["method"] == "candidates":
            lines.append(f"| {r['dataset']} | {r['setting']} (no scoring) | {m['pairs']} | "
                         f"{100 * m['fraction_of_n_squared']:.2f} | {m['gold_pairs_in_candidates']:.3f} | – | – | – | – |")
    cost = sorted((r for r in rows if r["method"] == "candidate_cost"), key=lambda r: r["metrics"]["tools"])
    if cost:
        lines += ["", "Schema blocking cost against catalog size (merged catalogs; `copies`: renamed copies beyond "
                  "the distinct tools):", "", "| tools | pairs | % of N² | seconds | peak MiB | copies |",
                  "|---|---|---|---|---|---|"]
        for r in cost:
            m = r["metrics"]
            lines.append(f"| {m['tools']} | {m['pairs']} | {100 * m['fraction_of_n_squared']:.3f} | {m['seconds']} | "
                         f"{m['peak_mib']} | {'yes' if m['copies'] else 'no'} |")
        e = cost[0]["fitted_exponent"]
        lines.append(f"\nFitted exponent (log-log slope over N): time {e['seconds']}, memory {e['memory']}.")
    write_block(page, "tgr-graph", "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("discriminator")
    d.add_argument("run", type=Path)
    d.add_argument("--setting", default=None, help="row setting (default: the run's stage)")
    d.add_argument("--plot", type=Path, default=None, help="write the reliability diagram here (PNG)")
    d.add_argument("--command", required=True)
    r = sub.add_parser("retrieval")
    r.add_argument("run", type=Path)
    r.add_argument("--method", required=True, choices=["dense", "tgr", "bi_encoder"])
    r.add_argument("--setting", required=True)
    r.add_argument("--encoder", default="all-MiniLM-L6-v2")
    r.add_argument("--note", default=None)
    r.add_argument("--command", required=True)
    g = sub.add_parser("graph")
    g.add_argument("run", type=Path)
    g.add_argument("--setting", default=None)
    g.add_argument("--command", required=True)
    c = sub.add_parser("candidates")
    c.add_argument("--dataset", required=True)
    c.add_argument("--links", type=Path, default=None)
    c.add_argument("--ms", type=int, nargs="+", default=[10, 20, 50, 100])
    c.add_argument("--tool-text", default="io")
    c.add_argument("--command", required=True)
    sc = sub.add_parser("scale")
    sc.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000, 64000])
    sc.add_argument("--m", type=int, default=20)
    sc.add_argument("--max-df", type=int, default=200)
    sc.add_argument("--command", required=True)
    sw = sub.add_parser("sweep")
    sw.add_argument("spec", type=Path, help="a W&B sweep spec with method: grid")
    sw.add_argument("--out", type=Path, default=Path("runs/sweeps/discriminator"))
    sw.add_argument("--command", required=True)
    t = sub.add_parser("tune")
    t.add_argument("--dataset", required=True, choices=["api-bank", "toollinkos", "seal-tools"])
    t.add_argument("--encoder", default="all-MiniLM-L6-v2", help="base encoder: a name or an encoder folder")
    t.add_argument("--encoder-label", default=None, help="the encoder's name in the table")
    t.add_argument("--label", default="zero-shot", help="setting label of the base row")
    t.add_argument("--graph", type=Path, nargs="*", default=[], help="`toolgraph graph build` folders (TGR-d)")
    t.add_argument("--thresholds", type=float, nargs="+", default=[0.5, 0.9])
    t.add_argument("--max-prerequisites", type=prerequisite_cap, nargs="+",
                   default=[None], help="discriminator graphs: each tool's k most probable prerequisites ('all': no cap)")
    t.add_argument("--no-gold", action="store_true", help="discriminator graphs only (TGR-d), not the annotated one")
    t.add_argument("--data-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a dataset option over the eval config's (YAML value), e.g. val_from=test")
    t.add_argument("--command", required=True)
    sub.add_parser("render")
    for sp in sub.choices.values():
        sp.add_argument("--page", type=Path, default=PAGE, help="page with the tgr-* blocks")
    args = p.parse_args()
    {"discriminator": discriminator, "retrieval": retrieval, "graph": graph, "candidates": candidates,
     "tune": tune, "scale": scale, "sweep": sweep, "render": lambda a: render(page=a.page)}[args.cmd](args)


if __name__ == "__main__":
    main()
