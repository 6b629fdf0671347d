"""Agent routing on the ToolBench test sets (RapidAPI tools as agents) and the serving benchmark.

    python benchmarks/agents.py quality [--finetuned RETRIEVER_DIR] [--sets ...]
    python benchmarks/agents.py tune            # type weights of weighted RRF, picked on StableToolBench G1
    python benchmarks/agents.py serve --tools 10000 --requests 400
    python benchmarks/agents.py render          # README tables from benchmarks/results/agents.json

Test sets: StableToolBench G1 / G2 (catalog = union of the queries' candidate APIs) and G3 (COLT's
1,419-API G3 corpus), DRAFT's original G2 (with the RapidAPI tool descriptions DRAFT ships, 273 of
280 agents) and G3 (COLT corpus). ToolBench has no annotated steps: step-wise queries are the
request's sentences (``eval.steps: sentences``), merged by interleaving (retrieval/steps.py).
Rows: method ``t2a`` / ``agent_only`` / ``tool_only`` (BM25 + dense RRF) and ``mcp_zero`` (dense);
``<method>/<scorer>`` rows are the other entity scorers, ``t2a/merge=<rule>`` the other step merges.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from results_io import RESULTS, machine, upsert, write_readme_table  # noqa: E402

NAME = "agents"
KEY = ("method", "dataset", "split", "setting", "encoder")
KS = [1, 3, 5, 10]
SETS = {  # name -> (adapter, options)
    "stabletoolbench-g1": ("toolbench-g1", {}),
    "stabletoolbench-g2": ("toolbench-g2", {}),
    "stabletoolbench-g3": ("toolbench-g3", {"corpus": "colt"}),
    "draft-g2": ("toolbench-g2", {"source": "draft", "agent_docs": "initial"}),
    "draft-g3": ("toolbench-g3", {"source": "draft", "corpus": "colt"}),
}
MAIN = {"t2a": "rrf", "agent_only": "rrf", "tool_only": "rrf", "mcp_zero": "dense"}
VARIANTS = {"t2a": ["dense", "bm25", "weighted_rrf"], "agent_only": ["dense", "bm25"], "tool_only": ["dense", "bm25"]}
COMMAND = "python benchmarks/agents.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def dense_spec(finetuned: Path | None) -> dict:
    """MiniLM zero-shot, or the encoder of a saved dense retriever (through the embedding cache)."""
    if finetuned is None:
        return {"name": "dense", "max_length": 128, "progress": False}
    cfg = json.loads((finetuned / "retriever.json").read_text())["config"]
    model = finetuned / cfg["model"] if (finetuned / cfg["model"]).is_dir() else cfg["model"]
    return {"name": "dense", "model": str(model), "max_length": cfg["max_length"],
            "query_max_length": cfg.get("query_max_length"), "pooling": cfg["pooling"], "progress": False}


def agent_row(method: str, dataset: str, setting: str, encoder: str, report, ds, seconds: float, **extra) -> dict:
    m = {f"agent_{k}": round(v, 4) for k, v in report.agent_metrics.items()
         if k.split("@")[0] in ("recall", "map", "ndcg") and int(k.split("@")[1]) in KS}
    m.update({f"tool_{k}": round(report.metrics[k], 4) for k in ("recall@5", "ndcg@5")})
    return {"method": method, "dataset": dataset, "split": "test", "setting": setting, "encoder": encoder,
            "metrics": m, "queries": len(report.query_ids), "tools": len(ds.tools), "agents": len(ds.agents),
            "notes": report.notes, "command": COMMAND, "seconds": round(seconds, 1), "machine": machine(), **extra}


def _evaluate(name: str, ds, dense, mode: str, merge: str = "interleave", **config):
    from toolgraph.config import EvalConfig
    from toolgraph.evaluation import evaluate
    from toolgraph.retrieval import RETRIEVERS

    cls = RETRIEVERS.get(name)
    r = cls(cls.Config(name=name, **config), dense=dense)
    t0 = time.perf_counter()
    cfg = EvalConfig(ks=KS, query_mode=mode, steps="sentences" if mode == "step-wise" else "auto", step_merge=merge)
    rep = evaluate(r, ds, "test", cfg)
    return rep, time.perf_counter() - t0


def cmd_quality(args: argparse.Namespace) -> None:
    from toolgraph.data import load_dataset
    from toolgraph.retrieval.pipeline import resolve_retriever

    dense = resolve_retriever(dense_spec(args.finetuned), "dense")
    encoder = "all-MiniLM-L6-v2" if args.finetuned is None else args.encoder_name
    weights = json.loads(args.weights) if args.weights else {}
    for set_name in args.sets:
        adapter, options = SETS[set_name]
        ds = load_dataset(adapter, **options)
        rows = []
        for mode in args.modes:
            for method, scorer in MAIN.items():
                rep, sec = _evaluate(method, ds, dense, mode, scorer=scorer)
                rows.append(agent_row(method, set_name, mode, encoder, rep, ds, sec, scorer=scorer))
                for v in VARIANTS.get(method, []) if args.variants else []:
                    kw = weights if v == "weighted_rrf" else {}
                    rep, sec = _evaluate(method, ds, dense, mode, scorer=v, **kw)
                    rows.append(agent_row(f"{method}/{v}", set_name, mode, encoder, rep, ds, sec, scorer=v, **kw))
            if mode == "step-wise" and args.variants:
                for merge in ("max", "rrf"):
                    rep, sec = _evaluate("t2a", ds, dense, mode, merge, scorer="rrf")
                    rows.append(agent_row(f"t2a/merge={merge}", set_name, mode, encoder, rep, ds, sec, scorer="rrf"))
            print(set_name, mode, " | ".join(f"{r['method']} {r['metrics']['agent_recall@5']:.3f}" for r in rows
                                             if r["setting"] == mode), flush=True)
        upsert(NAME, rows, KEY)


def cmd_tune(args: argparse.Namespace) -> None:
    """Agent/tool type weights of weighted RRF on StableToolBench G1 (direct), by agent nDCG@5."""
    from toolgraph.data import load_dataset
    from toolgraph.retrieval.pipeline import resolve_retriever

    dense = resolve_retriever(dense_spec(None), "dense")
    ds = load_dataset(*SETS["stabletoolbench-g1"][:1], **SETS["stabletoolbench-g1"][1])
    rows = []
    for w in args.agent_weights:
        rep, sec = _evaluate("t2a", ds, dense, "direct", scorer="weighted_rrf", agent_weight=w, tool_weight=1.0)
        rows.append(agent_row(f"t2a/tune/agent_weight={w}", "stabletoolbench-g1", "direct", "all-MiniLM-L6-v2",
                              rep, ds, sec, agent_weight=w, tool_weight=1.0))
        print(w, rows[-1]["metrics"]["agent_ndcg@5"], flush=True)
    upsert(NAME, rows, KEY)


def _fmt(m: dict, k: str) -> str:
    return f"{m[k]:.3f}" if k in m else "–"


def render() -> None:
    path = RESULTS / f"{NAME}.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    cols = ["agent_recall@1", "agent_recall@3", "agent_recall@5", "agent_map@5", "agent_ndcg@5", "tool_recall@5"]
    head = "| test set (queries / tools / agents) | encoder | query | method | " + " | ".join(
        c.replace("agent_", "A-").replace("tool_", "T-") for c in cols) + " |"
    lines = [head, "|---|---|---|---|" + "---|" * len(cols)]
    order = {m: i for i, m in enumerate(MAIN)}
    main = [r for r in rows if r["method"] in MAIN]
    for r in sorted(main, key=lambda r: (list(SETS).index(r["dataset"]) if r["dataset"] in SETS else 99,
                                         r["encoder"], r["setting"], order[r["method"]])):
        best = max(x["metrics"]["agent_recall@5"] for x in main if (x["dataset"], x["encoder"], x["setting"]) ==
                   (r["dataset"], r["encoder"], r["setting"]))
        cells = [_fmt(r["metrics"], c) for c in cols]
        if r["metrics"]["agent_recall@5"] == best:
            cells[2] = f"**{cells[2]}**"
        lines.append(f"| {r['dataset']} ({r['queries']} / {r['tools']} / {r['agents']}) | {r['encoder']} | "
                     f"{r['setting']} | {r['method']} | " + " | ".join(cells) + " |")
    write_readme_table("agents-main", "\n".join(lines))
    var = [r for r in rows if "/" in r["method"] and "/tune/" not in r["method"] and r["encoder"] == "all-MiniLM-L6-v2"]
    lines = ["| test set | query | variant | A-R@1 | A-R@5 | A-nDCG@5 | T-R@5 |", "|---|---|---|---|---|---|---|"]
    for r in sorted(var, key=lambda r: (r["dataset"], r["setting"], r["method"])):
        m = r["metrics"]
        lines.append(f"| {r['dataset']} | {r['setting']} | {r['method']} | " +
                     " | ".join(_fmt(m, c) for c in ("agent_recall@1", "agent_recall@5", "agent_ndcg@5",
                                                     "tool_recall@5")) + " |")
    write_readme_table("agents-variants", "\n".join(lines))
    serve = [r for r in rows if r["method"] in ("serve/search_tools", "serve/sync")]
    lines = ["| measurement | figures |", "|---|---|"]
    for r in serve:
        lines.append(f"| {r['method']} ({r['dataset']}) | " + ", ".join(f"{k} {v}" for k, v in r["metrics"].items())
                     + " |")
    write_readme_table("agents-serving", "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    q.add_argument("--modes", nargs="+", default=["direct", "step-wise"])
    q.add_argument("--finetuned", type=Path, default=None, help="a saved dense retriever folder (fine-tuned encoder)")
    q.add_argument("--encoder-name", default="minilm-toollens-ft")
    q.add_argument("--weights", default=None, help='weighted RRF type weights as JSON, e.g. {"agent_weight": 2.0}')
    q.add_argument("--no-variants", dest="variants", action="store_false")
    t = sub.add_parser("tune")
    t.add_argument("--agent-weights", nargs="+", type=float, default=[0.25, 0.5, 0.75, 1.5, 2.0, 3.0])
    s = sub.add_parser("serve")
    s.add_argument("--tools", type=int, default=10000)
    s.add_argument("--changed", type=int, default=1000)
    s.add_argument("--requests", type=int, default=400)
    s.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    s.add_argument("--index", type=Path, default=Path("runs/serve_bench"))
    sub.add_parser("render")
    args = p.parse_args()
    if args.cmd == "quality":
        cmd_quality(args)
    elif args.cmd == "tune":
        cmd_tune(args)
    elif args.cmd == "serve":
        from serve_bench import run as serve_run

        rows = serve_run(args, COMMAND)
        upsert(NAME, rows, KEY)
    if args.cmd in ("render", "quality", "tune", "serve"):
        render()


if __name__ == "__main__":
    main()
