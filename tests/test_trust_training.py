"""Issue 41 ("Trust"), training side.

Finding 2: a checkpoint save is atomic on any filesystem: a full disk or a kill -9 mid-write leaves
the earlier checkpoint whole and never a cut file under a checkpoint's name (a real tmpfs that is too
small; a real SIGKILL of a process mid-save). Finding 5: a new run into an earlier run's folder
moves its checkpoints/ aside, and ``resume=auto`` takes the newest last checkpoint. Finding 7: a run
that would train nothing is refused with a ConfigError naming the key; a run without validation
says so. Weak: a seed outside 32 bits is a ConfigError."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_overrides

from toolgraph.cli import main as cli
from toolgraph.config import load_config
from toolgraph.training import TrainConfig, build_trainer, resolve_resume

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["test=false", "export=false"]


def _overrides(data, model, out, steps=8, extra=()):
    return [*tiny_train_overrides(data, model, out, steps=steps), *QUICK, *extra]


def _cfg(out: Path, extra=()) -> TrainConfig:
    return load_config(TrainConfig, [], [f"out_dir={out}", "trainer.accelerator=cpu", "trainer.devices=1",
                                         "logger.wandb=false", "logger.csv=false", *extra])


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)``: a new folder on its own small tmpfs (another filesystem than $TMPDIR, and a disk
    that can be filled); unmounted after the test. Skipped where mounting is not permitted."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        point = tmp_path / f"tmpfs-{len(mounted)}"
        point.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a {size} tmpfs here (needs root / CAP_SYS_ADMIN): "
                        f"{(proc.stderr or proc.stdout).strip()[:200]}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


@pytest.fixture(scope="module")
def first_run(synthetic_dataset_dir, tiny_bert_dir, tmp_path_factory):
    """An earlier run's folder: 8 steps, validated at step 7: checkpoints/best-0-7.ckpt and last.ckpt."""
    out = tmp_path_factory.mktemp("first") / "run"
    assert cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, out)]) == 0
    assert _files(out / "checkpoints") == {"best-0-7.ckpt", "last.ckpt"}
    return out


# ---- finding 2: atomic checkpoint saves -------------------------------------------------------------
def test_a_checkpoint_that_does_not_fit_leaves_the_earlier_one_whole(tmpfs):
    out = tmpfs("5m") / "run"
    io = build_trainer(_cfg(out), out).strategy.checkpoint_io  # what ModelCheckpoint saves through
    last = out / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(2**18)}, last)  # 1 MiB: fits
    errors = {}
    for name in ("last.ckpt", "best-0-9.ckpt"):  # over the earlier file, and under a new name
        with pytest.raises(OSError) as err:
            io.save_checkpoint({"step": 2, "w": torch.ones(2**21)}, last.with_name(name))  # 8 MiB: does not fit
        errors[name] = str(err.value)
    old = torch.load(last, weights_only=True)  # still the whole earlier checkpoint
    assert old["step"] == 1 and torch.equal(old["w"], torch.ones(2**18))
    assert _files(last.parent) == {"last.ckpt"}  # no partial best-0-9.ckpt, no temp file left
    for name, message in errors.items():  # says what failed, and that nothing was lost
        assert f"{name}: not written, the disk is full" in message and "unchanged" in message, message


def test_training_on_a_full_disk_stops_with_a_clear_error_and_no_cut_checkpoint(
        synthetic_dataset_dir, tiny_bert_dir, tmpfs, capsys):
    out = tmpfs("5m") / "run"  # room for config and logs, not for one 12 MB checkpoint
    code = cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, out)])
    err = capsys.readouterr().err
    assert code == 2 and "best-0-7.ckpt: not written, the disk is full" in err, err[-2000:]
    assert "Traceback" not in err
    assert _files(out / "checkpoints") == set()  # nothing under a checkpoint's name, no temp file


