"""Issue "General retriever": requests split into pieces before dense scoring (``retriever.query_split``).

A request that asks for several things ("Create a device named 'iEdge'. After that, check if my session
token is still valid") needs one tool per thing, and one vector of the whole request sits between them.
``query_split: sentences | clauses`` scores each piece on its own and gives a tool its best piece's score
(toolgraph/retrieval/steps.py). Zero-shot: it reads the request only, never a label.

For every dataset with a test split, this measures the dense retriever (MiniLM, or with ``--lodo SETTING``
each dataset's leave-one-dataset-out model at its val-chosen WiSE alpha) under each split rule, alone and
fused with BM25 (``dense + w * bm25``, min-max scores, BM25 on the whole request):

    python benchmarks/query_split.py                         # MiniLM, the 14 datasets
    python benchmarks/query_split.py --lodo "zero-shot, test-only datasets train, sampler fix" \\
        --datasets seal-tools api-bank gorilla-torchhub toollens metatool ultratool toollinkos

With ``--second ENCODER`` the dense member is that model fused with a second encoder, zero-shot (each
dataset's MiniLM preset with the encoder swapped, under the same split rule; min-max scores,
``dense + v * second`` for each v of ``--second-weights``): the top-3 models beside all-mpnet-base-v2, a
larger encoder no training touched:

    python benchmarks/query_split.py --lodo "zero-shot, test-only datasets train, sampler fix, top 3 layers, seed 2" \\
        --wise 0.5 --rules none clauses clauses:0.3+cover --weights 0.1 --second all-mpnet-base-v2 --second-weights 0.5

The rule (split and w) is chosen by the mean R@5 on the val splits of the datasets that have one; test
never chooses. Beside the pooled choice, each dataset's test R@5 under the rule chosen on the *other*
datasets' val splits (what a catalog outside all of them gets). Rows: benchmarks/results/query_split.json;
table: docs/general.md (block ``general-query-split``).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import get_args

sys.path.insert(0, str(Path(__file__).resolve().parent))

from general import LODO_SETS, PAGE, apply_rule, chosen_alpha, second_member, second_part, split_rule, with_second  # noqa: E402
from general_hybrid import fusion_grid, members  # noqa: E402
from results_io import RESULTS, machine, upsert, write_block  # noqa: E402

from toolgraph.config import QuerySplit  # noqa: E402

NAME = "query_split"
MINILM = "all-MiniLM-L6-v2"
SPLITS = get_args(QuerySplit)
WHOLE = (0.15, 0.3, 0.5)  # query_split_whole weights tried with each split (--whole)


def rules(whole: tuple[float, ...] = WHOLE, cover: bool = False) -> tuple[str, ...]:
    """The rules measured, simplest first (a val tie keeps the earlier): each split alone, then each split
    with the whole request weighing w beside its best piece (``clauses:0.3``: general.split_rule), then with
    ``cover`` each of those again with each piece's best tool first (``clauses:0.3+cover``)."""
    base = (*SPLITS, *(f"{s}:{w}" for s in SPLITS if s != "none" for w in whole))
    return (*base, *(f"{r}+cover" for r in base if r != "none")) if cover else base


def chosen_rules(given: list[str] | None, whole: tuple[float, ...], cover: bool) -> tuple[str, ...]:
    """--rules as given (each parsed by general.split_rule on the command line; ``none`` and ``clauses`` must
    be among them: the table's first columns), else :func:`rules` of --whole and --cover."""
    if not given:
        return rules(whole, cover)
    missing = [r for r in ("none", "clauses") if r not in given]
    if missing:
        raise SystemExit(f"--rules: must include {' and '.join(missing)} (the table compares every rule with them)")
    return tuple(dict.fromkeys(given))


def lodo_model(setting: str, dataset: str, wise: float | None = None) -> tuple[Path, float | None, str]:
    """The encoder folder of ``dataset``'s general_lodo row of ``setting``, the WiSE alpha (``wise`` when
    given, else the one its setting's val splits chose; None: the weights as trained) and the encoder its
    training started from (WiSE interpolates towards it)."""
    import json

    rows = [r for r in json.loads((RESULTS / "general.json").read_text())["rows"]
            if r["method"] == "general_lodo" and r["setting"] == setting]
    mine = [r for r in rows if r["dataset"] == dataset]
    if not mine:
        raise SystemExit(f"--lodo: no general_lodo row of {dataset!r} with setting {setting!r} in general.json")
    alpha = str(wise) if wise is not None else chosen_alpha(rows)[0]
    folder = Path(mine[0].get("adapt", {}).get("run") or mine[0]["run"]) / "retriever" / "encoder"  # adapted: that model
    if not folder.is_dir():
        raise SystemExit(f"--lodo: {folder} is not here (train it with benchmarks/general.py lodo)")
    return folder, None if alpha == "1.0" else float(alpha), mine[0].get("encoder", MINILM)


