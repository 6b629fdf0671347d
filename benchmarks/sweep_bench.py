"""The discriminator sweep (configs/sweeps/discriminator.yaml, 9 grid points) run by ``toolgraph sweep``:
1 worker, 2 workers on the same cores, and 1 worker with the median pruner; wall-clock seconds, the best
point, trials pruned. Rows in benchmarks/results/sweep.json, the table in docs/configuration.md.

    python benchmarks/sweep_bench.py run --setting "1 worker" --workers 1
    python benchmarks/sweep_bench.py run --setting "2 workers" --workers 2
    python benchmarks/sweep_bench.py run --setting "1 worker, median pruner" --workers 1 -- --pruner median \\
        --prune-startup 3 --prune-warmup 10
    python benchmarks/sweep_bench.py render
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time

from results_io import RESULTS, ROOT, machine, upsert, write_block

NAME = "sweep"
SPEC = "configs/sweeps/discriminator.yaml"
PAGE = "docs/configuration.md"


def run(args: argparse.Namespace) -> None:
    import optuna

    from toolgraph.sweep.study import open_storage, storage_url

    out = ROOT / "runs" / "sweeps" / ("bench-" + "".join(c if c.isalnum() else "-" for c in args.setting))
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "toolgraph.cli", "sweep", SPEC, "--out", str(out), "--workers", str(args.workers),
           *args.extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    seconds = time.perf_counter() - t0
    store = open_storage(storage_url(None, out))
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
    study = optuna.load_study(study_name=name, storage=store)
    trials = study.get_trials()
    states = {s: sum(t.state.name == s for t in trials) for s in ("COMPLETE", "PRUNED", "FAIL")}
    best = study.best_trial
    row = {"method": "sweep", "dataset": "tdi", "split": "val", "setting": args.setting, "model": "discriminator_schema",
           "workers": args.workers, "seconds": round(seconds, 1),
           "trial_seconds": round(sum(float(t.user_attrs.get("seconds", 0)) for t in trials), 1),
           "metrics": {study.user_attrs["toolgraph"]["metric"]: round(best.value, 4),
                       "complete": states["COMPLETE"], "pruned": states["PRUNED"], "failed": states["FAIL"],
                       "validations": sum(int(t.user_attrs.get("validations", 0)) for t in trials)},
           "best": {k: v for k, v in best.params.items()}, "machine": machine(),
           "command": "python benchmarks/sweep_bench.py run --setting '" + args.setting + "' --workers "
                      f"{args.workers}" + (" -- " + " ".join(args.extra) if args.extra else ""),
           "sweep_command": " ".join(["toolgraph", *cmd[3:]]).replace(str(ROOT) + "/", "")}
    print(row, flush=True)
    upsert(NAME, [row])
    render()


def render(page: str = PAGE) -> None:
    import json

    path = RESULTS / f"{NAME}.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    base = next((r for r in rows if r["workers"] == 1 and not r["metrics"]["pruned"]
                 and "pruner" not in r["setting"]), None)
    lines = ["| setting | workers | wall seconds | vs 1 worker | trials complete / pruned | validations run | "
             "best val macro-F1 | best point |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["setting"] != (base or {}).get("setting"), r["seconds"])):
        m = r["metrics"]
        ratio = f"{r['seconds'] / base['seconds']:.2f}x" if base else "–"
        point = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in r["best"].items())
        metric = next(k for k in m if k.startswith("val/"))
        lines.append(f"| {r['setting']} | {r['workers']} | {r['seconds']:.0f} | {ratio} | {m['complete']} / "
                     f"{m['pruned']} | {m['validations']} | {m[metric]:.4f} | {point} |")
    if rows:
        lines += ["", f"On {rows[0]['machine']}; each row: `{rows[0]['command'].split(' --setting')[0]} ...` "
                      "(the commands are in benchmarks/results/sweep.json)."]
    write_block(page, "sweep-bench", "\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--setting", required=True)
    r.add_argument("--workers", type=int, default=1)
    r.add_argument("extra", nargs="*", help="after --: more toolgraph sweep options")
    sub.add_parser("render")
    args = ap.parse_args()
    run(args) if args.cmd == "run" else render()


if __name__ == "__main__":
    main()
