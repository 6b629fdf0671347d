"""toolgraph sweep for real on the tiny model: workers sharing one study (journal file, PostgreSQL), no grid
point run twice, a SIGKILLed worker's trial re-run by the other, SIGTERM and --resume, the median pruner."""

import collections
import os
import signal

import pytest
import yaml
from sweeps import finish, load, tiny_spec, toolgraph, trial_processes, trials_so_far, wait_for

from toolgraph.cli import main as cli
from toolgraph.config import TrainConfig, load_config

pytestmark = pytest.mark.distributed

GRID = {"optim.lr": {"values": [1.0e-3, 3.0e-3, 1.0e-2]}, "model.temperature": {"values": [0.05, 0.1]}}
POINTS = {(lr, t) for lr in (1.0e-3, 3.0e-3, 1.0e-2) for t in (0.05, 0.1)}


def by_state(study) -> dict[str, list]:
    out = collections.defaultdict(list)
    for t in study.get_trials():
        out[t.state.name].append(t)
    return out


def check_grid_ran_once(study) -> None:
    states = by_state(study)
    done = [(t.params["optim.lr"], t.params["model.temperature"]) for t in states["COMPLETE"]]
    assert sorted(done) == sorted(POINTS), done  # every point once, none twice
    assert not states["RUNNING"] and not states["WAITING"]
    for t in states["COMPLETE"]:
        saved = yaml.safe_load(open(os.path.join(t.user_attrs["out_dir"], "config.yaml")))
        assert saved["optim"]["lr"] == t.params["optim.lr"]  # the trial trained its own values
        assert saved["model"]["temperature"] == t.params["model.temperature"]
        assert t.value == max(t.intermediate_values.values()) and len(t.intermediate_values) == 2


def test_two_workers_on_one_journal_finish_a_six_point_grid_running_no_point_twice(
        synthetic_dataset_dir, tiny_bert_dir, tmp_path, capsys):
    spec = tiny_spec(tmp_path, synthetic_dataset_dir, tiny_bert_dir, GRID)
    out = finish(toolgraph("sweep", str(spec), "--out", str(tmp_path / "sw"), "--workers", "2"))
    study = load(tmp_path / "sw")
    check_grid_ran_once(study)
    workers = {t.system_attrs["toolgraph:pid"] for t in study.get_trials()}
    assert len(workers) == 2, "both workers ran trials"
    assert "best" in out and (tmp_path / "sw" / "best.yaml").is_file() and (tmp_path / "sw" / "report.html").is_file()
    best = load_config(TrainConfig, [tmp_path / "sw" / "best.yaml"])
    assert best.optim.lr == study.best_trial.params["optim.lr"] and best.out_dir == str(tmp_path / "sw" / "best")
    assert cli(["sweep", "report", str(tmp_path / "sw"), "--out", str(tmp_path / "again")]) == 0
    table = capsys.readouterr().out
    assert table.count("| complete |") == 6 and (tmp_path / "again" / "report.html").is_file()


def test_two_workers_share_a_study_in_postgresql(synthetic_dataset_dir, tiny_bert_dir, tmp_path, postgres_url, capsys):
    spec = tiny_spec(tmp_path, synthetic_dataset_dir, tiny_bert_dir, GRID)
    finish(toolgraph("sweep", str(spec), "--out", str(tmp_path / "sw"), "--study", "pg-grid", "--workers", "0",
                     "--storage", postgres_url))
    assert not (tmp_path / "sw" / "study.journal").exists()
    workers = [toolgraph("sweep", "--worker", "pg-grid", "--storage", postgres_url) for _ in range(2)]
    for w in workers:
        finish(w)
    study = load(tmp_path / "sw", postgres_url, "pg-grid")
    check_grid_ran_once(study)
    assert len({t.system_attrs["toolgraph:pid"] for t in study.get_trials()}) == 2
    assert cli(["sweep", "report", "pg-grid", "--storage", postgres_url]) == 0  # read back from the database
    assert capsys.readouterr().out.count("| complete |") == 6 and (tmp_path / "sw" / "best.yaml").is_file()