_SLOW_SAVE = textwrap.dedent('''
    import builtins, io, os, shutil, sys, time
    from pathlib import Path

    import torch

    from toolgraph.config import load_config
    from toolgraph.training import TrainConfig, build_trainer

    out = Path(sys.argv[1])
    cfg = load_config(TrainConfig, [], [f"out_dir={out}", "trainer.accelerator=cpu", "trainer.devices=1",
                                        "logger.wandb=false", "logger.csv=false"])
    checkpoint_io = build_trainer(cfg, out).strategy.checkpoint_io
    last = out / "checkpoints" / "last.ckpt"
    checkpoint_io.save_checkpoint({"step": 1, "w": torch.full((2**18,), 1.0)}, last)  # at full speed


    class SlowDisk:  # a file on slow (network) storage: 20 ms per 64 KiB written
        def __init__(self, f):
            self._f = f

        def write(self, data):
            view = memoryview(data).cast("B")
            for i in range(0, len(view), 65536):
                self._f.write(view[i:i + 65536])
                time.sleep(0.02)
            return len(view)

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)


    real_open = builtins.open

    def slow_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        here = isinstance(file, (str, os.PathLike)) and Path(file).resolve().parent == last.parent.resolve()
        return SlowDisk(f) if here and "w" in mode else f  # every file written into checkpoints/


    builtins.open = io.open = slow_open
    shutil._USE_CP_SENDFILE = False  # a copy into checkpoints/ writes through the slow disk too
    print("writing", flush=True)
    checkpoint_io.save_checkpoint({"step": 2, "w": torch.full((2**20,), 2.0)}, last)  # 4 MiB: 1.3 s or more
    print("done", flush=True)
''')


def test_sigkill_mid_save_leaves_the_old_checkpoint_or_the_new_one(tmpfs, tmp_path):
    out = tmpfs("64m") / "run"  # another filesystem than $TMPDIR, where Lightning's move is a copy
    script = tmp_path / "slow_save.py"
    script.write_text(_SLOW_SAVE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT)
    try:
        while (line := proc.stdout.readline()) and line.strip() != "writing":
            pass
        assert line.strip() == "writing", "the child died before its second save"
        time.sleep(0.4)  # a third of the way into the slow write
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    assert "done" not in rest, "the save finished before the kill: nothing was tested"
    folder = out / "checkpoints"
    assert {n for n in _files(folder) if not n.startswith(".last.ckpt.tmp-")} == {"last.ckpt"}
    ckpt = torch.load(folder / "last.ckpt", weights_only=True)  # whole: the old one or the new one
    expected = {1: torch.full((2**18,), 1.0), 2: torch.full((2**20,), 2.0)}[ckpt["step"]]
    assert torch.equal(ckpt["w"], expected)


def test_ddp_trainer_saves_through_the_atomic_checkpoint_io(tmp_path):
    out = tmp_path / "run"
    trainer = build_trainer(_cfg(out, ["trainer.devices=2", "trainer.strategy=ddp"]), out)  # nothing launched yet
    io = trainer.strategy.checkpoint_io  # Lightning hands the Trainer's plugin to the strategy
    assert type(trainer.strategy).__name__ == "DDPStrategy"
    assert f"{type(io).__module__}.{type(io).__name__}" == "toolgraph.training.AtomicCheckpointIO"


_DDP_TRAIN = textwrap.dedent('''
    import os, sys

    from toolgraph.training import AtomicCheckpointIO
    from toolgraph.cli import main

    real = AtomicCheckpointIO.save_checkpoint

    def logged(self, checkpoint, path, storage_options=None):  # which process saved what, through this class
        with open(os.environ["SAVES_LOG"], "a") as f:
            f.write(f"{os.environ.get('LOCAL_RANK', '0')} {os.path.basename(path)}\\n")
        return real(self, checkpoint, path, storage_options)

    AtomicCheckpointIO.save_checkpoint = logged
    sys.exit(main(["train", *sys.argv[1:]]))
''')


@pytest.mark.distributed
def test_ddp_training_saves_through_the_atomic_checkpoint_io(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    out = tmp_path / "ddp"
    script, saves = tmp_path / "ddp_train.py", tmp_path / "saves.log"
    script.write_text(_DDP_TRAIN)
    over = [o for o in _overrides(synthetic_dataset_dir, tiny_bert_dir, out) if not o.startswith("trainer.devices")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "PYTHONPATH": str(ROOT),
           "SAVES_LOG": str(saves)}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, str(script), *over, "trainer.devices=2", "trainer.strategy=ddp",
                           "trainer.val_check_interval=4"], env=env, capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in proc.stderr + proc.stdout
    assert saves.exists(), "no checkpoint was saved through AtomicCheckpointIO"
    ranks, names = zip(*(line.split() for line in saves.read_text().splitlines()))
    assert set(ranks) == {"0"} and "last.ckpt" in names and any(n.startswith("best-") for n in names)
    # validated at step 4 and at the last step, 8 (ValidateTheLastStep): last.ckpt is the end of the run
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8


