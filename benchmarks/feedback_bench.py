"""Issue "An index that learns from its own usage": replay a dataset's training queries as an agent's
log and measure test R@5 after each step, beside the fast bi-encoder trained on the same queries.

    # the fast bi-encoder (configs/methods/bi_encoder_fast.yaml) trained on the first N logged queries
    python benchmarks/feedback_bench.py trained --datasets toollens metatool ultratool toollinkos --steps 100 300 1000 3000
    # the feedback rule's constants chosen by replay on val, then test R@5 after 0/100/300/1000/3000/all logs
    python benchmarks/feedback_bench.py replay --datasets toollens metatool ultratool toollinkos
    # one step end to end through the command line (index sync, index feedback, evaluate)
    python benchmarks/feedback_bench.py cli --dataset toollens --logged 1000
    # the table and the plot on docs/agents-and-serving.md
    python benchmarks/feedback_bench.py render

The log is the dataset's train split in one seeded order (``log_order``, seed 0); step N feeds its first
N queries (``all``: every one). Rows go to benchmarks/results/feedback.json: method ``feedback`` (the
index's zero-shot model, all-MiniLM-L6-v2, with the logged queries' votes), ``zero-shot`` and
``bi_encoder_fast``, each with ``logged_queries``, test metrics, the command and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import torch  # noqa: E402
from results_io import ROOT, machine, upsert, write_block  # noqa: E402

NAME = "feedback"
KEY = ("method", "dataset", "split", "setting", "logged_queries")
DATASETS = ["toollens", "metatool", "ultratool", "toollinkos"]
STEPS = [0, 100, 300, 1000, 3000, "all"]
TOOL_TEXT = {"toollens": "toolbench"}  # the tool text each dataset's MiniLM eval config uses (configs/eval/)
FAST = "configs/methods/bi_encoder_fast.yaml"
BUDGET = "00:00:12:00"  # a guard only: the schedule's steps end every trained row before it on 2 CPU cores


def load(name: str):
    from toolgraph.data.loading import load_dataset

    return load_dataset(name)


def log_order(ds) -> list:
    """The dataset's train queries in the one seeded order every step feeds them in."""
    train = sorted(ds.split("train"), key=lambda q: q.id)
    random.Random(0).shuffle(train)
    return train


def step_size(step, n: int) -> int:
    return n if step == "all" else min(int(step), n)


def trained(args: argparse.Namespace) -> None:
    """The fast bi-encoder trained on each step's log (train + a carved 10 % val), tested on test."""
    from toolgraph.data.formats import write_dataset
    from toolgraph.data.usage_log import Entry, log_dataset
    from toolgraph.feedback import schedule

    out = ROOT / args.out
    for name in args.datasets:
        ds = load(name)
        order = log_order(ds)
        for step in args.steps:
            n = step_size(step, len(order))
            if n == 0 or (step != "all" and int(step) > len(order)):
                continue
            folder = out / "data" / f"{name}_{n}"
            entries = [Entry(q.text, q.tools) for q in order[:n]]
            log = log_dataset(ds.tools, entries, ds.agents, extra=ds.split("test"), name=f"{name}-log-{n}")
            write_dataset(log, folder)
            run = out / f"bi_{name}_{n}"
            # index train's schedule (toolgraph/feedback.py): the fast recipe's batch, >= 100 steps, >= 5 epochs
            over = [*schedule(len(log.split("train"))), f"data.name={folder}", f"out_dir={run}",
                    f"trainer.max_time={BUDGET}", "trainer.enable_progress_bar=false", "logger.wandb=false"]
            if name in TOOL_TEXT:
                over.append(f"model.tool_text={TOOL_TEXT[name]}")
            cmd = [sys.executable, "train.py", "--config", FAST, *over]
            print("$", " ".join(cmd[1:]), flush=True)
            start = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL if args.quiet else None)
            seconds = round(time.perf_counter() - start, 1)
            res = json.loads((run / "results.json").read_text())
            row = {"method": "bi_encoder_fast", "dataset": name, "split": "test", "setting": f"trained on {n} logged queries",
                   "logged_queries": n, "metrics": {k: round(v, 4) for k, v in res["metrics"].items()},
                   "train_seconds": res["training"]["train_seconds"], "steps": res["training"]["steps"],
                   "seconds": seconds, "command": "python " + " ".join(cmd[1:]).replace(str(ROOT) + "/", ""),
                   "device": res["training"]["device"], "machine": machine()}
            print(json.dumps({k: row[k] for k in ("dataset", "logged_queries", "seconds")}),
                  row["metrics"].get("recall@5"), flush=True)
            upsert(NAME, [row], KEY)