def test_a_worker_killed_by_sigkill_leaves_its_trial_failed_and_the_other_worker_re_runs_it(
        synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    spec = tiny_spec(tmp_path, synthetic_dataset_dir, tiny_bert_dir, {"optim.lr": {"values": [3.0e-3, 1.0e-2]}},
                     steps=42)
    folder = tmp_path / "sw"
    finish(toolgraph("sweep", str(spec), "--out", str(folder), "--workers", "0"))
    a = toolgraph("sweep", "--worker", str(folder))
    b = toolgraph("sweep", "--worker", str(folder))

    def a_mid_trial():
        for t in trials_so_far(folder):
            if t.state.name == "RUNNING" and t.system_attrs.get("toolgraph:pid") == a.pid and t.intermediate_values:
                return t
        return None

    victim = wait_for(a_mid_trial, what="worker A's trial to validate once")
    a.kill()  # SIGKILL: no handler runs, the trial stays RUNNING in the study
    a.wait()
    wait_for(lambda: not trial_processes(victim.number), timeout=10, what="the trial's process to die with its worker")
    out = finish(b)
    assert f"trial {victim.number}: its worker is gone" in out, out[-3000:]
    study = load(folder)
    lost = study.trials[victim.number]
    assert lost.state.name == "FAIL" and lost.user_attrs["exit"] == "lost"
    (rerun,) = [t for t in study.get_trials() if t.user_attrs.get("retry_of") == victim.number]
    assert rerun.state.name == "COMPLETE" and rerun.params == lost.params and rerun.user_attrs["attempt"] == 2
    assert rerun.user_attrs["out_dir"] == lost.user_attrs["out_dir"]  # same folder: it resumed from last.ckpt
    assert rerun.intermediate_values[0] == lost.intermediate_values[0]  # the validations before the kill, re-told
    assert len(rerun.intermediate_values) == 6
    complete = [t.params["optim.lr"] for t in study.get_trials() if t.state.name == "COMPLETE"]
    assert sorted(complete) == [3.0e-3, 1.0e-2]
    assert {t.system_attrs["toolgraph:pid"] for t in study.get_trials() if t.state.name == "COMPLETE"} == {b.pid}


def test_sigterm_requeues_the_trial_and_resume_continues_it_from_last_ckpt(
        synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    spec = tiny_spec(tmp_path, synthetic_dataset_dir, tiny_bert_dir, {"optim.lr": {"values": [1.0e-2]}}, steps=42)
    folder = tmp_path / "sw"
    run = toolgraph("sweep", str(spec), "--out", str(folder))
    first = wait_for(lambda: next((t for t in trials_so_far(folder) if t.intermediate_values), None),
                     what="the first validation")
    run.send_signal(signal.SIGTERM)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 143, out[-3000:]
    study = load(folder)
    stopped = study.trials[first.number]
    assert stopped.state.name == "FAIL" and stopped.user_attrs["exit"] == "interrupted"
    (queued,) = [t for t in study.get_trials() if t.state.name == "WAITING" and t.user_attrs.get("retry_of") == 0]
    assert queued.user_attrs["out_dir"] == stopped.user_attrs["out_dir"]

    again = toolgraph("sweep", str(spec), "--out", str(folder))
    assert "already exists" in finish_fails(again)  # a second start is refused; --resume continues
    finish(toolgraph("sweep", str(spec), "--out", str(folder), "--resume"))
    study = load(folder)
    rerun = study.trials[queued.number]
    assert rerun.state.name == "COMPLETE" and rerun.intermediate_values[0] == stopped.intermediate_values[0]
    assert "Restoring states from the checkpoint" in open(rerun.user_attrs["log"]).read()
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "COMPLETE"]


def finish_fails(proc) -> str:
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out[-3000:]
    return out


def test_the_median_pruner_stops_a_trial_worse_than_the_median_and_keeps_its_folder(
        synthetic_dataset_dir, tiny_bert_dir, tmp_path, capsys):
    spec = tiny_spec(tmp_path, synthetic_dataset_dir, tiny_bert_dir,
                     {"optim.lr": {"values": [1.0e-2, 3.0e-3, 1.0e-8]}}, steps=28)
    folder = tmp_path / "sw"
    assert cli(["sweep", str(spec), "--out", str(folder), "--pruner", "median", "--prune-startup", "2",
                "--prune-warmup", "0"]) == 0
    study = load(folder)
    good, fair, bad = study.trials
    assert good.state.name == fair.state.name == "COMPLETE" and len(good.intermediate_values) == 4
    assert bad.state.name == "PRUNED" and bad.user_attrs["exit"] == "pruned"
    assert len(bad.intermediate_values) == 1  # stopped at its first validation, three before its end
    assert bad.intermediate_values[0] < min(good.intermediate_values[0], fair.intermediate_values[0])
    run = bad.user_attrs["out_dir"]
    assert os.path.isfile(os.path.join(run, "config.yaml")) and os.path.isfile(os.path.join(run, "logs", "metrics.csv"))
    assert "pruned" in capsys.readouterr().out


def test_a_ddp_trial_is_pruned_on_both_ranks_at_once(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    """Rank 0 asks the pruner and broadcasts the answer: both gloo ranks stop at the same validation (no hang)."""
    spec = tiny_spec(tmp_path, synthetic_dataset_dir, tiny_bert_dir, {"optim.lr": {"values": [1.0e-2, 1.0e-8]}},
                     steps=28, command_extra=["trainer.devices=2", "trainer.strategy=ddp"])
    folder = tmp_path / "sw"
    finish(toolgraph("sweep", str(spec), "--out", str(folder), "--pruner", "median", "--prune-startup", "1",
                     "--prune-warmup", "0"), timeout=400)
    good, bad = load(folder).trials
    assert good.state.name == "COMPLETE" and len(good.intermediate_values) == 4
    assert bad.state.name == "PRUNED" and len(bad.intermediate_values) == 1
    log = open(bad.user_attrs["log"]).read()
    assert "pruned at validation 0" in log and log.count("Initializing distributed: GLOBAL_RANK") == 2
