"""Issue "usage-driven and classification retrieval": quality rows and stage latencies.

    # a finished run (train.py out_dir) or evaluate.py --out folder -> one row
    python benchmarks/usage_rerank.py add RUN_DIR --method refiner+mlc --setting standard --command "python train.py ..."
    # median latency per query of each stage (batch 1 and 64), refiner vs cross-encoder over 64 candidates
    python benchmarks/usage_rerank.py latency
    # a trained reranker run: first_stage_weight chosen on val (grid), then test with it -> one row
    python benchmarks/usage_rerank.py tune-weight RUN_DIR --method refiner+mlc --setting fast --command "..."
    # ... over another first stage: the summed scores of several runs (e.g. MLC seeds), saved as one pipeline
    python benchmarks/usage_rerank.py tune-weight RUN_DIR ... --first-stage MLC_RUN_A MLC_RUN_B --save OUT_DIR
    # the tables again, from the results file
    python benchmarks/usage_rerank.py render [--page docs/usage-and-rerank.md]

Rows go to benchmarks/results/usage_rerank.json and the tables on docs/usage-and-rerank.md (markers ``usage`` and
``usage-speed``). Latency is independent of trained weights, so it uses pretrained MiniLM
everywhere (the rerank heads are freshly initialised); medians and ratios come from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from results_io import DOCS, RESULTS, machine, quality_table, upsert, write_block  # noqa: E402

NAME = "usage_rerank"
PAGE = DOCS / "usage-and-rerank.md"  # where the usage and usage-speed blocks live
WEIGHTS = [0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 10.0]  # tune-weight's default grid of first-stage weights


def add(args: argparse.Namespace) -> None:
    res = json.loads((args.run / "results.json").read_text())
    cfg = res["config"]
    model = cfg.get("model") or cfg.get("retriever") or {}
    encoder = model.get("encoder") or model.get("model") or "all-MiniLM-L6-v2"
    row = {"method": args.method, "dataset": args.dataset or cfg["data"]["name"], "split": "test",
           "setting": args.setting, "encoder": Path(str(encoder)).name,
           "queries": res["dataset"]["queries"]["test"] if "queries" in res["dataset"] else None,
           "metrics": {k: round(v, 4) for k, v in res["metrics"].items()}, "command": args.command}
    if "training" in res:
        row["training_steps"] = res["training"]["global_step"]
        row["seconds"] = round(res["training"]["seconds"])
        row.update({k: res["training"][k] for k in ("train_seconds", "device") if k in res["training"]})
    elif "timings" in res:
        row["seconds"] = round(res["timings"].get("index_s", 0) + res["timings"].get("retrieve_s", 0))
    if args.training_steps is not None:  # e.g. a run stopped early and evaluated from a checkpoint
        row["training_steps"] = args.training_steps
    if args.seconds is not None:
        row["seconds"] = args.seconds
    if args.note:
        row["note"] = args.note
    if (args.run / "logs" / "metrics.csv").is_file():
        from training_results import val_curve

        row["val_curve"] = val_curve(args.run)
    if args.test_curve:  # test Recall@5 of every checkpoint the run kept (checkpoint.save_top_k=-1)
        from training_results import test_curve

        row["test_curve"] = test_curve(args.run)
    upsert(NAME, [row])
    render(page=args.page)
    print(json.dumps({k: row.get(k) for k in ("method", "setting", "metrics", "training_steps", "seconds")}))


def render(page: str | Path = PAGE) -> None:
    """The usage and usage-speed tables of ``page`` from the results file."""
    rows = json.loads((RESULTS / f"{NAME}.json").read_text())["rows"]
    quality = [r for r in rows if "recall@5" in r["metrics"]]
    write_block(page, "usage", quality_table(quality, extra=("training_steps", "seconds")))
    speed = [r for r in rows if r["setting"].startswith("latency")]
    lines = []
    if speed:
        lines = ["| stage | batch 1 (ms/query) | batch 64 (ms/query) | note |", "|---|---|---|---|"]
        for r in speed:
            m = r["metrics"]
            lines.append(f"| {r['method']} | {m['ms_per_query_b1']} | {m['ms_per_query_b64']} | {r.get('note', '')} |")
    ratio = next((r for r in rows if r["setting"] == "speed:refiner-vs-cross-encoder"), None)
    if ratio:
        m = ratio["metrics"]
        lines.append(f"\nToolRefiner vs cross-encoder over the same 64 candidates (batch 1, {m['runs']} alternating "
                     f"runs): {m['refiner_ms']} ms vs {m['cross_encoder_ms']} ms per query, **{m['ratio']}x** "
                     f"({ratio['machine']}).")
    if lines:
        write_block(page, "usage-speed", "\n".join(lines).strip())


def latency(args: argparse.Namespace) -> None:
    import torch

    from toolgraph.config import DataConfig
    from toolgraph.data import prepare_dataset
    from toolgraph.nn.encoder import TextEncoder, load_backbone
    from toolgraph.nn.heads import ToolClassifier
    from toolgraph.nn.rerankers import PairScorer, ToolRefiner
    from toolgraph.retrieval.classifier import ClassifierRetriever, ClassifierRetrieverConfig
    from toolgraph.retrieval.rerankers import (
        CrossEncoderReranker,
        CrossEncoderRerankerConfig,
        RefinerReranker,
        RefinerRerankerConfig,
    )
    from toolgraph.retrieval.tool2vec import Tool2VecConfig, Tool2VecRetriever

    torch.manual_seed(0)
    ds = prepare_dataset(DataConfig(name="toollens"))
    queries = [q.text for q in ds.split("test")]
    # query-time cost does not depend on how tool vectors were made: index without usage (no 15k encodes)
    t2v = Tool2VecRetriever(Tool2VecConfig(model="all-MiniLM-L6-v2", cache_dir=".cache/embeddings", progress=False))
    t2v.index(ds.tools)
    t2v.config.cache_dir = None  # timed queries must really be encoded
    t2v._cache = None
    backbone, tok = load_backbone("all-MiniLM-L6-v2")
    mlc_net = ToolClassifier(TextEncoder(backbone, "mean", normalize=False), len(ds.tools))
    mlc = ClassifierRetriever(ClassifierRetrieverConfig(cache_dir=None, progress=False, max_length=128,
                                                        query_max_length=128),
                              encoder=mlc_net.encoder, tokenizer=tok, head=mlc_net.head,
                              head_tools=[t.id for t in t2v.tools])
    mlc.index(ds.tools)
    refiner = RefinerReranker(RefinerRerankerConfig(max_length=128), network=ToolRefiner(load_backbone(
        "all-MiniLM-L6-v2")[0], 384).eval(), tokenizer=tok, vectors=t2v)
    refiner.index(ds.tools)
    cross = CrossEncoderReranker(CrossEncoderRerankerConfig(max_length=160, batch_size=64),
                                 network=PairScorer(load_backbone("all-MiniLM-L6-v2")[0]).eval(), tokenizer=tok)
    cross.index(ds.tools)
    cands = t2v.retrieve(queries[:64], 64).ids  # the same 64 candidates for both rerankers

    def per_query(fn, batch: int, repeats: int) -> float:
        times = []
        for r in range(repeats):
            lo = (r * batch) % (len(queries) - batch)
            qs = queries[lo:lo + batch]
            t0 = time.perf_counter()
            fn(qs, [cands[i % 64] for i in range(lo, lo + batch)])
            times.append((time.perf_counter() - t0) / batch * 1000)
        return round(statistics.median(times), 2)

    from toolgraph.retrieval.encode import encode_texts
    from toolgraph.retrieval.topk import topk

    def t2v_stage(qs, cs):  # the uncached query path (retrieve() would serve repeats from the cache)
        return topk(encode_texts(t2v.encoder, t2v._tokenizer, qs, 64, 128) @ t2v.tool_vectors.T, 64)

    def mlc_stage(qs, cs):
        return topk(encode_texts(mlc.encoder, tok, qs, 64, 128) @ mlc.weight.T + mlc.bias, 64)

    stages = {
        "tool2vec": (t2v_stage, "encode the query + exact search over 464 tools"),
        "mlc": (mlc_stage, "encode the query + head logits over 464 tools"),
        "refiner": (lambda qs, cs: refiner.rerank(qs, cs), "rerank 64 candidates (one pass: query + 64 slots)"),
        "cross_encoder": (lambda qs, cs: cross.rerank(qs, cs), "rerank 64 candidates (64 pair passes)"),
    }
    for fn, _ in stages.values():  # warm-up
        fn(queries[:1], cands[:1])
    rows, b1 = [], {}
    with torch.inference_mode():
        for name, (fn, note) in ([] if args.ratio_only else stages.items()):
            b1[name] = per_query(fn, 1, args.repeats)
            b64 = per_query(fn, 64, args.repeats_b64)
            rows.append({"method": name, "dataset": "toollens", "split": "test", "setting": "latency",
                         "metrics": {"ms_per_query_b1": b1[name], "ms_per_query_b64": b64}, "note": note,
                         "machine": machine(), "command": "python benchmarks/usage_rerank.py latency"})
            print(rows[-1]["method"], rows[-1]["metrics"], flush=True)
        # the headline ratio: alternate the two rerankers so drifting load hits both alike
        r_t, c_t = [], []
        for i in range(args.repeats):
            q, c = [queries[i]], [cands[i % 64]]
            t0 = time.perf_counter()
            refiner.rerank(q, c)
            r_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            cross.rerank(q, c)
            c_t.append(time.perf_counter() - t0)
    r_ms, c_ms = statistics.median(r_t) * 1000, statistics.median(c_t) * 1000
    rows.append({"method": "refiner", "dataset": "toollens", "split": "test",
                 "setting": "speed:refiner-vs-cross-encoder", "machine": machine(),
                 "metrics": {"refiner_ms": round(r_ms, 2), "cross_encoder_ms": round(c_ms, 2),
                             "ratio": round(c_ms / r_ms, 1), "runs": args.repeats},
                 "note": "batch 1, the same 64 Tool2Vec candidates, MiniLM backbones, alternating",
                 "command": "python benchmarks/usage_rerank.py latency"})
    print(rows[-1]["metrics"])
    upsert(NAME, rows)
    render(page=args.page)


def _tuning_base(run: Path):
    """The training config of ``run``, its dataset, and the evaluation config of its test split that
    ``toolgraph.tuning`` searches on its val split (ks 1, 3, 5, 7, 10)."""
    from toolgraph.config import EvaluateConfig, load_config
    from toolgraph.data import prepare_dataset
    from toolgraph.training import TrainConfig

    cfg = load_config(TrainConfig, [run / "config.yaml"])
    data = {k: getattr(cfg.data, k) for k in ("name", "root", "setting", "seed", "options")}
    base = load_config(EvaluateConfig, [{"data": {**data, "split": cfg.data.test_split},
                                         "eval": {"ks": [1, 3, 5, 7, 10]}}], where=str(run / "config.yaml"))
    return cfg, prepare_dataset(cfg.data), base


def tune_weight(args: argparse.Namespace) -> None:
    """The pipeline a reranker run exported, with ``first_stage_weight`` chosen on the run's val split by
    ``toolgraph.tuning.choose_on_val`` (best val R@5, then R@3, then the weight listed first: the
    smallest), then tested once with that weight."""
    from dataclasses import replace

    import toolgraph
    from toolgraph.tuning import choose_on_val

    cfg, ds, base = _tuning_base(args.run)
    r = toolgraph.load(args.run)
    if args.first_stage:  # another first stage; several: the sum of their raw scores (e.g. MLC seeds' logits)
        from toolgraph.retrieval.loading import resolve_retriever
        from toolgraph.retrieval.pipeline import FusionConfig, FusionRetriever

        members = [str(m) for m in args.first_stage]
        r.first_stage = (resolve_retriever(members[0], "--first-stage") if len(members) == 1 else
                         FusionRetriever(FusionConfig(members=members, method="score", normalize="none")))
    tuned = choose_on_val(replace(base, retriever=r.config), {"retriever.first_stage_weight": args.weights},
                          ["recall@5", "recall@3"], val_split=cfg.data.val_split, retriever=r, ds=ds, log=print)
    grid = [{"weight": p.overrides["retriever.first_stage_weight"],
             **{k: round(p.metrics[k], 4) for k in ("recall@3", "recall@5", "recall@7")}} for p in tuned.table]
    best = next(g for g, p in zip(grid, tuned.table) if p.overrides == tuned.winner)
    if args.save:  # the tuned pipeline as one folder (first stage, reranker, weight): toolgraph.load(args.save)
        r.save(args.save)
    res = json.loads((args.run / "results.json").read_text())
    tr = res.get("training", {})
    row = {"method": args.method, "dataset": cfg.data.name, "split": "test", "setting": args.setting,
           "encoder": Path(str(cfg.model.encoder.name)).name, "queries": len(ds.split("test")),
           "metrics": {k: round(v, 4) for k, v in tuned.report.metrics.items()},
           "command": f"{args.command}; python benchmarks/usage_rerank.py tune-weight {args.run}"
                      + (" --first-stage " + " ".join(map(str, args.first_stage)) if args.first_stage else "")
                      + ("" if args.weights == WEIGHTS else " --weights " + " ".join(f"{w:g}" for w in args.weights)),
           "first_stage_weight": best["weight"], "val_grid": grid, "tune_seconds": round(tuned.seconds, 1),
           "training_steps": tr.get("global_step"), "seconds": round(tr.get("train_seconds", tr.get("seconds", 0))),
           "train_seconds": tr.get("train_seconds"),
           "device": tr.get("device"), "machine": machine()}
    if args.first_stage:
        row["first_stage"] = [str(m) for m in args.first_stage]
    upsert(NAME, [row])
    render(page=args.page)
    m = row["metrics"]
    print(f"{args.method} {args.setting}: w={best['weight']:g} (val R@5 {best['recall@5']:.4f}); test R@3 "
          f"{m['recall@3']:.4f} R@5 {m['recall@5']:.4f} R@7 {m['recall@7']:.4f}")


def tune_knn(args: argparse.Namespace) -> None:
    """A first stage (an MLC run) fused with query neighbours (``query_knn`` over ``--encoder``):
    first-stage score + w x neighbour votes (a ``fusion`` retriever, ``method: score``, no normalising),
    ``neighbors`` and w chosen on the run's val split by ``toolgraph.tuning.choose_on_val`` (best val R@5,
    then R@3, then the point listed first: fewer neighbours, then the smaller weight), then tested once;
    saved as one ``fusion`` retriever folder (``--save``) that a reranker can take as its first stage."""
    from dataclasses import replace

    import toolgraph
    from toolgraph.config import EvalConfig
    from toolgraph.evaluation import evaluate
    from toolgraph.retrieval.pipeline import FusionConfig, FusionRetriever
    from toolgraph.tuning import choose_on_val

    cfg, ds, base_cfg = _tuning_base(args.run)
    base = toolgraph.load(args.run)
    knn = {"name": "query_knn", "model": str(args.encoder), "max_length": cfg.data.max_tool_length,
           "query_max_length": cfg.data.eval_max_query_length, "progress": False, "cache_dir": args.cache_dir}
    fused = FusionRetriever(FusionConfig(members=[str(args.run), knn], weights=[1.0, args.weights[0]],
                                         method="score", normalize="none"), members=[base, None])
    grid = {"retriever.members.1.neighbors": args.neighbors, "retriever.weights": [[1.0, w] for w in args.weights]}
    tuned = choose_on_val(replace(base_cfg, retriever=fused.config), grid, ["recall@5", "recall@3"],
                          val_split=cfg.data.val_split, retriever=fused, ds=ds, log=print)
    rows = [{"neighbors": p.overrides["retriever.members.1.neighbors"], "weight": p.overrides["retriever.weights"][1],
             **{n: round(p.metrics[n], 4) for n in ("recall@3", "recall@5")}} for p in tuned.table]
    best = next(g for g, p in zip(rows, tuned.table) if p.overrides == tuned.winner)
    if args.save:
        fused.save(args.save)
    alone = evaluate(base, ds, "test", EvalConfig(ks=[3, 5])).metrics
    res = json.loads((args.run / "results.json").read_text())
    tr = res.get("training", {})
    row = {"method": args.method, "dataset": cfg.data.name, "split": "test", "setting": args.setting,
           "encoder": Path(str(cfg.model.encoder.name)).name, "queries": len(ds.split("test")),
           "metrics": {k: round(v, 4) for k, v in tuned.report.metrics.items()},
           "command": f"{args.command}; python benchmarks/usage_rerank.py tune-knn {args.run} --encoder {args.encoder}",
           "neighbors": best["neighbors"], "knn_weight": best["weight"], "val_grid": rows,
           "tune_seconds": round(tuned.seconds, 1), "training_steps": tr.get("global_step"),
           "seconds": round(tr.get("train_seconds", tr.get("seconds", 0))), "train_seconds": tr.get("train_seconds"),
           "device": tr.get("device"), "machine": machine()}
    upsert(NAME, [row])
    render(page=args.page)
    m = row["metrics"]
    print(f"{args.method} {args.setting}: k={best['neighbors']} w={best['weight']:g} (val R@5 {best['recall@5']:.4f}); "
          f"test R@3 {m['recall@3']:.4f} R@5 {m['recall@5']:.4f} (first stage alone {alone['recall@5']:.4f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add")
    a.add_argument("run", type=Path)
    a.add_argument("--method", required=True)
    a.add_argument("--setting", default="standard")
    a.add_argument("--dataset")
    a.add_argument("--command", required=True)
    a.add_argument("--training-steps", type=int)
    a.add_argument("--seconds", type=int)
    a.add_argument("--note")
    a.add_argument("--test-curve", action="store_true")
    a.set_defaults(fn=add)
    lat = sub.add_parser("latency")
    lat.add_argument("--repeats", type=int, default=30)
    lat.add_argument("--repeats-b64", type=int, default=3)
    lat.add_argument("--ratio-only", action="store_true", help="only the refiner vs cross-encoder ratio")
    lat.set_defaults(fn=latency)
    tw = sub.add_parser("tune-weight")
    tw.add_argument("run", type=Path)
    tw.add_argument("--method", default="refiner+mlc")
    tw.add_argument("--setting", required=True)
    tw.add_argument("--command", required=True, help="the train.py command(s) that made the run")
    tw.add_argument("--weights", type=float, nargs="+", default=WEIGHTS)
    tw.add_argument("--first-stage", type=Path, nargs="+",
                    help="a run or retriever folder that replaces the run's first stage; several: their summed scores (an ensemble)")
    tw.add_argument("--save", type=Path, help="save the tuned pipeline to this folder")
    tw.set_defaults(fn=tune_weight)
    tk = sub.add_parser("tune-knn")
    tk.add_argument("run", type=Path, help="the first stage: an MLC run folder")
    tk.add_argument("--encoder", type=Path, required=True, help="the query encoder of the neighbours (a model folder)")
    tk.add_argument("--method", default="mlc+knn")
    tk.add_argument("--setting", required=True)
    tk.add_argument("--command", required=True, help="the train.py command(s) that made the run")
    tk.add_argument("--neighbors", type=int, nargs="+", default=[5, 10, 20, 50])
    tk.add_argument("--weights", type=float, nargs="+", default=[0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0])
    tk.add_argument("--save", type=Path, help="save the tuned fusion to this folder")
    tk.add_argument("--cache-dir", default=".cache/embeddings", help="the neighbours' embedding cache")
    tk.set_defaults(fn=tune_knn)
    ren = sub.add_parser("render")
    ren.set_defaults(fn=lambda a: render(page=a.page))
    for sp in sub.choices.values():
        sp.add_argument("--page", type=Path, default=PAGE, help="page with the usage and usage-speed blocks")
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
