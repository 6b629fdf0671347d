"""The MCP server and index sync, for real: a server process on 127.0.0.1, a real MCP client session."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import pytest
from conftest import MCP_SERVERS, write_mcp_catalog

from toolgraph.cli import main as cli
from toolgraph.errors import ConfigError, DataError
from toolgraph.retrieval.loading import load as load_index
from toolgraph.serving import LiveIndex
from toolgraph.sync import recover, save_atomically, sync_index

REPO = Path(__file__).resolve().parents[1]


def spec(tiny_bert_dir):
    return {"name": "t2a", "scorer": "rrf",
            "dense": {"name": "dense", "model": str(tiny_bert_dir), "cache_dir": None, "progress": False}}


@pytest.fixture
def index(mcp_catalog, tiny_bert_dir, tmp_path):
    counts = sync_index(mcp_catalog[0], tmp_path / "idx", spec(tiny_bert_dir))
    assert counts["created"] and counts["encoded"] == 10 + 5 and counts["added"] == 15
    return tmp_path / "idx"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, data: dict | None = None):
    req = urllib.request.Request(url, data=json.dumps(data).encode() if data is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture
def http_server(index):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "toolgraph.cli", "serve", "--retriever", str(index),
                             "--transport", "http", "--port", str(port)], env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if get_json(base + "/health")[0] == 200:
                break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.3)
    else:
        proc.kill()
        raise RuntimeError("server did not start within 120 s")
    yield base, index
    proc.terminate()
    proc.wait(timeout=30)


async def mcp_calls(target, calls):
    from mcp import Client

    async with Client(target) as client:
        listed = await client.list_tools()
        out = [sorted(t.name for t in listed.tools)]
        for name, args in calls:
            out.append(await client.call_tool(name, args))
        return out


def test_mcp_over_streamable_http_and_json_routes(http_server):
    base, idx = http_server
    local = LiveIndex(idx)
    names, tools, agents, bad = anyio.run(mcp_calls, base + "/mcp", [
        ("search_tools", {"query": "seven day weather forecast", "k": 3}),
        ("search_agents", {"query": "book a flight", "k": 2}),
        ("search_tools", {"query": "x", "k": 0})])
    assert names == ["search_agents", "search_tools"]
    assert not tools.is_error and tools.structured_content["result"] == local.search_tools("seven day weather forecast", 3)
    got = agents.structured_content["result"]
    assert [a["id"] for a in got] == [a["id"] for a in local.search_agents("book a flight", 2)]
    assert all(t["id"].startswith(a["id"] + "::") and t["name"] for a in got for t in a["tools"])
    assert [a["rank"] for a in got] == [1, 2] and [t["rank"] for t in tools.structured_content["result"]] == [1, 2, 3]
    assert bad.is_error and "k must be an integer" in bad.content[0].text

    status, body = get_json(base + "/search?q=seven+day+weather+forecast&k=3")
    assert status == 200 and body["results"] == local.search_tools("seven day weather forecast", 3)
    status, body = get_json(base + "/search_agents", {"query": "book a flight", "k": 2})
    assert status == 200 and [a["id"] for a in body["results"]] == [a["id"] for a in got]
    assert get_json(base + "/search?k=3")[0] == 400  # no query
    assert get_json(base + "/search", {"query": "x", "k": 1000})[0] == 400


def test_running_server_follows_a_sync(http_server, tmp_path):
    base, idx = http_server
    servers = MCP_SERVERS + [{"name": "recipes", "description": "Cooking recipes", "category": "Food",
                              "tools": [{"name": "find_recipe", "description": "vegan lasagna recipes",
                                         "inputSchema": {}}]}]
    catalog, _ = write_mcp_catalog(tmp_path / "v2", servers, [])
    counts = sync_index(catalog, idx)
    assert counts["added"] == 2 and counts["encoded"] == 2 and not counts["created"]
    deadline = time.time() + 30  # the server checks once a second and loads the new index beside the old
    while get_json(base + "/health")[1]["reloads"] < 1 and time.time() < deadline:
        time.sleep(0.2)
    status, body = get_json(base + "/search?q=vegan+lasagna+recipes&k=11")
    assert status == 200 and "recipes::find_recipe" in [r["id"] for r in body["results"]]
    assert get_json(base + "/health")[1]["reloads"] == 1 and get_json(base + "/health")[1]["tools"] == 11


def test_mcp_over_stdio(index):
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, env=env(),
                                   args=["-m", "toolgraph.cli", "serve", "--retriever", str(index)])
    names, res = anyio.run(mcp_calls, params, [("search_tools", {"query": "convert dollars to euro", "k": 2})])
    assert names == ["search_agents", "search_tools"]
    assert res.structured_content["result"] == LiveIndex(index).search_tools("convert dollars to euro", 2)


def test_sync_counts_and_cli(index, tmp_path, capsys):
    servers = [dict(s) for s in MCP_SERVERS[:4]]  # finance removed
    servers[0] = dict(servers[0], description="Forecasts")  # one agent changed
    catalog, _ = write_mcp_catalog(tmp_path / "v2", servers, [])
    assert cli(["index", "sync", str(catalog), "--index", str(index)]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["removed"] == 3 and counts["updated"] == 1 and counts["encoded"] == 1 and counts["tools"] == 8
    assert cli(["index", "sync", str(catalog), "--index", str(index)]) == 0
    assert json.loads(capsys.readouterr().out)["encoded"] == 0
    assert cli(["index", "sync", str(tmp_path / "missing.json"), "--index", str(index)]) == 2


def test_sync_cli_creates_an_index_from_a_retriever_config(mcp_catalog, tiny_bert_dir, tmp_path, capsys):
    import yaml

    cfg = tmp_path / "t2a.yaml"
    cfg.write_text(yaml.safe_dump({"retriever": spec(tiny_bert_dir)}))
    assert cli(["index", "sync", str(mcp_catalog[0]), "--index", str(tmp_path / "new"),
                "--retriever-config", str(cfg)]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["created"] and counts["encoded"] == 15
    assert load_index(tmp_path / "new").name == "t2a"
    bad = tmp_path / "bad.yaml"
    bad.write_text("retriever:\n  name: t2a\n  scorer: [rrf\n")
    assert cli(["index", "sync", str(mcp_catalog[0]), "--index", str(tmp_path / "other"),
                "--retriever-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:" in err and "invalid YAML" in err and not (tmp_path / "other").exists()


def test_crash_while_saving_leaves_the_old_index(index, monkeypatch, tmp_path):
    r = load_index(index)
    before = r.retrieve(["weather"], 3).ids
    catalog, _ = write_mcp_catalog(tmp_path / "v2", MCP_SERVERS[:2], [])
    from toolgraph.retrieval.agents import AgentRetriever

    def crash(self, folder):
        (Path(folder) / "retriever.json").write_text("{half")
        raise OSError("disk full")

    monkeypatch.setattr(AgentRetriever, "_save_state", crash)
    with pytest.raises(OSError, match="disk full"):
        sync_index(catalog, index)
    monkeypatch.undo()
    assert not list(index.parent.glob(".idx.new-*"))
    assert load_index(index).retrieve(["weather"], 3).ids == before  # untouched


def test_crash_between_the_renames_is_recovered(index):
    r = load_index(index)
    old = index.parent / ".idx.old-4242"
    os.rename(index, old)  # as if the process died right after moving the old index aside
    assert recover(index) and index.is_dir() and not old.exists()
    assert load_index(index).retrieve(["weather"], 2).ids == r.retrieve(["weather"], 2).ids
    save_atomically(r, index)  # a plain re-save swaps cleanly
    assert [p.name for p in index.parent.glob(".idx.*")] == []  # nothing left beside it (the lock file is removed)


def test_sync_of_a_plain_tool_index_and_a_missing_catalog(tmp_path, mcp_catalog, tiny_bert_dir):
    from toolgraph.retrieval.loading import resolve_retriever

    r = resolve_retriever({"name": "bm25"}, "r")
    r.index(load_index_tools(mcp_catalog))
    r.save(tmp_path / "bm25")
    assert sync_index(mcp_catalog[0], tmp_path / "bm25")["unchanged"] == 10
    with pytest.raises(DataError, match="catalog not found"):
        sync_index(tmp_path / "nope.json", tmp_path / "x")


def load_index_tools(mcp_catalog):
    from toolgraph.sync import read_catalog_any

    return read_catalog_any(mcp_catalog[0])[0]


def test_plain_retrievers_serve_agents_by_roll_up(tmp_path, mcp_catalog):
    from toolgraph.retrieval.loading import resolve_retriever

    r = resolve_retriever({"name": "bm25"}, "r")
    r.index(load_index_tools(mcp_catalog))
    r.save(tmp_path / "bm25")
    live = LiveIndex(tmp_path / "bm25")
    agents = live.search_agents("book a seat on a flight", 2)
    assert agents[0]["id"] == "flights" and agents[0]["tools"][0]["id"] == "flights::book_flight"
    assert agents[0]["score"] == agents[0]["tools"][0]["score"]  # rolled up: an agent scores as its best tool
    with pytest.raises(ValueError, match="non-empty"):
        live.search_tools("  ", 2)


def test_concurrent_requests_are_batched_and_answered_exactly(index):
    from concurrent.futures import ThreadPoolExecutor

    live = LiveIndex(index)
    queries = ["weather in paris", "book a flight", "hotel rooms", "stock price", "web page", "convert money"]
    sequential = [live.search_tools(q, 3) for q in queries] + [live.search_agents(q, 2) for q in queries]
    real, first = live._tools, [True]

    def slow(qs, k):  # hold the worker on the first batch so the other requests pile up behind it
        if first[0]:
            first[0] = False
            time.sleep(0.5)
        return real(qs, k)

    live._tools = slow
    live.batches.clear()
    with ThreadPoolExecutor(12) as pool:
        futs = [pool.submit(live.search_tools, q, 3) for q in queries]
        futs += [pool.submit(live.search_agents, q, 2) for q in queries]
        got = [f.result() for f in futs]
    assert [[t["id"] for t in r] for r in got] == [[t["id"] for t in r] for r in sequential]
    assert max(live.batches) > 1 and sum(live.batches) == 12
    one = LiveIndex(index, max_batch=1)
    assert one.search_tools(queries[0], 3) == sequential[0] and set(one.batches) == {1}
    with pytest.raises(ConfigError, match="max_batch"):
        LiveIndex(index, max_batch=0)
