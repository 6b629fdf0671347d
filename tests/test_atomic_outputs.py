"""Issue 20, finding 9 / Build 4: evaluate's outputs are atomic. Every file is written to a temp name
and renamed, results.json is removed first and written last, an interrupted re-run never leaves one
run's results beside another's config or rankings, SIGTERM / SIGINT exit 143 / 130 with nothing
half-written, and a broken results.json is named with what to do."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from toolgraph.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
TOOLS, QUERIES, DEPTH = 600, 2000, 600  # rankings.jsonl of ~30 MB: writing it takes a moment


@pytest.fixture(scope="module")
def big_dataset(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(400)]
    folder = tmp_path_factory.mktemp("big")
    tools = [{"id": f"t{i}", "name": f"tool_{i}", "description": " ".join(rng.sample(words, 8))} for i in range(TOOLS)]
    queries = [{"id": f"q{i}", "text": " ".join(rng.sample(words, 6)), "tools": [f"t{rng.randrange(TOOLS)}"],
                "split": "test"} for i in range(QUERIES)]
    for name, rows in [("tools", tools), ("queries", queries)]:
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _cmd(data: Path, out: Path, ks: str) -> list[str]:
    return [sys.executable, str(ROOT / "evaluate.py"), "retriever.name=bm25", f"data.name={data}",
            f"eval.depth={DEPTH}", f"eval.ks={ks}", "eval.agent_level=false", "--out", str(out)]


def _run_and_signal(cmd: list[str], out: Path, sig: int) -> tuple[int, str]:
    """Start ``cmd``; send ``sig`` as soon as it starts writing rankings (the file or its temp name)."""
    def rankings_state():
        path = out / "rankings.jsonl"
        return (path.stat().st_mtime_ns, path.stat().st_size) if path.exists() else None

    before = rankings_state()  # a re-run: the previous run's file is there already
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if out.is_dir() and (rankings_state() != before
                                 or any("rankings" in n and ".tmp" in n for n in os.listdir(out))):
                break
            time.sleep(0.005)
        assert proc.poll() is None, "finished before it could be interrupted: " + proc.stderr.read().decode()[-800:]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err.decode()


def _assert_consistent(out: Path) -> None:
    """results.json, when present, belongs with config.yaml and a complete rankings.jsonl."""
    if not (out / "results.json").exists():
        return
    res = json.loads((out / "results.json").read_text())
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert res["config"]["eval"] == cfg["eval"], "results.json of one run beside config.yaml of another"
    lines = (out / "rankings.jsonl").read_text().splitlines()
    assert len(lines) == QUERIES, f"rankings.jsonl cut at {len(lines)} of {QUERIES} lines beside results.json"
    assert all(json.loads(line)["top"] for line in lines)
    assert sorted(k for k in res["metrics"] if k.startswith("recall@")) == \
        sorted(f"recall@{k}" for k in cfg["eval"]["ks"])


def test_kill_9_during_a_rerun_never_mixes_two_runs(big_dataset, tmp_path):
    out = tmp_path / "out"
    subprocess.run(_cmd(big_dataset, out, "[1,3]"), check=True, capture_output=True, timeout=300)
    _assert_consistent(out)
    code, _ = _run_and_signal(_cmd(big_dataset, out, "[1,5]"), out, signal.SIGKILL)
    assert code == -signal.SIGKILL
    _assert_consistent(out)
    assert not (out / "results.json").exists()  # the killed re-run took the old results with it
    subprocess.run(_cmd(big_dataset, out, "[1,5]"), check=True, capture_output=True, timeout=300)
    _assert_consistent(out)
    assert not [n for n in os.listdir(out) if ".tmp-" in n], "a killed run's temp files stay behind"


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_sigint_while_writing_exit_non_zero_with_nothing_half_written(big_dataset, tmp_path, sig, code):
    out = tmp_path / "out"
    rc, err = _run_and_signal(_cmd(big_dataset, out, "[1,3]"), out, sig)
    assert rc == code, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    names = os.listdir(out)
    assert not [n for n in names if ".tmp-" in n], names
    assert "results.json" not in names
    if "rankings.jsonl" in names:
        assert len((out / "rankings.jsonl").read_text().splitlines()) == QUERIES


def test_a_failure_while_writing_leaves_no_results_beside_the_new_config(tiny_dataset_dir, tmp_path, monkeypatch,
                                                                         capsys):
    import toolgraph.evaluation as evaluation

    out = tmp_path / "out"
    base = ["evaluate", "retriever.name=bm25", f"data.name={tiny_dataset_dir}", "--out", str(out)]
    assert cli([*base, "eval.ks=[1,3]"]) == 0

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(evaluation, "plot_curves", disk_full)
    assert cli([*base, "eval.ks=[1,5]"]) == 2  # a full disk is a clear error now, not a traceback (issue 41)
    assert "no space left" in capsys.readouterr().err.lower()
    _assert_consistent_small(out)
    assert not (out / "results.json").exists()
    assert not [n for n in os.listdir(out) if ".tmp-" in n]


def _assert_consistent_small(out: Path) -> None:
    if (out / "results.json").exists():
        res = json.loads((out / "results.json").read_text())
        assert res["config"]["eval"] == yaml.safe_load((out / "config.yaml").read_text())["eval"]


def test_report_names_a_broken_results_file_and_says_to_rerun(tiny_dataset_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["evaluate", "retriever.name=bm25", f"data.name={tiny_dataset_dir}", "--out", str(out)]) == 0
    capsys.readouterr()
    path = out / "results.json"
    path.write_bytes(path.read_bytes()[:40])
    assert cli(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "re-run" in err
    path.write_text("[1, 2]")
    assert cli(["report", str(out)]) == 2
    assert "re-run" in capsys.readouterr().err


def test_evaluate_refuses_an_out_folder_that_is_not_ours(tiny_dataset_dir, tmp_path, capsys):
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("\\section{Intro}\n")
    code = cli(["evaluate", "retriever.name=bm25", f"data.name={tiny_dataset_dir}", "--out", str(mine)])
    assert code == 2 and "refusing" in capsys.readouterr().err
    assert os.listdir(mine) == ["chapter1.tex"]
    afile = tmp_path / "results.txt"
    afile.write_text("keep\n")
    assert cli(["evaluate", "retriever.name=bm25", f"data.name={tiny_dataset_dir}", "--out", str(afile)]) == 2
    assert afile.read_text() == "keep\n"
