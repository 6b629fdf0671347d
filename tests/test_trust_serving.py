"""Issue 41, findings 6 and 8 and four WEAK cases of 9: a saved NaN / inf vector, a vector of
another dtype or width is refused when the retriever loads (a DataError naming the file), and a
non-finite score at query time is an error that the server counts; idle or half-sent connections
cannot take the HTTP server down (connection cap with 503, header timeout with 408); a lone
surrogate over MCP stdio is answered; a client gone mid-body is one log line; a bad --port is a
ConfigError before the index loads; a request line over the parser's limit gets 414, not a reset.

The servers run for real: a subprocess on 127.0.0.1 (a low ``ulimit -n`` where it matters), raw
sockets, a BM25 index (nothing to encode)."""

from __future__ import annotations

import json
import os
import resource
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from conftest import write_mcp_catalog
from safetensors.torch import load_file, save_file
from saved_retrievers import KINDS, QUERIES, VECTOR_FILES, build

import toolgraph
from toolgraph.cli import main as cli
from toolgraph.errors import ConfigError, DataError, ToolgraphError

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
       "PYTHONPATH": str(REPO)}


# ---- finding 6: NaN / inf, dtype and width of saved tensors -----------------------------------------
def _resave_manifests(folder: Path) -> None:
    """As if the changed tensor had been saved so (a model that diverged): every manifest.json is
    written again, the innermost first, so the folder passes its manifest check."""
    from toolgraph.retrieval.manifest import write_manifest

    for m in sorted(folder.rglob("manifest.json"), key=lambda p: -len(p.parts)):
        info = json.loads(m.read_text())
        write_manifest(m.parent, info["retriever"], info["tools"])


def _saved_with(kind: str, tiny_bert_dir: Path, folder: Path, change, name: str | None = None,
                key: str | None = None) -> Path:
    """``build(kind)`` saved to ``folder`` with ``change(tensor)`` written in place of its per-tool
    tensor (or ``name`` / ``key``), under a valid manifest."""
    build(kind, tiny_bert_dir).save(folder)
    name, key = (name, key) if name else VECTOR_FILES[kind]
    tensors = load_file(str(folder / name))
    tensors[key] = change(tensors[key].clone())
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / name))
    _resave_manifests(folder)
    return folder


def _poison(value: float):
    def change(t: torch.Tensor) -> torch.Tensor:
        t[2, 1] = value  # one number of one vector (the third tool's)
        return t
    return change


@pytest.mark.parametrize("kind,value", [(k, float("nan")) for k in KINDS] + [("dense", float("inf")),
                                                                            ("t2a", float("-inf"))])
def test_a_saved_nan_or_inf_vector_is_refused_when_the_retriever_loads(kind, value, tiny_bert_dir, tmp_path):
    folder = _saved_with(kind, tiny_bert_dir, tmp_path / kind, _poison(value))
    name, key = VECTOR_FILES[kind]
    with pytest.raises(DataError, match=rf"{name.split('/')[-1]}: {key} holds 1 NaN or infinite values "
                                        r"\(first in row 2\).*retrain or re-index"):
        toolgraph.load(folder)


def test_a_nan_vector_is_an_error_of_retrieve_and_serve_not_a_rank_one_tool(tiny_bert_dir, tmp_path, capsys):
    from toolgraph.serving import LiveIndex

    folder = _saved_with("dense", tiny_bert_dir, tmp_path / "dense", _poison(float("nan")))
    assert cli(["retrieve", "--checkpoint", str(folder), "-k", "3", "weather"]) == 2
    assert "tool_vectors.safetensors: tool_vectors holds 1 NaN" in capsys.readouterr().err
    with pytest.raises(DataError, match="tool_vectors holds 1 NaN"):  # the server refuses to start on it
        LiveIndex(folder, check_every=0)


@pytest.mark.parametrize("kind,name,key", [(k, *VECTOR_FILES[k]) for k in KINDS]
                         + [("query_knn", "example_vectors.safetensors", "example_vectors")])
