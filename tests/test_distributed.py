"""Real multi-process training on CPU with gloo: Lightning DDP with 2 devices, and a 2-node
torchrun launch on 127.0.0.1 (one process per "node")."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
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


def _check_run(out: Path, steps: int) -> None:
    res = json.loads((out / "results.json").read_text())
    assert res["training"]["global_step"] == steps
    assert res["dataset"]["queries"]["test"] == 40 and 0 <= res["metrics"]["recall@5"] <= 1
    assert (out / "retriever" / "retriever.json").exists()


@pytest.mark.distributed
def test_lightning_ddp_two_cpu_devices(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    out = tmp_path / "ddp"
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=8)
    over = [o for o in over if not o.startswith(("trainer.devices", "trainer.val_check_interval"))]
    over += ["trainer.devices=2", "trainer.strategy=ddp", "trainer.val_check_interval=4"]
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *over], env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "distributed_backend=gloo" in proc.stderr + proc.stdout
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in proc.stderr + proc.stdout
    _check_run(out, 8)


@pytest.mark.distributed
def test_torchrun_two_nodes_on_localhost(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    out = tmp_path / "nodes"
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=8)
    over = [o for o in over if not o.startswith(("trainer.devices", "trainer.val_check_interval"))]
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
@pytest.mark.parametrize("task", ["mlc", "refiner"])
def test_label_and_rerank_tasks_under_ddp(task, synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """Shuffled label batches and first-stage candidates sharded over 2 gloo ranks."""
    out = tmp_path / task
    over = [o for o in tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=6)
            if not o.startswith(("model.", "trainer.devices", "trainer.val_check_interval"))]
    over += ["trainer.devices=2", "trainer.strategy=ddp", "trainer.val_check_interval=3", f"model.name={task}",
             f"model.encoder={tiny_bert_dir}"]
    if task == "refiner":
        over += ["model.first_stage=bm25", "model.vectors=description", f"model.vector_encoder={tiny_bert_dir}",
                 "model.cache_dir=null", "model.candidates=6"]
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *over], env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in proc.stderr + proc.stdout
    _check_run(out, 6)
    res = json.loads((out / "results.json").read_text())
    # the Lightning test (queries sharded over 2 ranks, metric states summed) equals the exported evaluation
    assert res["training"]["test"]["test/recall@3"] == pytest.approx(res["metrics"]["recall@3"], abs=1e-5)