# the replay grid of the feedback rule's constants (retrieval/feedback.py), scored on val
GRID = {"neighbors": [5, 10, 20, 40], "kernel": [0.02, 0.05, 0.1, 0.2], "prior": [0.01, 0.03, 0.1, 0.3, 1.0],
        "weight": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]}
KS = [1, 3, 5, 7, 10]


class Replay:
    """One dataset's vectors (MiniLM: tools, the ordered log, val, test) and base scores, encoded once."""

    def __init__(self, name: str):
        from toolgraph.retrieval.loading import resolve_retriever

        self.name, self.ds = name, load(name)
        spec = {"name": "dense", "encoder": "all-MiniLM-L6-v2", **({"tool_text": TOOL_TEXT[name]} if name in TOOL_TEXT else {})}
        self.base = resolve_retriever(spec)
        start = time.perf_counter()
        self.base.index(self.ds.tools)
        self.order = log_order(self.ds)
        t0 = time.perf_counter()
        self.log_vectors = self.base.encode_queries([q.text for q in self.order])
        self.log_seconds = time.perf_counter() - t0  # encoding the whole log (through the embedding cache if warm)
        pos = {t.id: i for i, t in enumerate(self.base.tools)}
        from toolgraph.retrieval.feedback import item_matrix

        self.items = item_matrix([[pos[t] for t in q.tools] for q in self.order])
        self.splits = {}
        for split in ("val", "test"):
            queries = self.ds.split(split)
            texts = [q.text for q in queries]
            self.splits[split] = (self.base.encode_queries(texts), self.base.score(texts), [q.tools for q in queries])
        self.seconds = time.perf_counter() - start
        self._votes: dict = {}

    def steps(self) -> list:
        return [s for s in STEPS if s in (0, "all") or int(s) < len(self.order)]

    def scores(self, split: str, n: int, c: dict) -> torch.Tensor:
        """The feedback rule's test scores (retrieval/feedback.py's own functions) with the first ``n`` logs."""
        from toolgraph.retrieval.feedback import fuse, neighbour_votes

        q, base, _ = self.splits[split]
        key = (split, n, c["neighbors"], c["kernel"])
        if key not in self._votes:  # the votes depend on these alone: the grid re-fuses them
            self._votes[key] = neighbour_votes(q, self.log_vectors[:n], self.items[:n], torch.ones(n),
                                               len(self.base.tools), c["neighbors"], c["kernel"])
        votes, evidence = self._votes[key]
        return fuse(base, votes, evidence, c["prior"], c["weight"])

    def metrics(self, split: str, scores) -> dict:
        from toolgraph.metrics import compute

        idx = scores.topk(max(KS), dim=1).indices.tolist()
        ranking = [[self.base.tools[i].id for i in row] for row in idx]
        return compute(ranking, self.splits[split][2], KS)


def grid_points() -> list[dict]:
    import itertools

    keys = list(GRID)
    return [dict(zip(keys, values)) for values in itertools.product(*(GRID[k] for k in keys))]


