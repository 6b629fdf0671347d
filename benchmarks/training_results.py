"""Collect a finished train.py run into benchmarks/results/training_core.json and the ``training``
table on docs/results.md.

    python benchmarks/training_results.py RUN_DIR --method bi_encoder --command "python train.py ..." \
        [--test-curve]   # also evaluate every kept checkpoint on the test split (test R@5 vs steps)
    python benchmarks/training_results.py --render-only [--page docs/results.md]   # only the table

Reads RUN_DIR/results.json (test metrics of the exported best checkpoint) and
RUN_DIR/logs/metrics.csv (validation Recall@5 at every validation step).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from results_io import DOCS, RESULTS, quality_table, upsert, write_block  # noqa: E402

PAGE = DOCS / "results.md"  # where the training block lives


def val_curve(run: Path) -> list[dict]:
    """Validation Recall@5 at every validation step, with the seconds since the fit started when
    the run logged them (``time/seconds``, runs from the "Converge" issue on)."""
    path = run / "logs" / "metrics.csv"
    if not path.is_file():  # a run whose results.json alone came back (e.g. from a device machine)
        return []
    rows = list(csv.DictReader(path.open()))
    out = []
    for r in rows:
        if r.get("val/recall@5"):
            point = {"step": int(r["step"]), "val/recall@5": round(float(r["val/recall@5"]), 4)}
            if r.get("time/seconds"):
                point["seconds"] = round(float(r["time/seconds"]), 1)
            out.append(point)
    return out


def throughput(training: dict, cfg: dict) -> dict:
    """train_seconds, steps, examples_per_second and device of a run's results.json ``training``
    section (runs written before these were recorded: from fit_seconds and global_step)."""
    if "train_seconds" in training:
        return {k: training[k] for k in ("train_seconds", "steps", "examples_per_second", "device")}
    seconds, steps = training["fit_seconds"], training["global_step"]
    return {"train_seconds": round(seconds, 1), "steps": steps,
            "examples_per_second": round(steps * cfg["data"]["batch_size"] / seconds, 2),
            "device": f"cpu: {os.cpu_count()} cores (recorded by training_results.py)"}


def test_curve(run: Path) -> list[dict]:
    """Test Recall@5 of every kept checkpoint (save_top_k=-1 keeps one per validation)."""
    import torch

    from toolgraph.config import EvalConfig
    from toolgraph.evaluation import evaluate
    from toolgraph.retrieval.loading import load_task

    out = []
    for ckpt in sorted((run / "checkpoints").glob("best-*.ckpt")):
        step = torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"]
        task = load_task(ckpt)
        report = evaluate(task.as_retriever(), _dataset(task), "test", EvalConfig(ks=[3, 5, 7]))
        out.append({"step": int(step), "test/recall@5": round(report.metrics["recall@5"], 4)})
        print(out[-1], flush=True)
    return sorted(out, key=lambda r: r["step"])


def _dataset(task):
    from toolgraph.data import prepare_dataset
    from toolgraph.tasks.bi_encoder import instret_augment

    ds = prepare_dataset(task.cfg.data)
    return instret_augment(ds, task.model_cfg.instret_queries) if getattr(task.model_cfg, "instret", False) else ds


def render(page: str | Path = PAGE) -> None:
    """The training table of ``page``: every quality row of training_core.json."""
    rows = [r for r in json.loads((RESULTS / "training_core.json").read_text())["rows"] if "recall@5" in r["metrics"]]
    write_block(page, "training", quality_table(rows, extra=("training_steps", "seconds")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path, nargs="?")
    ap.add_argument("--method")
    ap.add_argument("--command")
    ap.add_argument("--setting", default="transductive")
    ap.add_argument("--test-curve", action="store_true")
    ap.add_argument("--eval-dir", type=Path, help="take the test metrics from this evaluate.py --checkpoint output")
    ap.add_argument("--page", type=Path, default=PAGE, help="page with the training block")
    ap.add_argument("--render-only", action="store_true", help="only rewrite the table from the results file")
    args = ap.parse_args()
    if args.render_only:
        render(args.page)
        return
    if args.run is None or not args.method or not args.command:
        ap.error("RUN, --method and --command are required (or --render-only)")
    res = json.loads((args.run / "results.json").read_text())
    if args.eval_dir:
        evaluated = json.loads((args.eval_dir / "results.json").read_text())
        res["metrics"], res["agent_metrics"] = evaluated["metrics"], evaluated.get("agent_metrics", {})
    cfg = res["config"]
    row = {"method": args.method, "dataset": cfg["data"]["name"], "split": cfg["data"]["test_split"],
           "setting": args.setting, "encoder": cfg["model"]["encoder"].split("/")[-1],
           "queries": res["dataset"]["queries"]["test"],
           "metrics": {k: round(v, 4) for k, v in res["metrics"].items()},
           "agent_metrics": {k: round(v, 4) for k, v in res.get("agent_metrics", {}).items()},
           "training_steps": res["training"]["global_step"], "val_curve": val_curve(args.run),
           "command": args.command, "seconds": round(res["training"]["seconds"]),
           **throughput(res["training"], cfg)}
    if args.test_curve:
        row["test_curve"] = test_curve(args.run)
    upsert("training_core", [row])
    render(args.page)
    print(json.dumps({k: row[k] for k in ("method", "metrics", "training_steps", "val_curve", "seconds")}, indent=1))


if __name__ == "__main__":
    main()
