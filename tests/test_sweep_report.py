"""toolgraph sweep report: the trials table, best.yaml and the HTML page of a study (built in memory here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest
from browser import rendered_dom
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from toolgraph.config import TrainConfig, load_config
from toolgraph.errors import ConfigError, ToolgraphError
from toolgraph.sweep.report import best_config, best_trial, param_importances, render_html, trials_table, write_report

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "discriminator.yaml"
DISTS = {"optim.lr": FloatDistribution(1e-4, 1e-1, log=True), "model.hidden": CategoricalDistribution([64, 128, 256])}
COMPLETE, PRUNED, FAIL = TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL

optuna.logging.set_verbosity(optuna.logging.WARNING)


def attrs(seconds: float, validations: int, best_epoch: int, **more) -> dict:
    return {"seconds": seconds, "validations": validations, "best_epoch": best_epoch, "attempt": 1,
            "exit": "complete", "out_dir": "/x/trial", **more}


# (state, lr, hidden, value, validation curve, user attrs)
TRIALS = [
    (COMPLETE, 1e-3, 64, 0.70, [0.5, 0.7], attrs(12.6, 2, 1)),
    (COMPLETE, 1e-2, 256, 0.80, [0.6, 0.8, 0.75], attrs(20.6, 3, 1)),
    (PRUNED, 5e-2, 256, 0.40, [0.4], attrs(3.0, 1, 0, exit="pruned")),
    (FAIL, None, None, None, [], {}),  # a trial that died before it recorded anything
    (COMPLETE, 1e-4, 128, 0.80, [0.8], attrs(9.0, 1, 0, attempt=2, retry_of=3)),  # ties #1: #1 is best
    (COMPLETE, 2e-2, 64, 0.30, [0.2, 0.3], attrs(7.5, 2, 1)),  # the best when minimising
]


def make_study(folder: Path, direction: str = "maximize", trials=TRIALS, configs=(RECIPE,)) -> optuna.Study:
    study = optuna.create_study(direction=direction, study_name="disc-sweep")
    study.set_user_attr("toolgraph", {
        "spec": {"method": "random", "metric": {"name": "val/macro_f1", "goal": direction}}, "spec_path": "s.yaml",
        "folder": str(folder), "configs": [str(c) for c in configs], "overrides": ["trainer.max_epochs=2"],
        "metric": "val/macro_f1", "goal": direction, "method": "random", "pruner": {"name": "median"}, "budget": 6})
    for state, lr, hidden, value, curve, user_attrs in trials:
        params = {"optim.lr": lr, "model.hidden": hidden} if lr is not None else {}
        study.add_trial(create_trial(params=params, distributions={k: DISTS[k] for k in params}, value=value,
                                     intermediate_values=dict(enumerate(curve)), state=state, user_attrs=user_attrs))
    return study


def rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| #")]


def test_the_table_has_a_row_per_trial_and_marks_the_best_the_lowest_number_winning_a_tie(tmp_path):
    table = trials_table(make_study(tmp_path))
    head = table.splitlines()[0]
    assert re.fullmatch(r"\| # +\| state +\| optim\.lr +\| model\.hidden \| val/macro_f1 \| epoch \| validations \| "
                        r"seconds \| attempt +\| best \|", head), head
    got = rows(table)
    assert [r[0] for r in got] == ["0", "1", "2", "3", "4", "5"]
    assert got[1] == ["1", "complete", "0.01", "256", "0.8000", "1", "3", "21", "1", "best"]
    assert [r[-1] for r in got] == ["", "best", "", "", "", ""]  # #4 ties #1 at 0.8: the lower number wins
    assert got[2][:5] == ["2", "pruned", "0.05", "256", "0.4000"]
    assert got[3] == ["3", "fail", "-", "-", "-", "-", "-", "0", "-", ""]  # no params, no attrs (seconds: its duration)
    assert got[4][8] == "2 (retry of #3)"
    assert "#3 fail: no error recorded" in table
    assert table.rstrip().splitlines()[-1] == ("study disc-sweep: 6 trials (4 complete, 1 pruned, 1 fail), 53 s of "
                                               "trials; best #1: val/macro_f1 0.8000 (optim.lr=0.01, model.hidden=256)")


def test_a_maximise_and_a_minimise_study_pick_different_bests(tmp_path):
    assert best_trial(make_study(tmp_path, "maximize")).number == 1
    low = make_study(tmp_path, "minimize")
    assert best_trial(low).number == 5  # 0.30; the pruned 0.40 never counts, nor its lower curve
    cfg = best_config(low)
    assert (cfg.optim.lr, cfg.model.hidden) == (2e-2, 64)
    assert "best #5: val/macro_f1 0.3000" in trials_table(low)


def test_best_yaml_loads_back_with_the_best_params_and_out_dir(tmp_path):
    folder = tmp_path / "sweep"
    written = write_report(make_study(folder))
    assert set(written) == {"trials.md", "trials.json", "best.yaml", "report.html"}
    assert all(p.parent == folder and p.is_file() for p in written.values())
    text = written["best.yaml"].read_text()
    assert text.startswith("# Best trial of study disc-sweep")
    assert f"#   python train.py --config {folder / 'best.yaml'}\n" in text
    assert "trial #1, val/macro_f1 = 0.8000 (maximize), of 6 trials" in text
    cfg = load_config(TrainConfig, [written["best.yaml"]], [])
    assert (cfg.optim.lr, cfg.model.hidden) == (1e-2, 256)
    assert cfg.out_dir == str(folder / "best")
    assert cfg.trainer.max_epochs == 2  # the spec's command overrides
    recipe = load_config(TrainConfig, [RECIPE], [])
    assert (cfg.test, cfg.export, cfg.model.name) == (recipe.test, recipe.export, recipe.model.name)
    assert (recipe.optim.lr, recipe.model.hidden) == (3e-3, 128)  # the recipe's own: the trial's replaced them
    saved = json.loads(written["trials.json"].read_text())
    assert [t["number"] for t in saved] == list(range(6)) and [t["best"] for t in saved].count(True) == 1
    assert saved[1]["params"] == {"optim.lr": 1e-2, "model.hidden": 256}
    assert saved[1]["intermediate_values"] == {"0": 0.6, "1": 0.8, "2": 0.75}
    assert saved[1]["user_attrs"]["seconds"] == 20.6 and saved[1]["state"] == "complete"
    assert saved[3] == {**saved[3], "state": "fail", "value": None, "params": {}, "user_attrs": {}}
    out = tmp_path / "elsewhere"
    assert set(write_report(make_study(folder), out).values()) == {out / n for n in written}


def test_no_completed_trial_is_a_clear_error_and_no_best_yaml(tmp_path):
    study = make_study(tmp_path, trials=[t for t in TRIALS if t[0] != COMPLETE])
    with pytest.raises(ToolgraphError, match=r"study 'disc-sweep': no trial completed \((1 pruned, 1 fail|1 fail, "
                                             r"1 pruned)\), so there is no best config"):
        best_config(study)
    written = write_report(study)
    assert set(written) == {"trials.md", "trials.json", "report.html"} and not (tmp_path / "best.yaml").exists()
    assert "no trial completed: no best config" in written["trials.md"].read_text()
    page = written["report.html"].read_text()
    assert "No trial completed: best.yaml is not written." in page
    assert "not enough trials: 0 completed" in page
    assert best_trial(make_study(tmp_path, trials=[])) is None
    assert "0 trials (none run)" in trials_table(make_study(tmp_path, trials=[]))


def test_a_best_config_that_does_not_load_names_the_file_after_writing_the_rest(tmp_path):
    gone = tmp_path / "moved.yaml"
    with pytest.raises(ConfigError, match=r"best.yaml not written: the best config does not load: .*moved\.yaml"):
        write_report(make_study(tmp_path, configs=[gone]))
    assert (tmp_path / "trials.md").is_file() and (tmp_path / "report.html").is_file()
    assert not (tmp_path / "best.yaml").exists()
    with pytest.raises(ToolgraphError, match="not a toolgraph sweep"):
        trials_table(optuna.create_study())


def test_the_page_has_the_three_plots_and_escapes_every_value(tmp_path):
    page = render_html(make_study(tmp_path))
    assert page.count("<svg id=") == 3
    assert re.search(r'<svg id="history".*?</svg>', page)
    assert len(re.findall(r'<circle class="complete"', page)) == 4 and len(re.findall(r'class="pruned"', page)) == 1
    assert '<text class="failed" data-trial="3"' in page
    assert '<g class="axis" data-axis="optim.lr" data-scale="log">' in page  # 1e-4 .. 5e-2: three decades
    assert '<g class="axis" data-axis="model.hidden" data-scale="linear">' in page
    assert '<g class="axis" data-axis="val/macro_f1" data-scale="linear">' in page
    assert len(re.findall(r'<polyline class="trial', page)) == 5 and 'class="trial best" data-trial="1"' in page
    assert re.findall(r'<rect class="bar" data-param="([^"]+)"', page) in (["optim.lr", "model.hidden"],
                                                                          ["model.hidden", "optim.lr"])
    assert len(re.findall(r'<svg class="spark" data-points="(\d)"', page)) == 5  # the failed trial has no curve
    assert '<tr data-trial="1" data-state="complete" class="best">' in page
    assert "<title>disc-sweep</title>" in page
    found, _ = param_importances(make_study(tmp_path))
    assert set(found) == set(DISTS) and sum(found.values()) == pytest.approx(1.0)

    evil = "<script>alert(1)</script>"
    study = optuna.create_study(direction="maximize", study_name="<b>study</b>")
    study.set_user_attr("toolgraph", {"folder": str(tmp_path), "configs": [str(RECIPE)], "metric": "val/<i>",
                                      "method": "grid", "pruner": {"name": "none"}})
    tag = CategoricalDistribution(["plain", evil])
    for i, value in enumerate([evil, "plain", evil]):
        study.add_trial(create_trial(params={"model.tag": value}, distributions={"model.tag": tag}, value=i / 2,
                                     intermediate_values={0: i / 2}, user_attrs={"error": f"<img src=x> {i}"}))
    page = render_html(study)
    assert evil not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<script>") == 1 and "<b>study</b>" not in page and "<img" not in page
    assert '<g class="axis" data-axis="model.tag" data-scale="categorical">' in page


def test_importances_need_two_completed_trials_and_a_param_that_varies(tmp_path):
    one = make_study(tmp_path, trials=TRIALS[:1])
    assert param_importances(one) == ({}, "not enough trials: 1 completed (importances need 2 or more)")
    same = make_study(tmp_path, trials=[TRIALS[0], TRIALS[0]])
    assert param_importances(same) == ({}, "not enough trials: no param takes two values among the completed trials")
    assert "not enough trials: no param takes two values" in render_html(same)
    lr_only = make_study(tmp_path, trials=[TRIALS[0], (COMPLETE, 0.05, 64, 0.9, [0.9], {})])
    found, note = param_importances(lr_only)
    assert found == {"optim.lr": pytest.approx(1.0)} and "constant in the completed trials: model.hidden" in note


def test_the_page_renders_in_headless_chromium_without_errors(tmp_path):
    page = write_report(make_study(tmp_path / "sweep"))["report.html"]
    dom = rendered_dom(page, tmp_path, window="1200,1600")
    for chart in ("history", "parallel", "importances"):
        assert f'<svg id="{chart}"' in dom
