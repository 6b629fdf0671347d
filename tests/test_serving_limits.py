"""A bounded server (issue 20, findings 4 and 5): request size limits, JSON content type, Host and
Origin checks, a per-request timeout, fixed-size counters, no query vectors on disk, and an index
that cannot be served is never served."""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import anyio
import pytest
from conftest import MCP_SERVERS, write_mcp_catalog

from toolgraph.cli import main as cli
from toolgraph.errors import ConfigError, DataError
from toolgraph.serving import LiveIndex
from toolgraph.sync import read_catalog_any, save_atomically, sync_index

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 60):
    """(status, parsed JSON or text) of one request; HTTP errors are answers, not exceptions."""
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def post_json(url: str, obj, **headers):
    return request(url, json.dumps(obj).encode(), {"Content-Type": "application/json", **headers})


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


def bm25_index(folder: Path, catalog: Path, servers=None) -> Path:
    from toolgraph.retrieval.loading import resolve_retriever

    if servers is not None:
        catalog, _ = write_mcp_catalog(folder.parent / (folder.name + "-catalog"), servers, [])
    r = resolve_retriever({"name": "bm25"}, "retriever")
    r.index(read_catalog_any(catalog)[0])
    r.save(folder)
    return folder


@pytest.fixture(scope="module")
def served(tiny_bert_dir, tmp_path_factory):
    """``toolgraph serve`` over HTTP on 127.0.0.1, default limits, a t2a index over a tiny encoder
    whose embedding cache is the default ``.cache/embeddings`` of the server's working folder."""
    work = tmp_path_factory.mktemp("served")
    catalog, _ = write_mcp_catalog(work / "mcp")
    dense = {"name": "dense", "model": str(tiny_bert_dir), "progress": False}  # cache_dir: the default
    cwd = os.getcwd()
    os.chdir(work)  # the index build caches its tool vectors under work/.cache (allowed)
    try:
        sync_index(catalog, work / "idx", {"name": "t2a", "scorer": "rrf", "dense": dense})
    finally:
        os.chdir(cwd)
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    log = (work / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "toolgraph.cli", "serve", "--retriever", str(work / "idx"),
                             "--transport", "http", "--port", str(port)], env=env, cwd=work,
                            stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {(work / 'server.log').read_text()[-2000:]}")
        try:
            if request(base + "/health", timeout=5)[0] == 200:
                break
        except OSError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError("server did not start within 120 s")
        time.sleep(0.3)
    yield base, work
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


async def mcp_call(url: str, name: str, args: dict):
    from mcp import Client

    async with Client(url) as client:
        return await client.call_tool(name, args)


def test_oversized_queries_and_bodies_are_refused_with_413(served):
    base, _ = served
    long_query = "weather " * 700  # 5,600 characters: over the default 4,096
    status, body = post_json(base + "/search", {"query": long_query, "k": 3})
    assert status == 413 and "4096" in body["error"] and "--max-query-chars" in body["error"]
    status, body = request(base + "/search?" + urllib.parse.urlencode({"q": long_query, "k": 3}))
    assert status == 413 and "--max-query-chars" in body["error"]
    status, body = post_json(base + "/search_agents", {"query": "weather", "k": 3, "pad": "x" * 100_000})
    assert status == 413 and "--max-body-bytes" in body["error"]
    t0 = time.perf_counter()
    status, body = post_json(base + "/search", {"query": "x" * 5_000_000, "k": 3})  # 5 MB: a clean 413, fast
    assert status == 413 and "65536" in body["error"] and time.perf_counter() - t0 < 10
    res = anyio.run(mcp_call, base + "/mcp", "search_tools", {"query": long_query, "k": 3})
    assert res.is_error and "--max-query-chars" in res.content[0].text
    status, body = post_json(base + "/search", {"query": "seven day weather forecast", "k": 3})
    assert status == 200 and len(body["results"]) == 3  # and the server still answers


