"""Quality against wall-clock time: the old bi-encoder recipe, the fast one, and each fast technique
alone, every one given the same wall-clock budget on this machine.

    python benchmarks/convergence.py --budget 00:00:08:00 [--variants old,fast,full_catalog,frozen] \
        [--out runs/convergence] [--val-queries 1024]

Each variant is ``train.py`` on ToolLens with ``trainer.max_time=BUDGET`` (its own recipe otherwise:
learning rate, schedule and epochs as in its YAML), validation about every 2 minutes (a step count
per variant) on the first ``--val-queries`` val queries (the same subset for all), the best val checkpoint
tested on the full test split. Fast variants build their activation cache inside the budget (a fresh
``model.states_dir`` per variant), so the cache's cost is counted.

Writes ``benchmarks/results/convergence.json``: per variant its command, the val curve (seconds,
step, val R@5), test R@5 of the best checkpoint, train_seconds and examples/s; and the speed-up of
each variant, ``time for the old recipe to reach its best val R@5 / time for the variant to reach
it``, all from this one run. ``benchmarks/results/convergence.png`` plots the curves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

from results_io import RESULTS, ROOT, machine, write_block  # noqa: E402
from training_results import val_curve  # noqa: E402

OLD = "configs/bi_encoder_toollens.yaml"
FAST = "configs/bi_encoder_toollens_fast.yaml"
# variant -> (config, overrides, validate every N steps): each technique alone and together
VARIANTS = {
    "old": (OLD, [], 12),
    "fast": (FAST, [], 40),
    "full_catalog": (FAST, ["model.freeze_layers=0"], 12),  # full-catalog loss alone, the whole encoder trains
    "frozen": (FAST, ["model.loss=in_batch", "model.multi_positive=false"], 40),  # frozen bottom alone
}

METHOD = {"old": "bi_encoder", "fast": "bi_encoder_fast", "full_catalog": "bi_encoder_full_catalog_only",
          "frozen": "bi_encoder_frozen_only"}
PAGE = ROOT / "docs" / "dense.md"


def run_variant(name: str, budget: str, out: Path, val_queries: int, eval_batch: int = 256) -> dict:
    config, extra, every = VARIANTS[name]
    run = out / name
    over = [f"out_dir={run}", f"trainer.max_time={budget}", f"trainer.val_check_interval={every}",
            f"trainer.limit_val_batches={max(1, val_queries // eval_batch)}", f"data.eval_batch_size={eval_batch}",
            "trainer.enable_progress_bar=false", "checkpoint.save_top_k=1", "logger.wandb=false"]
    if config == FAST:
        over.append(f"model.states_dir={run / 'cache'}")  # built inside the budget
    cmd = [sys.executable, "train.py", "--config", config, *over, *extra]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    res = json.loads((run / "results.json").read_text())
    t = res["training"]
    return {"method": METHOD[name], "dataset": "toollens", "split": "test", "setting": f"budget {budget}",
            "variant": name, "command": "python " + " ".join(cmd[1:]), "config": config, "overrides": extra,
            "metrics": {k: round(v, 4) for k, v in res["metrics"].items()}, "val_curve": val_curve(run),
            "train_seconds": t["train_seconds"], "steps": t["steps"], "examples_per_second": t["examples_per_second"],
            "device": t["device"]}


def time_to(curve: list[dict], target: float) -> float | None:
    """Seconds at the first validation whose R@5 reaches ``target`` (None: never within the budget)."""
    return next((p["seconds"] for p in curve if p["val/recall@5"] >= target), None)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        pts = [(p["seconds"] / 60, p["val/recall@5"]) for p in r["val_curve"]]
        ax.plot(*zip(*pts), marker="o", ms=3, label=f"{r['variant']} (test R@5 {r['metrics']['recall@5']:.3f})")
    ax.set_xlabel("wall-clock minutes (2 CPU cores)")
    ax.set_ylabel("val Recall@5")
    ax.set_title("ToolLens bi-encoder: quality against time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def render(page: str | Path = PAGE) -> None:
    """The ``fast`` block of docs/dense.md: the fast recipes' rows of training_core.json, then the
    convergence run (when there is one)."""
    rows = [r for r in json.loads((RESULTS / "training_core.json").read_text())["rows"]
            if r["method"].startswith("bi_encoder_fast")]
    lines = ["| method | dataset | setting | test R@3 | test R@5 | test R@7 | steps | train_seconds | examples/s | device |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["metrics"]
        lines.append(f"| {r['method']} | {r['dataset']} | {r['setting']} | {m['recall@3']:.3f} | {m['recall@5']:.3f} | "
                     f"{m['recall@7']:.3f} | {r['steps']} | {r['train_seconds']:.0f} | {r['examples_per_second']} | "
                     f"{r['device']} |")
    path = RESULTS / "convergence.json"
    if path.exists():
        conv = json.loads(path.read_text())
        lines += ["", f"Convergence, every variant given {conv['budget']} (DD:HH:MM:SS) of wall-clock time on this machine "
                  f"(`python benchmarks/convergence.py --budget {conv['budget']}`; val R@5 on {conv['val_queries']} val "
                  "queries; speed-up = seconds for the old recipe to reach its best val R@5 / seconds for the variant):",
                  "", "| variant | steps | best val R@5 | test R@5 | seconds to the old best | speed-up |",
                  "|---|---|---|---|---|---|"]
        for r in conv["rows"]:
            best = max(p["val/recall@5"] for p in r["val_curve"])
            lines.append(f"| {r['variant']} | {r['steps']} | {best:.3f} | {r['metrics']['recall@5']:.3f} | "
                         f"{r.get('seconds_to_old_best') if r.get('seconds_to_old_best') is not None else 'not reached'} | "
                         f"{r.get('speedup_vs_old') or '–'} |")
    lines += st_comparison()
    write_block(page, "fast", "\n".join(lines))


def st_comparison() -> list[str]:
    """The sentence-transformers MNRL rows (benchmarks/st_baseline.py) beside this machine's toolgraph
    runs of the same wall-clock budget: the convergence variants, and the fast recipe's full run."""
    path = RESULTS / "st_baseline.json"
    if not path.exists():
        return []
    conv = json.loads((RESULTS / "convergence.json").read_text()) if (RESULTS / "convergence.json").exists() else {}
    lines = ["", "The sentence-transformers trainer (MultipleNegativesRankingLoss, in-batch negatives, no duplicates "
             "in a batch) on the same ToolLens training queries, the same MiniLM and the same budget, tested by the "
             "same evaluation (`benchmarks/st_baseline.py`, in `.venv-st` from `make st-env`):", "",
             "| budget | trainer | steps | train_seconds | test R@3 | test R@5 | test R@7 | command |", "|---|---|---|---|---|---|---|---|"]
    def budget(st: dict) -> str:  # rows before the "budget" field kept it in the setting
        return st.get("budget", st["setting"].removeprefix("budget "))

    st_rows = json.loads(path.read_text())["rows"]
    for b in dict.fromkeys(map(budget, st_rows)):
        named = [("sentence-transformers MNRL, " + (f"schedule of {st['max_steps']} steps"
                  if st.get("max_steps", -1) > 0 else "one-epoch schedule"), st) for st in st_rows if budget(st) == b]
        named += [(f"toolgraph {r['variant']}", r) for r in conv.get("rows", [])
                  if conv.get("budget") == b and r["variant"] in ("old", "fast")]
        for name, r in named:
            m = r["metrics"]
            lines.append(f"| {b} | {name} | {r['steps']} | {r['train_seconds']:.0f} | {m['recall@3']:.3f} | "
                         f"{m['recall@5']:.3f} | {m['recall@7']:.3f} | `{r['command']}` |")
    return lines


