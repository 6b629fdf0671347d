"""A W&B sweep spec (the files in ``configs/sweeps/``) read for Optuna.

The same file runs with ``wandb sweep`` and with ``toolgraph sweep``: the keys W&B defines are read here;
a key W&B does not define, or a value Optuna cannot run, is a ConfigError naming the file and the key.

- ``method``: ``grid`` (every point of the product of the ``values``, each run once), ``random``
  (Optuna's RandomSampler) or ``bayes`` (TPE; constant liar when several workers run at once).
- ``metric``: ``name`` (a metric the task logs at validation, e.g. ``val/macro_f1``), ``goal``
  (``maximize`` | ``minimize``; W&B's default is ``minimize``), optional ``target`` (the sweep stops
  once a trial reaches it).
- ``parameters``: dotted config keys, each with ``values`` (a categorical), ``value`` (a constant), or
  ``distribution`` with ``min``/``max``: ``int_uniform``, ``uniform``, ``log_uniform_values``,
  ``log_uniform`` (min/max are natural logs, as in W&B), ``q_uniform`` (``q`` the step). W&B's nested
  form (``optim: {parameters: {lr: ...}}``) is flattened to ``optim.lr``.
- ``command``: the ``--config`` files and literal ``key=value`` items (W&B's ``${...}`` macros, the
  interpreter and ``train.py`` are skipped). A trial is ``train(cfg)`` of those files, those items and
  the trial's values.
- ``run_cap``: the number of trials of a random / bayes sweep (``--trials`` overrides it).
- ``early_terminate``: ``{type: hyperband, min_iter, max_iter, eta}`` maps to Optuna's HyperbandPruner
  (``--pruner`` overrides it).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from toolgraph.errors import ConfigError

__all__ = ["DISTRIBUTIONS", "Parameter", "SweepSpec", "format_value", "point_overrides", "read_spec", "parse_spec"]

TOP_KEYS = ("program", "method", "metric", "parameters", "command", "name", "description", "project", "entity",
            "run_cap", "early_terminate")
METHODS = ("grid", "random", "bayes")
DISTRIBUTIONS = ("constant", "categorical", "int_uniform", "uniform", "log_uniform_values", "log_uniform", "q_uniform")
W_AND_B_ONLY = ("q_log_uniform_values", "q_log_uniform", "inv_log_uniform", "inv_log_uniform_values", "normal",
                "q_normal", "log_normal", "q_log_normal", "beta", "q_beta")
MACROS = ("${env}", "${interpreter}", "${program}", "${args}", "${args_no_hyphens}", "${args_no_boolean_flags}",
          "${args_json}", "${args_json_file}")
PROGRAMS = ("train.py", "toolgraph/cli.py")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


@dataclass
class Parameter:
    """One swept key: its distribution and the bounds or choices that define it."""

    key: str
    distribution: str
    values: list[Any] = field(default_factory=list)  # categorical choices / the constant
    low: float | int | None = None
    high: float | int | None = None
    step: float | None = None
    log: bool = False

    def grid_values(self) -> list[Any]:
        if self.distribution == "int_uniform":
            return list(range(int(self.low), int(self.high) + 1))
        return list(self.values)

    def optuna(self):
        """The Optuna distribution of this parameter."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.distribution in ("constant", "categorical"):
            return CategoricalDistribution([_choice(v) for v in self.values])
        if self.distribution == "int_uniform":
            return IntDistribution(int(self.low), int(self.high))
        return FloatDistribution(float(self.low), float(self.high), log=self.log, step=self.step)


@dataclass
class SweepSpec:
    """A parsed sweep spec; ``raw`` is the file's mapping as written (kept in the study)."""

    path: Path
    name: str
    method: str
    metric: str
    goal: str
    parameters: dict[str, Parameter]
    configs: list[str]
    overrides: list[str]
    run_cap: int | None = None
    target: float | None = None
    early_terminate: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def grid(self) -> list[dict[str, Any]]:
        """Every grid point (the product of each key's values, the first key outermost)."""
        import itertools

        keys = list(self.parameters)
        choices = [[_choice(v) for v in self.parameters[k].grid_values()] for k in keys]
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*choices)]

    def distributions(self) -> dict[str, Any]:
        return {k: p.optuna() for k, p in self.parameters.items()}


