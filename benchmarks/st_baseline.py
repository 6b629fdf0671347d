"""The sentence-transformers baseline of issue "Converge": its trainer with MultipleNegativesRankingLoss
on the same ToolLens training queries, the same all-MiniLM-L6-v2 and the same wall-clock budget as a
toolgraph recipe, tested by toolgraph's own evaluation on the same test split.

It needs sentence-transformers, datasets and accelerate, which toolgraph does not: ``make st-env``
builds ``.venv-st`` on top of ``.venv`` (toolgraph's packages stay shared, nothing of ``.venv`` changes).

    make st-env
    .venv-st/bin/python benchmarks/st_baseline.py --budget 00:00:06:00 [--batch-size 64] [--lr 5e-5]

What it trains: one (query, tool text) pair per gold tool of every train query (val carved from train
is left out, as in toolgraph's recipes), tool text rendered exactly as the bi-encoder's
``tool_text: default`` and cut at 96 tokens, queries at 64; in-batch negatives with the
``NO_DUPLICATES`` batch sampler (the library's recipe for MNRL), scale 20 (= temperature 0.05, as the
fast recipe), linear schedule over one epoch with 10 % warm-up, stopped when the budget is spent
(``train_seconds`` counts ``trainer.train()``: tokenisation included, model loading not). No model
selection: the model at the end of the budget is tested.

Writes a row to ``benchmarks/results/st_baseline.json``; ``python benchmarks/convergence.py render``
puts it beside the convergence run of the same budget on docs/dense.md.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from results_io import ROOT, machine, upsert  # noqa: E402

# benchmarks/datasets.py would shadow Hugging Face ``datasets``: this folder leaves the path once
# results_io is imported
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

NAME = "st_baseline"


def budget_seconds(budget: str) -> int:
    """DD:HH:MM:SS -> seconds (the format of toolgraph's ``trainer.max_time``)."""
    parts = budget.split(":")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise SystemExit(f"--budget: {budget!r} is not DD:HH:MM:SS")
    d, h, m, s = map(int, parts)
    return ((d * 24 + h) * 60 + m) * 60 + s


def training_pairs(ds, seed: int) -> tuple[list[str], list[str]]:
    from toolgraph.data.schema import render_tool

    text = {t.id: render_tool(t, "default") for t in ds.tools}
    pairs = [(q.text, text[g]) for q in ds.split("train") for g in q.tools]
    random.Random(seed).shuffle(pairs)
    return [a for a, _ in pairs], [p for _, p in pairs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", default="00:00:06:00", help="wall-clock budget, DD:HH:MM:SS")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--epochs", type=int, default=1, help="the schedule's length (the budget may stop it earlier)")
    ap.add_argument("--max-steps", type=int, default=-1,
                    help="the schedule's length in steps (> 0: overrides --epochs; size it to what the budget fits)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "st_baseline")
    args = ap.parse_args()
    seconds = budget_seconds(args.budget)

    import sentence_transformers as st
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from sentence_transformers.training_args import BatchSamplers
    from transformers import TrainerCallback

    from toolgraph.config import DataConfig, EvalConfig
    from toolgraph.data import prepare_dataset
    from toolgraph.evaluation import evaluate
    from toolgraph.nn.encoder import resolve_model
    from toolgraph.retrieval.dense import DenseConfig, DenseRetriever

    class Budget(TrainerCallback):
        """Stop after ``seconds`` of training (checked after every step, like Lightning's max_time)."""

        def on_train_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, _args, state, control, **k):
            if time.perf_counter() - self.t0 >= seconds:
                control.should_training_stop = True

    ds = prepare_dataset(DataConfig(name="toollens"))
    anchors, positives = training_pairs(ds, args.seed)
    model = SentenceTransformer(resolve_model("all-MiniLM-L6-v2"), device="cpu")
    model.max_seq_length = 96
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(args.out / "trainer"), num_train_epochs=args.epochs, max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_ratio=0.1, lr_scheduler_type="linear", batch_sampler=BatchSamplers.NO_DUPLICATES,
        save_strategy="no", eval_strategy="no", logging_steps=10, report_to="none", seed=args.seed, use_cpu=True,
        dataloader_num_workers=0)
    trainer = SentenceTransformerTrainer(
        model=model, args=targs, train_dataset=Dataset.from_dict({"anchor": anchors, "positive": positives}),
        loss=MultipleNegativesRankingLoss(model, scale=20.0), callbacks=[Budget()])
    t0 = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - t0
    steps = trainer.state.global_step
    model.save(str(args.out / "model"))

    retriever = DenseRetriever(DenseConfig(model=str(args.out / "model"), pooling="mean", normalize=True, max_length=96,
                                           query_max_length=64, cache_dir=None, progress=False, device="cpu"))
    report = evaluate(retriever, ds, "test", EvalConfig(ks=[1, 3, 5, 7, 10]))
    # run with .venv-st's python (make st-env); recorded like every row's command
    sized = args.max_steps > 0
    command = (f"python benchmarks/st_baseline.py --budget {args.budget} --batch-size {args.batch_size} "
               f"--lr {args.lr:g} --epochs {args.epochs}" + (f" --max-steps {args.max_steps}" if sized else ""))
    row = {"method": "st_mnrl", "dataset": "toollens", "split": "test",
           "setting": f"budget {args.budget}" + (f" max_steps={args.max_steps}" if sized else ""),
           "command": command, "metrics": {k: round(v, 4) for k, v in report.metrics.items()},
           "train_seconds": round(train_seconds, 1), "steps": steps, "pairs": len(anchors),
           "examples_per_second": round(steps * args.batch_size / train_seconds, 2),
           "device": "cpu", "batch_size": args.batch_size, "lr": args.lr, "epochs": args.epochs,
           "max_steps": args.max_steps, "budget": args.budget, "venv": ".venv-st (make st-env)",
           "sentence_transformers": st.__version__, "torch_threads": torch.get_num_threads(), "machine": machine()}
    upsert(NAME, [row])
    print(f"st_mnrl budget {args.budget}: {steps} steps in {train_seconds:.0f} s, test R@5 {row['metrics']['recall@5']:.4f} "
          f"R@3 {row['metrics']['recall@3']:.4f} R@7 {row['metrics']['recall@7']:.4f}")


if __name__ == "__main__":
    main()
