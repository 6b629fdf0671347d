"""toolgraph index feedback: a usage log into a live index (votes of the logged queries nearest a request)."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from toolgraph.cli import main as cli
from toolgraph.data.formats import read_dataset
from toolgraph.errors import ConfigError, DataError
from toolgraph.feedback import apply_feedback
from toolgraph.retrieval.feedback import FeedbackRetriever, fuse, minmax, neighbour_votes
from toolgraph.retrieval.loading import load
from toolgraph.sync import sync_index

REPO = Path(__file__).resolve().parents[1]


def dense(tiny_bert_dir):
    return {"name": "dense", "model": str(tiny_bert_dir), "cache_dir": None, "progress": False}


@pytest.fixture
def index(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    sync_index(synthetic_dataset_dir, tmp_path / "idx", dense(tiny_bert_dir))
    return tmp_path / "idx"


def write_log(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def top(index_dir: Path, query: str, k: int = 3) -> list[str]:
    return load(index_dir).retrieve([query], k).ids[0]


def test_votes_are_the_neighbours_share_and_the_gate_grows_with_evidence():
    log = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]), dim=1)
    items = torch.tensor([[2, 1], [2, -1], [0, -1]])
    q = torch.tensor([[1.0, 0.0]])
    votes, evidence = neighbour_votes(q, log, items, torch.ones(3), 3, neighbors=2, kernel=0.1)
    c = torch.exp((torch.tensor([1.0, 0.8]) - 1) / 0.1)  # the two nearest: itself (cos 1) and cos 0.8
    assert evidence.item() == pytest.approx(float(c.sum()))
    assert votes[0].tolist() == pytest.approx([0.0, float(c[0] / c.sum()), 1.0])  # tool 2: both neighbours used it
    base = torch.tensor([[0.9, 0.1, 0.5]])
    assert torch.equal(fuse(base, votes, torch.zeros(1), 1.0, 5.0), minmax(base))  # no evidence: the base order
    weak, strong = fuse(base, votes, evidence * 0.01, 1.0, 5.0), fuse(base, votes, evidence * 100, 1.0, 5.0)
    assert weak.argmax().item() == 0 and strong.argmax().item() == 2  # the log decides only once it is near
    failed = neighbour_votes(q, log, items, torch.tensor([0.0, 1.0, 1.0]), 3, 2, 0.1)[1]
    assert failed.item() == pytest.approx(float(c[1]))  # failed_weight 0: a failed task's calls do not count


def test_feedback_moves_a_logged_request_to_the_tools_it_used_and_keeps_a_cold_index_as_it_was(index, tmp_path):
    query = "please tell me the weather"
    before = top(index, query)
    assert before[0] != "5"
    log = write_log(tmp_path / "log.jsonl", [{"query": query, "tools": ["5", "7"], "ok": True}] * 3
                    + [{"query": "PLEASE tell me   the weather", "tools": ["7", "5"], "time": 10}])
    counts = apply_feedback(log, index)
    assert counts["lines"] == 4 and counts["added"] == 1 and counts["repeated"] == 3 and counts["stored"] == 1
    r = load(index)
    assert isinstance(r, FeedbackRetriever) and len(r.entries) == 1 and r.log_vectors.shape == (1, 32)
    assert set(top(index, query, 2)) == {"5", "7"}  # the request's own log decides
    far = "zzzz qqqq xxxx"  # nothing logged near it (a random tiny BERT puts all texts near: a narrow kernel)
    r.config.kernel = 1e-3
    assert r.retrieve([far], 5).ids == r.base.retrieve([far], 5).ids and set(r.retrieve([query], 2).ids[0]) == {"5", "7"}


def test_a_bad_line_names_file_and_line_and_changes_nothing(index, tmp_path):
    apply_feedback(write_log(tmp_path / "ok.jsonl", [{"query": "news today", "tools": ["5"]}]), index)
    before = snapshot(index)
    cases = {
        "unknown tool": [{"query": "a", "tools": ["1"]}, {"query": "b", "tools": ["nope"]}],
        "bad json": [{"query": "a", "tools": ["1"]}, "{not json"],
        "no tools": [{"query": "a", "tools": ["1"]}, {"query": "b", "tools": []}],
        "bad ok": [{"query": "a", "tools": ["1"]}, {"query": "b", "tools": ["1"], "ok": "yes"}],
        "bad time": [{"query": "a", "tools": ["1"]}, {"query": "b", "tools": ["1"], "time": "yesterday"}],
        "extra key": [{"query": "a", "tools": ["1"]}, {"query": "b", "tools": ["1"], "tool": "1"}],
    }
    for why, rows in cases.items():
        path = write_log(tmp_path / f"{why.replace(' ', '_')}.jsonl", rows)
        with pytest.raises(DataError) as e:
            apply_feedback(path, index)
        assert f"{path}:2:" in str(e.value), why
        assert snapshot(index) == before, why  # all or nothing
    assert len(load(index).entries) == 1


def test_remove_by_query_and_by_time_and_the_cap_drops_the_oldest(index, tmp_path, capsys):
    rows = [{"query": f"tell me the news number {i}", "tools": ["5"], "time": 1000 + i} for i in range(6)]
    apply_feedback(write_log(tmp_path / "log.jsonl", rows), index)
    assert cli(["index", "feedback", "--remove", "--query", "Tell me the news number 2", "--index", str(index)]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 1
    assert cli(["index", "feedback", "--remove", "--before", "1002", "--index", str(index)]) == 0
    assert [e.query for e in load(index).entries] == [f"tell me the news number {i}" for i in (3, 4, 5)]
    counts = apply_feedback(write_log(tmp_path / "more.jsonl", [{"query": "stock price", "tools": ["6"],
                                                                  "time": "2026-11-30T18:02:11Z"}]), index, cap=2)
    assert counts["dropped_by_cap"] == 2 and [e.query for e in load(index).entries] == ["tell me the news number 5",
                                                                                        "stock price"]
    assert load(index).config.max_queries == 2  # the cap is kept in the index
    capsys.readouterr()
    assert cli(["index", "feedback", "--remove", "--index", str(index)]) == 2
    assert "--query TEXT" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="index sync"):
        apply_feedback(tmp_path / "more.jsonl", tmp_path / "no_index")


def test_sync_keeps_the_store_and_a_removed_tool_stops_voting(index, synthetic_dataset_dir, tmp_path):
    apply_feedback(write_log(tmp_path / "log.jsonl", [{"query": "please tell me the weather", "tools": ["5"]}]), index)
    ds = read_dataset(synthetic_dataset_dir)
    smaller = tmp_path / "catalog"
    smaller.mkdir()
    (smaller / "tools.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in ds.tools if t.id != "5"))
    (smaller / "agents.jsonl").write_text((synthetic_dataset_dir / "agents.jsonl").read_text())
    (smaller / "queries.jsonl").write_text("")
    counts = sync_index(smaller, index)
    assert counts["removed"] == 1
    r = load(index)
    assert isinstance(r, FeedbackRetriever) and len(r.entries) == 1  # the log stays the source of truth
    assert "5" not in top(index, "please tell me the weather", 23)


def test_an_agent_index_keeps_its_router_and_fuses_agent_votes(mcp_catalog, tiny_bert_dir, tmp_path):
    idx = tmp_path / "t2a"
    sync_index(mcp_catalog[0], idx, {"name": "t2a", "scorer": "rrf", "dense": dense(tiny_bert_dir)})
    plain = load(idx)
    tools = [t.id for t in plain.tools]
    query = "what should I cook tonight"
    cold = plain.retrieve_agents_and_tools([query], 2)
    target = next(t for t in plain.tools if t.agent != cold[0].ids[0][0])
    apply_feedback(write_log(tmp_path / "log.jsonl", [{"query": query, "tools": [target.id]}]), idx)
    r = load(idx)
    agents, ranked = r.retrieve_agents_and_tools([query], 2)
    assert agents.ids[0][0] == target.agent and ranked.ids[0][0] == target.id and len(ranked.ids[0]) == len(tools)
    other = "zzzz qqqq"
    r.config.kernel = 1e-3  # nothing logged near it: the router's own agent order
    assert r.retrieve_agents_and_tools([other], 2)[0].ids == plain.retrieve_agents_and_tools([other], 2)[0].ids


def env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}


def test_kill_9_during_feedback_leaves_a_whole_index_old_or_new(index, tmp_path):
    apply_feedback(write_log(tmp_path / "first.jsonl", [{"query": "news today", "tools": ["5"]}]), index)
    big = write_log(tmp_path / "big.jsonl", [{"query": f"request {i} about item {i * 7}", "tools": [str(i % 24)]}
                                             for i in range(4000)])
    seen = set()
    for delay in (0.0, 0.5, 1.5):
        proc = subprocess.Popen([sys.executable, "-m", "toolgraph.cli", "index", "feedback", str(big), "--index",
                                 str(index)], env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lock = index.parent / f".{index.name}.lock"
        deadline = time.time() + 120
        while not lock.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        r = load(index)  # a whole index: the old store, or (killed after the swap) the new one
        assert len(r.entries) in (1, 4001) and len(r.log_vectors) == len(r.entries)
        seen.add(len(r.entries))
        if len(r.entries) == 4001:
            apply_feedback(None, index, remove_queries=[f"request {i} about item {i * 7}" for i in range(4000)])
    assert 1 in seen  # at least one kill landed before the swap: the old store served
    counts = apply_feedback(big, index)  # the next run cleans up after the killed ones
    assert counts["stored"] == 4001 and not list(index.parent.glob(f".{index.name}.new-*"))


def test_a_running_server_picks_up_a_feedback_swap_with_no_failed_request(index, tmp_path):
    import threading
    import urllib.request

    from test_serving import free_port, get_json

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "toolgraph.cli", "serve", "--retriever", str(index), "--transport",
                             "http", "--port", str(port)], env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None and time.time() < deadline, "the server did not start"
            try:
                if get_json(base + "/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.3)
        query = "please tell me the weather"
        statuses, stop = [], threading.Event()

        def client():
            while not stop.is_set():
                with urllib.request.urlopen(f"{base}/search?q=please+tell+me+the+weather&k=2", timeout=30) as r:
                    statuses.append(r.status)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        assert cli(["index", "feedback", str(write_log(tmp_path / "log.jsonl", [{"query": query, "tools": ["5", "7"]}])),
                    "--index", str(index)]) == 0
        deadline = time.time() + 60
        while get_json(base + "/health")[1]["reloads"] < 1 and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        health = get_json(base + "/health")[1]
        assert health["reloads"] == 1 and health["reload_errors"] == 0
        assert statuses and set(statuses) == {200}  # every request during the swap answered
        status, body = get_json(base + "/search?q=please+tell+me+the+weather&k=2")
        assert status == 200 and {r["id"] for r in body["results"]} == {"5", "7"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_index_train_swaps_in_a_model_trained_on_the_log_and_keeps_the_log(index, synthetic_dataset_dir, tiny_bert_dir,
                                                                           tmp_path, capsys):
    from toolgraph.feedback import train_index
    from toolgraph.retrieval.dense import DenseRetriever

    ds = read_dataset(synthetic_dataset_dir)
    rows = [{"query": q.text, "tools": list(q.tools), "time": i} for i, q in enumerate(ds.split("train"))]
    rows.append({"query": "a task that failed", "tools": ["3"], "ok": False, "time": 999})
    apply_feedback(write_log(tmp_path / "log.jsonl", rows), index)
    stored = load(index)
    with pytest.raises(ConfigError, match="fewer than --min-queries 1000"):
        train_index(index)
    over = [f"model.encoder={tiny_bert_dir}", "model.freeze_layers=1", "model.grad_tools=8", "trainer.max_steps=12",
            "trainer.accelerator=cpu", "trainer.devices=1", "trainer.enable_progress_bar=false",
            "data.max_query_length=24", "data.max_tool_length=24", "optim.lr=1e-3", "eval.ks=[1,3,5]"]
    capsys.readouterr()
    assert cli(["index", "train", "--index", str(index), "--out", str(tmp_path / "train"), "--config",
                str(REPO / "configs" / "index_train.yaml"), "--min-queries", "50", *(f"--set={o}" for o in over)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["trained_on"] == len(stored.entries) - 1  # the failed task is not a training example
    r = load(index)
    assert isinstance(r, FeedbackRetriever) and isinstance(r.base, DenseRetriever)
    assert [e.query for e in r.entries] == [e.query for e in stored.entries]  # the log stays the source of truth
    assert not torch.allclose(r.log_vectors, stored.log_vectors)  # re-encoded by the trained encoder
    assert (index / "base" / "encoder").is_dir()  # the trained encoder travels with the index
    assert [t.id for t in r.tools] == [t.id for t in stored.tools]