def replay(args: argparse.Namespace) -> None:
    """Choose the constants on val (mean val R@5 over the datasets and their logged steps), then test."""
    data = {}
    for name in args.datasets:
        data[name] = Replay(name)
        print(f"{name}: encoded in {data[name].seconds:.0f} s", flush=True)
    points = grid_points()
    means = []
    for c in points:
        vals = [data[n].metrics("val", data[n].scores("val", step_size(s, len(data[n].order)), c))["recall@5"]
                for n in data for s in data[n].steps() if s != 0]
        means.append(sum(vals) / len(vals))
    best = max(range(len(points)), key=lambda i: (round(means[i], 4), -i))
    chosen = points[best]
    print("chosen on val:", chosen, f"mean val R@5 {means[best]:.4f}", flush=True)
    command = "python benchmarks/feedback_bench.py replay --datasets " + " ".join(args.datasets)
    rows = []
    for name, r in data.items():
        for step in r.steps():
            n = step_size(step, len(r.order))
            t0 = time.perf_counter()
            test = r.metrics("test", r.scores("test", n, chosen))
            seconds = time.perf_counter() - t0
            val = r.metrics("val", r.scores("val", n, chosen))
            rows.append({"method": "feedback", "dataset": name, "split": "test", "setting": f"replay, {n} logged queries",
                         "logged_queries": n, "encoder": "all-MiniLM-L6-v2", "queries": len(r.splits["test"][2]),
                         "metrics": {k: round(v, 4) for k, v in test.items()}, "val_recall@5": round(val["recall@5"], 4),
                         "constants": chosen, "seconds": round(seconds, 2),
                         "log_encode_seconds": round(r.log_seconds * n / len(r.order), 1),
                         "command": command, "device": "cpu", "machine": machine()})
            print(name, n, rows[-1]["metrics"]["recall@5"], flush=True)
    # every grid point's mean val R@5 (over the datasets and their logged steps)
    grid = [{"method": "feedback", "dataset": "+".join(args.datasets), "split": "val",
             "setting": " ".join(f"{k}={v}" for k, v in c.items()), "constants": c,
             "metrics": {"mean_recall@5": round(m, 4)}, "command": command} for c, m in zip(points, means)]
    upsert(f"{NAME}_grid", grid)
    upsert(NAME, rows, KEY)