def dense_label(lodo: str | None, wise: float | None, second: str | None = None, weight: float = 0.0) -> str:
    """The rows' ``dense``: MiniLM or the --lodo setting (and its WiSE alpha when given), then
    ``+ v x ENCODER`` when a second encoder is fused with it at weight v."""
    dense = MINILM if not lodo else lodo + (f", WiSE {wise}" if wise is not None else "")
    return dense + (f" {second_part(second, weight)}" if second else "")


def measure(args: argparse.Namespace) -> None:
    for d in args.datasets:
        start = time.perf_counter()
        encoder, wise, base = lodo_model(args.lodo, d, args.wise) if args.lodo else (None, None, MINILM)
        retriever, bm25, ds, cfg = members(d, encoder, wise, base)  # the catalog is encoded once, for every rule
        second = second_member(d, args.second) if args.second else None
        for v in args.second_weights if second else [0.0]:
            fused = second is not None and v > 0  # v = 0: the dense member alone, as without --second
            dense = dense_label(args.lodo, args.wise, args.second if fused else None, v)
            scorer = with_second(retriever, second, v) if fused else retriever
            test, val, queries = {}, {}, 0
            for rule in args.rules:
                apply_rule(retriever, rule)
                if fused:  # the second encoder splits the request the same way (BM25 reads it whole)
                    apply_rule(second, rule)
                got = fusion_grid(scorer, bm25, ds, cfg, args.weights)
                test[rule], queries = got["test"], got["queries"]
                if got["val_recall@5"]:
                    val[rule] = got["val_recall@5"]
            row = {"method": NAME, "dataset": d, "split": "test", "setting": f"zero-shot, {dense}", "dense": dense,
                   "wise": wise, "queries": queries, "metrics": test, "val_recall@5": val,
                   **({"second": {"encoder": args.second, "weight": v}} if fused else {}),
                   "seconds": round(time.perf_counter() - start, 1), "command": args.command, "machine": machine()}
            upsert(NAME, [row])
            print(f"{d} ({dense}): test R@5 " + ", ".join(f"{r} {test[r]['0.0']['recall@5']:.4f}" for r in test)
                  + ("; val " + ", ".join(f"{r} {val[r]['0.0']:.4f}" for r in val) if val else ""), flush=True)
    render()


def common_rules(rows: list[dict]) -> list[str]:
    """The rules every row was measured with, in the order the rows list them (simplest first)."""
    return [k for k in rows[0]["metrics"] if all(k in r["metrics"] for r in rows)] if rows else []


def choose(rows: list[dict]) -> tuple[tuple[str, str], dict[tuple[str, str], float]]:
    """The (rule, w) with the best mean val R@5 over ``rows`` with a val split (rule: the query split, w:
    BM25's weight); a tie keeps the earlier rule (simplest first, :func:`rules`), then w ascending."""
    have = [r for r in rows if r["val_recall@5"]]
    keys = [(s, w) for s in common_rules(have) for w in sorted(have[0]["val_recall@5"][s], key=float)
            if all(w in r["val_recall@5"][s] for r in have)] if have else []  # weights every row was measured with
    means = {k: sum(r["val_recall@5"][k[0]][k[1]] for r in have) / len(have) for k in keys}
    best = max(keys, key=lambda k: (round(means[k], 6), -keys.index(k))) if keys else ("none", "0.0")
    return best, means


