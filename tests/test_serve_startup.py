"""The server's first minute: ``toolgraph serve`` answers ``initialize`` and ``tools/list`` before the
index is loaded (it loads in the background, and nothing on the way to the first answer imports
torch), the first ``tools/call`` waits for the load or says it is still loading, the cheap checks
refuse a path that cannot be an index at once (exit 2), and an index that fails to load in the
background is never served: the calls get the error naming the file, and the process exits 2."""

import json
import os
import select
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import write_mcp_catalog
from test_serving_limits import bm25_index, free_port, request

import toolgraph
from toolgraph.cli import main as cli
from toolgraph.sync import read_catalog_any

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}

# serve() with the index load held until a gate file exists; the load says whether torch was imported
# before it began (by anything on the way to the server's first answers)
GATED = """
import sys, time
from pathlib import Path
import toolgraph.serving as serving
index, gate, seen, transport, port, timeout = sys.argv[1:7]
real = serving.open_index

def gated(path):
    Path(seen).write_text(",".join(m for m in ("torch", "transformers", "toolgraph.retrieval") if m in sys.modules))
    while not Path(gate).exists():
        time.sleep(0.05)
    return real(path)

serving.open_index = gated
serving.serve(index, transport, port=int(port), request_timeout=float(timeout))
"""


@pytest.fixture
def index(tmp_path, mcp_catalog):
    return bm25_index(tmp_path / "bm25", mcp_catalog[0])


class Stdio:
    """A server process spoken to in raw JSON-RPC lines (so that nothing waits for what it should not)."""

    def __init__(self, argv: list[str], log: Path):
        self.log = log
        self.proc = subprocess.Popen(argv, env=ENV, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log.open("w"))
        self.answers: dict = {}

    def send(self, message: dict) -> None:
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
        self.proc.stdin.flush()

    def reply(self, id_: int, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while id_ not in self.answers:
            if time.monotonic() > deadline:
                raise AssertionError(f"no reply to request {id_} within {timeout} s: {self.log.read_text()[-2000:]}")
            if select.select([self.proc.stdout], [], [], 0.2)[0]:
                line = self.proc.stdout.readline()
                if not line:
                    raise AssertionError(f"the server closed its output: {self.log.read_text()[-2000:]}")
                message = json.loads(line)
                self.answers[message.get("id")] = message
        return self.answers.pop(id_)

    def call(self, id_: int, query: str, k: int = 2, timeout: float = 120) -> dict:
        self.send({"id": id_, "method": "tools/call", "params": {"name": "search_tools",
                                                                  "arguments": {"query": query, "k": k}}})
        return self.reply(id_, timeout)["result"]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait(timeout=30)


def test_initialize_and_tools_list_are_answered_before_the_index_loads(index, tmp_path):
    gate, seen = tmp_path / "gate", tmp_path / "seen"
    server = Stdio([sys.executable, "-c", GATED, str(index), str(gate), str(seen), "stdio", "0", "1.0"],
                   tmp_path / "server.log")
    try:
        server.send({"id": 1, "method": "initialize", "params": INIT})
        info = server.reply(1)["result"]["serverInfo"]
        assert info["name"] == "toolgraph" and info["version"] == toolgraph.__version__
        server.send({"method": "notifications/initialized"})
        server.send({"id": 2, "method": "tools/list"})
        tools = {t["name"]: t for t in server.reply(2)["result"]["tools"]}
        assert sorted(tools) == ["search_agents", "search_tools"]
        for tool in tools.values():  # every parameter is described, k with its bounds
            props = tool["inputSchema"]["properties"]
            assert props["query"]["description"] and props["k"]["description"]
            assert (props["k"]["minimum"], props["k"]["maximum"]) == (1, 100) and "score" in tool["description"]
        early = server.call(3, "weather forecast")  # the load is held: --request-timeout 1 s, then this
        assert early["isError"] and "the index is still loading" in early["content"][0]["text"]
        assert seen.read_text() == ""  # nothing had imported torch (or the retrieval code) before the load
        gate.touch()
        for id_ in range(4, 1000):  # as a client would: retry while it is still loading
            late = server.call(id_, "weather forecast")
            if not late["isError"] or "still loading" not in late["content"][0]["text"]:
                break
        assert not late["isError"], late
        assert [r["rank"] for r in late["structuredContent"]["result"]] == [1, 2]
        server.proc.stdin.close()  # the client leaves: the server ends cleanly
        assert server.proc.wait(timeout=60) == 0
    finally:
        server.stop()
    assert "toolgraph serve: serving" in (tmp_path / "server.log").read_text()


def test_a_client_that_leaves_while_the_index_loads_ends_the_server_at_once(index, tmp_path):
    gate, seen = tmp_path / "gate", tmp_path / "seen"  # the gate stays closed: the load never ends
    server = Stdio([sys.executable, "-c", GATED, str(index), str(gate), str(seen), "stdio", "0", "30"],
                   tmp_path / "server.log")
    try:
        server.send({"id": 1, "method": "initialize", "params": INIT})
        assert server.reply(1)["result"]["serverInfo"]["name"] == "toolgraph"
        server.proc.stdin.close()
        assert server.proc.wait(timeout=60) == 0
    finally:
        server.stop()
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_health_says_loading_until_the_index_is_served(index, tmp_path):
    gate, seen, port = tmp_path / "gate", tmp_path / "seen", free_port()
    proc = subprocess.Popen([sys.executable, "-c", GATED, str(index), str(gate), str(seen), "http", str(port), "30"],
                            env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=(tmp_path / "log").open("w"))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                status, body = request(base + "/health", timeout=5)
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "log").read_text()[-2000:]
                time.sleep(0.2)
        assert status == 503 and body["status"] == "loading" and body["index"] == str(index)
        gate.touch()
        status, body = request(base + "/search?q=weather+forecast&k=2", timeout=60)  # waits for the load
        assert status == 200 and len(body["results"]) == 2
        status, body = request(base + "/health")
        assert status == 200 and body["status"] == "ok" and body["load_seconds"] > 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_an_index_that_fails_to_load_in_the_background_is_never_served(tmp_path, tiny_bert_dir):
    """It passes the cheap checks (a saved retriever), but its encoder has no weights: the first call
    gets the error naming the folder, and the process stops with exit 2 and the error on stderr."""
    from toolgraph.retrieval.loading import resolve_retriever

    encoder = tmp_path / "encoder"
    shutil.copytree(tiny_bert_dir, encoder)
    r = resolve_retriever({"name": "dense", "model": str(encoder), "cache_dir": None, "progress": False}, "retriever")
    r.index(read_catalog_any(write_mcp_catalog(tmp_path / "mcp")[0])[0])
    for f in encoder.glob("*.safetensors"):
        f.unlink()
    broken = r.save(tmp_path / "broken")  # its encoder folder is copied in as it is now: without weights
    server = Stdio([sys.executable, "-m", "toolgraph.cli", "serve", "--retriever", str(broken)], tmp_path / "log")
    try:
        server.send({"id": 1, "method": "initialize", "params": INIT})
        assert server.reply(1)["result"]["serverInfo"]["name"] == "toolgraph"
        server.send({"method": "notifications/initialized"})
        answer = server.call(2, "weather forecast")
        assert answer["isError"] and "cannot be served" in answer["content"][0]["text"]
        assert str(broken) in answer["content"][0]["text"]
        assert server.proc.wait(timeout=60) == 2
    finally:
        server.stop()
    log = (tmp_path / "log").read_text()
    assert f"error: {broken}" in log and "Traceback" not in log