def test_json_routes_need_json_and_a_local_host_and_origin(served):
    base, _ = served
    q = json.dumps({"query": "weather", "k": 2}).encode()
    status, body = request(base + "/search", q, {"Content-Type": "text/plain"})  # any web page can send this
    assert status == 415 and "application/json" in body["error"]
    assert request(base + "/search", q, {"Content-Type": "application/json; charset=utf-8"})[0] == 200
    status, body = request(base + "/search?q=weather&k=2", headers={"Host": "evil.example:80"})  # DNS rebinding
    assert status == 421 and "--allowed-host" in body["error"]
    assert request(base + "/health", headers={"Host": "evil.example"})[0] == 421
    status, body = post_json(base + "/search", {"query": "weather", "k": 2}, Origin="http://evil.example")
    assert status == 403 and "--allowed-origin" in body["error"]
    assert post_json(base + "/search", {"query": "weather", "k": 2}, Origin="http://localhost:3000")[0] == 200
    assert request(base + "/search?q=weather&k=2", headers={"Host": "localhost:1"})[0] == 200


def test_the_server_writes_no_query_vectors(served):
    base, work = served
    before = files_under(work / ".cache")  # index sync writes no cache (issue 41): empty, and must stay so
    for i in range(12):
        assert request(base + f"/search?q=find+the+weather+number+{i}&k=2")[0] == 200
        assert post_json(base + "/search_agents", {"query": f"book flight {i}", "k": 2})[0] == 200
    res = anyio.run(mcp_call, base + "/mcp", "search_tools", {"query": "convert dollars to euro", "k": 2})
    assert not res.is_error
    assert files_under(work / ".cache") == before
    health = request(base + "/health")[1]
    assert health["requests"] >= 25 and health["errors"] == 0


# ---- in process --------------------------------------------------------------------------------------
@pytest.fixture
def bm25(tmp_path, mcp_catalog):
    return bm25_index(tmp_path / "bm25", mcp_catalog[0])


def test_a_request_not_answered_in_time_gets_a_busy_error(bm25):
    from starlette.testclient import TestClient

    from toolgraph.serving import ServerBusy, build_server, http_app

    live = LiveIndex(bm25, request_timeout=0.3, check_every=0)
    real, calls = live._tools, []

    def slow(qs, k):
        calls.append(len(qs))
        if len(calls) == 1:
            time.sleep(1.0)
        return real(qs, k)

    live._tools = slow
    with pytest.raises(ServerBusy, match="no answer within 0.3 s"):
        live.search_tools("weather", 2)
    with TestClient(http_app(build_server(live)), base_url="http://127.0.0.1:8000") as client:
        time.sleep(1.0)
        r = client.get("/search", params={"q": "weather", "k": 2})
        assert r.status_code == 200 and r.json()["results"]
        live._tools = lambda qs, k: time.sleep(1.0) or real(qs, k)
        r = client.get("/search", params={"q": "weather", "k": 2})
        assert r.status_code == 503 and "--request-timeout" in r.json()["error"]
    assert live.health()["timeouts"] == 2
    with pytest.raises(ConfigError, match="request-timeout"):
        LiveIndex(bm25, request_timeout=0)
    live.close()


def test_counters_are_fixed_size(bm25):
    live = LiveIndex(bm25, check_every=0)
    for i in range(1100):
        live.search_tools(f"weather {i}", 1)
    assert len(live.batches) <= 1024
    health = live.health()
    assert health["requests"] == 1100 and health["batches"] >= 1 and health["mean_batch"] >= 1
    live.close()


