"""The three things ``toolgraph sweep`` does: start (or resume) a sweep from its spec, join one as a worker,
and report one. toolgraph/cli.py parses the arguments; docs/configuration.md "Sweeps" shows the commands.
"""

from __future__ import annotations

from pathlib import Path

from toolgraph.errors import ConfigError
from toolgraph.sweep.spec import read_spec
from toolgraph.sweep.study import JOURNAL, StudyExists, Sweep, create_sweep, open_sweep, pruner_settings, reap_stale
from toolgraph.sweep.worker import run_worker, spawn_workers

__all__ = ["finish", "join", "locate", "start"]


def start(spec_path: str | Path, *, out: str | Path | None = None, storage: str | None = None,
          study: str | None = None, workers: int = 1, gpus: list[str] | None = None, trials: int | None = None,
          pruner: str | None = None, prune_startup: int = 3, prune_warmup: int = 1, resume: bool = False,
          seed: int | None = None, grace: float = 120.0, order: str = "product", log=print) -> Sweep:
    """Create the sweep's study (or, with ``resume``, continue it) and run ``workers`` workers on it."""
    spec = read_spec(spec_path)
    if study:
        spec.name = study
    folder = Path(out) if out else Path("runs") / "sweeps" / spec.name
    budget = trials if trials is not None else spec.run_cap
    settings = pruner_settings(spec, pruner, prune_startup, prune_warmup)
    _check_recipe(spec)
    try:
        sweep = create_sweep(spec, folder, storage, pruner=settings, budget=budget, seed=seed, order=order)
        log(f"study {spec.name!r}: {spec.method}, {sweep.settings['budget']} trials, {spec.metric} ({spec.goal}), "
            f"pruner {settings['name']}; storage {sweep.url}", flush=True)
    except StudyExists:
        if not resume:
            raise
        # another worker may have created it a moment ago: wait for its grid to be queued
        sweep = open_sweep(spec.name, storage, folder, wait=60, seed=seed, parallel=workers > 1)
        if trials is not None and trials != sweep.settings["budget"] and spec.method != "grid":
            raise ConfigError(f"--trials: the study was created with {sweep.settings['budget']} trials") from None
        log(f"study {spec.name!r}: resumed from {sweep.url}", flush=True)
        reap_stale(sweep, grace, log=lambda m: log(m, flush=True))
    if workers == 0:
        join_cmd = f"toolgraph sweep --worker {sweep.name} --storage {sweep.url}"
        log(f"study created; no worker started. Join it from any machine that sees {sweep.folder}:\n  {join_cmd}",
            flush=True)
        return sweep
    if workers == 1 and not gpus:
        run_worker(sweep, grace=grace, log=log)
    else:
        codes = spawn_workers(sweep, workers, gpus or [], grace=grace, seed=seed, log=log)
        bad = [c for c in codes if c != 0]
        if bad:
            log(f"warning: {len(bad)} worker(s) exited {bad}; their logs: {sweep.folder / 'workers'}", flush=True)
    finish(sweep, log=log)
    return sweep


def _check_recipe(spec) -> None:
    """Every grid point (or the first sample's keys) loads as a config, before anything runs: a swept key
    the config does not have is a ConfigError naming it."""
    from toolgraph.config import TrainConfig, load_config
    from toolgraph.sweep.spec import point_overrides

    points = spec.grid() if spec.method == "grid" else [
        {k: (p.grid_values()[0] if p.values else p.low) for k, p in spec.parameters.items()}]
    from toolgraph.registry import TASKS

    for point in points:
        try:
            cfg = load_config(TrainConfig, spec.configs, [*spec.overrides, *point_overrides(point)])
        except ConfigError as e:
            raise ConfigError(f"{spec.path}: a trial's config does not load: {e}") from None
        logged = TASKS.get(cfg.model.name).monitorable(cfg)  # what the task logs at validation
        if spec.metric not in logged:
            raise ConfigError(f"{spec.path}: key 'metric.name': {spec.metric!r} is not logged by "
                              f"model.name={cfg.model.name!r} (it logs e.g. {', '.join(logged[:6])})")


def locate(target: str, storage: str | None) -> tuple[str | None, str | None, Path | None]:
    """STUDY of ``--worker`` / ``report``: a sweep folder (its journal) or a study name in ``--storage``."""
    path = Path(target)
    if path.is_dir():
        if not (path / JOURNAL).is_file() and storage is None:
            raise ConfigError(f"{target}: a folder without {JOURNAL}; give a sweep folder, or the study's name with "
                              "--storage")
        return None, storage, path
    if storage is None:
        raise ConfigError(f"{target}: no such sweep folder; a study name needs --storage (a journal file or a "
                          "database URL)")
    return target, storage, None


def join(target: str, storage: str | None = None, *, grace: float = 120.0, seed: int | None = None,
         log=print) -> Sweep:
    name, storage, folder = locate(target, storage)
    sweep = open_sweep(name, storage, folder, seed=seed)
    log(f"worker joined study {sweep.name!r} ({sweep.url})", flush=True)
    ended = run_worker(sweep, grace=grace, log=log)
    log(f"worker done: {ended or 'no trials left'}", flush=True)
    return sweep


def finish(sweep: Sweep, out: Path | None = None, log=print) -> dict:
    """The trials table on stdout; trials.md, trials.json, best.yaml and report.html in the sweep folder."""
    from toolgraph.sweep.report import trials_table, write_report

    log(trials_table(sweep.study), flush=True)
    written = write_report(sweep.study, out)
    for what, path in written.items():
        log(f"wrote {what}: {path}", flush=True)
    return written
