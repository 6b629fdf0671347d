"""A sweep's Optuna study: where it is stored, how it is created and joined, and how workers take trials.

**Storage.** By default a journal file in the sweep folder (``study.journal``: Optuna's JournalStorage
with an open-file lock, which works on NFS, where SQLite says "database is locked"); ``--storage`` takes
a journal file path or an SQLAlchemy URL (``postgresql://user@host/db``) for a cluster.

**What the study holds.** ``user_attrs["toolgraph"]``: the spec as written, its path, the sweep folder,
the config files, the command's overrides, metric, goal, method, pruner and budget, so that a worker on
another node joins with the study's name and storage only.

**No grid point twice.** The study's creator enqueues every grid point before any trial runs (Optuna's
GridSampler picks points in each worker independently and may repeat one when workers race); a worker
takes a waiting trial by setting it RUNNING, which the storage grants to one worker only. Two commands
creating the same study at once: the storage refuses the second (DuplicatedStudyError), which joins.

**Faults.** A worker records a heartbeat on its running trial (a system attribute, every
``HEARTBEAT_SECONDS``) with its host and pid. A trial is stale when its worker's pid is gone on this host,
or its heartbeat is older than ``grace`` seconds; any worker marks a stale trial failed (the storage lets
one worker do so) and enqueues the same point again with the same run folder, so the re-run resumes from
its ``last.ckpt``; a point is attempted at most ``MAX_ATTEMPTS`` times.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolgraph.errors import ConfigError
from toolgraph.sweep.spec import SweepSpec, parse_spec

__all__ = ["ATTR", "HEARTBEAT_SECONDS", "MAX_ATTEMPTS", "StudyExists", "Sweep", "claim", "create_sweep", "open_storage",
           "open_sweep", "reap_stale", "storage_url"]

ATTR = "toolgraph"  # the study's user attribute with the spec and the sweep's settings
JOURNAL = "study.journal"
HEARTBEAT_SECONDS = 15.0
GRACE_SECONDS = 120.0
MAX_ATTEMPTS = 3
PRUNERS = ("none", "median", "halving", "hyperband")


class StudyExists(ConfigError):
    """``create_sweep`` found a study of that name in the storage (``--resume`` continues it)."""


def storage_url(storage: str | Path | None, folder: Path) -> str:
    """The storage as one string every process can open: an SQLAlchemy URL, or a journal file's absolute path."""
    if storage is None:
        return str((folder / JOURNAL).resolve())
    text = str(storage)
    return text if "://" in text else str(Path(text).resolve())


def open_storage(url: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # toolgraph prints one line per trial itself
    if "://" in url:
        if url.startswith("sqlite"):
            print("warning: SQLite storage fails on NFS with many workers ('database is locked'); a journal file "
                  "(the default) or PostgreSQL is safer", flush=True)
        return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage

    Path(url).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(url, lock_obj=JournalFileOpenLock(url)))


def build_pruner(settings: dict[str, Any]):
    import optuna

    name = settings.get("name", "none")
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=settings.get("startup", 3),
                                           n_warmup_steps=settings.get("warmup", 1))
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=settings.get("min_resource", 1),
                                                      reduction_factor=settings.get("eta", 3))
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=settings.get("min_resource", 1),
                                              max_resource=settings.get("max_resource", "auto"),
                                              reduction_factor=settings.get("eta", 3))
    return optuna.pruners.NopPruner()


def pruner_settings(spec: SweepSpec, name: str | None, startup: int, warmup: int) -> dict[str, Any]:
    """``--pruner`` if given, else the spec's ``early_terminate`` (hyperband), else none."""
    if name is None and spec.early_terminate:
        e = spec.early_terminate
        return {"name": "hyperband", "min_resource": int(e.get("min_iter", 1)),
                "max_resource": int(e["max_iter"]) if "max_iter" in e else "auto", "eta": int(e.get("eta", 3))}
    name = name or "none"
    if name not in PRUNERS:
        raise ConfigError(f"--pruner: expects one of {', '.join(PRUNERS)}, got {name!r}")
    return {"name": name, "startup": startup, "warmup": warmup, "min_resource": max(1, warmup), "eta": 3}


@dataclass
class Sweep:
    """An opened study with what its workers need."""

    study: Any  # optuna.Study
    storage: Any
    url: str
    spec: SweepSpec
    settings: dict[str, Any]

    @property
    def name(self) -> str:
        return self.study.study_name

    @property
    def folder(self) -> Path:
        return Path(self.settings["folder"])

    @property
    def study_id(self) -> int:
        return self.storage.get_study_id_from_name(self.name)

    def trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def trials(self, *states) -> list:
        return self.study.get_trials(deepcopy=False, states=states or None)