def table(rows: list[dict], dense: str) -> list[str]:
    rows = sorted(rows, key=lambda r: LODO_SETS.index(r["dataset"]))
    kept = common_rules(rows)  # and the BM25 weights every row was measured with (a rerun may give fewer)
    ws = {k: [w for w in rows[0]["metrics"][k] if all(w in r["metrics"][k] for r in rows)] for k in kept}
    rows = [{**r, "metrics": {k: {w: r["metrics"][k][w] for w in ws[k]} for k in kept},
             "val_recall@5": {k: {w: v[w] for w in ws[k] if w in v} for k, v in r["val_recall@5"].items() if k in kept}}
            for r in rows]
    (split, w), means = choose(rows)
    alone = choose([{**r, "val_recall@5": {s: {"0.0": v["0.0"]} for s, v in r["val_recall@5"].items()}}
                    for r in rows])[0][0]
    hybrid_w = max((k for k in means if k[0] == "none"), key=lambda k: (round(means[k], 6), -float(k[1])))[1] \
        if means else "0.0"
    per_rule = {s: {k[1]: m for k, m in means.items() if k[0] == s} for s in kept}
    lines = [f"**{dense}** ({len(rows)} datasets). Mean val R@5 over the {sum(bool(r['val_recall@5']) for r in rows)} "
             "with a val split, dense alone (best BM25 weight): " + "; ".join(
                 f"{s} {ms['0.0']:.4f} (w {max(ms, key=ms.get)} {max(ms.values()):.4f})"
                 for s, ms in per_rule.items() if ms) + ".",
             f"Chosen on val: dense alone **{alone}**; with BM25 **{split}, w {w}** (without a split: w {hybrid_w}). "
             "`clauses:0.3`: clauses, the whole request weighing 0.3 beside the best piece (`query_split_whole`)"
             + ("; `+cover`: then each piece's own best tool first (`query_split_cover`)." if any(
                 k.endswith("+cover") for k in kept) else "."), "",
             f"| dataset | R@5 none | R@5 clauses | R@5 val's choice ({alone}) | Δ | hybrid none (w {hybrid_w}) "
             f"| hybrid {split} (w {w}) | Δ hybrid | rule chosen on the other datasets' val | its R@5 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    sums: dict[str, list[float]] = {}
    for r in rows:
        m = r["metrics"]
        cells = [m[s]["0.0"]["recall@5"] for s in ("none", "clauses", alone)] + [
            m["none"][hybrid_w]["recall@5"], m[split][w]["recall@5"]]
        other = choose([o for o in rows if o is not r])[0]
        lodo = m[other[0]][other[1]]["recall@5"]
        for key, v in zip(("none", "clauses", "alone", "hybrid", "hybrid split", "lodo"), [*cells, lodo]):
            sums.setdefault(key, []).append(v)
        lines.append(f"| {r['dataset']} | {cells[0]:.3f} | {cells[1]:.3f} | {cells[2]:.3f} | {cells[2] - cells[0]:+.3f} "
                     f"| {cells[3]:.3f} | {cells[4]:.3f} | {cells[4] - cells[3]:+.3f} | {other[0]}, w {other[1]} "
                     f"| {lodo:.3f} |")
    mean = {k: sum(v) / len(v) for k, v in sums.items()}
    lines.append(f"| **mean of {len(rows)}** | {mean['none']:.3f} | {mean['clauses']:.3f} | {mean['alone']:.3f} "
                 f"| {mean['alone'] - mean['none']:+.3f} | {mean['hybrid']:.3f} | {mean['hybrid split']:.3f} "
                 f"| {mean['hybrid split'] - mean['hybrid']:+.3f} | | {mean['lodo']:.3f} |")
    return lines


def render(page: str | Path = PAGE) -> None:
    import json

    path = RESULTS / f"{NAME}.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    out: list[str] = []
    for dense in dict.fromkeys(r["dense"] for r in rows):
        out += [*table([r for r in rows if r["dense"] == dense], dense), ""]
    if out:
        write_block(page, "general-query-split", "\n".join(out).rstrip())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=list(LODO_SETS), choices=LODO_SETS)
    p.add_argument("--weights", nargs="+", type=float, default=[0.2, 0.3, 0.5], help="BM25 weights of the hybrid")
    p.add_argument("--whole", nargs="*", type=float, default=list(WHOLE),
                   help="query_split_whole weights tried with each split (the whole request beside the best piece)")
    p.add_argument("--cover", action="store_true",
                   help="also every split rule with each piece's best tool first (retriever.query_split_cover)")
    p.add_argument("--rules", nargs="+", default=None, type=lambda spec: split_rule(spec) and spec,
                   help="exactly these rules (e.g. none clauses clauses:0.3 clauses:0.3+cover) instead of --whole/--cover's")
    p.add_argument("--lodo", default=None, help="the general_lodo setting whose models are the dense member "
                                                "(default: MiniLM, no training)")
    p.add_argument("--wise", type=float, default=None, help="--lodo: the WiSE alpha of the models (default: the "
                                                                "one their setting's val splits chose)")
    p.add_argument("--second", default=None, help="a second encoder, zero-shot, fused with the dense member "
                                                  "(e.g. all-mpnet-base-v2); its rows are tables of their own")
    p.add_argument("--second-weights", nargs="+", type=float, default=None,
                   help="--second: its weights beside the dense member's 1.0 (default 0.5; 0: the dense member "
                        "alone too, its rows as without --second, from the same indexed catalog)")
    p.add_argument("--render", action="store_true", help="only rewrite the docs table from the rows")
    p.add_argument("--command", default=None)
    args = p.parse_args()
    args.command = args.command or "python benchmarks/query_split.py " + shlex.join(sys.argv[1:])
    args.rules = chosen_rules(args.rules, tuple(args.whole), args.cover)  # before any encoding
    if args.second_weights and not args.second:
        p.error("--second-weights: give --second ENCODER too")
    if any(v < 0 for v in args.second_weights or []):
        p.error(f"--second-weights: {args.second_weights} has a negative weight (0: the dense member alone)")
    args.second_weights = args.second_weights or [0.5]
    render() if args.render else measure(args)


if __name__ == "__main__":
    main()
