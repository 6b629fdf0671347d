"""Workers: each takes a trial, runs it in a child process (``toolgraph.sweep.trial``), tells the study how
it ended, and takes the next, until the sweep has nothing left to start and no other worker's trial may
still fail back into the queue.

- ``--workers N`` on one machine: N worker processes, each pinned to its share of the CPU cores (its
  affinity mask, which toolgraph's trainer reads for its thread count) and, with ``--gpus``, its share of
  the GPUs (``CUDA_VISIBLE_DEVICES``). Their logs: ``workers/worker-I.log``; a trial's: ``trials/NNNN.log``.
- A trial's child dies with its worker (Linux: ``PR_SET_PDEATHSIG``), so a worker killed by SIGKILL leaves
  its trial running in the study with a heartbeat that stops: another worker fails it and runs the point
  again (study.reap_stale).
- SIGTERM / SIGINT to a worker (a scheduler's preemption): the trial is stopped at the end of its batch,
  marked failed with ``exit: interrupted`` and queued again in the same folder, so the next worker (or
  ``--resume``) continues it from ``last.ckpt``; the worker exits 143 / 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from toolgraph.sweep.study import (
    GRACE_SECONDS,
    HEARTBEAT_SECONDS,
    Sweep,
    claim,
    heartbeat,
    mark_running,
    reap_stale,
    requeue,
)

__all__ = ["run_worker", "share", "spawn_workers"]

EXITS = {0: "complete", 3: "pruned", 143: "interrupted", 130: "interrupted"}


def _die_with_parent() -> None:  # in the child, before exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _tell(sweep: Sweep, trial, rc: int, seconds: float) -> str:
    """Finish ``trial`` from its child's exit code and what it reported; ``seconds``: the trial process's
    wall time (start-up and imports included). A trial another worker already failed as lost (this worker's
    heartbeat was late) keeps that state: its point runs again there."""
    import optuna

    try:
        return _finish_trial(sweep, trial, rc, seconds)
    except optuna.exceptions.UpdateFinishedTrialError:
        print(f"trial {trial.number}: another worker marked it lost and queued its point again; this result is "
              "not recorded", flush=True)
        return "lost"


def _finish_trial(sweep: Sweep, trial, rc: int, seconds: float) -> str:
    from optuna.trial import TrialState

    trial_id = sweep.trial_id(trial.number)
    frozen = sweep.storage.get_trial(trial_id)
    exit_ = EXITS.get(rc, "failed")
    sweep.storage.set_trial_user_attr(trial_id, "exit", exit_)
    sweep.storage.set_trial_user_attr(trial_id, "seconds", round(seconds, 2))
    if exit_ == "complete" and "best_value" in frozen.user_attrs:
        sweep.study.tell(trial.number, float(frozen.user_attrs["best_value"]))
    elif exit_ == "pruned":
        sweep.study.tell(trial.number, state=TrialState.PRUNED)
    else:
        if exit_ == "complete":
            exit_ = "failed"
        if exit_ == "failed":
            sweep.storage.set_trial_user_attr(trial_id, "error", _tail(frozen.user_attrs.get("log")))
        sweep.study.tell(trial.number, state=TrialState.FAIL)
        if exit_ == "interrupted":
            requeue(sweep, sweep.storage.get_trial(trial_id))
    return exit_


def _tail(log: str | None, lines: int = 5) -> str:
    try:
        text = Path(log).read_text(errors="replace").splitlines() if log else []
    except OSError:
        return ""
    errors = [t for t in text if t.startswith("error:") or "Error" in t]
    return "\n".join((errors or text)[-lines:])


def _run_one(sweep: Sweep, trial, log=print) -> str:
    folder = sweep.folder
    trial_id = sweep.trial_id(trial.number)
    out_dir = trial.user_attrs.get("out_dir") or str(folder / "trials" / f"{trial.number:04d}")
    logfile = folder / "trials" / f"{trial.number:04d}.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    trial.set_user_attr("out_dir", out_dir)
    trial.set_user_attr("log", str(logfile))
    mark_running(sweep, trial_id)
    values = ", ".join(f"{k}={v}" for k, v in trial.params.items())
    log(f"trial {trial.number}: {values} -> {out_dir}", flush=True)
    cmd = [sys.executable, "-m", "toolgraph.sweep.trial", "--storage", sweep.url, "--study", sweep.name,
           "--trial", str(trial.number)]
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            heartbeat(sweep, trial_id)

    started = time.perf_counter()
    with logfile.open("ab") as f:
        child = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        beating = threading.Thread(target=beat, daemon=True)
        beating.start()
        try:
            rc = child.wait()
        except BaseException:  # SIGTERM / SIGINT to the worker: the trial stops at the end of its batch
            child.send_signal(signal.SIGTERM)
            rc = child.wait()
            rc = rc if rc in (130, 143) else 143
            stop.set()
            _tell(sweep, trial, rc, time.perf_counter() - started)
            log(f"trial {trial.number}: interrupted; queued again, it resumes from {out_dir}/checkpoints/last.ckpt",
                flush=True)
            raise
        finally:
            stop.set()
    exit_ = _tell(sweep, trial, rc, time.perf_counter() - started)
    frozen = sweep.storage.get_trial(trial_id)
    value = frozen.user_attrs.get("best_value")
    shown = f"{sweep.spec.metric} {value:.4f}" if isinstance(value, float) else "no value"
    log(f"trial {trial.number}: {exit_} ({shown}, {frozen.user_attrs.get('seconds', '?')} s; log {logfile})",
        flush=True)
    return exit_


def _target_reached(sweep: Sweep) -> bool:
    target = sweep.spec.target
    if target is None:
        return False
    from optuna.trial import TrialState

    values = [t.value for t in sweep.trials(TrialState.COMPLETE) if t.value is not None]
    return any(v >= target if sweep.spec.goal == "maximize" else v <= target for v in values)


def run_worker(sweep: Sweep, *, poll: float = 2.0, grace: float = GRACE_SECONDS, log=print) -> dict[str, int]:
    """Run trials until none is left to start and no other worker's trial is running; returns how its trials
    ended (``{"complete": 3, "pruned": 1}``)."""
    from optuna.trial import TrialState

    ended: dict[str, int] = {}
    while True:
        reap_stale(sweep, grace, log=lambda m: log(m, flush=True))
        if _target_reached(sweep):
            log(f"a trial reached {sweep.spec.metric} {sweep.spec.target}: no more trials start", flush=True)
            return ended
        trial = claim(sweep)
        if trial is None:
            if not sweep.trials(TrialState.RUNNING, TrialState.WAITING):
                return ended
            time.sleep(poll)  # another worker's trial may yet fail back into the queue
            continue
        exit_ = _run_one(sweep, trial, log=log)
        ended[exit_] = ended.get(exit_, 0) + 1


def share(items: list[Any], n: int, i: int) -> list[Any]:
    """Worker ``i``'s share of ``items`` among ``n`` workers (contiguous; every worker gets one when n > len)."""
    if not items:
        return []
    if n >= len(items):
        return [items[i % len(items)]]
    size, extra = divmod(len(items), n)
    start = i * size + min(i, extra)
    return items[start:start + size + (1 if i < extra else 0)]