def test_the_server_refuses_to_start_on_an_index_it_cannot_serve(bm25, tmp_path, tiny_bert_dir, capsys):
    half = tmp_path / "half"
    shutil.copytree(bm25, half)
    (half / "retriever.json").write_text('{"retriever": "bm2')
    assert cli(["serve", "--retriever", str(half), "--transport", "http", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert str(half) in err and "Traceback" not in err

    # loads (the encoder is read lazily) but cannot answer a query: refused at start, not at the first request
    from toolgraph.retrieval.loading import resolve_retriever

    encoder = tmp_path / "encoder"
    shutil.copytree(tiny_bert_dir, encoder)
    r = resolve_retriever({"name": "dense", "model": str(encoder), "cache_dir": None, "progress": False}, "retriever")
    r.index(read_catalog_any(write_mcp_catalog(tmp_path / "mcp2")[0])[0])
    for f in encoder.glob("*.safetensors"):
        f.unlink()
    r.save(tmp_path / "dense")  # the encoder folder is copied in as it is now: without weights
    with pytest.raises(DataError, match="encoder"):
        LiveIndex(tmp_path / "dense", check_every=0)


def test_a_running_server_keeps_the_last_good_index(bm25, tmp_path, tiny_bert_dir):
    from toolgraph.retrieval.loading import resolve_retriever

    live = LiveIndex(bm25, check_every=0.05)
    before = live.search_tools("seven day weather forecast", 3)
    # an index that loads but cannot answer (its encoder's weights are gone) is swapped in
    encoder = tmp_path / "encoder"
    shutil.copytree(tiny_bert_dir, encoder)
    broken = resolve_retriever({"name": "dense", "model": str(encoder), "cache_dir": None, "progress": False}, "r")
    broken.index(live.retriever.tools)
    for f in encoder.glob("*.safetensors"):
        f.unlink()
    broken.save(tmp_path / "broken")
    os.rename(bm25, tmp_path / "aside")
    os.rename(tmp_path / "broken", bm25)
    time.sleep(1.0)
    assert live.search_tools("seven day weather forecast", 3) == before
    assert live.retriever.name == "bm25"
    # a good one is taken
    servers = MCP_SERVERS + [{"name": "recipes", "description": "Cooking recipes", "category": "Food",
                              "tools": [{"name": "find_recipe", "description": "vegan lasagna recipes",
                                         "inputSchema": {}}]}]
    shutil.rmtree(bm25)
    bm25_index(bm25, None, servers)
    deadline = time.time() + 20
    while len(live.retriever.tools) != 11 and time.time() < deadline:
        time.sleep(0.1)
    assert live.search_tools("vegan lasagna recipes", 1)[0]["id"] == "recipes::find_recipe"
    live.close()


def test_requests_during_index_swaps_never_fail_or_mix(bm25, tmp_path):
    from toolgraph.retrieval.loading import load

    servers = MCP_SERVERS + [{"name": "recipes", "description": "Cooking recipes", "category": "Food",
                              "tools": [{"name": "find_recipe", "description": "vegan lasagna recipes",
                                         "inputSchema": {}}]}]
    a, b = load(bm25), load(bm25_index(tmp_path / "b", None, servers))
    live = LiveIndex(bm25, check_every=0.02)
    errors, answers, stop = [], [], threading.Event()

    def client():
        while not stop.is_set():
            try:
                answers.append({t["id"] for t in live.search_tools("vegan lasagna recipes and weather", 11)})
            except Exception as e:  # noqa: BLE001 - counted below
                errors.append(e)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(6):
        save_atomically(b if i % 2 == 0 else a, bm25)
        time.sleep(0.15)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    live.close()
    assert not errors and answers and live.reloads >= 2
    ids_a, ids_b = {t.id for t in a.tools}, {t.id for t in b.tools}
    assert all(ans in (ids_a, ids_b) for ans in answers)  # every answer from one whole index


def test_a_folder_replaced_during_its_load_is_no_reload_error(bm25, tmp_path, monkeypatch):
    """The soak's swaps come every 1.5 s: a load can read a folder that a second swap renames away
    under it. That torn read is retried on the next look, never counted as a broken index."""
    import toolgraph.serving as serving
    from toolgraph.retrieval.loading import load

    servers = MCP_SERVERS + [{"name": "recipes", "description": "Cooking recipes", "category": "Food",
                              "tools": [{"name": "find_recipe", "description": "vegan lasagna recipes",
                                         "inputSchema": {}}]}]
    a, b = load(bm25), load(bm25_index(tmp_path / "b", None, servers))
    live = LiveIndex(bm25, check_every=0)
    real_open = serving.open_index

    def torn(path):  # the folder is swapped again mid-read, and the read fails
        save_atomically(a, bm25)
        raise DataError("retriever.json vanished", path)

    save_atomically(b, bm25)
    monkeypatch.setattr(serving, "open_index", torn)
    assert live.reload_if_replaced() is False
    assert (live.reloads, live.reload_errors, live.last_error) == (0, 0, None)
    monkeypatch.setattr(serving, "open_index", real_open)
    assert live.reload_if_replaced() is True  # the newer folder, on the next look
    assert (live.reloads, live.reload_errors) == (1, 0)
    assert {t.id for t in live.retriever.tools} == {t.id for t in a.tools}

    def broken(path):  # the same folder fails to load: that is an error, counted once
        raise DataError("cannot serve this index", path)

    save_atomically(b, bm25)
    monkeypatch.setattr(serving, "open_index", broken)
    assert live.reload_if_replaced() is False and live.reload_if_replaced() is False
    assert live.reload_errors == 1 and "cannot serve" in live.last_error
    live.close()
