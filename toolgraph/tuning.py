"""Settings chosen on val: a grid of config overrides, each point evaluated on the val split, one rule
picking the winner, and the winner tested once.

    from toolgraph.config import EvaluateConfig, load_config
    from toolgraph.tuning import choose_on_val

    cfg = load_config(EvaluateConfig, ["configs/eval/pipeline_toollens.yaml"], ["retriever.first_stage=...", ...])
    tuned = choose_on_val(cfg, {"retriever.first_stage_weight": [0, 0.5, 1, 2, 4]}, ["recall@5", "recall@3"])
    tuned.winner          # {"retriever.first_stage_weight": 2.0}
    tuned.table           # every point's val metrics, in grid order
    tuned.report.metrics  # the winner on cfg.data.split (test), evaluated once

``toolgraph tune --config ... --grid retriever.first_stage_weight=0,0.5,1,2,4 --metric recall@5,recall@3``
is the same from the command line (docs/usage-and-rerank.md).

**The rule** (``pick``, the only one): the point with the highest value of the first metric wins, values
compared rounded to ``decimals`` (4) places so that float noise never decides; a tie goes to the next
metric named, and a tie on every metric to the point listed first in the grid. A grid given as a mapping
of keys to values is walked like ``itertools.product`` (the first key outermost), so with each key's
values in ascending order a tie goes to the smallest values.

**Grid keys** are dotted keys of the evaluation config under ``retriever.`` or ``eval.``
(``retriever.first_stage_weight``, ``retriever.members.1.neighbors``: a number is a list index;
``eval.step_merge``). ``data.*`` cannot be tuned: every point is scored on the same val queries. A key
the config does not have is a ConfigError naming it, before anything is evaluated.

**Cheap points.** Every point is scored by ``toolgraph.evaluation.evaluate``, with the same retriever
object where that is possible: a composed retriever (pipeline, fusion) is ``reconfigure``d to the next
point, keeping each member the point leaves unchanged, and while the grid runs it ``remember``s what its
members computed (each member fitted and indexed once, its outputs per batch of queries kept;
toolgraph/retrieval/pipeline.py), so a grid of fusion weights over a trained reranker scores val once and
re-sorts per weight. Any other retriever is built anew for each point.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from toolgraph import data
from toolgraph.config import EvaluateConfig, load_config, to_dict
from toolgraph.data.schema import ToolDataset
from toolgraph.errors import ConfigError
from toolgraph.evaluation import Report, evaluate, write_run
from toolgraph.registry import RETRIEVERS
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.loading import load, resolve_retriever
from toolgraph.retrieval.pipeline import ComposedRetriever
from toolgraph.runs import check_output_folder

__all__ = ["Point", "Tuning", "choose_on_val", "evaluate_grid", "grid_points", "parse_grid", "pick", "point_config"]

TUNABLE = ("retriever", "eval")  # the sections a grid key may change
RULE = ("highest value of the first metric (rounded to {decimals} places); a tie goes to the next metric "
        "named, a tie on every metric to the point listed first in the grid")


@dataclass
class Point:
    """One grid point: its overrides (dotted key -> value) and its metrics on the split it was scored on."""

    overrides: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)

    def as_dict(self, decimals: int | None = 4) -> dict[str, Any]:
        return {"overrides": dict(self.overrides),
                "metrics": {k: round(v, decimals) if decimals is not None else v for k, v in self.metrics.items()}}


@dataclass
class Tuning:
    """What ``choose_on_val`` found: the winner's overrides and config, every point's val metrics, and the
    winner's report on the test split (None with ``test=False``)."""

    metric: list[str]
    winner: dict[str, Any]
    table: list[Point]
    config: EvaluateConfig  # the base config with the winner's overrides
    retriever: Retriever  # configured as the winner
    report: Report | None
    val_split: str
    seconds: float  # the grid on val (the test evaluation not included)
    decimals: int = 4

    def as_dict(self) -> dict[str, Any]:
        """The record written to results.json (``tuning``): metric, rule, val split, winner, table."""
        return {"metric": self.metric, "rule": RULE.format(decimals=self.decimals), "val_split": self.val_split,
                "winner": self.winner, "table": [p.as_dict(self.decimals) for p in self.table],
                "seconds": round(self.seconds, 1)}