def read_spec(path: str | Path) -> SweepSpec:
    """The spec in ``path`` (YAML), checked; a ConfigError names the file and the key."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such sweep spec") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    return parse_spec(raw, path)


def parse_spec(raw: Any, path: str | Path) -> SweepSpec:
    path = Path(path)

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{path}: key '{key}': {why}")

    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a sweep spec is a mapping (method, metric, parameters, command), got "
                          f"{type(raw).__name__}")
    for key in raw:
        if key not in TOP_KEYS:
            raise bad(key, f"not a W&B sweep key (known: {', '.join(TOP_KEYS)})")
    method = raw.get("method")
    if method not in METHODS:
        raise bad("method", f"expects one of {', '.join(METHODS)}, got {method!r}")
    program = raw.get("program", "train.py")
    if Path(str(program)).as_posix() not in PROGRAMS:
        raise bad("program", f"only train.py trials run here (a trial is train(cfg)), got {program!r}")
    metric = raw.get("metric")
    if not isinstance(metric, dict) or not isinstance(metric.get("name"), str):
        raise bad("metric", "expects a mapping with a name, e.g. {name: val/recall@5, goal: maximize}")
    for key in metric:
        if key not in ("name", "goal", "target"):
            raise bad(f"metric.{key}", "not a W&B metric key (known: name, goal, target)")
    goal = metric.get("goal", "minimize")
    if goal not in ("maximize", "minimize"):
        raise bad("metric.goal", f"expects maximize or minimize, got {goal!r}")
    target = metric.get("target")
    if target is not None and not isinstance(target, (int, float)):
        raise bad("metric.target", f"expects a number, got {target!r}")
    params = raw.get("parameters")
    if not isinstance(params, dict) or not params:
        raise bad("parameters", "expects a mapping of config keys to {values: [...]} or {distribution: ...}")
    parameters: dict[str, Parameter] = {}
    _flatten(params, "", parameters, bad)
    if method == "grid":
        for p in parameters.values():
            if p.distribution not in ("constant", "categorical", "int_uniform"):
                raise bad(f"parameters.{p.key}", f"method grid needs values (or int_uniform), got distribution "
                                                 f"{p.distribution}")
    run_cap = raw.get("run_cap")
    if run_cap is not None and (not isinstance(run_cap, int) or isinstance(run_cap, bool) or run_cap < 1):
        raise bad("run_cap", f"expects a whole number >= 1, got {run_cap!r}")
    configs, overrides = _command(raw.get("command"), path, bad)
    early = raw.get("early_terminate")
    if early is not None:
        if not isinstance(early, dict) or early.get("type") != "hyperband":
            raise bad("early_terminate", f"expects {{type: hyperband, min_iter, eta}}, got {early!r}")
        for key in early:
            if key not in ("type", "min_iter", "max_iter", "eta", "s", "strict"):
                raise bad(f"early_terminate.{key}", "not a W&B hyperband key (min_iter, max_iter, eta, s, strict)")
    name = raw.get("name") or path.stem
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(name)):
        raise bad("name", f"a study name of letters, digits, '_', '-', '.', got {name!r}")
    return SweepSpec(path=path, name=str(name), method=method, metric=metric["name"], goal=goal,
                     parameters=parameters, configs=configs, overrides=overrides, run_cap=run_cap,
                     target=float(target) if target is not None else None, early_terminate=early, raw=raw)


def _flatten(params: dict, prefix: str, out: dict[str, Parameter], bad) -> None:
    for name, body in params.items():
        key = f"{prefix}{name}"
        where = f"parameters.{key}"
        if not _KEY.match(str(key)):
            raise bad(where, "not a dotted config key such as optim.lr")
        if not isinstance(body, dict):
            raise bad(where, f"expects a mapping such as {{values: [...]}}, got {body!r}")
        if "parameters" in body:  # W&B's nested form
            if set(body) != {"parameters"} or not isinstance(body["parameters"], dict):
                raise bad(where, "a nested block holds only parameters: {...}")
            _flatten(body["parameters"], f"{key}.", out, bad)
            continue
        out[key] = _parameter(key, body, lambda k, why, w=where: bad(f"{w}.{k}" if k else w, why))


def _parameter(key: str, body: dict, bad) -> Parameter:
    for k in body:
        if k not in ("values", "value", "distribution", "min", "max", "q", "probabilities", "mu", "sigma", "a", "b"):
            raise bad(k, "not a W&B parameter key (values, value, distribution, min, max, q)")
    if "probabilities" in body:
        raise bad("probabilities", "weighted choices have no Optuna counterpart here; drop them (wandb sweep "
                                   "still takes them)")
    dist = body.get("distribution")
    if dist is None:  # W&B infers it
        if "values" in body:
            dist = "categorical"
        elif "value" in body:
            dist = "constant"
        elif isinstance(body.get("min"), int) and isinstance(body.get("max"), int):
            dist = "int_uniform"
        elif "min" in body and "max" in body:
            dist = "uniform"
        else:
            raise bad("", "expects values, value, or min and max")
    if dist in W_AND_B_ONLY:
        raise bad("distribution", f"{dist} is a W&B distribution the Optuna runner does not take (supported: "
                                  f"{', '.join(DISTRIBUTIONS)}); wandb sweep still runs it")
    if dist not in DISTRIBUTIONS:
        raise bad("distribution", f"unknown distribution {dist!r} (supported: {', '.join(DISTRIBUTIONS)})")
    if dist == "categorical":
        values = body.get("values")
        if not isinstance(values, list) or not values:
            raise bad("values", f"expects a non-empty list, got {values!r}")
        if len({json.dumps(v, sort_keys=True, default=str) for v in values}) != len(values):
            raise bad("values", f"lists a value twice: {values!r}")
        return Parameter(key, dist, values=list(values))
    if dist == "constant":
        if "value" not in body:
            raise bad("value", "a constant needs value: ...")
        return Parameter(key, dist, values=[body["value"]])
    low, high = body.get("min"), body.get("max")
    for k, v in (("min", low), ("max", high)):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise bad(k, f"expects a number, got {v!r}")
    if not low < high:
        raise bad("max", f"must be > min ({low}), got {high}")
    if dist == "int_uniform":
        if not (isinstance(low, int) and isinstance(high, int)):
            raise bad("min", f"int_uniform needs whole numbers, got {low!r}, {high!r}")
        return Parameter(key, dist, low=low, high=high)
    if dist == "log_uniform_values":
        if low <= 0:
            raise bad("min", f"log_uniform_values needs min > 0, got {low}")
        return Parameter(key, dist, low=float(low), high=float(high), log=True)
    if dist == "log_uniform":  # W&B: min/max are natural logs of the bounds
        return Parameter(key, dist, low=math.exp(low), high=math.exp(high), log=True)
    if dist == "q_uniform":
        q = body.get("q", 1.0)
        if not isinstance(q, (int, float)) or q <= 0:
            raise bad("q", f"expects a step > 0, got {q!r}")
        return Parameter(key, dist, low=float(low), high=float(high), step=float(q))
    return Parameter(key, dist, low=float(low), high=float(high))


def _command(command: Any, path: Path, bad) -> tuple[list[str], list[str]]:
    if command is None:
        raise bad("command", "needs a command block with --config FILE (e.g. [${env}, python, ${program}, --config, "
                             "configs/discriminator.yaml, ${args_no_hyphens}])")
    if not isinstance(command, list):
        raise bad("command", f"expects a list, got {command!r}")
    configs: list[str] = []
    overrides: list[str] = []
    items = [str(c) for c in command]
    i = 0
    while i < len(items):
        item = items[i]
        if item in MACROS or item in ("python", "python3") or Path(item).as_posix() in PROGRAMS:
            pass
        elif item == "--config":
            if i + 1 >= len(items):
                raise bad(f"command[{i}]", "--config needs a file after it")
            configs.append(items[i + 1])
            i += 1
        elif item.startswith("--config="):
            configs.append(item.split("=", 1)[1])
        elif "=" in item and _KEY.match(item.lstrip("-").split("=", 1)[0]):
            overrides.append(item.lstrip("-"))
        else:
            raise bad(f"command[{i}]", f"{item!r} is neither a W&B macro, --config FILE, nor key=value")
        i += 1
    if not configs:
        raise bad("command", "names no --config file: a trial needs the recipe it varies")
    return configs, overrides


def _choice(value: Any) -> Any:
    """An Optuna categorical choice: a scalar as is, a list or mapping as its YAML flow text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return yaml.safe_dump(value, default_flow_style=True).strip()


def format_value(value: Any) -> str:
    """A value as the right-hand side of a ``key=value`` override that reads back as the same value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        text = repr(value)  # 1e-05 -> 1.0e-05: YAML 1.1 (PyYAML) reads an exponent without a dot as a string
        mantissa, e, exponent = text.partition("e")
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    if isinstance(value, str):
        try:
            same = yaml.safe_load(value) == value
        except yaml.YAMLError:
            same = False
        if same or value.startswith(("[", "{")):  # a YAML flow list / mapping stands for itself
            return value
        return json.dumps(value)
    return str(value)


def point_overrides(params: dict[str, Any]) -> list[str]:
    """A trial's values as ``key=value`` overrides for ``load_config``."""
    return [f"{k}={format_value(v)}" for k, v in params.items()]