def test_saved_vectors_of_another_width_are_refused_when_the_retriever_loads(kind, name, key, tiny_bert_dir,
                                                                             tmp_path):
    """16-wide vectors beside a 32-wide encoder (or the file's other 32-wide tensors): every query
    would fail with a shape error, or compare vectors from two models."""
    folder = _saved_with(kind, tiny_bert_dir, tmp_path / kind, lambda t: t[:, :16], name, key)
    with pytest.raises(DataError, match=r"vectors are (16|32) wide, but .* are (32|16): they come from another "
                                        r"model or save") as e:
        toolgraph.load(folder)
    assert "safetensors" in str(e.value) or "vectors:" in str(e.value), str(e.value)  # the file is named


def test_integer_vectors_are_refused_and_half_precision_ones_are_read_as_float32(tiny_bert_dir, tmp_path):
    for kind in ("dense", "mlc"):
        folder = _saved_with(kind, tiny_bert_dir, tmp_path / f"{kind}-int", lambda t: (t * 100).long())
        with pytest.raises(DataError, match=r"\.safetensors: (tool_vectors|weight) is int64; expected float32"):
            toolgraph.load(folder)
    exact = build("dense", tiny_bert_dir)
    half = toolgraph.load(_saved_with("dense", tiny_bert_dir, tmp_path / "half", lambda t: t.half()))
    assert half.tool_vectors.dtype == torch.float32
    assert half.retrieve(QUERIES, 3).ids == exact.retrieve(QUERIES, 3).ids
    assert torch.allclose(half.retrieve(QUERIES, 3).scores, exact.retrieve(QUERIES, 3).scores, atol=1e-2)


def test_a_non_finite_score_at_query_time_is_an_error_naming_the_tool(tiny_bert_dir):
    """torch.topk orders NaN first: without the check, t3 was every query's first tool."""
    r = build("dense", tiny_bert_dir)
    r.tool_vectors[2, 0] = float("nan")  # e.g. an encoder that overflowed: nothing on disk to refuse
    with pytest.raises(ToolgraphError, match=r"scored 1 of 6 tools NaN or infinite \(first: 't3'\)") as e:
        r.retrieve(QUERIES, 3)
    assert type(e.value).__name__ == "NonFiniteScores"


def test_the_server_counts_a_non_finite_score_and_answers_an_error(tiny_bert_dir, tmp_path):
    from starlette.testclient import TestClient

    from toolgraph.serving import LiveIndex, build_server, http_app

    live = LiveIndex(build("dense", tiny_bert_dir).save(tmp_path / "dense"), check_every=0)
    live.retriever.tool_vectors[2, 0] = float("nan")
    with TestClient(http_app(build_server(live)), base_url="http://127.0.0.1:8000") as client:
        r = client.get("/search", params={"q": "weather forecast", "k": 2})
        assert r.status_code == 500 and "NaN or infinite (first: 't3')" in r.json()["error"]
        r = client.post("/search", json={"query": "book a flight", "k": 2})
        assert r.status_code == 500 and "rebuild the index" in r.json()["error"]
        health = client.get("/health").json()
    assert health["errors"] == 2 and "NonFiniteScores" in health["last_request_error"]
    live.close()


# ---- servers in a subprocess ----------------------------------------------------------------------
LAUNCH = """
import inspect, json, sys
from toolgraph.serving import serve
args = json.loads(sys.argv[1])
known = inspect.signature(serve).parameters  # a serve() without some option runs with the ones it has
serve(**{k: v for k, v in args.items() if k in known})
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 10):
    """(status, body) of a GET; an HTTP error is an answer, a failed connection is (None, the error)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return None, repr(e)