# ---- the grid --------------------------------------------------------------------------------------
def grid_points(grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The points of ``grid``, in order: a mapping of keys to candidate values is its product (first key
    outermost); a list of mappings is taken as the points themselves (e.g. settings that only make
    sense together)."""
    if isinstance(grid, Mapping):
        for key, values in grid.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise ConfigError(f"--grid {key}: expected a non-empty list of candidate values, got {values!r}")
        points = [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]
    else:
        points = [dict(p) for p in grid]
    if not points or not all(points):
        raise ConfigError("--grid: no grid points (give at least one key with candidate values)")
    return points


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["retriever.first_stage_weight=0,0.5,1", "retriever.depth=16,32"]`` -> the grid mapping. Each
    value is read as YAML (``0.5`` a number, ``null``, ``[1, 0.3]`` a list: commas inside brackets do not
    split); a key given twice is an error."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().removeprefix("--")
        if not sep or not key or not values.strip():
            raise ConfigError(f"--grid {item!r} is not of the form key=value1,value2,...")
        if key in grid:
            raise ConfigError(f"--grid {key}: given twice")
        parts, depth, cur = [], 0, ""
        for ch in values:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch in "[{"
            depth -= ch in "]}"
            cur += ch
        parts.append(cur)
        try:
            grid[key] = [yaml.safe_load(p) if p.strip() else None for p in parts]
        except yaml.YAMLError as e:
            raise ConfigError(f"--grid {key}: {values!r} is not a list of YAML values ({str(e).splitlines()[0]})") from None
    return grid


def _set(tree: dict, key: str, value: Any) -> None:
    """``tree[a][b][1][c] = value`` for ``key`` ``a.b.1.c``; the path up to the last part must exist."""
    parts = key.split(".")
    if parts[0] not in TUNABLE or len(parts) < 2 or not all(parts):
        raise ConfigError(f"--grid {key}: only keys under {' and '.join(f'{s}.' for s in TUNABLE)} can be tuned "
                          "(every point is scored on the same val queries)")
    node: Any = tree
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[:i])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--grid {key}: {where} is a list of {len(node)}; {part!r} is not an index of it")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value  # an unknown key fails when the point's config is checked, naming it
            elif part not in node:
                raise ConfigError(f"--grid {key}: {where or 'the config'} has no key {part!r}")
            else:
                node = node[part]
        else:
            raise ConfigError(f"--grid {key}: {where} is {node!r}, not a section; give the whole value of {where} "
                              "instead")


def _check_members(spec: Any, where: str) -> None:
    """Inline member configs (a pipeline's first stage, a fusion's members: dicts naming a retriever)
    checked against their retriever's schema, so that a bad key in one fails before any work."""
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str) and spec["name"] in RETRIEVERS:
        typed = RETRIEVERS.get(spec["name"]).parse_config(dict(spec), where)
        _check_members(typed, where)
    elif isinstance(spec, list):
        for i, s in enumerate(spec):
            _check_members(s, f"{where}.{i}")
    elif hasattr(spec, "__dataclass_fields__"):
        for name in spec.__dataclass_fields__:
            value = getattr(spec, name)
            if isinstance(value, (Mapping, list)):
                _check_members(value, f"{where}.{name}")


def point_config(base: Mapping[str, Any] | EvaluateConfig, overrides: Mapping[str, Any]) -> EvaluateConfig:
    """The evaluation config of one grid point: ``base`` (a config, or its plain dict) with ``overrides``
    set, checked like any config (a key the schema does not have is a ConfigError naming it)."""
    tree = to_dict(base) if isinstance(base, EvaluateConfig) else copy.deepcopy(dict(base))
    for key, value in overrides.items():
        _set(tree, key, copy.deepcopy(value))
    where = "--grid " + ", ".join(f"{k}={v!r}" for k, v in overrides.items())
    cfg = load_config(EvaluateConfig, [tree], where=where)
    try:
        _check_members(cfg.retriever, "retriever")
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return cfg