def test_a_path_that_cannot_be_an_index_is_refused_at_once(tmp_path, index, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "run.ckpt").write_bytes(b"half a checkpoint")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "retriever.json").write_text('{"retriever": "bm2')
    cases = [(tmp_path / "missing", "does not exist"), (tmp_path / "notes", "no retriever.json in it"),
             (tmp_path / "run.ckpt", "not a readable checkpoint"),
             (tmp_path / "half" / "retriever.json", "not a folder written by toolgraph index sync"),
             (tmp_path / "half", "not a readable saved retriever")]
    for path, why in cases:
        t0 = time.monotonic()
        assert cli(["serve", "--retriever", str(path)]) == 2  # stdio: refused before the server starts
        err = capsys.readouterr().err
        assert f"error: {path}" in err and why in err and "Traceback" not in err, err
        assert time.monotonic() - t0 < 5  # nothing was loaded to find out
    assert cli(["mcp-config", "--retriever", str(tmp_path / "missing")]) == 2  # the same checks
    assert "does not exist" in capsys.readouterr().err


def test_the_start_of_serve_imports_no_torch(index):
    """What ``toolgraph serve`` runs before its first answer: the CLI, the cheap checks, the MCP server
    with both tools, the stdio transport — and not torch, transformers or the retrieval code."""
    code = f"""
import sys
from toolgraph.cli import build_parser
from toolgraph.serving import LiveIndex, build_server, check_servable
import mcp.server.stdio
build_server(LiveIndex(check_servable({str(index)!r}), background=True))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "lightning", "toolgraph")))
"""
    run = subprocess.run([sys.executable, "-c", code], env=ENV, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().replace("'", '"')) == [
        "toolgraph", "toolgraph.cli", "toolgraph.errors", "toolgraph.files", "toolgraph.serving"]
