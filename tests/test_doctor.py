"""toolgraph doctor: what the machine has, the fix for what it lacks, exit 1 when a recipe would fail."""

import json

import pytest

from toolgraph import doctor
from toolgraph.cli import main


def test_doctor_on_this_machine_finds_everything(capsys, data_root):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "ok      all-MiniLM-L6-v2" in out and "toollens" in out and "everything toolgraph needs is here" in out
    assert main(["doctor", "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)
    assert {c["name"] for c in checks} >= {"python", "torch", "lightning", "cpu", "data", "all-MiniLM-L6-v2"}
    assert all(c["status"] in ("ok", "warn") for c in checks)


@pytest.mark.parametrize("value", [None, "/nonexistent/benchmarks"])
def test_a_missing_data_folder_is_named_with_its_fix(monkeypatch, capsys, tmp_path, value):
    from toolgraph.data import loading

    monkeypatch.setattr(loading, "CHECKOUT_DATA", tmp_path / "shared" / "datasets")  # no ../shared either
    if value is None:
        monkeypatch.delenv("TOOLGRAPH_DATA", raising=False)
    else:
        monkeypatch.setenv("TOOLGRAPH_DATA", value)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("missing ") and " data " in x)
    assert ("not set" in line) if value is None else (value in line)
    assert "fix: " in out.split(line, 1)[1].splitlines()[1]  # the fix on the next line


def test_packages_are_checked_against_the_lock(monkeypatch, tmp_path, capsys):
    lock = tmp_path / "cpu.lock"
    lock.write_text("torch==0.0.1+cpu\n    # via toolgraph\nnumpy==" + doctor._version("numpy") + "\n")
    monkeypatch.setattr(doctor, "LOCK", lock)
    monkeypatch.setattr(doctor, "REQUIRED", [*doctor.REQUIRED, "no-such-package-xyz"])
    checks = {c.name: c for c in doctor.package_checks()}
    assert checks["torch"].status == "warn" and "the lock says 0.0.1+cpu" in checks["torch"].detail
    assert checks["numpy"].status == "ok" and checks["numpy"].detail.endswith("(locked)")
    assert checks["no-such-package-xyz"].status == "missing" and "make install" in checks["no-such-package-xyz"].fix
    monkeypatch.setattr(doctor, "diagnose", lambda: list(checks.values()))
    assert main(["doctor"]) == 1  # a required package missing
    assert "1 missing" in capsys.readouterr().out


def test_without_toolgraph_data_the_checkouts_shared_datasets_are_used_and_said(monkeypatch, tmp_path):
    """Unset TOOLGRAPH_DATA is fine beside a ../shared/datasets: every command finds it (data.loading.data_root),
    and doctor says it is that folder."""
    from toolgraph.data import loading

    shared = tmp_path / "shared" / "datasets"
    (shared / "toollens").mkdir(parents=True)
    (shared / "toollens" / "SOURCE.txt").write_text("test")
    monkeypatch.setattr(loading, "CHECKOUT_DATA", shared)
    monkeypatch.delenv("TOOLGRAPH_DATA", raising=False)
    [check] = doctor.data_checks()
    assert check.status == "ok" and check.detail.startswith(f"TOOLGRAPH_DATA unset: the checkout's ../shared/datasets, "
                                                              f"{shared}: 1 benchmark folders (toollens)")
    assert loading.data_root() == shared


# ---- the W&B line says what training does (training.wandb_mode decides both) -------------------------
@pytest.mark.parametrize("env,status,says,logs", [
    (None, "ok", "logs to W&B offline, into OUT_DIR/wandb", "offline"),
    ("", "ok", "logs to W&B offline, into OUT_DIR/wandb", "offline"),
    ("offline", "ok", "logs to W&B offline, into OUT_DIR/wandb", "offline"),
    ("online", "ok", "logs to W&B online (needs `wandb login` and the network)", "online"),
    ("disabled", "ok", "no run logs to W&B, whatever logger.wandb says", None),
    ("bogus", "warn", "'bogus' is not a W&B mode", "error"),
])
def test_the_wandb_line_says_what_a_training_run_does(monkeypatch, tmp_path, env, status, says, logs):
    from lightning.pytorch.loggers import WandbLogger

    from toolgraph.config import TrainConfig
    from toolgraph.errors import ConfigError
    from toolgraph.training import build_loggers

    if env is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", env)
    check = doctor.wandb_check()
    assert check.status == status and says in check.detail, check.detail
    assert check.detail.startswith(f"WANDB_MODE={env or '(unset)'}") or status == "warn"
    if status == "warn":
        assert check.fix and "fails" in check.detail
    # what training does with the same environment: the logger doctor promised, in that mode
    cfg = TrainConfig()
    assert cfg.logger.wandb  # on by default, as the line says
    if logs == "error":
        with pytest.raises(ConfigError, match="not a W&B mode"):
            build_loggers(cfg, tmp_path)
        return
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    wandb = [lg for lg in build_loggers(cfg, tmp_path) if isinstance(lg, WandbLogger)]
    assert len(wandb) == (0 if logs is None else 1)
    if logs is not None:
        import os

        assert os.environ["WANDB_MODE"] == logs  # nothing was started: a logger's run begins on first use
    assert "logger.wandb is on by default" in check.detail or logs is None


def test_the_wandb_line_counts_the_recipes_that_keep_logging_on(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "quiet.yaml").write_text("logger: {wandb: false}\n")
    (tmp_path / "a.yaml").write_text("model: {name: bi_encoder}\n")
    (tmp_path / "b_fast.yaml").write_text("defaults: [methods/quiet.yaml]\nmodel: {name: bi_encoder}\n")
    (tmp_path / "eval.yaml").write_text("retriever: {name: bm25}\n")  # not a training recipe
    detail = doctor.wandb_check(tmp_path).detail
    assert detail.endswith("logger.wandb is on by default, 1 of 2 recipes in configs/ keep it "
                           "(1 set logger.wandb: false)"), detail
    assert doctor.wandb_check(tmp_path / "none").detail.endswith("logger.wandb is on by default")