# ---- the rule --------------------------------------------------------------------------------------
def _metric_list(metric: str | Sequence[str]) -> list[str]:
    names = [metric] if isinstance(metric, str) else list(metric)
    names = [m.strip() for n in names for m in str(n).split(",") if m.strip()]
    if not names:
        raise ConfigError("--metric: name at least one metric (e.g. recall@5)")
    return names


def pick(table: Sequence[Mapping[str, float] | Point], metric: str | Sequence[str], decimals: int = 4) -> int:
    """The index of the winning row of ``table`` (metric dicts, or Points) under the rule of this module:
    the highest value of the first metric, compared rounded to ``decimals`` places; a tie goes to the next
    metric named, a tie on every metric to the row listed first."""
    names = _metric_list(metric)
    if not table:
        raise ConfigError("--grid: no grid points to choose from")
    rows = [r.metrics if isinstance(r, Point) else r for r in table]
    for n in names:
        if any(n not in r for r in rows):
            have = sorted(set().union(*rows))
            raise ConfigError(f"--metric {n!r}: not among the metrics evaluated ({', '.join(have)})")
    best = 0
    key = [tuple(round(float(r[n]), decimals) for n in names) for r in rows]
    for i in range(1, len(rows)):
        if key[i] > key[best]:  # strictly better: an equal row listed later never wins
            best = i
    return best


def _check_metrics(names: list[str], cfg: EvaluateConfig) -> None:
    """The metrics to choose by must be among those the eval section computes."""
    have = {f"{m}@{k}" for m in cfg.eval.metrics if m != "mrr" for k in cfg.eval.ks}
    have |= {"mrr"} & set(cfg.eval.metrics)
    for n in names:
        if n not in have:
            raise ConfigError(f"--metric {n!r}: not among the metrics eval.metrics x eval.ks computes "
                              f"({', '.join(sorted(have))})")


# ---- scoring the points ----------------------------------------------------------------------------
class _Points:
    """The retriever of each point in turn: reconfigured in place where it is composed, else built anew
    (or loaded anew from ``checkpoint``, taking the point's config)."""

    def __init__(self, cfg: EvaluateConfig, retriever: Retriever | None):
        self.given = retriever is not None
        self.checkpoint = cfg.checkpoint if not self.given else None
        self.retriever = retriever if retriever is not None else (load(cfg.checkpoint) if cfg.checkpoint else None)
        base = to_dict(cfg)
        if self.retriever is not None:  # its own config is the one the grid changes
            base["retriever"] = to_dict(self.retriever.config)
        self.base = base

    def at(self, point: EvaluateConfig) -> Retriever:
        r = self.retriever
        if r is not None and point.retriever == r.config:
            return r
        if isinstance(r, ComposedRetriever) and r.reconfigure(point.retriever):
            return r
        if self.given:
            raise ConfigError(f"--grid: the retriever given ({type(r).__name__}) cannot take another "
                              f"{point.retriever.name} config in place; only composed retrievers (pipeline, "
                              "fusion) can: pass a config instead of a retriever")
        self.drop()
        if self.checkpoint:  # a saved model with the point's settings: index() rebuilds what they change
            r = load(self.checkpoint)
            r.config = type(r).parse_config(to_dict(point.retriever), "--grid")
        else:
            r = resolve_retriever(point.retriever, "retriever")
        self.retriever = r
        return r

    def drop(self) -> None:
        if isinstance(self.retriever, ComposedRetriever):
            self.retriever.remember(False)


def _no_bootstrap(cfg: EvaluateConfig) -> EvaluateConfig:
    return replace(cfg, eval=replace(cfg.eval, bootstrap=0))  # intervals are not what chooses


def evaluate_grid(cfg: EvaluateConfig, grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]],
                  split: str, *, retriever: Retriever | None = None, ds: ToolDataset | None = None,
                  log: Callable[[str], None] | None = None) -> list[Point]:
    """Every point of ``grid`` (over ``cfg``) scored on ``split``: the table ``choose_on_val`` chooses from.
    Scoring every point on test too (to report it beside the val choice, never to choose) is this on
    ``test``; ``retriever``: a composed retriever built in code, reconfigured to each point."""
    table, runner, _ = _score(cfg, grid, split, retriever, ds, log)
    runner.drop()  # the last point's retriever forgets its members' outputs
    return table