def _sampler(spec: SweepSpec, seed: int | None, parallel: bool):
    import optuna

    if spec.method == "bayes":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=parallel)
    return optuna.samplers.RandomSampler(seed=seed)  # grid: every point is enqueued, nothing is sampled


def create_sweep(spec: SweepSpec, folder: Path, storage: str | Path | None, *, pruner: dict[str, Any],
                 budget: int | None, seed: int | None = None, order: str = "product") -> Sweep:
    """A new study for ``spec``, its grid enqueued (``order``: ``product``, W&B's order, the first key
    outermost; ``shuffled``: a random order from ``seed``, as Optuna's GridSampler takes points, so that a
    pruner meets good and bad points early); an existing one of that name is a ConfigError."""
    import random

    import optuna

    if spec.method != "grid" and budget is None:
        raise ConfigError(f"{spec.path}: key 'run_cap': method {spec.method} needs a number of trials (run_cap in "
                          "the spec, or --trials N)")
    url = storage_url(storage, folder)
    store = open_storage(url)
    settings = {"spec": spec.raw, "spec_path": str(spec.path.resolve()), "folder": str(folder.resolve()),
                "configs": [str(Path(c).resolve()) for c in spec.configs], "overrides": spec.overrides,
                "metric": spec.metric, "goal": spec.goal, "method": spec.method, "pruner": pruner,
                "budget": len(spec.grid()) if spec.method == "grid" else budget, "seed": seed, "order": order}
    try:
        study = optuna.create_study(study_name=spec.name, storage=store, direction=spec.goal,
                                    sampler=_sampler(spec, seed, False), pruner=build_pruner(pruner))
    except optuna.exceptions.DuplicatedStudyError:
        raise StudyExists(f"study {spec.name!r} already exists in {url}: continue it with --resume, join it from "
                          f"another machine with toolgraph sweep --worker {spec.name} --storage ..., or give another "
                          "--out / spec name") from None
    study.set_user_attr(ATTR, settings)
    points = spec.grid() if spec.method == "grid" else []
    if order == "shuffled":
        random.Random(seed or 0).shuffle(points)
    for point in points:
        study.enqueue_trial(point, user_attrs={"attempt": 1})
    study.set_user_attr("toolgraph_ready", True)  # last: a joiner waits for the whole grid
    return Sweep(study, store, url, spec, settings)


def open_sweep(name: str | None, storage: str | Path | None, folder: Path | None = None, *,
               wait: float = 60.0, seed: int | None = None, parallel: bool = True) -> Sweep:
    """An existing study: by name in ``storage``, or the one study of a sweep folder's journal."""
    import optuna

    if storage is None and folder is None:
        raise ConfigError("--storage: give the study's storage (a journal file or a database URL), or its sweep folder")
    url = storage_url(storage, folder or Path("."))
    if "://" not in url and not Path(url).is_file():
        raise ConfigError(f"{url}: no study journal here (a sweep folder holds {JOURNAL}; start the sweep with "
                          "toolgraph sweep SPEC first)")
    try:
        store = open_storage(url)
        names = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
    except (KeyError, ValueError, TypeError) as e:  # a journal line that is not Optuna's (json errors are ValueErrors)
        raise ConfigError(f"{url}: not a readable Optuna journal ({type(e).__name__}: {e}); it was left as it is") \
            from None
    if name is None:
        if len(names) != 1:
            raise ConfigError(f"{url}: holds {len(names)} studies ({', '.join(names) or 'none'}): name one")
        name = names[0]
    deadline = time.monotonic() + wait
    while name not in names or not _ready(store, name):
        if time.monotonic() > deadline:
            known = f"it holds {', '.join(names)}" if names else "it holds none"
            raise ConfigError(f"study {name!r} is not (or not completely) in {url}: {known}")
        time.sleep(1.0)
        names = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
    probe = optuna.load_study(study_name=name, storage=store)
    settings = probe.user_attrs[ATTR]
    spec = parse_spec(settings["spec"], settings["spec_path"])
    spec.configs, spec.overrides = list(settings["configs"]), list(settings["overrides"])
    study = optuna.load_study(study_name=name, storage=store, sampler=_sampler(spec, seed, parallel),
                              pruner=build_pruner(settings["pruner"]))
    return Sweep(study, store, url, spec, settings)