# ---- finding 5: a new run does not mix with the earlier run's checkpoints --------------------------
def test_a_new_run_into_an_earlier_run_folder_moves_its_checkpoints_aside(first_run, synthetic_dataset_dir,
                                                                          tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(first_run, out)
    before = {n: (out / "checkpoints" / n).read_bytes() for n in _files(out / "checkpoints")}
    (out / "checkpoints" / ".last.ckpt.tmp-4242").write_bytes(b"cut")  # what a killed save left
    # validated once, at its last step (ValidateTheLastStep), before the interval of 7 came
    assert cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=4)]) == 0
    err = capsys.readouterr().err
    assert _files(out / "checkpoints") == {"best-0-4.ckpt", "last.ckpt"}  # not last-v1.ckpt beside the old run's
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    old = [p for p in out.iterdir() if p.name.startswith("checkpoints.old-")]
    assert len(old) == 1 and f"moved to {old[0].name}/ (nothing deleted)" in err, err[-2000:]
    assert {n: (old[0] / n).read_bytes() for n in _files(old[0])} == before  # kept whole, temp file gone
    cfg = load_config(TrainConfig, [], _overrides(synthetic_dataset_dir, tiny_bert_dir, out, extra=["resume=auto"]))
    assert resolve_resume(cfg, out) == str(out / "checkpoints" / "last.ckpt")  # this run's, not the old one


def test_resume_auto_takes_the_newest_last_checkpoint(first_run, synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """A folder that an earlier version re-ran a run into: last.ckpt (the first run) and last-v1.ckpt
    (the re-run, newer). Resuming continues the re-run, and a run that resumes keeps its folder."""
    out = tmp_path / "run"
    shutil.copytree(first_run, out)
    folder = out / "checkpoints"
    shutil.copy(folder / "last.ckpt", folder / "last-v1.ckpt")
    now = time.time()
    os.utime(folder / "last.ckpt", (now - 3600, now - 3600))
    os.utime(folder / "last-v1.ckpt", (now, now))
    cfg = load_config(TrainConfig, [], _overrides(synthetic_dataset_dir, tiny_bert_dir, out, extra=["resume=auto"]))
    assert resolve_resume(cfg, out) == str(folder / "last-v1.ckpt")
    from toolgraph.training import set_aside_checkpoints

    assert set_aside_checkpoints(out, str(folder / "last-v1.ckpt")) is None and folder.is_dir()


# ---- finding 7: training that trains nothing ------------------------------------------------------
@pytest.mark.parametrize("override,key", [
    ("data.batch_size=512", "data.batch_size"),  # 240 training queries: no full batch
    ("data.max_queries_per_tool=1 data.batch_size=32", "data.max_queries_per_tool"),  # 24 tools: <= 24 queries kept
    ("trainer.max_epochs=0", "trainer.max_epochs"),
    ("trainer.max_steps=0", "trainer.max_steps"),
    ("trainer.limit_train_batches=0", "trainer.limit_train_batches"),
    ("trainer.limit_train_batches=0.01", "trainer.limit_train_batches"),  # 1 % of 15 batches
    ("trainer.val_check_interval=100", "trainer.val_check_interval"),  # an epoch is 15 batches
])
def test_a_run_that_would_train_nothing_is_refused_naming_the_key(first_run, synthetic_dataset_dir, tiny_bert_dir,
                                                                   tmp_path, capsys, override, key):
    out = tmp_path / "run"
    shutil.copytree(first_run, out)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    code = cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, out), *override.split()])
    err = capsys.readouterr().err
    assert code == 2 and f"error: {key}:" in err, err[-2000:]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before  # nothing written, moved or removed


def test_a_run_without_validation_says_so_on_stderr_and_in_results(synthetic_dataset_dir, tiny_bert_dir, tmp_path,
                                                                     capsys):
    out = tmp_path / "run"
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, out, steps=4)
    assert cli(["train", *over, "trainer.limit_val_batches=0"]) == 0
    err = capsys.readouterr().err
    assert "warning: no validation ran" in err and "trainer.limit_val_batches" in err, err[-2000:]
    training = json.loads((out / "results.json").read_text())["training"]
    assert training["best_checkpoint"] == ""
    assert len(training["warnings"]) == 1 and "the export use the last weights" in training["warnings"][0]


# ---- weak: the seed -------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [2**32, -1])
def test_a_seed_outside_32_bits_is_a_config_error(seed, synthetic_dataset_dir, tiny_bert_dir, tmp_path, capsys):
    code = cli(["train", *_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run"), f"seed={seed}"])
    err = capsys.readouterr().err
    assert code == 2 and "key 'seed'" in err and "4294967295" in err and f"seed={seed}" in err, err[-2000:]
