"""benchmarks/device/parallel.py: jobs side by side, each in its own copy of the repository, and only
the rows they added or changed gathered (on a tiny stand-in repository; the jobs are shell one-liners)."""

import json
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def parallel(monkeypatch):
    return load_benchmark("device/parallel", monkeypatch)


def add_row(name, row):
    """A job: read-modify-write benchmarks/results/<name>.json, as the benchmark scripts do."""
    code = (f"import json, pathlib; p = pathlib.Path('benchmarks/results/{name}.json'); "
            f"d = json.loads(p.read_text()) if p.exists() else {{'rows': []}}; "
            f"d['rows'] = [r for r in d['rows'] if r['dataset'] != {row['dataset']!r}] + [{row!r}]; "
            f"p.write_text(json.dumps(d))")
    return f'{sys.executable} -c "{code}"'


def test_jobs_run_apart_and_only_their_new_rows_come_back(parallel, tmp_path):
    root = tmp_path / "repo"
    (root / "benchmarks" / "results").mkdir(parents=True)
    old = [{"dataset": "a", "v": 1}, {"dataset": "b", "v": 2}]
    (root / "benchmarks" / "results" / "g.json").write_text(json.dumps({"rows": old}))
    (root / "runs").mkdir()
    (root / "runs" / "big.bin").write_bytes(b"x" * 1000)  # runs/ is not copied into the jobs' folders
    jobs = [add_row("g", {"dataset": "c", "v": 3}), add_row("g", {"dataset": "b", "v": 20}),
            add_row("h", {"dataset": "a", "v": 4}), "echo failing; exit 3"]
    out, work = tmp_path / "out", tmp_path / "work"
    rc = parallel.run(jobs, 3, out, work, root)
    assert rc == 3
    rows = json.loads((out / "rows.json").read_text())
    # both writers of g.json kept their row (own copies), the unchanged row "a" is not sent back
    assert sorted(rows["g.json"], key=lambda r: r["dataset"]) == [{"dataset": "b", "v": 20}, {"dataset": "c", "v": 3}]
    assert rows["h.json"] == [{"dataset": "a", "v": 4}]
    status = json.loads((out / "jobs.json").read_text())
    assert [s["rc"] for s in status] == [0, 0, 0, 3] and all(s["seconds"] is not None for s in status)
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == [f"job-{i}.log" for i in range(4)]
        assert b"failing" in tar.extractfile("job-3.log").read()
    assert not (work / "job-0" / "runs").exists()
    assert json.loads((root / "benchmarks" / "results" / "g.json").read_text())["rows"] == old  # the original untouched


def test_a_jobs_file_without_a_job_names_the_file(parallel, tmp_path):
    f = tmp_path / "empty.jobs"
    f.write_text("# only a comment\n\n")
    with pytest.raises(SystemExit, match="empty.jobs: no job"):
        parallel.read_jobs(f)
    f.write_text("# first\necho a\n\n  echo b  \n")
    assert parallel.read_jobs(f) == ["echo a", "echo b"]


def test_merge_upserts_the_gathered_rows(parallel, tmp_path, monkeypatch):
    import results_io

    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    key = {"method": "m", "split": "test", "setting": "s"}
    (tmp_path / "g.json").write_text(json.dumps({"rows": [{**key, "dataset": "a", "v": 1}, {**key, "dataset": "b", "v": 2}]}))
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps({"g.json": [{**key, "dataset": "b", "v": 20}]}))
    parallel.merge(rows)
    assert [r["v"] for r in json.loads((tmp_path / "g.json").read_text())["rows"]] == [1, 20]
    for bad in ("{not json", "[1, 2]", '{"g.json": {"dataset": "b"}}'):
        rows.write_text(bad)
        with pytest.raises(SystemExit, match="rows.json: not a rows file"):
            parallel.merge(rows)
    assert [r["v"] for r in json.loads((tmp_path / "g.json").read_text())["rows"]] == [1, 20]  # nothing lost


def test_a_job_that_breaks_a_results_file_is_marked_and_the_others_rows_kept(parallel, tmp_path):
    root = tmp_path / "repo"
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "benchmarks" / "results" / "g.json").write_text(json.dumps({"rows": []}))
    jobs = ["echo '{broken' > benchmarks/results/g.json", add_row("h", {"dataset": "a", "v": 1})]
    out = tmp_path / "out"
    assert parallel.run(jobs, 1, out, tmp_path / "work", root) == 1
    status = json.loads((out / "jobs.json").read_text())
    assert "g.json: not a results file" in status[0]["error"] and status[0]["rc"] == 0
    assert json.loads((out / "rows.json").read_text()) == {"h.json": [{"dataset": "a", "v": 1}]}
    (root / "benchmarks" / "results" / "g.json").write_text("[]")  # the repository's own file broken: refused
    with pytest.raises(SystemExit, match="g.json: not a results file"):
        parallel.run(jobs, 1, out, tmp_path / "work2", root)
    with pytest.raises(SystemExit, match="--workers: at least 1"):
        parallel.run(jobs, 0, out, tmp_path / "work3", root)


JOBS_FILES = sorted((ROOT / "benchmarks" / "device").glob("*.jobs"))


@pytest.mark.parametrize("path", JOBS_FILES, ids=[p.name for p in JOBS_FILES])
def test_committed_jobs_name_scripts_configs_and_settings_that_exist(parallel, path, monkeypatch):
    """Device time is scarce: a jobs file must not fail on a typo. Every command of every line runs a
    script that exists, with config files that exist, and a general_hybrid --lodo setting it knows."""
    import shlex

    hybrid = load_benchmark("general_hybrid", monkeypatch)
    general = load_benchmark("general", monkeypatch)
    for job in parallel.read_jobs(path):
        for command in job.split("&&"):
            argv = shlex.split(command)
            assert argv[0] == "python" and (ROOT / argv[1]).is_file(), f"{path.name}: {command}"
            for i, arg in enumerate(argv):
                if arg.endswith(".yaml"):
                    assert (ROOT / arg).is_file(), f"{path.name}: {arg} does not exist"
                if arg == "--lodo":
                    assert argv[i + 1] in hybrid.SETTINGS, f"{path.name}: --lodo {argv[i + 1]}"
            if "--query-split" in argv:  # every rule parses (general.split_rule names a bad one)
                rules = argv[argv.index("--query-split") + 1:]
                for rule in rules[:next((k for k, r in enumerate(rules) if r.startswith("--")), len(rules))]:
                    general.split_rule(rule)