def _ready(store, name: str) -> bool:
    study_id = store.get_study_id_from_name(name)
    return bool(store.get_study_user_attrs(study_id).get("toolgraph_ready"))


# ---- taking trials ---------------------------------------------------------------------------------
def claim(sweep: Sweep):
    """The next trial for this worker (an ``optuna.Trial``, its values suggested), or None when the sweep
    has nothing left to start: a waiting trial first (a grid point, a retry), then, for random / bayes, a new
    sample while the budget allows."""
    import optuna
    from optuna.trial import TrialState

    for waiting in sweep.trials(TrialState.WAITING):
        trial_id = sweep.trial_id(waiting.number)
        try:
            taken = sweep.storage.set_trial_state_values(trial_id, TrialState.RUNNING)
        except optuna.exceptions.UpdateFinishedTrialError:
            taken = False
        if taken:
            trial = optuna.trial.Trial(sweep.study, trial_id)
            _suggest_all(trial, sweep.spec)
            return trial
    if sweep.spec.method == "grid":
        return None
    counted = sweep.trials(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    if len(counted) >= sweep.settings["budget"]:
        return None
    trial = sweep.study.ask()
    trial.set_user_attr("attempt", 1)
    _suggest_all(trial, sweep.spec)
    return trial


def _suggest_all(trial, spec: SweepSpec) -> None:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    for key, param in spec.parameters.items():
        dist = param.optuna()
        if isinstance(dist, CategoricalDistribution):
            trial.suggest_categorical(key, dist.choices)
        elif isinstance(dist, IntDistribution):
            trial.suggest_int(key, dist.low, dist.high)
        else:
            trial.suggest_float(key, dist.low, dist.high, log=dist.log, step=dist.step)


def mark_running(sweep: Sweep, trial_id: int) -> None:
    """Who runs the trial (host, pid) and its first heartbeat."""
    sweep.storage.set_trial_system_attr(trial_id, "toolgraph:host", socket.gethostname())
    sweep.storage.set_trial_system_attr(trial_id, "toolgraph:pid", os.getpid())
    heartbeat(sweep, trial_id)


def heartbeat(sweep: Sweep, trial_id: int) -> None:
    sweep.storage.set_trial_system_attr(trial_id, "toolgraph:heartbeat", time.time())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(trial, grace: float, now: float | None = None) -> bool:
    attrs = trial.system_attrs
    if "toolgraph:heartbeat" not in attrs:  # between a claim and the first heartbeat: by its start time
        start = trial.datetime_start.timestamp() if trial.datetime_start else time.time()
        return (now or time.time()) - start > grace
    if attrs.get("toolgraph:host") == socket.gethostname() and not _alive(int(attrs["toolgraph:pid"])):
        return True
    return (now or time.time()) - float(attrs["toolgraph:heartbeat"]) > grace


def reap_stale(sweep: Sweep, grace: float = GRACE_SECONDS, log=print) -> list[int]:
    """Fail the running trials whose worker is gone and enqueue each point again (same run folder, so it
    resumes); returns the numbers of the trials failed by this call."""
    import optuna
    from optuna.trial import TrialState

    reaped = []
    for t in sweep.trials(TrialState.RUNNING):
        if t.system_attrs.get("toolgraph:pid") == os.getpid() and \
                t.system_attrs.get("toolgraph:host") == socket.gethostname():
            continue  # this worker's own
        if not is_stale(t, grace):
            continue
        trial_id = sweep.trial_id(t.number)
        try:
            sweep.storage.set_trial_user_attr(trial_id, "exit", "lost")
            sweep.storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker (or the trial's own, late) finished it first
        reaped.append(t.number)
        log(f"trial {t.number}: its worker is gone (no heartbeat); marked failed")
        requeue(sweep, t, log=log)
    return reaped


def requeue(sweep: Sweep, trial, log=print) -> bool:
    """Enqueue ``trial``'s point again, in the same run folder (it resumes from last.ckpt)."""
    attempt = int(trial.user_attrs.get("attempt", 1))
    if attempt >= MAX_ATTEMPTS:
        log(f"trial {trial.number}: attempted {attempt} times; not run again")
        return False
    attrs = {"attempt": attempt + 1, "retry_of": trial.user_attrs.get("retry_of", trial.number)}
    if "out_dir" in trial.user_attrs:
        attrs["out_dir"] = trial.user_attrs["out_dir"]
    sweep.study.enqueue_trial(dict(trial.params), user_attrs=attrs)
    log(f"trial {trial.number}: its point is queued again (attempt {attempt + 1})")
    return True
