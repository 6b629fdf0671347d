"""The W&B sweep spec read for Optuna: every shipped spec, the distributions, and a clear error for each
key W&B does not define or Optuna cannot run, naming the file and the key."""

import math
from pathlib import Path

import pytest
import yaml

from toolgraph.cli import main as cli
from toolgraph.config import TrainConfig, load_config
from toolgraph.errors import ConfigError
from toolgraph.sweep.spec import format_value, parse_spec, point_overrides, read_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted(ROOT.glob("configs/sweeps/*.yaml"))
RECIPE = str(ROOT / "configs" / "discriminator.yaml")


def spec(**over):
    raw = {"program": "train.py", "method": "grid", "metric": {"name": "val/macro_f1", "goal": "maximize"},
           "parameters": {"optim.lr": {"values": [1.0e-3, 3.0e-3]}},
           "command": ["${env}", "python", "${program}", "--config", RECIPE, "${args_no_hyphens}"]}
    raw.update(over)
    return raw


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_every_shipped_spec_reads_and_each_of_its_points_builds_a_config(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the command's --config paths are relative to the repository root
    s = read_spec(path)
    points = s.grid()
    assert len(points) == math.prod(len(p.grid_values()) for p in s.parameters.values())
    for point in points[:: max(1, len(points) // 7)]:
        cfg = load_config(TrainConfig, s.configs, [*s.overrides, *point_overrides(point)])
        for key, value in point.items():
            section, name = key.split(".")
            assert getattr(getattr(cfg, section), name) == value


def test_the_discriminator_grid_is_nine_points_first_key_outermost():
    s = read_spec(ROOT / "configs/sweeps/discriminator.yaml")
    assert s.method == "grid" and s.metric == "val/macro_f1" and s.goal == "maximize" and s.name == "discriminator"
    assert s.grid()[:2] == [{"optim.lr": 3.0e-4, "model.hidden": 32}, {"optim.lr": 3.0e-4, "model.hidden": 64}]
    assert len(s.grid()) == 9 and s.configs == ["configs/discriminator.yaml"]


def test_distributions_map_to_optuna_as_w_and_b_defines_them():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    s = parse_spec(spec(method="random", parameters={
        "optim.lr": {"distribution": "log_uniform_values", "min": 1.0e-5, "max": 1.0e-3},
        "optim.weight_decay": {"distribution": "log_uniform", "min": -9.2, "max": -4.6},  # W&B: natural logs
        "model.hidden": {"min": 32, "max": 128},  # ints: int_uniform, as W&B infers
        "model.dropout": {"distribution": "q_uniform", "min": 0.0, "max": 0.5, "q": 0.1},
        "optim.schedule": {"values": ["linear", "cosine"]},
        "seed": {"value": 3},
        "optim": {"parameters": {"eps": {"min": 1.0e-9, "max": 1.0e-7}}},  # W&B's nested form
    }), "s.yaml")
    d = s.distributions()
    assert d["optim.lr"] == FloatDistribution(1.0e-5, 1.0e-3, log=True)
    assert d["optim.weight_decay"].log and math.isclose(d["optim.weight_decay"].low, math.exp(-9.2))
    assert d["model.hidden"] == IntDistribution(32, 128)
    assert d["model.dropout"].step == 0.1
    assert d["optim.schedule"] == CategoricalDistribution(["linear", "cosine"]) and d["seed"].choices == (3,)
    assert d["optim.eps"] == FloatDistribution(1.0e-9, 1.0e-7)
    assert s.goal == "maximize"
    assert parse_spec({**spec(), "metric": {"name": "val/nll"}}, "s.yaml").goal == "minimize"  # W&B's default


def test_int_uniform_is_a_grid_axis_and_values_of_any_yaml_kind_read_back():
    s = parse_spec(spec(parameters={"model.hidden": {"distribution": "int_uniform", "min": 1, "max": 3},
                                    "eval.ks": {"values": [[1, 3], [5]]}}), "s.yaml")
    assert [p["model.hidden"] for p in s.grid()] == [1, 1, 2, 2, 3, 3]
    assert {p["eval.ks"] for p in s.grid()} == {"[1, 3]", "[5]"}
    for value in (True, None, 0.1, 1e-05, "linear", "true", "a b", 3):
        (item,) = point_overrides({"k": value})
        assert yaml.safe_load(item.split("=", 1)[1]) == value, item
    assert format_value("[1, 3]") == "[1, 3]"


@pytest.mark.parametrize("change, key, words", [
    ({"optimizer": "tpe"}, "optimizer", "not a W&B sweep key"),
    ({"method": "hyperopt"}, "method", "grid, random, bayes"),
    ({"program": "evaluate.py"}, "program", "only train.py"),
    ({"metric": {"name": "val/f1", "goal": "up"}}, "metric.goal", "maximize or minimize"),
    ({"metric": {"name": "val/f1", "mode": "max"}}, "metric.mode", "not a W&B metric key"),
    ({"parameters": {"optim.lr": {"distribution": "normal", "mu": 0, "sigma": 1}}}, "parameters.optim.lr.distribution",
     "does not take"),
    ({"parameters": {"optim.lr": {"distribution": "gamma", "min": 0, "max": 1}}}, "parameters.optim.lr.distribution",
     "unknown distribution"),
    ({"parameters": {"optim.lr": {"min": 1.0e-5, "max": 1.0e-3}}}, "parameters.optim.lr", "method grid needs values"),
    ({"parameters": {"optim.lr": {"values": [1, 2], "probabilities": [0.5, 0.5]}}},
     "parameters.optim.lr.probabilities", "no Optuna counterpart"),
    ({"parameters": {"optim.lr": {"values": [1, 1]}}}, "parameters.optim.lr.values", "twice"),
    ({"parameters": {"optim.lr": {"range": [1, 2]}}}, "parameters.optim.lr.range", "not a W&B parameter key"),
    ({"method": "random", "parameters": {"optim.lr": {"min": 0.1, "max": 0.01}}}, "parameters.optim.lr.max",
     "must be > min"),
    ({"command": ["python", "train.py", "${args}"]}, "command", "no --config"),
    ({"command": ["python", "train.py", "--config", RECIPE, "--verbose"]}, "command[4]", "neither"),
    ({"run_cap": 0}, "run_cap", ">= 1"),
    ({"early_terminate": {"type": "envelope"}}, "early_terminate", "hyperband"),
])
def test_a_bad_spec_names_the_file_and_the_key(change, key, words):
    with pytest.raises(ConfigError) as e:
        parse_spec(spec(**change), "configs/sweeps/bad.yaml")
    assert f"configs/sweeps/bad.yaml: key '{key}'" in str(e.value) and words in str(e.value), str(e.value)


def test_the_command_line_refuses_a_bad_spec_before_anything_runs(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec(parameters={"optim.lrr": {"values": [1.0e-3]}})))
    assert cli(["sweep", str(bad), "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "optim.lrr" in err, err
    assert not (tmp_path / "sw").exists()  # nothing was created
    random = tmp_path / "random.yaml"
    random.write_text(yaml.safe_dump(spec(method="random", parameters={"optim.lr": {"min": 1.0e-4, "max": 1.0e-2}})))
    assert cli(["sweep", str(random), "--out", str(tmp_path / "sw2")]) == 2
    assert "run_cap" in capsys.readouterr().err
    missing = tmp_path / "nope.yaml"
    assert cli(["sweep", str(missing)]) == 2 and "no such sweep spec" in capsys.readouterr().err
    assert cli(["sweep", "report", str(tmp_path)]) == 2 and "study.journal" in capsys.readouterr().err


def test_a_trial_config_has_the_trials_values_and_its_w_and_b_run_is_grouped_by_the_study(tmp_path, monkeypatch):
    from toolgraph.sweep.study import create_sweep
    from toolgraph.sweep.trial import trial_config
    from toolgraph.training import build_loggers

    s = parse_spec(spec(command=["python", "train.py", "--config", RECIPE, "model.dropout=0.3", "${args}"]),
                   tmp_path / "ablation.yaml")
    sweep = create_sweep(s, tmp_path / "sw", None, pruner={"name": "none"}, budget=None)
    assert len(sweep.study.trials) == 2  # the grid, queued once by the study's creator
    out = str(tmp_path / "sw" / "trials" / "0001")
    cfg = trial_config(sweep, {"optim.lr": 3.0e-3}, out, 1)
    assert cfg.optim.lr == 3.0e-3 and cfg.model.dropout == 0.3 and cfg.out_dir == out and cfg.resume == "auto"
    assert cfg.test is False  # chosen on val: a sweep never looks at test
    assert cfg.logger.group == "ablation" and cfg.logger.run_name == "ablation-trial-1"
    assert {"sweep:ablation", "trial:1"} <= set(cfg.logger.tags)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    cfg.logger.wandb = True
    (run,) = [lg for lg in build_loggers(cfg, tmp_path / "run") if type(lg).__name__ == "WandbLogger"]
    assert run._wandb_init["group"] == "ablation" and "trial:1" in run._wandb_init["tags"]
    assert run._wandb_init["config"]["optim"]["lr"] == 3.0e-3  # every rank builds the same config: no wandb.config


def test_the_pruner_comes_from_the_command_line_else_the_specs_hyperband(tmp_path):
    import optuna

    from toolgraph.sweep.study import build_pruner, pruner_settings

    s = parse_spec(spec(early_terminate={"type": "hyperband", "min_iter": 3, "eta": 2}), "s.yaml")
    settings = pruner_settings(s, None, 3, 1)
    assert settings == {"name": "hyperband", "min_resource": 3, "max_resource": "auto", "eta": 2}
    assert isinstance(build_pruner(settings), optuna.pruners.HyperbandPruner)
    assert isinstance(build_pruner(pruner_settings(s, "median", 2, 5)), optuna.pruners.MedianPruner)
    assert isinstance(build_pruner(pruner_settings(parse_spec(spec(), "s.yaml"), None, 3, 1)), optuna.pruners.NopPruner)


def test_a_metric_target_reached_by_a_trial_stops_the_sweep(tmp_path):
    from toolgraph.sweep.study import claim, create_sweep
    from toolgraph.sweep.worker import _target_reached, run_worker

    s = parse_spec(spec(metric={"name": "val/macro_f1", "goal": "maximize", "target": 0.8},
                        parameters={"optim.lr": {"values": [1.0e-3, 3.0e-3, 1.0e-2]}}), tmp_path / "t.yaml")
    sweep = create_sweep(s, tmp_path / "sw", None, pruner={"name": "none"}, budget=None)
    assert not _target_reached(sweep)
    first = claim(sweep)
    sweep.study.tell(first.number, 0.79)
    assert not _target_reached(sweep)
    second = claim(sweep)
    sweep.study.tell(second.number, 0.81)
    assert _target_reached(sweep)
    assert run_worker(sweep, log=lambda *a, **k: None) == {}  # returns at once: the third point never starts
    assert [t.state.name for t in sweep.study.trials] == ["COMPLETE", "COMPLETE", "WAITING"]


def test_a_random_sweep_samples_within_its_bounds_until_its_run_cap(tmp_path):
    from optuna.trial import TrialState

    from toolgraph.sweep.study import claim, create_sweep

    s = parse_spec(spec(method="random", run_cap=3,
                        parameters={"optim.lr": {"distribution": "log_uniform_values", "min": 1.0e-4, "max": 1.0e-2}}),
                   tmp_path / "r.yaml")
    sweep = create_sweep(s, tmp_path / "sw", None, pruner={"name": "none"}, budget=s.run_cap, seed=0)
    assert sweep.study.trials == []  # nothing is queued: each worker samples when it takes a trial
    taken = [claim(sweep) for _ in range(3)]
    assert claim(sweep) is None  # 3 running: the cap is reached
    lrs = [t.params["optim.lr"] for t in taken]
    assert len(set(lrs)) == 3 and all(1.0e-4 <= lr <= 1.0e-2 for lr in lrs)
    sweep.study.tell(taken[0].number, state=TrialState.FAIL)
    assert claim(sweep) is not None  # a failed trial does not count against the cap


def test_a_grid_is_queued_in_w_and_b_order_or_shuffled_by_the_seed(tmp_path):
    from toolgraph.sweep.study import create_sweep

    s = parse_spec(spec(parameters={"optim.lr": {"values": [1.0e-3, 3.0e-3]}, "model.hidden": {"values": [32, 64]}}),
                   tmp_path / "g.yaml")

    def queued(order, seed, name):
        s.name = name
        sweep = create_sweep(s, tmp_path / name, None, pruner={"name": "none"}, budget=None, seed=seed, order=order)
        return [(t.system_attrs["fixed_params"]["optim.lr"], t.system_attrs["fixed_params"]["model.hidden"])
                for t in sweep.study.trials]

    product = [(1.0e-3, 32), (1.0e-3, 64), (3.0e-3, 32), (3.0e-3, 64)]
    assert queued("product", None, "a") == product
    shuffled = queued("shuffled", 0, "b")
    assert sorted(shuffled) == sorted(product) and shuffled != product
    assert queued("shuffled", 0, "c") == shuffled and queued("shuffled", 1, "d") != shuffled


def test_a_metric_the_task_does_not_log_and_a_damaged_journal_are_clear_errors(tmp_path, capsys):
    bad = tmp_path / "metric.yaml"
    bad.write_text(yaml.safe_dump(spec(metric={"name": "val/macro_f2", "goal": "maximize"})))
    assert cli(["sweep", str(bad), "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err
    assert "key 'metric.name'" in err and "val/macro_f2" in err and "val/macro_f1" in err, err
    assert not (tmp_path / "sw").exists()
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    text = '{"op_code": 0, "worker_id": "w"}\n'
    (damaged / "study.journal").write_text(text)
    assert cli(["sweep", "report", str(damaged)]) == 2
    assert "study.journal: not a readable Optuna journal" in capsys.readouterr().err
    assert (damaged / "study.journal").read_text() == text  # nothing lost


def test_two_workers_reaping_the_same_lost_trial_fail_it_once_and_queue_it_once(tmp_path, monkeypatch):
    import socket
    import subprocess

    from optuna.trial import TrialState

    from toolgraph.sweep.study import claim, create_sweep, reap_stale

    sweep = create_sweep(parse_spec(spec(), tmp_path / "r.yaml"), tmp_path / "sw", None, pruner={"name": "none"},
                         budget=None)
    trial = claim(sweep)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a worker pid that no longer runs on this host
    trial_id = sweep.trial_id(trial.number)
    for key, value in (("host", socket.gethostname()), ("pid", gone.pid), ("heartbeat", 0.0)):
        sweep.storage.set_trial_system_attr(trial_id, f"toolgraph:{key}", value)
    seen = sweep.trials(TrialState.RUNNING)  # what both workers read before either acted
    assert reap_stale(sweep, log=lambda m: None) == [trial.number]
    monkeypatch.setattr(sweep, "trials", lambda *states: seen if states == (TrialState.RUNNING,) else [])
    assert reap_stale(sweep, log=lambda m: None) == []  # the second worker loses the race and does nothing
    retries = [t for t in sweep.study.trials if t.user_attrs.get("retry_of") == trial.number]
    assert len(retries) == 1 and sweep.study.trials[trial.number].state == TrialState.FAIL
