"""Issue "Graph learning and inductive retrieval": LoSemB's protocol on ToolLens and UltraTool.

    # a finished train.py run (bi_encoder, instret, cross_encoder, a GNN) -> one row
    python benchmarks/inductive.py run RUN_DIR --method bi_encoder --command "python train.py ..."
    # train LightGCN / GAT / SAGE for every setting (finished runs are only read) -> rows
    python benchmarks/inductive.py gnn --dataset toollens --runs runs/inductive
    # frozen MiniLM ("EmbSim" taken literally) for every setting
    python benchmarks/inductive.py zeroshot --dataset toollens
    # LoSemB for every setting, its three ablations and the alignment KL (no training)
    python benchmarks/inductive.py losemb --dataset toollens
    # J and I of LoSemB chosen on a nested inductive split of train/val (never on test)
    python benchmarks/inductive.py tune --dataset toollens --variants "" "retriever.top_i=3"
    # add_tools of the unseen tools vs retraining the bi-encoder with them
    python benchmarks/inductive.py timing --dataset toollens --retrain-run RUN --retrain-command "..."
    python benchmarks/inductive.py render [--page docs/graph.md]

Rows go to benchmarks/results/inductive.json; the tables on docs/graph.md (markers ``inductive-main``,
``inductive-ablation``, ``inductive-kl``, ``inductive-timing``) are generated from it. The headline
metric is the mean of R@3, R@7, P@3, P@7 (``mean_r3_r7_p3_p7``); ``relative_drop`` is measured
from the same method's transductive row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from results_io import DOCS, RESULTS, machine, upsert, write_block  # noqa: E402

NAME = "inductive"
PAGE = DOCS / "graph.md"  # where the inductive-* blocks live
ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("transductive", "inductive-10", "inductive-20", "inductive-30", "noise-10")
METHODS = ("minilm", "bi_encoder", "bi_encoder_fast", "instret", "cross_encoder", "lightgcn", "gat", "sage", "losemb")
ABLATIONS = ("no_query_transfer", "no_tool_transfer", "no_relational_retrieval")
KEEP = ("recall@3", "recall@7", "precision@3", "precision@7")
HEADLINE = "mean_r3_r7_p3_p7"


def headline(metrics: dict) -> dict:
    out = {k: round(float(metrics[k]), 4) for k in KEEP}
    out[HEADLINE] = round(sum(float(metrics[k]) for k in KEEP) / len(KEEP), 4)
    return out


def row(method: str, dataset: str, setting: str, metrics: dict, command: str, **extra) -> dict:
    return {"method": method, "dataset": dataset, "split": "test", "setting": setting,
            "encoder": "all-MiniLM-L6-v2", "metrics": metrics, "command": command, "machine": machine(), **extra}


def run_row(run: Path, method: str, command: str) -> dict:
    """A train.py out_dir -> a row (dataset and setting from its resolved config)."""
    import yaml

    res = json.loads((run / "results.json").read_text())
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    tr = res.get("training", {})  # absent for an evaluate.py folder (a checkpoint scored on another setting)
    seconds = tr.get("train_seconds", tr.get("fit_seconds"))
    return row(method, cfg["data"]["name"], cfg["data"]["setting"], headline(res["metrics"]), command,
               queries=res.get("dataset", {}).get("queries", {}).get("test"), training_steps=tr.get("global_step"),
               training_seconds=None if seconds is None else round(seconds, 1))


def cmd_run(args: argparse.Namespace) -> None:
    r = run_row(args.run, args.method, args.command)
    upsert(NAME, [r])
    print(r["method"], r["dataset"], r["setting"], r["metrics"])
    render(page=args.page)


def cmd_gnn(args: argparse.Namespace) -> None:
    rows = []
    for gnn in args.gnns:
        for setting in args.settings:
            out = args.runs / f"{gnn}_{args.dataset}_{setting}"
            command = (f"python train.py --config configs/graph_{args.dataset}.yaml model.gnn={gnn} "
                       f"data.setting={setting} out_dir=runs/inductive/{out.name}")
            if not (out / "results.json").exists():
                argv = [sys.executable, "train.py", "--config", f"configs/graph_{args.dataset}.yaml", f"model.gnn={gnn}",
                        f"data.setting={setting}", f"out_dir={out}"]
                with open(f"{out}.log", "w") as log:
                    subprocess.run(argv, cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT)
            r = run_row(out, gnn, command)
            rows.append(r)
            upsert(NAME, [r])
            print(gnn, setting, r["metrics"], r["training_seconds"], "s", flush=True)
    render(page=args.page)


def _evaluate_losemb(dataset: str, setting: str, overrides: list[str]) -> tuple[dict, object, float]:
    from toolgraph.config import EvaluateConfig, load_config
    from toolgraph.data import prepare_dataset
    from toolgraph.evaluation import run
    from toolgraph.retrieval.loading import resolve_retriever

    cfg = load_config(EvaluateConfig, [ROOT / f"configs/eval/losemb_{dataset}.yaml"],
                      [f"data.setting={setting}", *overrides])
    ds = prepare_dataset(cfg.data)
    r = resolve_retriever(cfg.retriever)
    t0 = time.perf_counter()
    report = run(cfg, r, ds)
    return report.metrics, r, time.perf_counter() - t0


def cmd_losemb(args: argparse.Namespace) -> None:
    """LoSemB per setting (+ ablations). ``--graph-runs``: the trained LightGCN of each setting
    (method ``losemb+lightgcn``); ``--encoder-runs``: X from the bi-encoder fine-tuned on each
    setting's training split, run folders ``<encoder-prefix>_<dataset>_<setting>`` (method
    ``losemb+<encoder-method>``); default: frozen MiniLM, no training."""
    base = f"python evaluate.py --config configs/eval/losemb_{args.dataset}.yaml"
    variants = [("losemb", [])] + [(f"losemb/{a}", [f"retriever.{a}=true"]) for a in ABLATIONS]
    for setting in args.settings:
        extra, shown, suffix = list(args.overrides), list(args.overrides), ""
        if args.graph_runs:
            extra.append(f"retriever.graph={args.graph_runs / f'lightgcn_{args.dataset}_{setting}'}")
            shown.append(f"retriever.graph=runs/inductive/lightgcn_{args.dataset}_{setting}")
            suffix += "+lightgcn"
        if args.encoder_runs:
            run = f"{args.encoder_prefix}_{args.dataset}_{setting}"
            extra.append(f"retriever.encoder={args.encoder_runs / run / 'retriever' / 'encoder'}")
            shown.append(f"retriever.encoder=runs/inductive/{run}/retriever/encoder")
            suffix += f"+{args.encoder_method}"
        for method, over in variants:
            if method != "losemb" and setting not in args.ablation_settings:
                continue
            metrics, r, seconds = _evaluate_losemb(args.dataset, setting, over + extra)
            m = headline(metrics)
            if method == "losemb" and any(r.transferred) and not all(r.transferred):
                m.update({f"kl_{k}": round(v, 3) for k, v in r.alignment_kl().items()})
                m["unseen_tools"] = sum(r.transferred)
            command = " ".join([base, f"data.setting={setting}", *over, *shown])
            name = method.replace("losemb", "losemb" + suffix, 1) + args.name_suffix
            upsert(NAME, [row(name, args.dataset, setting, m, command, seconds=round(seconds, 1))])
            print(name, setting, m, f"{seconds:.0f}s", flush=True)
    render(page=args.page)


def cmd_zeroshot(args: argparse.Namespace) -> None:
    """"EmbSim" in its literal sense: frozen all-MiniLM-L6-v2 cosine, nothing trained (method minilm)."""
    from toolgraph.config import EvaluateConfig, load_config
    from toolgraph.evaluation import run

    options = ["data.options.dependency_splits=[train]"] if args.dataset == "ultratool" else []
    for setting in args.settings:
        over = ["retriever.name=dense", "retriever.tool_text=default", "retriever.max_length=128",
                f"data.name={args.dataset}", f"data.setting={setting}", "eval.ks=[3,7]", "eval.metrics=[recall,precision]",
                *options]
        cfg = load_config(EvaluateConfig, [], over)
        m = headline(run(cfg).metrics)
        upsert(NAME, [row("minilm", args.dataset, setting, m, "python evaluate.py " + " ".join(over))])
        print("minilm", setting, m, flush=True)
    render(page=args.page)


def cmd_tune(args: argparse.Namespace) -> None:
    """LoSemB's J and I picked without the test set: val plays test, ``ratio`` of the val tools
    (seed 1) become unseen and every training query using one is dropped (the same protocol one
    level down). One row per (ratio, variant)."""
    from dataclasses import replace

    from toolgraph.config import EvaluateConfig, load_config
    from toolgraph.data import prepare_dataset
    from toolgraph.data.schema import ToolDataset
    from toolgraph.data.splits import inductive
    from toolgraph.evaluation import run

    base = load_config(EvaluateConfig, [ROOT / f"configs/eval/losemb_{args.dataset}.yaml"], ["data.setting=standard"])
    ds = prepare_dataset(base.data)
    queries = [replace(q, split="test") if q.split == "val" else q for q in ds.queries if q.split != "test"]
    ds = ToolDataset(ds.name, ds.tools, queries, ds.agents, ds.dependencies)
    for ratio in args.ratios:
        nested, unseen = inductive(ds, ratio, seed=1)
        for variant in args.variants:
            over = variant.split()
            cfg = load_config(EvaluateConfig, [ROOT / f"configs/eval/losemb_{args.dataset}.yaml"], over)
            m = headline(run(cfg, ds=nested).metrics)  # cfg.data.split: test (the nested split's val)
            setting = f"nested-val-{round(100 * ratio)} {variant}".strip()
            command = (f"python benchmarks/inductive.py tune --dataset {args.dataset} --ratios {ratio} "
                       f"--variants '{variant}'")
            upsert(NAME, [row("losemb/tune", args.dataset, setting, m, command, unseen_tools=len(unseen),
                              queries=len(nested.split("test")))])
            print(setting, m[HEADLINE], flush=True)


def cmd_timing(args: argparse.Namespace) -> None:
    """LoSemB indexes the seen tools, then add_tools() takes the unseen ones (embedding cache off,
    so their documents are really encoded); checked to rank like indexing everything at once."""
    from toolgraph.config import EvaluateConfig, load_config
    from toolgraph.data import prepare_dataset
    from toolgraph.retrieval.loading import resolve_retriever

    setting = "inductive-30"
    cfg = load_config(EvaluateConfig, [ROOT / f"configs/eval/losemb_{args.dataset}.yaml"], [f"data.setting={setting}"])
    ds = prepare_dataset(cfg.data)
    unseen = set(ds.notes["unseen_tools"])
    r = resolve_retriever(cfg.retriever)
    r.fit(ds)
    r.index([t for t in ds.tools if t.id not in unseen])
    test = [q.text for q in ds.split("test")]
    r.config.cache_dir = None
    r._embedder = None  # a fresh in-memory embedder: nothing cached for the new tools
    _ = r.embedder.encoder  # load the model outside the timed part
    new = [t for t in ds.tools if t.id in unseen]
    t0 = time.perf_counter()
    r.add_tools(new)
    add_s = time.perf_counter() - t0
    ranked = r.retrieve(test[:200], 10).ids
    full = resolve_retriever(cfg.retriever)
    full.fit(ds)
    full.index(ds.tools)
    same = ranked == full.retrieve(test[:200], 10).ids
    retrain = json.loads((args.retrain_run / "results.json").read_text())["training"]
    retrain_s = float(retrain["fit_seconds"])
    m = {"tools_added": len(new), "add_tools_seconds": round(add_s, 2), "retrain_seconds": round(retrain_s, 1),
         "retrain_steps": retrain.get("global_step"), "speedup": round(retrain_s / add_s, 1),
         "same_ranking_as_full_index": same}
    if args.full_retrain_seconds:  # the whole recipe, measured earlier (e.g. training_core.json)
        m.update({"full_retrain_seconds": args.full_retrain_seconds, "full_retrain_steps": args.full_retrain_steps,
                  "full_speedup": round(args.full_retrain_seconds / add_s, 1), "full_retrain_source": args.full_retrain_source})
    command = f"python benchmarks/inductive.py timing --dataset {args.dataset} --retrain-run <run of: {args.retrain_command}>"
    upsert(NAME, [row("losemb/add_tools", args.dataset, setting, m, command)])
    print(m)
    render(page=args.page)


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.2f}"


def render(save: bool = True, page: str | Path = PAGE) -> None:
    """The inductive-* tables of ``page`` from the results file; ``save`` also stores each row's relative
    drop in it."""
    path = RESULTS / f"{NAME}.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    by = {(r["method"], r["dataset"], r["setting"]): r for r in rows}
    for r in rows:  # relative drop from the same method's transductive row
        base = by.get((r["method"], r["dataset"], "transductive"))
        if base and r["setting"] != "transductive" and HEADLINE in r["metrics"]:
            b = base["metrics"][HEADLINE]
            r["metrics"]["relative_drop"] = round((b - r["metrics"][HEADLINE]) / b, 4) if b else None
    if rows and save:
        path.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    methods += sorted({r["method"] for r in rows if r["method"].startswith("losemb+") and "/" not in r["method"]})
    lines = []
    for ds in sorted({r["dataset"] for r in rows}):
        lines += [f"**{ds}** — mean of R@3, R@7, P@3, P@7 (×100); in brackets the change relative to transductive",
                  "", "| method | " + " | ".join(SETTINGS) + " |", "|---|" + "---|" * len(SETTINGS)]
        for m in methods:
            cells = []
            for s in SETTINGS:
                r = by.get((m, ds, s))
                if r is None:
                    cells.append("–")
                    continue
                v = r["metrics"][HEADLINE]
                drop = r["metrics"].get("relative_drop")
                change = f"{-100 * drop:+.1f}".replace("-0.0", "±0.0").replace("+0.0", "±0.0") if drop is not None else None
                cells.append(f"{100 * v:.2f}" + (f" ({change} %)" if change is not None else ""))
            if any(c != "–" for c in cells):
                lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
    write_block(page, "inductive-main", "\n".join(lines).rstrip())

    lines = ["| dataset | setting | variant | R@3 | R@7 | P@3 | P@7 | mean |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["dataset"], r["setting"], r["method"])):
        if r["method"] == "losemb" or (r["method"].startswith("losemb/") and r["method"] != "losemb/add_tools"):
            if not any(by.get((f"losemb/{a}", r["dataset"], r["setting"])) for a in ABLATIONS):
                continue
            m = r["metrics"]
            lines.append(f"| {r['dataset']} | {r['setting']} | {r['method']} | " +
                         " | ".join(_fmt(m[k]) for k in (*KEEP, HEADLINE)) + " |")
    write_block(page, "inductive-ablation", "\n".join(lines))

    lines = ["| dataset | setting | tools without training queries | KL before alignment | KL after |",
             "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["dataset"], r["setting"])):
        if r["method"] == "losemb" and "kl_before" in r["metrics"]:
            m = r["metrics"]
            lines.append(f"| {r['dataset']} | {r['setting']} | {m['unseen_tools']} | {m['kl_before']} | {m['kl_after']} |")
    write_block(page, "inductive-kl", "\n".join(lines))

    lines = ["| dataset | tools added | add_tools (s) | retraining the bi-encoder, quick recipe (s, steps) | speed-up "
             "| full recipe (s, steps) | speed-up | same ranking as a full index |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["method"] == "losemb/add_tools":
            m = r["metrics"]
            full = (f"{m['full_retrain_seconds']:.0f} ({m['full_retrain_steps']}) | **{m['full_speedup']}×**"
                    if m.get("full_retrain_seconds") else "– | –")
            lines.append(f"| {r['dataset']} | {m['tools_added']} | {m['add_tools_seconds']} | {m['retrain_seconds']} "
                         f"({m['retrain_steps']}) | **{m['speedup']}×** | {full} | {m['same_ranking_as_full_index']} |")
    write_block(page, "inductive-timing", "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("run", type=Path)
    r.add_argument("--method", required=True, choices=METHODS)
    r.add_argument("--command", required=True)
    g = sub.add_parser("gnn")
    g.add_argument("--dataset", required=True)
    g.add_argument("--gnns", nargs="+", default=["lightgcn", "gat", "sage"])
    g.add_argument("--settings", nargs="+", default=list(SETTINGS))
    g.add_argument("--runs", type=Path, default=ROOT / "runs" / "inductive")
    s = sub.add_parser("losemb")
    s.add_argument("--dataset", required=True)
    s.add_argument("--settings", nargs="+", default=list(SETTINGS))
    s.add_argument("--ablation-settings", nargs="+", default=["transductive", "inductive-30"])
    s.add_argument("--graph-runs", type=Path, default=None,
                   help="folder of trained lightgcn_<dataset>_<setting> runs (default: parameter-free propagation)")
    s.add_argument("--encoder-runs", type=Path, default=None,
                   help="folder of <encoder-prefix>_<dataset>_<setting> train.py runs whose encoder gives X "
                   "(default: frozen MiniLM)")
    s.add_argument("--encoder-prefix", default="bi", help="run folder prefix under --encoder-runs (bi_fast: the fast recipe)")
    s.add_argument("--encoder-method", default="bi_encoder", help="row name: losemb+<this>")
    s.add_argument("--overrides", nargs="*", default=[], help="retriever settings, e.g. chosen by `tune` on val")
    s.add_argument("--name-suffix", default="", help="appended to the row names (e.g. ' (val-tuned)')")
    t = sub.add_parser("timing")
    t.add_argument("--dataset", required=True)
    t.add_argument("--retrain-run", type=Path, required=True)
    t.add_argument("--retrain-command", required=True)
    t.add_argument("--full-retrain-seconds", type=float, default=None)
    t.add_argument("--full-retrain-steps", type=int, default=None)
    t.add_argument("--full-retrain-source", default=None)
    z = sub.add_parser("zeroshot")
    z.add_argument("--dataset", required=True)
    z.add_argument("--settings", nargs="+", default=list(SETTINGS))
    u = sub.add_parser("tune")
    u.add_argument("--dataset", required=True)
    u.add_argument("--ratios", type=float, nargs="+", default=[0.1, 0.3])
    u.add_argument("--variants", nargs="+", default=[""], help="override sets, e.g. 'retriever.top_i=3 retriever.top_j=5'")
    sub.add_parser("render")
    for sp in sub.choices.values():
        sp.add_argument("--page", type=Path, default=PAGE, help="page with the inductive-* blocks")
    args = p.parse_args()
    {"run": cmd_run, "gnn": cmd_gnn, "losemb": cmd_losemb, "timing": cmd_timing, "tune": cmd_tune, "zeroshot": cmd_zeroshot,
     "render": lambda a: render(page=a.page)}[args.cmd](args)


if __name__ == "__main__":
    main()