class Server:
    """``serve(index, "http", ...)`` in a subprocess, stderr in a log file; ``nofile``: its ulimit -n."""

    def __init__(self, index: Path, log: Path, nofile: int | None = None, **options):
        self.port, self.log = free_port(), log
        self.base = f"http://127.0.0.1:{self.port}"
        args = {"retriever": str(index), "transport": "http", "port": self.port, **options}

        def limit_files():
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        with log.open("w") as f:
            self.proc = subprocess.Popen([sys.executable, "-c", LAUNCH, json.dumps(args)], env=ENV, cwd=REPO,
                                         stdout=subprocess.DEVNULL, stderr=f, preexec_fn=limit_files)

    def wait_up(self, timeout: float = 120) -> Server:
        deadline = time.monotonic() + timeout
        while get(self.base + "/health", 5)[0] != 200:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited ({self.proc.returncode}): {self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not answer within {timeout} s: {self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory) -> Path:
    from toolgraph.retrieval.loading import resolve_retriever
    from toolgraph.sync import read_catalog_any

    work = tmp_path_factory.mktemp("bm25")
    catalog, _ = write_mcp_catalog(work / "mcp")
    r = resolve_retriever({"name": "bm25"}, "retriever")
    r.index(read_catalog_any(catalog)[0])
    return r.save(work / "idx")


def half_requests(port: int, n: int) -> list[socket.socket]:
    """``n`` sockets that send a request line and one header, never the blank line that ends them."""
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        out.append(s)
    return out


def status_line(s: socket.socket) -> bytes:
    try:
        return s.recv(64).split(b"\r\n")[0]
    except OSError as e:
        return repr(e).encode()


# ---- finding 8: idle connections ------------------------------------------------------------------
def test_half_sent_requests_cannot_take_the_server_down(bm25_index, tmp_path):
    """100 sockets that never finish their headers against a server with 64 file descriptors: it
    used to run out of them and exit. Now the 9th connection on gets 503, the first 8 get 408 after
    the header timeout, and the server answers normally again."""
    server = Server(bm25_index, tmp_path / "server.log", nofile=64, limit_concurrency=8, header_timeout=8)
    try:
        server.wait_up()
        held = half_requests(server.port, 100)
        status, body = get(server.base + "/health")  # while the 8 allowed connections are taken
        assert status == 503 and b"--limit-concurrency" in body, (status, body)
        deadline = time.monotonic() + 90
        while get(server.base + "/health", 5)[0] != 200 and time.monotonic() < deadline:
            assert server.proc.poll() is None, server.log.read_text()[-3000:]
            time.sleep(0.5)
        assert get(server.base + "/health")[0] == 200
        status, body = get(server.base + "/search?q=weather+forecast&k=2")
        assert status == 200 and json.loads(body)["results"], body
        answers = [status_line(s) for s in held]
        assert answers.count(b"HTTP/1.1 408 Request Timeout") >= 1, answers
        assert answers.count(b"HTTP/1.1 503 Service Unavailable") >= 1, answers
        for s in held:
            s.close()
        assert server.proc.poll() is None
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()


def test_a_connection_limit_that_ulimit_cannot_hold_is_refused_at_start(bm25_index, tmp_path):
    server = Server(bm25_index, tmp_path / "server.log", nofile=64, limit_concurrency=100)
    try:
        deadline = time.monotonic() + 120
        while server.proc.poll() is None and time.monotonic() < deadline:
            assert get(server.base + "/health", 2)[0] is None, "the server started"
            time.sleep(0.2)
    finally:
        server.stop()
    assert server.proc.returncode not in (None, 0)
    assert "--limit-concurrency 100 needs about" in server.log.read_text() and "ulimit -n is 64" in server.log.read_text()


def test_limits_are_checked():
    from toolgraph.serving import Limits

    for key, bad in (("limit_concurrency", 0), ("header_timeout", 0), ("keep_alive_timeout", -1.0),
                     ("limit_concurrency", True)):
        with pytest.raises(ConfigError, match=f"--{key.replace('_', '-')} must be"):
            Limits(**{key: bad})


@pytest.mark.parametrize("flag, bad", [("--limit-concurrency", "0"), ("--header-timeout", "0"),
                                       ("--keep-alive-timeout", "-1")])
def test_toolgraph_serve_passes_the_connection_limits(flag, bad, tmp_path, capsys):
    """The options reach serve(): a bad value is refused, naming it, before any index is read."""
    assert cli(["serve", "--retriever", str(tmp_path / "no-index"), "--transport", "http", flag, bad]) == 2
    err = capsys.readouterr().err
    assert f"{flag} must be" in err and "no-index" not in err


# ---- WEAK cases of finding 9 -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain_server(bm25_index, tmp_path_factory):
    server = Server(bm25_index, tmp_path_factory.mktemp("plain") / "server.log").wait_up()
    yield server
    server.stop()


def test_a_request_line_or_headers_over_the_limit_get_414_or_431_not_a_reset(plain_server):
    """A 20 MB request line: the server used to stop reading at its 64 KB limit and close the socket,
    and the kernel answered the rest with a reset (the client never read the 400)."""
    for head, expected in ((b"GET /search?q=" + b"a" * 20_000_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                            b"HTTP/1.1 414 Request-URI Too Long"),
                           (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 20_000_000 + b"\r\n\r\n",
                            b"HTTP/1.1 431 Request Header Fields Too Large")):
        with socket.create_connection(("127.0.0.1", plain_server.port), timeout=30) as s:
            s.sendall(head)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(expected), answer[:200]
        assert b"bytes" in answer.split(b"\r\n\r\n", 1)[1]  # the JSON error says the limit
    assert get(plain_server.base + "/health")[0] == 200


def test_a_client_gone_mid_body_is_one_log_line(plain_server):
    for path in ("/search", "/mcp"):
        with socket.create_connection(("127.0.0.1", plain_server.port), timeout=10) as s:
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{plain_server.port}\r\nContent-Type: application/json\r\n"
                      "Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n"
                      '{"query": "wea'.encode())
            time.sleep(0.3)  # the route is waiting for the rest of the body
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        log = plain_server.log.read_text()
        if log.count("the client disconnected") >= 2 or "Traceback" in log or "ClientDisconnect" in log:
            break
        time.sleep(0.2)
    assert "Traceback" not in log and "ClientDisconnect" not in log, log[-3000:]
    for path in ("/search", "/mcp"):
        assert f"POST {path}: the client disconnected after 14 of 1000 body bytes" in log, log[-3000:]
    assert get(plain_server.base + "/health")[0] == 200


