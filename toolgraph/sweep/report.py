"""``toolgraph sweep report STUDY``: what a sweep found, as a table, a config and a page.

    from toolgraph.sweep.report import best_config, trials_table, write_report

    print(trials_table(study))   # one row per trial: state, params, best val metric, epoch, seconds, attempt
    cfg = best_config(study)     # the best trial's TrainConfig, out_dir <sweep folder>/best
    write_report(study)          # trials.md, trials.json, best.yaml, report.html in the sweep folder

**The best trial** is the COMPLETE trial with the best value (``study.direction``); a tie goes to the
lowest trial number. Pruned trials are shown but never best: they stopped before their budget.

**best.yaml** is ``load_config(TrainConfig, configs, overrides + point_overrides(best.params))`` of the
study's ``toolgraph`` user attrs, written out whole (``to_yaml``) with ``out_dir: <folder>/best``;
``test`` and ``export`` are what the configs say: ``python train.py --config best.yaml`` retrains the
point for real. No completed trial: no best.yaml (the table and the page say so).

**report.html** is one self-contained page (inline SVG drawn here, no script from anywhere): the
optimisation history (each trial's value by number, pruned ones hollow, the best-so-far line), parallel
coordinates (an axis per param, categorical for non-numbers and log-scaled where the values span two
decades or more, and one for the metric; a line per finished trial coloured by its value), parameter
importances, and the trials table with each trial's learning curve (its validations) as a sparkline.

**Importances** are Optuna's PED-ANOVA (``optuna.importance.PedAnovaImportanceEvaluator``, its default):
it needs only numpy (fANOVA and mean decrease impurity need scikit-learn, which toolgraph does not
depend on), reads the study's direction, takes categorical, integer and log-scaled float params, and
gives a usable answer from a handful of trials. It measures how far each param's distribution among the
top 10 % of completed trials is from its distribution among all of them (Pearson divergence of Parzen
estimates), normalised to sum to 1. With fewer than 2 completed trials, or no param taking two values
among them, the page says "not enough trials" instead.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna

from toolgraph.errors import ConfigError
from toolgraph.files import write_text_atomic
from toolgraph.sweep.page import render_html
from toolgraph.sweep.trials import (
    _best_yaml,
    _trials,
    best_config,
    best_trial,
    param_importances,
    study_info,
    summary,
    trials_table,
)

__all__ = ["best_config", "best_trial", "param_importances", "render_html", "study_info", "summary", "trials_table",
           "write_report"]


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _trials_json(study: optuna.Study) -> str:
    best = best_trial(study)
    rows = [{"number": t.number, "state": t.state.name.lower(), "best": best is not None and t.number == best.number,
             "params": t.params, "value": t.value, "intermediate_values": dict(sorted(t.intermediate_values.items())),
             "user_attrs": t.user_attrs, "datetime_start": t.datetime_start, "datetime_complete": t.datetime_complete}
            for t in _trials(study)]
    return json.dumps(_json_safe(rows), indent=1, allow_nan=False, default=str) + "\n"


def write_report(study: optuna.Study, out: Path | None = None) -> dict[str, Path]:
    """Write ``trials.md``, ``trials.json``, ``best.yaml`` and ``report.html`` into ``out`` (default: the
    sweep folder), each atomically; returns file name -> path of what was written. No completed trial:
    no best.yaml (the page and the table say so). A best config that does not load (a config file
    moved since the sweep) is a ConfigError, raised after the other three files are written."""
    info = study_info(study)
    out = Path(out if out is not None else info["folder"])
    out.mkdir(parents=True, exist_ok=True)
    best_path = out / "best.yaml"
    best_text, note, error = None, "", None
    if best_trial(study) is None:
        note = "No trial completed: best.yaml is not written."
    else:
        try:
            best_text = _best_yaml(study, best_config(study), best_path)
        except ConfigError as e:
            error = e
            note = f"best.yaml not written: the best config does not load: {e}"
    written = {"trials.md": write_text_atomic(out / "trials.md", trials_table(study)),
               "trials.json": write_text_atomic(out / "trials.json", _trials_json(study)),
               "report.html": write_text_atomic(out / "report.html", render_html(study, best_text, note))}
    if error is not None:
        raise ConfigError(f"{note} (trials.md, trials.json and report.html are in {out})") from None
    if best_text is not None:
        written["best.yaml"] = write_text_atomic(best_path, best_text)
    return written