def spawn_workers(sweep: Sweep, n: int, gpus: list[str], *, grace: float, seed: int | None = None,
                  poll: float = 5.0, log=print) -> list[int]:
    """``n`` worker processes on this machine, each on its share of the cores and GPUs (worker ``i`` samples
    with ``seed + i``); prints progress until they end; returns their exit codes."""
    from optuna.trial import TrialState

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    (sweep.folder / "workers").mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(n):
        mine = share(cores, n, i)
        env = dict(os.environ, OMP_NUM_THREADS=str(len(mine)), MKL_NUM_THREADS=str(len(mine)))
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(share(gpus, n, i))
        cmd = [sys.executable, "-m", "toolgraph.cli", "sweep", "--worker", sweep.name, "--storage", sweep.url,
               "--grace", str(grace), *(["--seed", str(seed + i)] if seed is not None else [])]
        logfile = (sweep.folder / "workers" / f"worker-{i}.log").open("ab")

        def pin(cpus=mine) -> None:
            _die_with_parent()
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, cpus)

        procs.append(subprocess.Popen(cmd, env=env, stdout=logfile, stderr=subprocess.STDOUT, preexec_fn=pin))
        log(f"worker {i}: cores {mine}" + (f", GPUs {env['CUDA_VISIBLE_DEVICES']}" if gpus else "")
            + f"; log {logfile.name}", flush=True)
    seen = None
    try:
        while any(p.poll() is None for p in procs):
            states = [t.state for t in sweep.trials()]
            line = ", ".join(f"{s.name.lower()} {states.count(s)}" for s in TrialState if states.count(s))
            if line != seen:
                log(f"[{time.strftime('%H:%M:%S')}] trials: {line}", flush=True)
                seen = line
            time.sleep(poll)
    except BaseException:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        raise
    return [p.returncode for p in procs]
