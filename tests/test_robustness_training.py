"""Issue 20, training side: a non-finite loss stops the run (finding 6), resume checks the checkpoint's
task and model section and loads it weights-only (finding 7), checkpoint load errors are messages,
SIGTERM exits 143 (finding 9), and an out_dir / export folder that is not ours is refused (Build 1)."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_overrides

from toolgraph.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["test=false", "export=false"]


def _overrides(data, model, out, steps=8, extra=()):
    return [*tiny_train_overrides(data, model, out, steps=steps), *QUICK, *extra]


@pytest.fixture(scope="module")
def tool2vec_run(synthetic_dataset_dir, tiny_bert_dir, tmp_path_factory):
    """A tiny Tool2Vec run: 8 steps, one validation, last.ckpt."""
    out = tmp_path_factory.mktemp("t2v") / "run"
    assert cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, out, extra=["model.name=tool2vec"])]) == 0
    assert (out / "checkpoints" / "last.ckpt").is_file()
    return out


# ---- finding 6: a non-finite loss -----------------------------------------------------------------
def test_a_nan_loss_stops_training_with_a_clear_error_and_exports_nothing(synthetic_dataset_dir, tiny_bert_dir,
                                                                          tmp_path, monkeypatch, capsys):
    from toolgraph.tasks.bi_encoder import BiEncoderTask

    real = BiEncoderTask.compute_loss
    monkeypatch.setattr(BiEncoderTask, "compute_loss", lambda self, batch: real(self, batch) * float("nan"))
    out = tmp_path / "run"
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=8)
    code = cli(["train", *over])
    err = capsys.readouterr().err
    assert code != 0 and "train/loss is nan" in err and "optim.lr" in err
    assert not (out / "retriever").exists() and not (out / "results.json").exists()
    for ckpt in (out / "checkpoints").glob("*.ckpt") if (out / "checkpoints").exists() else []:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()), ckpt


# ---- finding 7: resume ----------------------------------------------------------------------------
def test_resume_from_another_tasks_checkpoint_is_refused(tool2vec_run, synthetic_dataset_dir, tiny_bert_dir,
                                                         tmp_path, capsys):
    ckpt = tool2vec_run / "checkpoints" / "last.ckpt"
    out = tmp_path / "bi"
    code = cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=10), f"resume={ckpt}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "resume:" in err and "'tool2vec'" in err and "'bi_encoder'" in err
    assert not (out / "checkpoints").exists()


def test_resume_with_another_model_section_is_refused(tool2vec_run, synthetic_dataset_dir, tiny_bert_dir,
                                                      tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(tool2vec_run, out)
    code = cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=10,
                                     extra=["model.name=tool2vec", "model.temperature=0.2", "resume=auto"])])
    err = capsys.readouterr().err
    assert code == 2 and "model.temperature: 0.1 in the checkpoint, 0.2 in this run" in err, err


def test_resume_of_the_same_run_continues_weights_only(tool2vec_run, synthetic_dataset_dir, tiny_bert_dir,
                                                       tmp_path, monkeypatch):
    import lightning.pytorch.trainer.trainer as trainer_module

    seen = []
    real_fit = trainer_module.Trainer.fit
    monkeypatch.setattr(trainer_module.Trainer, "fit",
                        lambda self, *a, **kw: seen.append(kw.get("weights_only")) or real_fit(self, *a, **kw))
    out = tmp_path / "run"
    shutil.copytree(tool2vec_run, out)
    assert cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=15,
                                     extra=["model.name=tool2vec", "resume=auto"])]) == 0
    assert seen == [True]
    steps = [torch.load(c, map_location="cpu", weights_only=True)["global_step"]
             for c in (out / "checkpoints").glob("*.ckpt")]
    assert max(steps) == 14  # validated at step 14 (Lightning names the copied folder's new last.ckpt last-v1)


class Payload:  # a pickled object in a "checkpoint"
    pass


@pytest.mark.parametrize("kind", ["cut", "pickle", "not_toolgraph"])
def test_resume_from_a_bad_checkpoint_is_a_clear_error(kind, tool2vec_run, synthetic_dataset_dir, tiny_bert_dir,
                                                       tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    if kind == "cut":
        data = (tool2vec_run / "checkpoints" / "last.ckpt").read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    elif kind == "pickle":
        torch.save({"state_dict": {}, "payload": Payload()}, bad)
    else:
        torch.save({"state_dict": {"w": torch.zeros(2)}}, bad)
    code = cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run"), f"resume={bad}"])
    err = capsys.readouterr().err
    assert code == 2 and f"resume: {bad}" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", ["cut", "garbage"])
def test_evaluate_checkpoint_load_errors_are_messages(kind, tool2vec_run, tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    data = (tool2vec_run / "checkpoints" / "last.ckpt").read_bytes()
    bad.write_bytes(data[: len(data) // 3] if kind == "cut" else b"not a checkpoint at all\n" * 10)
    code = cli(["evaluate", "--checkpoint", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and str(bad) in err and "checkpoint" in err, err


# ---- finding 9: SIGTERM ---------------------------------------------------------------------------
def test_sigterm_during_training_exits_143(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    out = tmp_path / "run"
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=100000)
    over += ["trainer.val_check_interval=2", "checkpoint.every_n_train_steps=2"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *over], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (out / "checkpoints" / "last.ckpt").exists() and proc.poll() is None:
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err.decode()[-2000:]
    assert "SIGTERM" in err.decode()
    assert not (out / "results.json").exists() and not (out / "retriever").exists()
    assert not [p for p in out.rglob(".*tmp*")], "temp files left"


# ---- Build 1: never write into someone else's folder ----------------------------------------------
def test_out_dir_that_is_not_a_toolgraph_folder_is_refused(synthetic_dataset_dir, tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "my-project"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    code = cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, out)])
    err = capsys.readouterr().err
    assert code == 2 and "out_dir" in err and "refusing" in err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine\n"


def test_export_refuses_a_folder_or_file_that_is_not_an_export(tool2vec_run, tmp_path, capsys):
    ckpt = str(tool2vec_run / "checkpoints" / "last.ckpt")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("a,b\n")
    assert cli(["export", "--checkpoint", ckpt, "--out", str(mine)]) == 2
    assert "refusing" in capsys.readouterr().err and sorted(os.listdir(mine)) == ["data.csv"]
    afile = tmp_path / "file.bin"
    afile.write_bytes(b"x")
    assert cli(["export", "--checkpoint", ckpt, "--out", str(afile)]) == 2
    assert "not a folder" in capsys.readouterr().err and afile.read_bytes() == b"x"
    out = tmp_path / "export"  # an earlier export is replaced whole, with nothing left beside it
    assert cli(["export", "--checkpoint", ckpt, "--out", str(out)]) == 0
    (out / "stale.txt").write_text("from an older export\n")
    assert cli(["export", "--checkpoint", ckpt, "--out", str(out)]) == 0
    assert not (out / "stale.txt").exists() and (out / "retriever.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
