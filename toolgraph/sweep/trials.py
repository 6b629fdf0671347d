"""A sweep's trials read back: the best trial, the table, the best config, the parameter importances
(what ``toolgraph sweep report`` writes, toolgraph/sweep/report.py; the page: toolgraph/sweep/page.py).
"""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from toolgraph.config import TrainConfig, load_config, to_yaml
from toolgraph.errors import ToolgraphError
from toolgraph.sweep.spec import point_overrides

__all__ = ["best_config", "best_trial", "param_importances", "study_info", "summary", "trials_table"]


# ---- the study ---------------------------------------------------------------------------------
def study_info(study: optuna.Study) -> dict[str, Any]:
    """The ``toolgraph`` user attr of a study made by ``toolgraph sweep`` (spec, folder, configs, metric...)."""
    info = study.user_attrs.get("toolgraph")
    if not isinstance(info, dict):
        raise ToolgraphError(f"study {study.study_name!r} is not a toolgraph sweep: it has no 'toolgraph' user attr "
                             "(studies made by toolgraph sweep carry their spec, folder and configs there)")
    return info


def _maximize(study: optuna.Study) -> bool:
    return study.direction == StudyDirection.MAXIMIZE


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The COMPLETE trial with the best value by the study's direction (a tie: the lowest number); None
    when no trial completed with a finite value."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if _finite(t.value)]
    sign = -1 if _maximize(study) else 1
    return min(done, key=lambda t: (sign * t.value, t.number), default=None)


def _trials(study: optuna.Study) -> list[FrozenTrial]:
    return sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)


def _param_keys(trials: list[FrozenTrial]) -> list[str]:
    return list(dict.fromkeys(k for t in trials for k in t.params))  # first seen: the order trials suggest them


def _curve(trial: FrozenTrial) -> list[tuple[int, float]]:
    return sorted((s, v) for s, v in trial.intermediate_values.items() if _finite(v))


def _best_value(trial: FrozenTrial, maximize: bool) -> float | None:
    """The trial's best val metric: its ``best_value`` attr, else its value (COMPLETE), else its best validation."""
    best = trial.user_attrs.get("best_value")
    if _finite(best):
        return float(best)
    if trial.state == TrialState.COMPLETE and _finite(trial.value):
        return float(trial.value)
    values = [v for _, v in _curve(trial)]
    return (max if maximize else min)(values) if values else None


def _seconds(trial: FrozenTrial) -> float | None:
    seconds = trial.user_attrs.get("seconds")
    if _finite(seconds):
        return float(seconds)
    return trial.duration.total_seconds() if trial.duration is not None else None


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _dash(value: Any, spec: str = "") -> str:
    return "-" if value is None or value == "" else format(value, spec)


def _attempt(trial: FrozenTrial) -> str:
    attempt, first = trial.user_attrs.get("attempt"), trial.user_attrs.get("retry_of")
    text = _dash(attempt)
    return f"{text} (retry of #{first})" if first is not None else text


def _point(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in params.items())


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def summary(study: optuna.Study) -> str:
    """One line: the trials per state, their total seconds, the best trial and its params."""
    trials = _trials(study)
    info = study_info(study)
    counts = Counter(t.state.name.lower() for t in trials)
    total = sum(s for s in map(_seconds, trials) if s is not None)
    states = ", ".join(f"{n} {state}" for state, n in counts.most_common())
    best = best_trial(study)
    found = (f"best #{best.number}: {info.get('metric', 'value')} {best.value:.4f} ({_point(best.params)})"
             if best is not None else "no trial completed: no best config")
    return f"{len(trials)} trials ({states or 'none run'}), {total:.0f} s of trials; {found}"


# ---- the table --------------------------------------------------------------------------------
def _rows(study: optuna.Study) -> tuple[list[str], list[list[str]], list[FrozenTrial]]:
    trials = _trials(study)
    keys = _param_keys(trials)
    metric = study_info(study).get("metric") or "value"
    best = best_trial(study)
    maximize = _maximize(study)
    head = ["#", "state", *keys, metric, "epoch", "validations", "seconds", "attempt", "best"]
    rows = []
    for t in trials:
        a = t.user_attrs
        seconds = _seconds(t)
        rows.append([str(t.number), t.state.name.lower(), *(_fmt(t.params[k]) if k in t.params else "-" for k in keys),
                     _dash(_best_value(t, maximize), ".4f"), _dash(a.get("best_epoch")), _dash(a.get("validations")),
                     _dash(round(seconds) if seconds is not None else None), _attempt(t),
                     "best" if best is not None and t.number == best.number else ""])
    return head, rows, trials


