"""Training step time: the Lightning BiEncoderTask vs a plain PyTorch loop, same model, batches,
loss, optimizer and schedule (all-MiniLM-L6-v2, ToolLens, batch 32 queries + 32 tools).

    python benchmarks/train_step.py [--steps 15] [--encoder all-MiniLM-L6-v2]
    python benchmarks/train_step.py --render-only [--page docs/results.md]   # only the sentence, from the file

Time per iteration = wall time between consecutive step ends (data, forward, backward, clip,
optimizer, schedule, logging). Median over the steps after the first two (warm-up). The two runs
alternate in blocks (Lightning, plain, Lightning, plain) to spread machine noise over both. The row
goes to benchmarks/results/training_core.json (setting speed:train-step), the sentence to the
``trainstep`` block of docs/results.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from results_io import DOCS, RESULTS, machine, upsert, write_block  # noqa: E402

from toolgraph.config import load_config  # noqa: E402
from toolgraph.data import prepare_dataset  # noqa: E402
from toolgraph.nn.losses import false_negative_mask, info_nce  # noqa: E402
from toolgraph.tasks.base import lr_lambda  # noqa: E402
from toolgraph.tasks.bi_encoder import BiEncoderTask  # noqa: E402
from toolgraph.training import TrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGE = DOCS / "results.md"  # where the trainstep block lives


class StepTimer(L.Callback):
    def __init__(self):
        self.ends: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        self.ends.append(time.perf_counter())


def lightning_run(cfg: TrainConfig, steps: int) -> list[float]:
    L.seed_everything(0)
    task = BiEncoderTask(cfg)
    dm = task.make_datamodule(prepare_dataset(cfg.data), cfg.data, cfg.seed)
    timer = StepTimer()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        gradient_clip_val=cfg.trainer.gradient_clip_val, callbacks=[timer],
                        use_distributed_sampler=False, num_sanity_val_steps=0)
    trainer.fit(task, datamodule=dm)
    return [b - a for a, b in zip(timer.ends, timer.ends[1:])]


def plain_run(cfg: TrainConfig, steps: int) -> list[float]:
    L.seed_everything(0)
    task = BiEncoderTask(cfg)  # only for the identical encoder and datamodule
    dm = task.make_datamodule(prepare_dataset(cfg.data), cfg.data, cfg.seed)
    enc, temp = task.query_encoder.train(), cfg.model.temperature
    groups = task.param_groups()
    opt = torch.optim.AdamW(groups, lr=cfg.optim.lr)
    total = len(dm.train_dataloader())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, total, int(0.1 * total), "linear"))
    ends = []
    for i, batch in enumerate(dm.train_dataloader()):
        if i == steps:
            break
        q = enc(**batch["query"])
        d = enc(**batch["doc"])
        mask = false_negative_mask(batch["gold"], batch["doc_tools"], batch["positive"])
        loss = info_nce(q, d, batch["positive"], temp, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(enc.parameters(), cfg.trainer.gradient_clip_val)
        opt.step()
        sched.step()
        ends.append(time.perf_counter())
    return [b - a for a, b in zip(ends, ends[1:])]


def render(page: str | Path = PAGE) -> None:
    """The trainstep sentence of ``page`` from the speed:train-step row of training_core.json."""
    import json

    rows = json.loads((RESULTS / "training_core.json").read_text())["rows"]
    row = next(r for r in rows if r["setting"] == "speed:train-step")
    m = row["metrics"]
    write_block(page, "trainstep", f"Training step, Lightning task vs a plain PyTorch loop (same model, batches, loss, "
                                   f"optimizer; `python benchmarks/train_step.py`): {m['lightning_s_median']} s vs "
                                   f"{m['plain_torch_s_median']} s median per step, ratio **{m['ratio']}** "
                                   f"({m['lightning_steps']} + {m['plain_steps']} steps, {row['note']}).")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--encoder", default="all-MiniLM-L6-v2")
    ap.add_argument("--page", type=Path, default=PAGE, help="page with the trainstep block")
    ap.add_argument("--render-only", action="store_true", help="only rewrite the sentence from the results file")
    args = ap.parse_args()
    if args.render_only:
        render(args.page)
        return
    cfg = load_config(TrainConfig, [ROOT / "configs/bi_encoder_toollens.yaml"], [f"model.encoder={args.encoder}"])
    light, plain = [], []
    for _ in range(2):
        light += lightning_run(cfg, args.steps // 2 + 2)[1:]
        plain += plain_run(cfg, args.steps // 2 + 2)[1:]
    ml, mp = statistics.median(light), statistics.median(plain)
    row = {"method": "bi_encoder", "dataset": "toollens", "split": "train", "setting": "speed:train-step",
           "encoder": args.encoder,
           "metrics": {"lightning_s_median": round(ml, 3), "plain_torch_s_median": round(mp, 3),
                       "ratio": round(ml / mp, 3), "lightning_steps": len(light), "plain_steps": len(plain)},
           "note": f"batch {cfg.data.batch_size} queries + {cfg.data.batch_size} tools, query len <= "
                   f"{cfg.data.max_query_length}, tool len <= {cfg.data.max_tool_length}; {machine()}",
           "command": "python benchmarks/train_step.py"}
    print(row["metrics"])
    upsert("training_core", [row])
    render(args.page)
    print("wrote benchmarks/results/training_core.json")


if __name__ == "__main__":
    main()