def main() -> None:
    if sys.argv[1:] == ["render"]:
        render()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", default="00:00:08:00", help="wall-clock budget per variant, DD:HH:MM:SS")
    ap.add_argument("--variants", default="old,fast,full_catalog,frozen")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "convergence")
    ap.add_argument("--val-queries", type=int, default=1024, help="val queries scored at each validation")
    args = ap.parse_args()
    names = args.variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    rows = [run_variant(n, args.budget, args.out, args.val_queries) for n in names]
    by = {r["variant"]: r for r in rows}
    summary = {}
    if "old" in by and by["old"]["val_curve"]:
        target = max(p["val/recall@5"] for p in by["old"]["val_curve"])
        t_old = time_to(by["old"]["val_curve"], target)
        for r in rows:
            t = time_to(r["val_curve"], target)
            r["seconds_to_old_best"] = t
            r["speedup_vs_old"] = round(t_old / t, 2) if t else None
        summary = {"old_best_val_recall@5": target, "old_seconds_to_best": t_old}
    out = {"budget": args.budget, "machine": machine(), "val_queries": args.val_queries, **summary, "rows": rows}
    (RESULTS / "convergence.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(rows, RESULTS / "convergence.png")
    render()
    for r in rows:
        print(f"{r['variant']:14s} steps {r['steps']:5d}  best val R@5 {max(p['val/recall@5'] for p in r['val_curve']):.4f}"
              f"  test R@5 {r['metrics']['recall@5']:.4f}  to old best {r.get('seconds_to_old_best')} s"
              f"  speed-up {r.get('speedup_vs_old')}")


if __name__ == "__main__":
    main()