def trials_table(study: optuna.Study) -> str:
    """A markdown table, one row per trial in number order (params, best val metric, best epoch,
    validations, seconds, attempt), ``best`` on the best trial; the failed trials' errors under it,
    and the :func:`summary` line last."""
    head, rows, trials = _rows(study)

    def cell(text: str) -> str:
        return _one_line(text).replace("|", "\\|")

    cells = [[cell(c) for c in head]] + [[cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for t in trials:
        error = t.user_attrs.get("error")
        if t.state == TrialState.FAIL or error:
            log = t.user_attrs.get("log")
            lines.append(f"\n#{t.number} {t.user_attrs.get('exit') or t.state.name.lower()}: "
                         f"{_one_line(error or 'no error recorded')[:300]}" + (f" (log: {log})" if log else ""))
    return "\n".join(lines) + f"\n\nstudy {study.study_name}: {summary(study)}\n"


# ---- the best config ----------------------------------------------------------------------------
def best_config(study: optuna.Study) -> TrainConfig:
    """The best trial's training config (the study's configs, its overrides, the trial's params), with
    ``out_dir`` ``<sweep folder>/best``; ``test`` and ``export`` as the configs say."""
    info = study_info(study)
    best = best_trial(study)
    if best is None:
        counts = Counter(t.state.name.lower() for t in _trials(study))
        ran = ", ".join(f"{n} {s}" for s, n in counts.most_common()) or "no trial has run"
        raise ToolgraphError(f"study {study.study_name!r}: no trial completed ({ran}), so there is no best config; "
                             "run more trials (toolgraph sweep) or look at the failed ones' logs")
    configs = info.get("configs") or []
    if not configs:
        raise ToolgraphError(f"study {study.study_name!r}: its 'toolgraph' user attr names no configs")
    cfg = load_config(TrainConfig, configs, [*(info.get("overrides") or []), *point_overrides(best.params)])
    cfg.out_dir = str(Path(info["folder"]) / "best")
    return cfg


def _best_yaml(study: optuna.Study, cfg: TrainConfig, path: Path) -> str:
    info, best = study_info(study), best_trial(study)
    head = [f"Best trial of study {study.study_name} (toolgraph sweep report; folder {info.get('folder')}):",
            f"trial #{best.number}, {info.get('metric', 'value')} = {best.value:.4f} ({study.direction.name.lower()}), "
            f"of {len(_trials(study))} trials",
            f"params: {_point(best.params)}",
            "Retrain it for real (test and export as the configs say):"]
    return ("".join(f"# {_one_line(line)}\n" for line in head) + f"#   python train.py --config {_one_line(path)}\n"
            + to_yaml(cfg))


# ---- importances -----------------------------------------------------------------------------
def param_importances(study: optuna.Study) -> tuple[dict[str, float], str]:
    """(param -> importance, summing to 1; a note): PED-ANOVA over the completed trials (module
    docstring). Empty, with the reason in the note, when there are not enough trials."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if _finite(t.value)]
    if len(done) < 2:
        return {}, f"not enough trials: {len(done)} completed (importances need 2 or more)"
    keys = _param_keys(done)
    varied = [k for k in keys if len({json.dumps(t.params.get(k), default=str) for t in done}) > 1]
    if not varied:
        return {}, "not enough trials: no param takes two values among the completed trials"
    fixed = [k for k in keys if k not in varied]
    notes = [f"constant in the completed trials: {', '.join(fixed)}"] if fixed else []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            found = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), params=varied)
        except (ValueError, RuntimeError, TypeError) as e:  # e.g. params whose distributions changed mid-study
            return {}, f"importances not computed: {type(e).__name__}: {e}"
    notes += [f"Optuna: {_one_line(w.message)}" for w in caught]
    return dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))), "; ".join(dict.fromkeys(notes))


# ---- charts -------------------------------------------------------------------------------------
