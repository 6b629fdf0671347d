"""Fault tolerance: SIGKILL a run mid-epoch, resume from last.ckpt, finish with the same weights."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_overrides

ROOT = Path(__file__).resolve().parents[1]


def _cmd(data, model, out, extra=()):
    over = tiny_train_overrides(data, model, out, steps=39)  # a multiple of 3: last.ckpt holds the end
    over += ["checkpoint.every_n_train_steps=3", "trainer.val_check_interval=14", "test=false", "export=false",
             "model.hard_negatives=true", "trainer.deterministic=true"]
    return [sys.executable, str(ROOT / "train.py"), *over, *extra]


def _weights(out: Path) -> dict:
    return torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def _step(path: Path) -> int:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)["global_step"]
    except Exception:  # noqa: BLE001 - being written
        return -1


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    ref = tmp_path / "ref"
    subprocess.run(_cmd(synthetic_dataset_dir, tiny_bert_dir, ref), check=True, env=env, capture_output=True,
                   timeout=600)

    run = tmp_path / "run"
    proc = subprocess.Popen(_cmd(synthetic_dataset_dir, tiny_bert_dir, run), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = run / "checkpoints" / "last.ckpt"
    deadline = time.time() + 300
    while time.time() < deadline and not (last.exists() and _step(last) >= 18):
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # mid-epoch: 14 batches an epoch, killed at step >= 18
    proc.wait()
    killed_at = _step(last)
    assert 18 <= killed_at < 39 and killed_at % 14 != 0

    subprocess.run(_cmd(synthetic_dataset_dir, tiny_bert_dir, run, ["resume=auto"]), check=True, env=env,
                   capture_output=True, timeout=600)
    a, b = _weights(ref), _weights(run)
    assert _step(last) == _step(ref / "checkpoints" / "last.ckpt") == 39
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
