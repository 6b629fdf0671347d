"""On a CUDA device (``pytest -m gpu``; skipped without one, so CI never runs them): a bf16-mixed
training run learns, and what it saved loads on CPU and ranks as it does on the GPU."""

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_overrides

import toolgraph
from toolgraph.config import load_config
from toolgraph.training import TrainConfig, train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ["please tell me the weather", "please tell me the taxi and please tell me the map", "book a flight"]


@pytest.fixture(scope="module")
def gpu_run(synthetic_dataset_dir, tiny_bert_dir, tmp_path_factory):
    """The tiny bi-encoder recipe of tests/test_training.py, on one GPU with configs/cluster/1gpu.yaml."""
    out = tmp_path_factory.mktemp("gpu-run")
    over = [o for o in tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=30)
            if not o.startswith(("trainer.accelerator=", "trainer.devices="))]
    cfg = load_config(TrainConfig, [ROOT / "configs" / "cluster" / "1gpu.yaml"], over)
    assert (cfg.trainer.accelerator, cfg.trainer.precision) == ("gpu", "bf16-mixed")
    return out, train(cfg)


def test_bf16_mixed_training_learns_on_the_gpu(gpu_run):
    out, summary = gpu_run
    training = json.loads((out / "results.json").read_text())["training"]
    assert training["device"] == f"1 x {torch.cuda.get_device_name(0)}" and training["steps"] == 30
    losses = [float(r["train/loss"]) for r in csv.DictReader((out / "logs" / "metrics.csv").open()) if r.get("train/loss")]
    assert losses and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert summary["metrics"]["recall@5"] > 0.5  # chance is ~0.2 on 24 tools
    # mixed precision: bf16 compute, fp32 weights (what the checkpoint holds)
    state = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    assert {t.dtype for t in state.values() if t.is_floating_point()} == {torch.float32}


def test_gpu_trained_checkpoint_loads_on_cpu_and_ranks_the_same(gpu_run):
    out, summary = gpu_run
    for path in (summary["best_checkpoint"], out / "retriever"):
        on_cpu, on_gpu = toolgraph.load(path), toolgraph.load(path)
        on_cpu.config.device, on_gpu.config.device = "cpu", "cuda"
        a, b = on_cpu.retrieve(QUERIES, 10), on_gpu.retrieve(QUERIES, 10)
        assert a.ids == b.ids
        assert torch.allclose(a.scores.float().cpu(), b.scores.float().cpu(), atol=1e-4)
