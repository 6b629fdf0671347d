"""Real multi-process training on CPU with gloo: Lightning DDP with 2 devices, and a 2-node
torchrun launch on 127.0.0.1 (one process per "node")."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_overrides

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "PYTHONPATH": str(ROOT)}
    env.pop("LOCAL_RANK", None)
    return env


def _check_run(out: Path, steps: int) -> dict:
    """The run's results.json: all steps ran, the retriever was exported, and the Lightning test (queries
    sharded over the ranks, metric states summed) equals the exported evaluation."""
    res = json.loads((out / "results.json").read_text())
    assert res["training"]["global_step"] == steps
    assert res["dataset"]["queries"]["test"] == 40 and 0 <= res["metrics"]["recall@5"] <= 1
    assert (out / "retriever" / "retriever.json").exists()
    for k in ("recall@1", "recall@3", "ndcg@5"):
        assert res["training"]["test"][f"test/{k}"] == pytest.approx(res["metrics"][k], abs=1e-5)
    return res


def _train_ddp(over: list[str], out: Path, steps: int) -> tuple[str, dict]:
    """train.py over 2 gloo ranks (Lightning DDP on CPU); checks the run, returns its log and results."""
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *over, "trainer.devices=2", "trainer.strategy=ddp",
                           f"trainer.val_check_interval={steps // 2}"], env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stderr + proc.stdout
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in log
    return log, _check_run(out, steps)


def _tiny(synthetic_dataset_dir, tiny_bert_dir, out: Path, steps: int, drop: tuple[str, ...] = ()) -> list[str]:
    return [o for o in tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=steps)
            if not o.startswith(("trainer.devices", "trainer.val_check_interval", *drop))]


@pytest.mark.distributed
def test_lightning_ddp_two_cpu_devices(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    out = tmp_path / "ddp"
    log, _ = _train_ddp(_tiny(synthetic_dataset_dir, tiny_bert_dir, out, 8), out, 8)
    assert "distributed_backend=gloo" in log


@pytest.mark.distributed
def test_ema_weights_under_ddp(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """trainer.ema_decay over 2 gloo ranks: the checkpoint holds the average beside the raw weights,
    and the Lightning test (sharded over both ranks) ranks with the average, as the export does."""
    out = tmp_path / "ema"
    _, res = _train_ddp([*_tiny(synthetic_dataset_dir, tiny_bert_dir, out, 8), "trainer.ema_decay=0.8"], out, 8)
    ckpt = torch.load(res["training"]["best_checkpoint"], map_location="cpu", weights_only=True)
    avg, raw = ckpt["state_dict"], ckpt["current_model_state"]
    assert avg.keys() == raw.keys() and any(not torch.equal(avg[k], raw[k]) for k in avg)


@pytest.mark.distributed
def test_torchrun_two_nodes_on_localhost(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    out = tmp_path / "nodes"
    over = _tiny(synthetic_dataset_dir, tiny_bert_dir, out, 8)
    over += ["trainer.devices=1", "trainer.num_nodes=2", "trainer.strategy=ddp", "trainer.val_check_interval=4"]
    port = _port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
               f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}",
               str(ROOT / "train.py"), *over]
        procs.append(subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in "".join(logs)  # two ranks formed one world
    _check_run(out, 8)


@pytest.mark.distributed
@pytest.mark.parametrize("task", ["mlc", "refiner", "graph"])
def test_label_and_rerank_tasks_under_ddp(task, synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """Shuffled label batches, first-stage candidates and full-batch GNN training (GAT through
    to_hetero, every rank holding the whole graph) sharded over 2 gloo ranks."""
    out = tmp_path / task
    over = [*_tiny(synthetic_dataset_dir, tiny_bert_dir, out, 6, ("model.",)), f"model.name={task}",
            f"model.encoder={tiny_bert_dir}"]
    if task == "refiner":
        over += ["model.first_stage=bm25", "model.vectors=description", f"model.vector_encoder={tiny_bert_dir}",
                 "model.cache_dir=null", "model.candidates=6"]
    _train_ddp(over, out, 6)


@pytest.mark.distributed
def test_discriminator_trains_and_scores_graph_pairs_over_two_ranks(dependency_dataset_dir, tiny_bert_dir,
                                                                     tiny_discriminator_ckpt, tmp_path):
    """The 3-class discriminator under 2 gloo ranks (confusion-matrix states summed), and graph
    scoring through Lightning predict on 2 ranks gathering the same scores as one process."""
    from toolgraph.data.tdi import TDIConfig, build_tdi, write_tdi

    tdi = write_tdi(build_tdi(TDIConfig(sources=[{"dataset": str(dependency_dataset_dir)}], test_fraction=0.25,
                                        tool_text="io")), tmp_path / "tdi")
    out = tmp_path / "disc"
    over = [f"data.name={tdi}", "model.name=discriminator", f"model.encoder={tiny_bert_dir}", "model.stage=finetune",
            f"out_dir={out}", "data.batch_size=4", "model.max_pair_length=48", "trainer.max_steps=4",
            "trainer.max_epochs=100", "trainer.val_check_interval=1.0", "trainer.accelerator=cpu", "trainer.devices=2",
            "trainer.strategy=ddp", "trainer.enable_progress_bar=false", "logger.wandb=false",
            "checkpoint.monitor=val/macro_f1"]
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *over], env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in proc.stderr + proc.stdout
    res = json.loads((out / "results.json").read_text())
    test_pairs = sum(1 for _ in (tdi / "test.jsonl").open())
    assert sum(map(sum, res["test"]["confusion"])) == test_pairs  # each test pair counted once over 2 ranks
    assert sum(v["pairs"] for v in res["test"]["per_source"].values()) == test_pairs

    graphs = {}
    for devices in (1, 2):
        folder = tmp_path / f"graph{devices}"
        cmd = [sys.executable, "-m", "toolgraph.cli", "graph", "build", "--discriminator", str(tiny_discriminator_ckpt),
               "--data", str(dependency_dataset_dir), "--out", str(folder), "top_m=3", "keep_prob=0.0",
               "accelerator=cpu", f"devices={devices}", "strategy=" + ("ddp" if devices == 2 else "auto")]
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [json.loads(line) for line in (folder / "edges.jsonl").read_text().splitlines()]
        assert "header" in lines[0]  # the graph describes itself, on one rank's write
        graphs[devices] = {(e["source"], e["target"]): e["prob"] for e in lines[1:]}
    assert graphs[1].keys() == graphs[2].keys() and len(graphs[1]) > 40
    assert all(abs(graphs[1][k] - graphs[2][k]) < 1e-4 for k in graphs[1])