def test_a_bad_port_or_host_is_a_config_error_before_the_index_loads(tmp_path, capsys):
    from toolgraph.serving import serve

    missing = tmp_path / "no-index"  # loading it would be a DataError: the port must be checked first
    with pytest.raises(ConfigError, match=r"--port must be an integer from 0 to 65535 .*got 99999"):
        serve(missing, "http", port=99999)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match=rf"--port {taken.getsockname()[1]}: cannot listen there"):
            serve(missing, "http", port=taken.getsockname()[1])
    with pytest.raises(ConfigError, match="--host 999.1.1.1 --port 8000: cannot listen there"):
        serve(missing, "http", host="999.1.1.1", port=8000)
    assert cli(["serve", "--retriever", str(missing), "--transport", "http", "--port", "99999"]) == 2
    assert "--port must be an integer" in capsys.readouterr().err


def test_a_lone_surrogate_over_mcp_stdio_gets_a_tool_error(bm25_index):
    """JSON "\\ud800" is valid JSON but no valid text: the SDK's parser refused the line and the
    request was never answered."""
    proc = subprocess.Popen([sys.executable, "-m", "toolgraph.cli", "serve", "--retriever", str(bm25_index)],
                            env=ENV, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
    lines = [json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}),
             json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
             r'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "search_tools", '
             r'"arguments": {"query": "weather \ud800", "k": 2}}}',
             r'{"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"cursor": "\udfff"}}',
             json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                         "params": {"name": "search_tools", "arguments": {"query": "weather forecast", "k": 1}}})]
    answers: dict = {}
    try:
        proc.stdin.write("".join(line + "\n" for line in lines).encode())
        proc.stdin.flush()
        deadline = time.monotonic() + 120
        while 4 not in answers and time.monotonic() < deadline:  # the last request: all earlier ones are read
            if select.select([proc.stdout], [], [], 1.0)[0]:
                line = proc.stdout.readline()
                assert line, "the server closed its output"
                reply = json.loads(line)
                answers[reply.get("id")] = reply
    finally:
        proc.kill()
        proc.wait()
    assert answers[4]["result"]["content"] and not answers[4]["result"].get("isError")
    assert 2 in answers, "the request holding a lone surrogate was never answered"
    assert answers[2]["result"]["isError"] and "lone surrogate" in answers[2]["result"]["content"][0]["text"]
    assert answers[3]["error"]["code"] == -32602 and "lone surrogate" in answers[3]["error"]["message"]