def cli(args: argparse.Namespace) -> None:
    """One step end to end, as a user runs it: index sync of the dataset's catalog (MiniLM), index feedback of
    the first N logged queries (their JSON lines), then test R@5 of the served index (toolgraph.load)."""
    from toolgraph.config import EvalConfig
    from toolgraph.data.formats import write_dataset
    from toolgraph.data.schema import ToolDataset
    from toolgraph.evaluation import evaluate
    from toolgraph.retrieval.loading import load as load_index

    ds = load(args.dataset)
    work = ROOT / "runs" / "feedback" / f"cli_{args.dataset}_{args.logged}"
    catalog = write_dataset(ToolDataset(args.dataset, ds.tools, [], ds.agents), work / "catalog")
    spec = work / "retriever.yaml"
    spec.write_text("retriever: {name: dense, encoder: all-MiniLM-L6-v2"
                    + (f", tool_text: {TOOL_TEXT[args.dataset]}" if args.dataset in TOOL_TEXT else "") + "}\n")
    log = work / "log.jsonl"
    log.write_text("".join(json.dumps({"query": q.text, "tools": list(q.tools)}) + "\n"
                           for q in log_order(ds)[:args.logged]))
    index = work / "index"
    commands = [["toolgraph", "index", "sync", str(catalog), "--index", str(index), "--retriever-config", str(spec)],
                ["toolgraph", "index", "feedback", str(log), "--index", str(index)]]
    seconds = []
    for cmd in commands:
        print("$", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        subprocess.run([str(ROOT / ".venv" / "bin" / cmd[0]), *cmd[1:]], cwd=ROOT, check=True)
        seconds.append(round(time.perf_counter() - t0, 1))
    report = evaluate(load_index(index), ds, "test", EvalConfig(ks=KS))
    row = {"method": "feedback", "dataset": args.dataset, "split": "test", "setting": f"end to end: index sync + index feedback of {args.logged}",
           "logged_queries": args.logged, "encoder": "all-MiniLM-L6-v2", "queries": len(ds.split("test")),
           "metrics": {k: round(v, 4) for k, v in report.metrics.items()}, "sync_seconds": seconds[0],
           "seconds": seconds[1], "command": "python benchmarks/feedback_bench.py cli --dataset "
           f"{args.dataset} --logged {args.logged}  # " + " && ".join(" ".join(c) for c in commands).replace(str(ROOT) + "/", ""),
           "device": "cpu", "machine": machine()}
    print(row["metrics"]["recall@5"], seconds, flush=True)
    upsert(NAME, [row], KEY)


def over_trained(args: argparse.Namespace) -> None:
    """What ``index train`` serves: the log's votes (the replay's constants) over the fast bi-encoder trained on
    the same logged queries (a ``trained`` run's exported retriever), its own encoder giving the neighbours."""
    from toolgraph.retrieval.feedback import FeedbackConfig, wrap
    from toolgraph.retrieval.loading import load as load_index

    c = FeedbackConfig()
    for name in args.datasets:
        ds = load(name)
        order = log_order(ds)
        for n in args.steps:
            run = ROOT / args.out / f"bi_{name}_{n}" / "retriever"
            if not (run / "retriever.json").is_file():
                continue
            from toolgraph.data.usage_log import Entry

            t0 = time.perf_counter()
            r = wrap(load_index(run))
            r.set_entries([Entry(q.text, q.tools) for q in order[:n]])
            test = ds.split("test")
            from toolgraph.metrics import compute

            ranking = r.retrieve([q.text for q in test], max(KS)).ids
            metrics = compute(ranking, [q.tools for q in test], KS)
            row = {"method": "feedback+bi_encoder_fast", "dataset": name, "split": "test",
                   "setting": f"index train on {n} logged queries, then their votes", "logged_queries": n,
                   "metrics": {k: round(v, 4) for k, v in metrics.items()},
                   "constants": {k: getattr(c, k) for k in GRID}, "seconds": round(time.perf_counter() - t0, 1),
                   "command": f"python benchmarks/feedback_bench.py over-trained --datasets {name} --steps {n}",
                   "device": "cpu", "machine": machine()}
            print(name, n, row["metrics"]["recall@5"], flush=True)
            upsert(NAME, [row], KEY)


PAGE = ROOT / "docs" / "agents-and-serving.md"
PLOT = ROOT / "docs" / "img" / "feedback_replay.png"


def _rows() -> list[dict]:
    return json.loads((ROOT / "benchmarks" / "results" / f"{NAME}.json").read_text())["rows"]


def crossover(rows: list[dict], name: str) -> str:
    """The fewest logged queries at which the log alone (feedback) beats the model trained on as many."""
    trained = {r["logged_queries"]: r["metrics"]["recall@5"] for r in rows
               if r["method"] == "bi_encoder_fast" and r["dataset"] == name}
    fed = {r["logged_queries"]: r["metrics"]["recall@5"] for r in rows if r["method"] == "feedback" and r["dataset"] == name and r["setting"].startswith("replay")}
    both = sorted(set(trained) & set(fed))
    if not both:
        return "not measured"
    ahead = [f"{n:,}" for n in both if fed[n] > trained[n]]
    behind = [f"{n:,}" for n in both if fed[n] <= trained[n]]
    return "; ".join(part for part in (f"the log ahead at {', '.join(ahead)}" if ahead else "",
                                        f"the trained model ahead at {', '.join(behind)}" if behind else "") if part)


def render(page: str | Path = PAGE) -> None:
    """The replay table on ``page`` (the plot: ``plot``; the command ``render`` writes both)."""
    rows = _rows()
    lines = ["| dataset | logged queries | R@5 feedback (zero-shot MiniLM + the log) | R@1 | nDCG@5 | feedback s "
             "(scoring the test split) | R@5 fast bi-encoder trained on them | its training s | R@5 index train "
             "(the trained model + the log's votes) |", "|---|---|---|---|---|---|---|---|---|"]
    for name in DATASETS:
        fed = sorted((r for r in rows if r["method"] == "feedback" and r["dataset"] == name
                      and r["setting"].startswith("replay")), key=lambda r: r["logged_queries"])
        trained = {r["logged_queries"]: r for r in rows if r["method"] == "bi_encoder_fast" and r["dataset"] == name}
        both = {r["logged_queries"]: r for r in rows if r["method"] == "feedback+bi_encoder_fast" and r["dataset"] == name}
        for r in fed:
            n, m = r["logged_queries"], r["metrics"]
            t, b = trained.get(n), both.get(n)
            lines.append(f"| {name} | {n:,} | {m['recall@5']:.3f} | {m['recall@1']:.3f} | {m['ndcg@5']:.3f} | "
                         f"{r['seconds']} | " + (f"{t['metrics']['recall@5']:.3f} | {t['seconds']:.0f} |" if t else "– | – |")
                         + (f" {b['metrics']['recall@5']:.3f} |" if b else " – |"))
    lines += ["", "The log alone against the model trained on the same queries (R@5): "
              + "; ".join(f"{n}: {crossover(rows, n)}" for n in DATASETS) + "."]
    chosen = next((r["constants"] for r in rows if r["method"] == "feedback"), None)
    if chosen:
        lines += ["", "Constants chosen on val (mean val R@5 over the four datasets and their logged steps): "
                  + ", ".join(f"`{k}: {v}`" for k, v in chosen.items()) + "."]
    write_block(page, "feedback-replay", "\n".join(lines))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DATASETS), figsize=(4 * len(DATASETS), 3.4), sharey=True)
    for ax, name in zip(axes, DATASETS):
        for method, style, label in (("feedback", "o-", "zero-shot + log votes"),
                                     ("bi_encoder_fast", "s--", "fast bi-encoder trained on the log")):
            pts = sorted((r["logged_queries"], r["metrics"]["recall@5"]) for r in rows
                         if r["method"] == method and r["dataset"] == name and not r["setting"].startswith("end to end"))
            if pts:
                ax.plot([max(n, 1) for n, _ in pts], [v for _, v in pts], style, label=label)
        ax.set_xscale("symlog", linthresh=100)
        ax.set_title(name)
        ax.set_xlabel("logged queries")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test R@5")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trained")
    t.add_argument("--datasets", nargs="+", default=DATASETS)
    t.add_argument("--steps", nargs="+", default=[100, 300, 1000, 3000])
    t.add_argument("--out", default="runs/feedback")
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(fn=trained)
    r = sub.add_parser("replay")
    r.add_argument("--datasets", nargs="+", default=DATASETS)
    r.set_defaults(fn=replay)
    o = sub.add_parser("over-trained")
    o.add_argument("--datasets", nargs="+", default=DATASETS)
    o.add_argument("--steps", nargs="+", type=int, default=[100, 300, 1000, 3000])
    o.add_argument("--out", default="runs/feedback")
    o.set_defaults(fn=over_trained)
    c = sub.add_parser("cli")
    c.add_argument("--dataset", default="toollens")
    c.add_argument("--logged", type=int, default=1000)
    c.set_defaults(fn=cli)
    d = sub.add_parser("render")
    d.add_argument("--page", default=str(PAGE))
    d.set_defaults(fn=lambda a: (render(a.page), plot(_rows(), PLOT)))
    args = p.parse_args()
    args.steps = [s if s == "all" else int(s) for s in getattr(args, "steps", [])]
    args.fn(args)


if __name__ == "__main__":
    main()
