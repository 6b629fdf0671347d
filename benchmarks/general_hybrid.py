"""Issue "General retriever": dense + BM25 hybrids, zero-shot, on the leave-one-dataset-out datasets.

The hybrid is the shipped fusion retriever with ``method: score``: each member's scores min-max
normalised per query over the catalog, then ``dense + w * bm25`` (toolgraph/retrieval/pipeline.py).
Two dense members are measured, each fused with the dataset's own BM25 preset:

- ``hybrid_minilm``: all-MiniLM-L6-v2 (configs/eval/minilm_<dataset>.yaml), no training at all;
- ``hybrid_general``: the leave-one-dataset-out model of the dataset (the ``run`` of its
  ``general_lodo`` row, at the WiSE alpha chosen on val for those rows), where the run folder is here;
  ``--lodo test-as-train`` takes the models of ``lodo --test-as-train`` instead (rows with that setting).

    python benchmarks/general_hybrid.py --weights 0.2 0.3 0.5 [--datasets seal-tools ...]
    python benchmarks/general_hybrid.py --weights 0.2 0.3 0.5 --lodo test-as-train --dense general
    python benchmarks/general_hybrid.py --learned   # hybrid_minilm_learned: the fusion fitted on the other 13

``--learned`` fits a fusion model (``retriever.method: learned``, toolgraph/retrieval/fusion_model.py)
for each dataset on the test and val queries of the 13 others (their labels; never the held-out
dataset's), and ranks the held-out dataset with it: zero-shot, like the leave-one-dataset-out models.

``w`` is chosen once, by the mean R@5 of the MiniLM hybrid on the val splits of the datasets that have
one (test never chooses), and applied to both. Rows go to benchmarks/results/general.json, their
``metrics`` by w (``"0.0"``: the dense member alone, ``"0.5"``: dense + 0.5 x BM25) and
``val_recall@5`` by w; the table to docs/general.md (block ``general-hybrid``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from general import FULL_FT, KEEP, LODO_SETS, NAME, PAGE, ROOT, at_alpha, baseline, chosen_alpha  # noqa: E402
from results_io import RESULTS, machine, upsert, write_block  # noqa: E402

# --lodo: which leave-one-dataset-out models (general_lodo rows of this setting) are the dense member
SETTINGS = {"main": "zero-shot", "test-as-train": "zero-shot, test-only datasets train", "full-finetune": FULL_FT,
            "full-finetune-lr6e-5": f"{FULL_FT}, lr 6e-5",  # configs/general.yaml's recipe
            "self-supervised": "zero-shot, test-only datasets train, self-supervised pairs",
            # trained as the hybrid's dense side (model.bm25_fusion: 0.3, the serving weight)
            "bm25-fusion": "zero-shot, test-only datasets train, BM25-fused training"}
# the generated block of each --lodo setting's hybrid table (the main setting's is "general-hybrid")
BLOCKS = {SETTINGS["test-as-train"]: "general-hybrid-tat", FULL_FT: "general-hybrid-full-finetune",
          SETTINGS["full-finetune-lr6e-5"]: "general-hybrid-full-finetune-lr6e-5",
          SETTINGS["self-supervised"]: "general-hybrid-self-supervised",
          SETTINGS["bm25-fusion"]: "general-hybrid-bm25-fusion"}
# the jobs file that trains a setting's models and fuses each in the same job (the models stay on the GPU machine)
JOBS = {SETTINGS["full-finetune-lr6e-5"]: "benchmarks/device/general_fullft_lr6e-5.jobs"}


def members(dataset: str, encoder: Path | None, wise: float | None, base: str = "all-MiniLM-L6-v2"):
    """The dataset's dense retriever (MiniLM, or ``encoder`` at WiSE ``wise`` towards ``base``, the encoder
    its training started from) and its BM25, with the dataset and the evaluation config of its MiniLM preset."""
    from toolgraph.config import EvaluateConfig, load_config
    from toolgraph.data import prepare_dataset
    from toolgraph.retrieval.loading import resolve_retriever

    overrides = [f"retriever.model={encoder}", "retriever.cache_dir=null"] if encoder else []
    cfg = load_config(EvaluateConfig, [ROOT / "configs" / "eval" / f"minilm_{dataset}.yaml"], overrides)
    dense = resolve_retriever(cfg.retriever)
    if encoder is not None and wise is not None and wise != 1:
        from toolgraph.nn.encoder import interpolate_weights

        interpolate_weights(dense.encoder.backbone, base, wise)
    bm25 = resolve_retriever(load_config(EvaluateConfig, [ROOT / "configs" / "eval" / f"bm25_{dataset}.yaml"]).retriever)
    return dense, bm25, prepare_dataset(cfg.data), cfg


def rule_key(method: str, w: float) -> str:
    """The key of a fusion rule in a row's ``metrics`` / ``val_recall@5``: ``"0.3"`` for dense + 0.3 x BM25
    (min-max scores, ``method: score``; ``"0.0"``: the dense member alone), ``"rrf:1.0"`` for reciprocal
    rank fusion with BM25 at weight 1.0 (k = 60, the ``t2a`` preset's default rule)."""
    return str(w) if method == "score" else f"rrf:{w}"


def rule_order(key: str) -> tuple[int, float]:
    """Rules in the order a tie is broken: the dense member alone, then score fusion by w, then rrf by w."""
    return (1, float(key[4:])) if key.startswith("rrf:") else (0, float(key))


def grid(dataset: str, weights: list[float], encoder: Path | None = None, wise: float | None = None,
         rrf_weights: tuple[float, ...] = (), base: str = "all-MiniLM-L6-v2") -> dict:
    """Test metrics and val R@5 of ``dense + w * bm25`` for every w (w = 0: the dense member alone) and of
    reciprocal rank fusion for every w of ``rrf_weights``, by ``toolgraph.tuning.evaluate_grid`` over the
    fusion's rule and weights (each member scores or ranks each split once)."""
    return fusion_grid(*members(dataset, encoder, wise, base), weights, rrf_weights)


def fusion_grid(dense, bm25, ds, cfg, weights: list[float], rrf_weights: tuple[float, ...] = ()) -> dict:
    """:func:`grid` on members already built (:func:`members`): a caller that changes only how the dense
    member scores requests (its ``query_split``; BM25 always reads the whole request) reuses its indexed
    catalog instead of encoding it again."""
    from dataclasses import replace

    from toolgraph.evaluation import evaluate
    from toolgraph.retrieval.pipeline import FusionConfig, FusionRetriever
    from toolgraph.tuning import evaluate_grid

    fused = FusionRetriever(FusionConfig(method="score", weights=[1.0, weights[0]], normalize="minmax"),
                            members=[dense, bm25])
    rules = [("score", w) for w in weights] + [("rrf", w) for w in rrf_weights]
    points = [{"retriever.method": m, "retriever.weights": [1.0, w]} for m, w in rules]
    out: dict = {"test": {}, "val_recall@5": {}}
    for split in ("test", "val") if ds.split("val") else ("test",):
        table = [evaluate(dense, ds, split, cfg.eval).metrics] + [
            p.metrics for p in evaluate_grid(replace(cfg, retriever=fused.config), points, split, retriever=fused, ds=ds)]
        for w, m in zip(["0.0", *(rule_key(m, w) for m, w in rules)], table, strict=True):
            if split == "test":
                out["test"][w] = {k: round(m[k], 4) for k in KEEP}
            else:
                out["val_recall@5"][w] = round(m["recall@5"], 4)
    out["queries"] = len(ds.split("test"))
    return out


def scores_and_gold(dataset: str) -> dict[str, tuple[list, object]]:
    """Per split (test, val where it has queries): MiniLM's and BM25's [Q, N] scores over the
    dataset's catalog, and the [Q, N] gold matrix. The members are built and indexed once."""
    import torch

    dense, bm25, ds, _ = members(dataset, None, None)
    for r in (dense, bm25):
        r.fit(ds)
        r.index(ds.tools)
    assert [t.id for t in dense.tools] == [t.id for t in bm25.tools], dataset
    pos = {t.id: i for i, t in enumerate(dense.tools)}
    out = {}
    for split in ("test", "val"):
        queries = ds.split(split)
        if not queries:
            continue
        texts = [q.text for q in queries]
        gold = torch.zeros(len(queries), len(pos))
        for i, q in enumerate(queries):
            for t in q.tools:
                if t in pos:
                    gold[i, pos[t]] = 1
        out[split] = ([dense.score(texts).float(), bm25.score(texts).float()], gold)
    return out


def learned(args: argparse.Namespace) -> None:
    """hybrid_minilm_learned rows: per held-out dataset, a fusion model fitted on the 13 others."""
    from toolgraph.evaluation import evaluate
    from toolgraph.retrieval.fusion_model import FusionModel
    from toolgraph.retrieval.pipeline import FusionConfig, FusionRetriever

    examples = {}
    for d in LODO_SETS:  # every other dataset fits, whatever --datasets says
        examples.update({(d, split): got for split, got in scores_and_gold(d).items()})
        print(f"{d}: scores ready", flush=True)
    folder = Path(args.runs)
    for held in args.datasets:
        start = time.perf_counter()
        keys = [k for k in examples if k[0] != held]
        model = FusionModel.fit([examples[k] for k in keys], candidates=args.candidates, names=[f"{d}/{s}" for d, s in keys])
        path = model.save(folder / f"{held}.json")
        dense, bm25, ds, cfg = members(held, None, None)
        eval_cfg = cfg.eval
        fused = FusionRetriever(FusionConfig(method="learned", model_file=str(path)), members=[dense, bm25])
        report = evaluate(fused, ds, "test", eval_cfg)
        val = {"learned": round(evaluate(fused, ds, "val", eval_cfg).metrics["recall@5"], 4)} if ds.split("val") else {}
        row = {"method": "hybrid_minilm_learned", "dataset": held, "split": "test", "setting": "zero-shot",
               "encoder": "all-MiniLM-L6-v2", "queries": len(report.query_ids),
               "metrics": {k: round(report.metrics[k], 4) for k in KEEP}, "val_recall@5": val,
               "fusion_model": str(path), "trained_on": [f"{d}/{s}" for d, s in keys],
               "weights": dict(zip(model.features, [round(w, 4) for w in model.weights])),
               "minilm": {k: baseline("dense", held).get(k) for k in ("recall@5", "ndcg@5")},
               "bm25": {k: baseline("bm25", held).get(k) for k in ("recall@5", "ndcg@5")},
               "seconds": round(time.perf_counter() - start, 1), "command": args.command, "machine": machine()}
        upsert(NAME, [row])
        print(f"{held} learned fusion: R@5 {report.metrics['recall@5']:.4f} (MiniLM {row['minilm']['recall@5']})", flush=True)
    render()


def chosen_weight(rows: list[dict]) -> tuple[str, dict[str, float]]:
    """The w with the best mean val R@5 over the datasets with a val split, by the rule of
    ``toolgraph.tuning.pick`` (a tie: the smallest w), and each w's mean."""
    from toolgraph.tuning import pick

    have = [r for r in rows if r["val_recall@5"]]
    ws = sorted(set.intersection(*(set(r["val_recall@5"]) for r in have)) if have else set(), key=rule_order)
    means = {w: sum(r["val_recall@5"][w] for r in have) / max(1, len(have)) for w in ws}
    return (ws[pick([{"recall@5": means[w]} for w in ws], "recall@5")] if means else "0.0"), means


def lodo_choice(rows: list[dict]) -> dict[str, str]:
    """Per dataset, the rule chosen on the val splits of the *other* datasets (leave-one-dataset-out):
    the choice a catalog outside all of them would get, measured on each in turn."""
    return {r["dataset"]: chosen_weight([o for o in rows if o["dataset"] != r["dataset"]])[0] for r in rows}


def describe(key: str) -> str:
    """A rule key in words: ``0.0`` the dense member alone, ``0.3`` score fusion, ``rrf:1.0`` RRF."""
    if key.startswith("rrf:"):
        return f"RRF (k 60), BM25 weight {key[4:]}"
    return "the dense member alone" if float(key) == 0 else f"dense + {key} × BM25 (min-max scores)"


def choice_line(rows: list[dict], what: str) -> str:
    """How the leave-one-dataset-out choice of the fusion rule does on test: each dataset ranked with
    the rule the others' val splits chose, its R@5 minus its dense member's alone (``"0.0"``)."""
    chosen = lodo_choice(rows)
    deltas = [r["metrics"][chosen[r["dataset"]]]["recall@5"] - r["metrics"]["0.0"]["recall@5"] for r in rows]
    rules = ", ".join(f"{k} ({n})" for k, n in sorted(Counter(chosen.values()).items(), key=lambda x: rule_order(x[0])))
    return (f"{what}: the rule chosen on the other datasets' val splits, per dataset: {rules}; mean test R@5 "
            f"{sum(deltas) / max(1, len(deltas)):+.3f} over the dense member alone ({len(deltas)} datasets, "
            f"worst {min(deltas):+.3f}).")


def run(args: argparse.Namespace) -> None:
    rows = json.loads((RESULTS / f"{NAME}.json").read_text())["rows"]
    setting = SETTINGS[args.lodo]
    lodo = {r["dataset"]: r for r in rows if r["method"] == "general_lodo" and r["setting"] == setting}
    alpha = str(args.alpha) if args.alpha is not None else chosen_alpha(list(lodo.values()))[0]
    for d in args.datasets:
        start = time.perf_counter()
        found = [("hybrid_minilm", None, None, "zero-shot")] if "minilm" in args.dense else []
        model = Path(lodo[d]["run"]) / "retriever" / "encoder" if d in lodo else None
        if "general" in args.dense and model is not None and (model / "config.json").is_file():
            found.append(("hybrid_general", model, float(alpha), setting))
        elif "general" in args.dense:
            print(f"{d}: no leave-one-dataset-out model ({setting}) here ({model}): no general hybrid", flush=True)
        for method, encoder, wise, row_setting in found:
            g = grid(d, args.weights, encoder, wise, tuple(args.rrf_weights),
                     lodo.get(d, {}).get("encoder", "all-MiniLM-L6-v2"))  # WiSE's base: the fold's start
            row = {"method": method, "dataset": d, "split": "test", "setting": row_setting,
                   "encoder": str(encoder) if encoder else "all-MiniLM-L6-v2", "wise": wise, "queries": g["queries"],
                   "metrics": g["test"], "val_recall@5": g["val_recall@5"],
                   "minilm": {k: baseline("dense", d).get(k) for k in ("recall@5", "ndcg@5")},
                   "bm25": {k: baseline("bm25", d).get(k) for k in ("recall@5", "ndcg@5")},
                   "seconds": round(time.perf_counter() - start, 1), "command": args.command, "machine": machine()}
            upsert(NAME, [row])
            print(f"{d} {method}: " + ", ".join(f"w={w} R@5 {m['recall@5']:.4f}" for w, m in g["test"].items()), flush=True)
    render()


def render(page: str | Path = PAGE) -> None:
    rows = json.loads((RESULTS / f"{NAME}.json").read_text())["rows"]
    mini = {r["dataset"]: r for r in rows if r["method"] == "hybrid_minilm"}
    gen = {r["dataset"]: r for r in rows if r["method"] == "hybrid_general" and r["setting"] == SETTINGS["main"]}
    fit = {r["dataset"]: r for r in rows if r["method"] == "hybrid_minilm_learned"}
    lodo = {r["dataset"]: r for r in rows if r["method"] == "general_lodo" and r["setting"] == "zero-shot"}
    if not mini:
        return
    w, means = chosen_weight(list(mini.values()))
    alpha, _ = chosen_alpha(list(lodo.values()))
    lines = [f"Fusion rule chosen on the val splits of the {sum(bool(r['val_recall@5']) for r in mini.values())} "
             f"datasets that have one (MiniLM hybrid): **{describe(w)}** (mean val R@5 "
             + ", ".join(f"w {k}: {v:.4f}" for k, v in means.items()) + "). Test R@5:", "",
             f"| dataset | MiniLM | BM25 | MiniLM + BM25 | Δ vs MiniLM | MiniLM + BM25, learned | Δ vs MiniLM "
             f"| general (LODO, alpha {alpha}) | general + BM25 | Δ vs MiniLM |", "|---|---|---|---|---|---|---|---|---|---|"]
    d_mini, d_gen, d_fit = [], [], []
    for d in [x for x in LODO_SETS if x in mini]:
        m = mini[d]
        base, hyb = m["metrics"]["0.0"]["recall@5"], m["metrics"][w]["recall@5"]
        d_mini.append(hyb - base)
        g_alone = f"{at_alpha(lodo[d], alpha)['recall@5']:.3f}" if d in lodo else "–"
        g_hyb, g_delta = "–", "–"
        if d in gen:
            v = gen[d]["metrics"][w]["recall@5"]
            d_gen.append(v - base)
            g_hyb, g_delta = f"{v:.3f}", f"{v - base:+.3f}"
        f_hyb, f_delta = "–", "–"
        if d in fit:
            v = fit[d]["metrics"]["recall@5"]
            d_fit.append(v - base)
            f_hyb, f_delta = f"{v:.3f}", f"{v - base:+.3f}"
        lines.append(f"| {d} | {base:.3f} | {m['bm25']['recall@5']:.3f} | {hyb:.3f} | {hyb - base:+.3f} | {f_hyb} "
                     f"| {f_delta} | {g_alone} | {g_hyb} | {g_delta} |")
    lines.append(f"| **mean Δ** | | | | **{sum(d_mini) / len(d_mini):+.3f}** ({len(d_mini)} datasets) | "
                 f"| **{sum(d_fit) / max(1, len(d_fit)):+.3f}** ({len(d_fit)} datasets) | | "
                 f"| **{sum(d_gen) / max(1, len(d_gen)):+.3f}** ({len(d_gen)} datasets) |")
    lines += ["", choice_line(list(mini.values()), "MiniLM + BM25, leave-one-dataset-out")]
    write_block(page, "general-hybrid", "\n".join(lines))
    for setting, block in BLOCKS.items():
        found = {r["dataset"]: r for r in rows if r["method"] == "hybrid_general" and r["setting"] == setting}
        write_block(page, block, tat_table(mini, found, rows, w, setting) if found else not_measured(setting))


def not_measured(setting: str) -> str:
    """The block of a setting whose models were never here to fuse: how to measure it."""
    lodo = next(k for k, v in SETTINGS.items() if v == setting)
    how = (f"on a GPU machine, `python benchmarks/device/parallel.py {JOBS[setting]} --workers 8 --out $OUT` (each job "
           "trains one model and fuses it in the same copy)" if setting in JOBS else
           f"`python benchmarks/general_hybrid.py --datasets X --lodo {lodo} --dense general`, in the job that "
           "trained the models")
    return f"Not measured yet ({setting.removeprefix('zero-shot, ')}): {how}."


def tat_table(mini: dict, gen: dict, rows: list[dict], w: str, setting: str = SETTINGS["test-as-train"]) -> str:
    """The hybrid with the leave-one-dataset-out models of ``setting`` (``--lodo test-as-train``, or
    ``full-finetune``), at the BM25 weight ``w`` chosen for the MiniLM hybrid and the WiSE alpha chosen
    on those models' val."""
    tat = [r for r in rows if r["method"] == "general_lodo" and r["setting"] == setting]
    alpha, means = chosen_alpha(tat)  # chosen now, over every such row; each hybrid row keeps its own
    lines = [f"WiSE alpha chosen on val for these models: **{alpha}** (mean val R@5 "
             + ", ".join(f"alpha {a}: {m:.4f}" for a, m in means.items()) + f"); BM25 weight w = {w}, the weight val chose for the MiniLM hybrid (the line under the "
             "table gives the rule each dataset's leave-one-dataset-out choice picks for these models). Each row "
             "names the alpha it was measured at. Test R@5:", "",
             f"| dataset | MiniLM | MiniLM + BM25 | alpha | general ({setting.removeprefix('zero-shot, ')}) "
             "| Δ vs MiniLM | general + BM25 "
             "| Δ vs MiniLM |", "|---|---|---|---|---|---|---|---|"]
    alone, hybrid = [], []
    for d in [x for x in LODO_SETS if x in gen and x in mini]:
        base = mini[d]["metrics"]["0.0"]["recall@5"]
        a, h = gen[d]["metrics"]["0.0"]["recall@5"], gen[d]["metrics"][w]["recall@5"]
        alone.append(a - base)
        hybrid.append(h - base)
        lines.append(f"| {d} | {base:.3f} | {mini[d]['metrics'][w]['recall@5']:.3f} | {gen[d]['wise']} | {a:.3f} "
                     f"| {a - base:+.3f} | {h:.3f} | {h - base:+.3f} |")
    n = len(alone)
    lines.append(f"| **mean Δ** ({n} datasets) | | | | | **{sum(alone) / max(1, n):+.3f}** | "
                 f"| **{sum(hybrid) / max(1, n):+.3f}** |")
    if any(r.get("val_recall@5") for r in gen.values()):
        lines += ["", choice_line([gen[d] for d in LODO_SETS if d in gen], "general + BM25, leave-one-dataset-out")]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=list(LODO_SETS), choices=LODO_SETS)
    p.add_argument("--weights", nargs="+", type=float, default=[0.2, 0.3, 0.5], help="BM25 weights w (> 0)")
    p.add_argument("--rrf-weights", nargs="*", type=float, default=[],
                   help="BM25 weights of reciprocal rank fusion rules to measure beside (k = 60; metrics keys rrf:W)")
    p.add_argument("--lodo", choices=sorted(SETTINGS), default="main",
                   help="the leave-one-dataset-out models of hybrid_general: the main table's, lodo --test-as-train's, "
                        "or the full fine-tune's (docs/general.md)")
    p.add_argument("--alpha", type=float, default=None,
                   help="the WiSE alpha of the general member (default: chosen on val over that setting's rows)")
    p.add_argument("--dense", nargs="+", choices=("minilm", "general"), default=["minilm", "general"],
                   help="which dense members to measure (hybrid_minilm, hybrid_general rows)")
    p.add_argument("--learned", action="store_true",
                   help="hybrid_minilm_learned rows: a fusion model per dataset, fitted on the 13 others")
    p.add_argument("--candidates", type=int, default=30, help="--learned: each member's top tools the model scores")
    p.add_argument("--runs", default="runs/general_hybrid_learned", help="--learned: where the fusion models go")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--command", default=None, help="recorded in the rows (default: this command line)")
    args = p.parse_args()
    if args.command is None:
        args.command = "python " + " ".join(shlex.quote(x) for x in sys.argv)
    if any(w <= 0 for w in args.weights):
        p.error(f"--weights: every w must be > 0 (w = 0 is the dense member alone, always measured), got {args.weights}")
    if args.render_only:
        render()
    else:
        learned(args) if args.learned else run(args)


if __name__ == "__main__":
    main()
