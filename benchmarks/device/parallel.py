"""Run independent benchmark jobs side by side on one machine (one GPU shared by all), and gather
their result rows as they finish, so a run stopped at its time limit still returns what it finished.

    python benchmarks/device/parallel.py JOBS_FILE --workers 8 --out "$OUT"

JOBS_FILE: one shell command per line (blank lines and ``#`` comments skipped), each run from the
repository root. Every job runs in its own copy of the repository (benchmarks/results/*.json are
read-modify-written by the scripts, so parallel jobs must not share them), with
``OMP_NUM_THREADS = cores / workers``. After each job, ``OUT/rows.json`` holds every row that a job
added or changed ({results file name: [rows]}, merge them with ``merge``), ``OUT/jobs.json`` each
job's command, exit code and seconds, and ``OUT/logs.tar.gz`` the jobs' output.

    python benchmarks/device/parallel.py merge ROWS_JSON   # here: upsert the rows into benchmarks/results/
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = {".git", ".device", ".whl", ".venv", ".cache", "runs", "__pycache__"}


def read_jobs(path: Path) -> list[str]:
    jobs = [line.strip() for line in path.read_text().splitlines()]
    jobs = [j for j in jobs if j and not j.startswith("#")]
    if not jobs:
        raise SystemExit(f"{path}: no job (one shell command per line)")
    return jobs


def rows_of(copy: Path) -> dict[str, list[dict]]:
    """Every results file's rows; a file that is not ``{"rows": [...]}`` is an error naming it."""
    out = {}
    for f in sorted((copy / "benchmarks" / "results").glob("*.json")):
        try:
            rows = json.loads(f.read_text()).get("rows", [])
        except (json.JSONDecodeError, AttributeError) as e:
            raise ValueError(f"{f}: not a results file ({{\"rows\": [...]}}): {e}") from None
        out[f.name] = rows
    return out


def new_rows(before: dict[str, list[dict]], after: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Rows of ``after`` that ``before`` does not hold as they are (added or changed)."""
    seen = {name: {json.dumps(r, sort_keys=True) for r in rows} for name, rows in before.items()}
    found = {name: [r for r in rows if json.dumps(r, sort_keys=True) not in seen.get(name, set())]
             for name, rows in after.items()}
    return {name: rows for name, rows in found.items() if rows}


def run(jobs: list[str], workers: int, out: Path, work: Path, root: Path = ROOT) -> int:
    """Every job in its own copy of ``root``; the highest exit code (0 when all passed)."""
    if workers < 1:
        raise SystemExit(f"--workers: at least 1, got {workers}")
    try:
        before = rows_of(root)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // workers)
    lock = threading.Lock()
    status: list[dict] = [{"job": i, "command": j, "rc": None, "seconds": None} for i, j in enumerate(jobs)]
    gathered: dict[str, list[dict]] = {}

    def publish() -> None:
        (out / "rows.json").write_text(json.dumps(gathered, indent=1) + "\n")
        (out / "jobs.json").write_text(json.dumps(status, indent=1) + "\n")
        with tarfile.open(out / "logs.tar.gz.tmp", "w:gz") as tar:
            for log in sorted(work.glob("job-*.log")):
                tar.add(log, arcname=log.name)
        os.replace(out / "logs.tar.gz.tmp", out / "logs.tar.gz")

    def one(i: int) -> int:
        copy = work / f"job-{i}"
        shutil.copytree(root, copy, ignore=lambda d, names: [n for n in names if n in SKIP], dirs_exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads),
               "PYTHONPATH": os.pathsep.join([str(copy), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])}
        start = time.perf_counter()
        with open(work / f"job-{i}.log", "w") as log:
            log.write(f"$ {jobs[i]}\n")
            log.flush()
            rc = subprocess.call(["bash", "-c", jobs[i]], cwd=copy, env=env, stdout=log, stderr=subprocess.STDOUT)
        with lock:
            status[i].update(rc=rc, seconds=round(time.perf_counter() - start, 1))
            try:
                after = rows_of(copy)
            except ValueError as e:  # the job broke a results file: say so, keep the other jobs' rows
                status[i]["error"] = str(e)
                rc, after = rc or 1, before
            for name, rows in new_rows(before, after).items():
                keys = {json.dumps(r, sort_keys=True) for r in gathered.get(name, [])}
                gathered.setdefault(name, []).extend(r for r in rows if json.dumps(r, sort_keys=True) not in keys)
            publish()
        print(f"job {i}: rc={rc} {status[i]['seconds']} s: {jobs[i][:120]}", flush=True)
        return rc

    publish()
    with ThreadPoolExecutor(workers) as pool:
        codes = list(pool.map(one, range(len(jobs))))
    return max(codes, default=0)


def merge(path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results_io import upsert

    try:
        found = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"{path}: not a rows file of parallel.py ({e})") from None
    if not isinstance(found, dict) or not all(isinstance(v, list) and all(isinstance(r, dict) for r in v)
                                              for v in found.values()):
        raise SystemExit(f"{path}: not a rows file of parallel.py (expected {{results file name: [rows]}})")
    for name, rows in found.items():
        upsert(Path(name).stem, rows)
        print(f"{name}: {len(rows)} row(s) merged")


def main() -> None:
    if sys.argv[1:2] == ["merge"]:
        if len(sys.argv) != 3:
            raise SystemExit("usage: parallel.py merge ROWS_JSON")
        merge(Path(sys.argv[2]))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("jobs", type=Path)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "parallel-out")))
    p.add_argument("--work", type=Path, default=Path("/tmp/parallel-jobs"))
    args = p.parse_args()
    sys.exit(run(read_jobs(args.jobs), args.workers, args.out, args.work))


if __name__ == "__main__":
    main()