def _score(cfg: EvaluateConfig, grid: Any, split: str, retriever: Retriever | None, ds: ToolDataset | None,
           log: Callable[[str], None] | None) -> tuple[list[Point], _Points, ToolDataset]:
    overrides = grid_points(grid)
    runner = _Points(cfg, retriever)
    for key in dict.fromkeys(k for p in overrides for k in p):  # each key alone first: errors name it
        point_config(runner.base, {key: next(p[key] for p in overrides if key in p)})
    configs = [point_config(runner.base, p) for p in overrides]  # all checked before any work
    ds = ds if ds is not None else data.prepare_dataset(cfg.data)  # by its module: a stub replaces it in tests
    table = []
    try:
        for over, point in zip(overrides, configs, strict=True):
            r = runner.at(point)
            if isinstance(r, ComposedRetriever):  # on for every point's retriever: built, given or loaded
                r.remember(True)
            report = evaluate(r, ds, split, _no_bootstrap(point).eval)
            table.append(Point(over, report.metrics))
            if log is not None:
                log(f"{split} {_label(over)}: " + ", ".join(f"{k} {v:.4f}" for k, v in report.metrics.items()
                                                            if k in _shown(report.metrics)))
    except BaseException:
        runner.drop()
        raise
    return table, runner, ds


def _label(overrides: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in overrides.items())


def _shown(metrics: Mapping[str, float]) -> list[str]:
    return [k for k in ("recall@3", "recall@5", "ndcg@5", "pass@5") if k in metrics] or list(metrics)[:4]


def choose_on_val(cfg: EvaluateConfig, grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]],
                  metric: str | Sequence[str] = "recall@5", *, val_split: str = "val", test: bool = True,
                  retriever: Retriever | None = None, ds: ToolDataset | None = None, decimals: int = 4,
                  log: Callable[[str], None] | None = None) -> Tuning:
    """Each point of ``grid`` over ``cfg`` evaluated on ``val_split``, the winner chosen by the rule of
    this module (``pick``), then, with ``test``, the winner evaluated once on ``cfg.data.split`` (with
    ``cfg.out``: that folder gets what ``toolgraph evaluate --out`` writes, the tuned retriever under
    ``retriever/``, and results.json's ``tuning``: the whole val table). ``retriever``: a retriever built
    in code whose config the grid changes (composed retrievers only); else built from ``cfg.retriever``,
    or loaded from ``cfg.checkpoint``. ``ds``: the prepared dataset of ``cfg.data``."""
    names = _metric_list(metric)
    _check_metrics(names, cfg)
    if test and cfg.data.split == val_split:
        raise ConfigError(f"data.split: {cfg.data.split!r} is the val split the grid is chosen on; test on another "
                          "split (data.split=test)")
    if test and cfg.out:  # before any work: never write into someone else's folder
        check_output_folder(cfg.out, "out")
    t0 = time.perf_counter()
    table, runner, ds = _score(cfg, grid, val_split, retriever, ds, log)
    try:
        best = pick(table, names, decimals)
        winner = table[best].overrides
        config = point_config(runner.base, winner)
        r = runner.at(config)
        seconds = time.perf_counter() - t0
        tuning = Tuning(names, winner, table, config, r, None, val_split, seconds, decimals)
        if log is not None:
            log(f"chosen on {val_split}: {_label(winner)} ({', '.join(f'{n} {table[best].metrics[n]:.4f}' for n in names)})")
        if test:
            tuning.report = evaluate(r, ds, config.data.split, config.eval)
    finally:
        runner.drop()
    if test and cfg.out:  # what toolgraph evaluate --out writes, for the winner, and the val table
        write_run(cfg.out, replace(tuning.config, out=cfg.out), tuning.report, ds, tuning.retriever,
                  extra=lambda: {"tuning": tuning.as_dict()})
    return tuning
