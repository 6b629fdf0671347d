"""Agent routing on the ToolBench test sets (RapidAPI tools as agents) and the serving benchmark.

    python benchmarks/agents.py quality [--finetuned RETRIEVER_DIR] [--sets ...]
    python benchmarks/agents.py tune            # type weights of weighted RRF, picked on StableToolBench G1
    python benchmarks/agents.py mcp-layout --set draft-g2   # the MCP adapter on real data, round trip
    python benchmarks/agents.py serve --tools 10000 --requests 400
    python benchmarks/agents.py render [--page docs/agents-and-serving.md]   # the tables, from agents.json

Test sets: StableToolBench G1 / G2 (catalog = union of the queries' candidate APIs) and G3 (COLT's
1,419-API G3 corpus), DRAFT's original G2 (with the RapidAPI tool descriptions DRAFT ships, 273 of
280 agents) and G3 (COLT corpus). ToolBench has no annotated steps: step-wise queries are the
request's sentences (``eval.steps: sentences``), merged by max score (retrieval/steps.py).
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

from results_io import DOCS, RESULTS, machine, upsert, write_block  # noqa: E402

NAME = "agents"
PAGE = DOCS / "agents-and-serving.md"  # where the agents-* blocks live
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
# score: min-max fusion at the scorer's default bm25_weight (0.3, chosen on the datasets' val splits)
VARIANTS = {"t2a": ["dense", "bm25", "score", "weighted_rrf"], "agent_only": ["dense", "bm25", "score"],
            "tool_only": ["dense", "bm25", "score"]}
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


def _evaluate(name: str, ds, dense, mode: str, merge: str = "max", **config):
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
    from toolgraph.retrieval.loading import resolve_retriever

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
                for merge in ("interleave", "rrf"):
                    rep, sec = _evaluate("t2a", ds, dense, mode, merge, scorer="rrf")
                    rows.append(agent_row(f"t2a/merge={merge}", set_name, mode, encoder, rep, ds, sec, scorer="rrf"))
            print(set_name, mode, " | ".join(f"{r['method']} {r['metrics']['agent_recall@5']:.3f}" for r in rows
                                             if r["setting"] == mode), flush=True)
        upsert(NAME, rows, KEY)


def cmd_tune(args: argparse.Namespace) -> None:
    """Agent/tool type weights of weighted RRF on StableToolBench G1 (direct), by agent nDCG@5."""
    from toolgraph.data import load_dataset
    from toolgraph.retrieval.loading import resolve_retriever

    dense = resolve_retriever(dense_spec(None), "dense")
    ds = load_dataset(*SETS["stabletoolbench-g1"][:1], **SETS["stabletoolbench-g1"][1])
    rows = []
    for w in args.agent_weights:
        rep, sec = _evaluate("t2a", ds, dense, "direct", scorer="weighted_rrf", agent_weight=w, tool_weight=1.0)
        rows.append(agent_row(f"t2a/tune/agent_weight={w}", "stabletoolbench-g1", "direct", "all-MiniLM-L6-v2",
                              rep, ds, sec, agent_weight=w, tool_weight=1.0))
        print(w, rows[-1]["metrics"]["agent_ndcg@5"], flush=True)
    upsert(NAME, rows, KEY)


def cmd_mcp_layout(args: argparse.Namespace) -> None:
    """Write a ToolBench test set in the MCP (LiveMCPBench) layout — servers = RapidAPI tools, tasks with
    numbered 'Tools' (bare API names) and 'Steps' (the request's sentences) — read it back through the
    ``mcp`` adapter, and score the duplicate-name policy against the true owners, then T2A on it."""
    import tempfile

    from toolgraph.data import load_dataset
    from toolgraph.data.request_pieces import sentences
    from toolgraph.retrieval.loading import resolve_retriever

    adapter, options = SETS[args.set]
    ds = load_dataset(adapter, **options)
    by_agent: dict[str, list] = {}
    for t in ds.tools:
        by_agent.setdefault(t.agent, []).append(t)
    servers = [{"name": a.id, "description": a.description, "category": a.category,
                "tools": {"rapidapi": {"tools": [{"name": t.name, "description": t.description,
                                                  "inputSchema": t.parameters} for t in by_agent.get(a.id, [])]}}}
               for a in ds.agents]
    owner = ds.agent_of()
    name_of = ds.tool_by_id()
    tasks = [{"task_id": q.id, "Question": q.text, "category": name_of[q.tools[0]].category,
              "Annotator Metadata": {"Steps": "\n".join(f"{i}. {s}" for i, s in enumerate(sentences(q.text), 1)),
                                     "Tools": "\n".join(f"{i}. {name_of[t].name}" for i, t in enumerate(q.tools, 1)),
                                     "Number of tools": str(len(q.tools))}} for q in ds.queries]
    folder = args.write_only / "mcp" if args.write_only else Path(tempfile.mkdtemp(prefix="mcp-layout-"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "servers.json").write_text(json.dumps(servers))
    (folder / "tasks.json").write_text(json.dumps(tasks))
    if args.write_only:
        print(f"wrote {folder}/servers.json ({len(servers)} servers) and tasks.json ({len(tasks)} tasks)")
        return
    truth = {q.id: {(owner[t], name_of[t].name) for t in q.tools} for q in ds.queries}
    dense = resolve_retriever(dense_spec(None), "dense")
    rows = []
    for policy in args.policies:
        m = load_dataset("mcp", folder, servers="servers.json", tasks="tasks.json", duplicate_names=policy)
        got = {q.id: {(t.split("::", 1)[0], t.split("::", 1)[1]) for t in q.tools} for q in m.queries}
        exact = sum(got.get(qid) == want for qid, want in truth.items())
        notes = {k: m.notes.get(k, 0) for k in ("ambiguous_names_in_catalog", "ambiguous_gold", "resolved_by_category",
                                                 "resolved_by_catalog_order")}
        for mode in args.modes:
            rep, sec = _evaluate("t2a", m, dense, mode, scorer="rrf")
            rows.append(agent_row("t2a", f"{args.set}@mcp-layout/{policy}", mode, "all-MiniLM-L6-v2", rep, m, sec,
                                  adapter={**notes, "tasks": len(m.queries), "gold_sets_exact": exact,
                                           "tasks_in_source": len(ds.queries), "skipped": dict(m.skipped)}))
            print(policy, mode, rows[-1]["metrics"]["agent_recall@5"], rows[-1]["adapter"], flush=True)
    upsert(NAME, rows, KEY)


def _fmt(m: dict, k: str) -> str:
    return f"{m[k]:.3f}" if k in m else "–"


def render(page: str | Path = PAGE) -> None:
    """The agents-* tables of ``page`` from the results file."""
    path = RESULTS / f"{NAME}.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    by = {(r["method"], r["dataset"], r["setting"], r["encoder"]): r for r in rows}
    blocks = []
    for encoder in ("all-MiniLM-L6-v2", "minilm-toollens-ft"):
        sets = [s for s in SETS if any((m, s, "direct", encoder) in by for m in MAIN)]
        if not sets:
            continue
        lines = [f"**{encoder}** — agent Recall@1 / Recall@5 / nDCG@5 (best Recall@5 of the row in bold)", "",
                 "| test set (queries / APIs / agents) | query | " + " | ".join(MAIN) + " |",
                 "|---|---|" + "---|" * len(MAIN)]
        for s in sets:
            for mode in ("direct", "step-wise"):
                got = {m: by.get((m, s, mode, encoder)) for m in MAIN}
                if not any(got.values()):
                    continue
                best = max(r["metrics"]["agent_recall@5"] for r in got.values() if r)
                any_row = next(r for r in got.values() if r)
                cells = []
                for r in got.values():
                    if r is None:
                        cells.append("–")
                        continue
                    m = r["metrics"]
                    r5 = f"{m['agent_recall@5']:.3f}"
                    r5 = f"**{r5}**" if m["agent_recall@5"] == best else r5
                    cells.append(f"{m['agent_recall@1']:.3f} / {r5} / {m['agent_ndcg@5']:.3f}")
                lines.append(f"| {s} ({any_row['queries']} / {any_row['tools']} / {any_row['agents']}) | {mode} | "
                             + " | ".join(cells) + " |")
        blocks.append("\n".join(lines))
    write_block(page, "agents-main", "\n\n".join(blocks))

    lines = ["| test set | query | " + " | ".join(
        ["t2a rrf", "t2a score (dense + 0.3 BM25)", "t2a dense", "t2a bm25", "tool_only dense", "agent_only dense",
         "t2a merge=interleave", "t2a merge=rrf"]) + " |", "|---|---|" + "---|" * 8]
    keys = ["t2a", "t2a/score", "t2a/dense", "t2a/bm25", "tool_only/dense", "agent_only/dense", "t2a/merge=interleave",
            "t2a/merge=rrf"]
    for s in SETS:
        for mode in ("direct", "step-wise"):
            cells = [by.get((k, s, mode, "all-MiniLM-L6-v2")) for k in keys]
            if not any(cells):
                continue
            lines.append(f"| {s} | {mode} | " + " | ".join(
                f"{c['metrics']['agent_recall@5']:.3f}" if c else "–" for c in cells) + " |")
    write_block(page, "agents-variants", "\n".join(lines))

    lines = ["| catalog | policy | query | tasks | ambiguous gold names | by category | by catalog order "
             "| gold sets exactly right | agent R@5 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "@mcp-layout/" in r["dataset"]:
            a = r["adapter"]
            src, policy = r["dataset"].split("@mcp-layout/")
            lines.append(f"| {src} → MCP layout | {policy} | {r['setting']} | {a['tasks']} | {a['ambiguous_gold']} | "
                         f"{a['resolved_by_category']} | {a['resolved_by_catalog_order']} | "
                         f"{a['gold_sets_exact']} / {a['tasks_in_source']} | {r['metrics']['agent_recall@5']:.3f} |")
    write_block(page, "agents-mcp-layout", "\n".join(lines))

    lines = ["| index | clients | micro-batching | requests | errors | p50 ms | p95 ms | requests/s | mean batch |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted((r for r in rows if r["method"] == "serve/search_tools"),
                    key=lambda r: (r["metrics"]["clients"], -r["metrics"]["max_batch"])):
        m = r["metrics"]
        batching = f"on (≤{m['max_batch']})" if m["max_batch"] > 1 else "off"
        lines.append(f"| {m['tools']:,} tools | {m['clients']} | {batching} | {m['requests']} | {m['errors']} | "
                     f"{m['p50_ms']} | {m['p95_ms']} | {m['requests_per_s']} | {m['mean_batch']} |")
    for r in rows:
        if r["method"] == "serve/sync":
            m = r["metrics"]
            lines += ["", "| index sync | tools / agents | changed tools | updated | texts encoded | seconds "
                      "| full build: texts encoded, seconds | speed-up |", "|---|---|---|---|---|---|---|---|",
                      f"| `toolgraph index sync` | {m['tools']:,} / {m['agents']:,} | {m['changed_tools']} | "
                      f"{m['updated']} | **{m['encoded']}** | {m['sync_s']} | {m['build_encoded']:,}, {m['build_s']} "
                      f"| {m['speedup_vs_rebuild']}× |"]
    write_block(page, "agents-serving", "\n".join(lines))


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
    s.add_argument("--max-batches", type=int, nargs="+", default=[32, 1])
    m = sub.add_parser("mcp-layout")
    m.add_argument("--set", default="draft-g2", choices=list(SETS))
    m.add_argument("--policies", nargs="+", default=["category", "first", "all"])
    m.add_argument("--modes", nargs="+", default=["direct", "step-wise"])
    m.add_argument("--write-only", type=Path, default=None, metavar="DIR",
                   help="only write DIR/mcp/servers.json and tasks.json (then: TOOLGRAPH_DATA=DIR python evaluate.py "
                        "--config configs/eval/t2a_mcp.yaml)")
    sub.add_parser("render")
    for sp in sub.choices.values():
        sp.add_argument("--page", type=Path, default=PAGE, help="page with the agents-* blocks")
    args = p.parse_args()
    if args.cmd == "quality":
        cmd_quality(args)
    elif args.cmd == "tune":
        cmd_tune(args)
    elif args.cmd == "mcp-layout":
        cmd_mcp_layout(args)
    elif args.cmd == "serve":
        from serve_bench import run as serve_run

        rows = serve_run(args, COMMAND)
        upsert(NAME, rows, KEY)
    if args.cmd in ("render", "quality", "tune", "serve", "mcp-layout"):
        render(args.page)


if __name__ == "__main__":
    main()
