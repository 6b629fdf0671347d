"""Property-based tests (hypothesis) over what reads untrusted input: the canonical dataset reader,
the config loader and the server's request handling. Whatever the input, a failure is a toolgraph
error (DataError naming the file, ConfigError) or, from the server, a 4xx with a JSON message; never a
raw traceback or a 500. What is read successfully keeps its invariants and survives a round trip.

The example count is bounded by the hypothesis profile (tests/conftest.py: ``ci`` when CI is set,
``dev`` otherwise, ``HYPOTHESIS_PROFILE=thorough`` for a long local run)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from toolgraph.config import EvaluateConfig, TrainConfig, load_config  # noqa: E402
from toolgraph.data.formats import read_dataset, write_dataset  # noqa: E402
from toolgraph.data.schema import SPLITS, ToolDataset  # noqa: E402
from toolgraph.errors import ConfigError, DataError, ToolgraphError  # noqa: E402

# ---- JSON-ish values ------------------------------------------------------------------------------
SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False) | st.text(max_size=12))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
IDS = st.sampled_from(["a", "b", "c", "2", "10", "a b", " ", "", "é"]) | st.text(max_size=4)
TEXT = st.sampled_from(["weather in Paris", "  ", "", "x", "🙂 ok", "tab\there"]) | st.text(max_size=16)


def maybe_broken(obj: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    """A record, or the same record with one field dropped or set to any JSON value."""
    def mutate(draw_obj):
        return st.one_of(
            st.just(draw_obj),
            st.sampled_from(sorted(draw_obj) or ["id"]).map(lambda k: {x: v for x, v in draw_obj.items() if x != k}),
            st.tuples(st.sampled_from(sorted(draw_obj) or ["id"]), VALUES).map(lambda kv: {**draw_obj, kv[0]: kv[1]}),
        )
    return obj.flatmap(mutate)


TOOL = maybe_broken(st.fixed_dictionaries(
    {"id": IDS, "name": TEXT, "description": TEXT},
    optional={"agent": IDS, "category": st.text(max_size=5), "parameters": VALUES, "returns": VALUES}))
AGENT = maybe_broken(st.fixed_dictionaries({"id": IDS, "name": TEXT}, optional={"description": TEXT}))
QUERY = maybe_broken(st.fixed_dictionaries(
    {"id": IDS, "text": TEXT, "tools": st.lists(IDS, max_size=4)},
    optional={"split": st.sampled_from([*SPLITS, "dev", ""]), "steps": st.lists(TEXT, max_size=3) | TEXT}))
DEP = maybe_broken(st.fixed_dictionaries({"source": IDS, "target": IDS}, optional={"kind": st.text(max_size=5)}))


def lines(record: st.SearchStrategy[dict]) -> st.SearchStrategy[bytes]:
    """A JSONL file: mostly records, some garbage text, bare JSON values, blank lines and bad bytes."""
    line = st.one_of(
        record.map(lambda r: json.dumps(r).encode()),
        record.map(lambda r: json.dumps(r).encode()),
        record.map(lambda r: json.dumps(r).encode()),
        VALUES.map(lambda v: json.dumps(v).encode()),
        st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.binary(max_size=12),
        st.just(b""),
    )
    return st.lists(line, max_size=6).map(lambda ls: b"\n".join(ls) + b"\n")


FOLDER = st.fixed_dictionaries(
    {"tools.jsonl": lines(TOOL), "queries.jsonl": lines(QUERY)},
    optional={"agents.jsonl": lines(AGENT), "dependencies.jsonl": lines(DEP),
              "meta.json": st.one_of(VALUES.map(lambda v: json.dumps({"skipped": v}).encode()),
                                     VALUES.map(lambda v: json.dumps(v).encode()), st.binary(max_size=8))})


WORDS = st.text(min_size=1, max_size=12).filter(str.strip)


@st.composite
def consistent_folders(draw) -> dict[str, bytes]:
    """A folder that reads (ids unique, every reference known; gold ids and query ids may repeat), then
    perhaps one corruption: a line replaced by garbage, one field broken or dropped, bad bytes."""
    tool_ids = draw(st.lists(WORDS, min_size=1, max_size=5, unique=True))
    agent_ids = draw(st.lists(WORDS, max_size=2, unique=True))
    records: dict[str, list[dict]] = {
        "tools.jsonl": [{"id": t, "name": draw(WORDS), "description": draw(st.text(max_size=12)),
                         **({"agent": draw(st.sampled_from(agent_ids))} if agent_ids and draw(st.booleans()) else {}),
                         **({"parameters": draw(VALUES)} if draw(st.booleans()) else {})} for t in tool_ids],
        "queries.jsonl": [{"id": draw(st.sampled_from(["q1", "q2", "q3", "10", "2"])), "text": draw(WORDS),
                           "tools": draw(st.lists(st.sampled_from(tool_ids), min_size=1, max_size=4)),
                           "split": draw(st.sampled_from(SPLITS)),
                           **({"steps": draw(st.lists(WORDS, min_size=1, max_size=3))} if draw(st.booleans()) else {})}
                          for _ in range(draw(st.integers(0, 5)))],
    }
    if agent_ids:
        records["agents.jsonl"] = [{"id": a, "name": draw(WORDS)} for a in agent_ids]
    if draw(st.booleans()):
        records["dependencies.jsonl"] = [{"source": draw(st.sampled_from(tool_ids)),
                                          "target": draw(st.sampled_from(tool_ids))} for _ in range(draw(st.integers(0, 3)))]
    files = {name: [json.dumps(r, ensure_ascii=draw(st.booleans())).encode() for r in rows]
             for name, rows in records.items()}
    how = draw(st.sampled_from(["none", "none", "line", "field", "drop", "bytes"]))
    name = draw(st.sampled_from(sorted(files)))
    if how != "none" and files[name]:
        i = draw(st.integers(0, len(files[name]) - 1))
        record = json.loads(files[name][i])
        key = draw(st.sampled_from(sorted(record)))
        if how == "line":
            files[name][i] = draw(st.one_of(st.binary(max_size=12), VALUES.map(lambda v: json.dumps(v).encode())))
        elif how == "field":
            files[name][i] = json.dumps({**record, key: draw(VALUES)}).encode()
        elif how == "drop":
            files[name][i] = json.dumps({k: v for k, v in record.items() if k != key}).encode()
        else:
            at = draw(st.integers(0, len(files[name][i])))
            files[name][i] = files[name][i][:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xe9t\xe9", b"\x00"])) \
                + files[name][i][at:]
    return {name: b"\n".join(rows) + b"\n" for name, rows in files.items()}


def canonical(ds: ToolDataset) -> str:
    """Everything a round trip must keep, as text (NaN == NaN, tuples == lists)."""
    return json.dumps([[vars(t) for t in ds.tools], [vars(q) for q in ds.queries], [vars(a) for a in ds.agents],
                       [vars(d) for d in ds.dependencies]], sort_keys=True, default=str)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(files=st.one_of(FOLDER, consistent_folders()), on_duplicate=st.sampled_from(["error", "keep-first", "keep-last"]))
@example(files={"tools.jsonl": b'{"id": "a", "name": "n", "description": "\\ud800"}\n', "queries.jsonl": b""},
         on_duplicate="error")
@example(files={"tools.jsonl": b'{"id": "a", "name": "n", "description": "d"}\n',
                "queries.jsonl": b'{"id": "q", "text": "t", "tools": ["a", "a"], "steps": "abc"}\n'},
         on_duplicate="error")
@example(files={"tools.jsonl": b'{"id": "a", "name": "n", "description": "d"}\n',
                "queries.jsonl": b'{"id": "q", "text": "t", "tools": ["a", "a"]}\n{"id": "q", "text": "u", "tools": ["a"]}\n'},
         on_duplicate="keep-last")
@example(files={"tools.jsonl": b'{"id": "caf\xe9", "name": "n", "description": "d"}\n', "queries.jsonl": b""},
         on_duplicate="error")
@example(files={"tools.jsonl": b"[" * 50_000 + b"\n", "queries.jsonl": b""}, on_duplicate="error")
def test_read_dataset_is_a_dataset_or_a_data_error_naming_the_file(files, on_duplicate):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ds"
        folder.mkdir()
        for name, data in files.items():
            (folder / name).write_bytes(data)
        try:
            ds = read_dataset(folder, on_duplicate=on_duplicate)
        except DataError as e:
            assert e.path is not None and Path(e.path).parent == folder, str(e)
            assert Path(e.path).name in files, str(e)
            assert str(e).startswith(f"{e.path}:"), str(e)
            event(f"DataError: {str(e)[len(e.path) + 1:].split(':', 2)[-1].strip()[:25]}")
            return
        event(f"read: {len(ds.tools)} tools, {len(ds.queries)} queries")
        tool_ids = {t.id for t in ds.tools}
        assert len(tool_ids) == len(ds.tools) and len({q.id for q in ds.queries}) == len(ds.queries)
        for q in ds.queries:
            assert q.tools and len(set(q.tools)) == len(q.tools) and set(q.tools) <= tool_ids
            assert q.split in SPLITS and q.text.strip()
            assert q.steps is None or all(isinstance(s, str) and s.strip() for s in q.steps)
        back = read_dataset(write_dataset(ds, Path(tmp) / "copy"), name=ds.name)
        assert canonical(back) == canonical(ds)


# ---- the config loader ---------------------------------------------------------------------------
KEYS = {
    "data": ["name", "root", "split", "setting", "seed", "options", "nope"],
    "retriever": ["name", "k1", "b", "method", "nope"],
    "eval": ["ks", "metrics", "depth", "batch_size", "agent_level", "max_queries", "query_mode", "steps",
             "step_merge", "nope"],
    "out": None, "defaults": None, "nope": None,
}
CONFIG_VALUES = st.one_of(
    VALUES, st.sampled_from(["bm25", "dense", "toollens", "standard", "noise-10", "recall", "ndcg", "max", "rrf",
                             "${oc.env:HOME}", "${nope}", "???", "!!python/object:os.system", [1, 5], [0], -3]))


@st.composite
def config_dicts(draw):
    out = {}
    for section in draw(st.lists(st.sampled_from(sorted(KEYS)), max_size=4, unique=True)):
        if KEYS[section] is None or draw(st.booleans()) and draw(st.booleans()):
            out[section] = draw(CONFIG_VALUES)
            continue
        out[section] = {k: draw(CONFIG_VALUES) for k in draw(st.lists(st.sampled_from(KEYS[section]), max_size=4,
                                                                        unique=True))}
    return out


OVERRIDES = st.lists(st.one_of(
    st.tuples(st.sampled_from(["data.name", "data.seed", "eval.ks", "eval.depth", "eval.metrics", "retriever.name",
                               "retriever.k1", "out", "nope", "data.options.x", "eval"]),
              st.sampled_from(["1", "-1", "[1,2]", "abc", "", "null", "${oc.env:HOME}", "[", "{a: 1}", "bm25",
                               "1e999", "'x'"])).map("=".join),
    st.text(max_size=15)), max_size=3)


def _expect_config_error(fn):
    try:
        fn()
    except ConfigError as e:
        assert str(e).strip()
    except ToolgraphError as e:  # e.g. an unknown registry name: still one of ours, with a message
        assert str(e).strip()


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(values=config_dicts(), overrides=OVERRIDES)
@example(values={}, overrides=["data.name=["])
@example(values={"retriever": "${nope}"}, overrides=[])
@example(values={}, overrides=["eval=${oc.env:HOME}", "eval=[1,2]"])
def test_load_config_from_dicts_and_overrides_fails_only_with_config_errors(values, overrides):
    _expect_config_error(lambda: load_config(EvaluateConfig, [values], overrides))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(values=config_dicts(), raw=st.one_of(st.none(), st.text(max_size=40),
                                           st.sampled_from(["a: [1", "!!python/object/apply:os.system ['true']",
                                                            "- 1\n- 2", "data: {name: x}\ndata: {name: y}",
                                                            "defaults: [self.yaml]", "defaults: 3", "\t: x",
                                                            "a: &x [*x]", "\x00"])))
@example(values={}, raw="a: &x [*x]")
@example(values={"defaults": "${nope}"}, raw=None)
@example(values={"defaults": ["\x00"]}, raw=None)
def test_load_config_from_yaml_text_fails_only_with_config_errors(values, raw):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "self.yaml"
        path.write_text(yaml.safe_dump(values) if raw is None else raw, encoding="utf-8")
        _expect_config_error(lambda: load_config(EvaluateConfig, [path]))
        _expect_config_error(lambda: load_config(TrainConfig, [path]))


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=30))
@example(data=b"\x80")
def test_load_config_from_bytes_fails_only_with_config_errors(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_bytes(data)
        _expect_config_error(lambda: load_config(EvaluateConfig, [path]))


# ---- the server's request handling ---------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The ASGI app of ``toolgraph serve`` over a small BM25 index, in process, and its MCP server."""
    from conftest import MCP_SERVERS, write_mcp_catalog
    from starlette.testclient import TestClient

    from toolgraph import serving
    from toolgraph.retrieval.loading import resolve_retriever
    from toolgraph.sync import read_catalog_any

    tmp = tmp_path_factory.mktemp("served")
    catalog, _ = write_mcp_catalog(tmp / "mcp", MCP_SERVERS, [])
    retriever = resolve_retriever({"name": "bm25"}, "retriever")
    retriever.index(read_catalog_any(catalog)[0])
    retriever.save(tmp / "idx")
    server = serving.build_server(serving.LiveIndex(tmp / "idx"))
    app = serving.http_app(server) if hasattr(serving, "http_app") else server.streamable_http_app()
    with TestClient(app, base_url="http://127.0.0.1:8000", raise_server_exceptions=False) as client:
        yield client, server


QUERY_TEXT = st.one_of(st.text(max_size=30), st.sampled_from(["weather in Paris", "", " ", "\x00", "\ud800", "a" * 3000]))
K = st.one_of(st.integers(-5, 200), st.sampled_from([0, 1, 5, 100, 101, 10**30]), VALUES)


def _check_response(resp) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:300])
    if resp.status_code >= 400:
        body = resp.json()  # a JSON message, not an HTML traceback
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"].strip(), body
    else:
        body = resp.json()
        assert isinstance(body["results"], list)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None)
@given(route=st.sampled_from(["/search", "/search_agents"]), query=QUERY_TEXT, k=K,
       body=st.one_of(st.none(), st.binary(max_size=40), VALUES.map(lambda v: json.dumps(v).encode())),
       content_type=st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", None]),
       method=st.sampled_from(["GET", "POST"]),
       origin=st.sampled_from([None, None, "http://127.0.0.1:3000", "https://evil.example", "null"]),
       host=st.sampled_from([None, None, "localhost:8000", "evil.example", ""]))
@example(route="/search", query="\ud800", k=1, body=None, content_type="application/json", method="POST", origin=None,
         host=None)
@example(route="/search_agents", query="x", k=2, body=b"\xff\xfe", content_type="application/json", method="POST",
         origin=None, host=None)
@example(route="/search", query="x", k=2, body=b'{"query": "x", "k": 1e400}', content_type="text/plain",
         method="POST", origin=None, host=None)
@example(route="/search", query="x", k=2, body=b"[" * 100_000, content_type="application/json", method="POST",
         origin=None, host=None)
def test_json_routes_answer_or_refuse_with_a_4xx_message(served, route, query, k, body, content_type, method, origin,
                                                         host):
    client, _ = served
    headers = {**({"origin": origin} if origin else {}), **({"host": host} if host is not None else {})}
    if method == "GET":
        params = {"q": query.encode("utf-8", "surrogatepass").decode("utf-8", "replace"), "k": str(k)}
        _check_response(client.get(route, params=params, headers=headers))
        return
    if body is None:  # a well-formed envelope around generated values
        body = json.dumps({"query": query, "k": k}).encode()
    if content_type:
        headers["content-type"] = content_type
    _check_response(client.post(route, content=body, headers=headers))


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture], deadline=None)
@given(tool=st.sampled_from(["search_tools", "search_agents"]),
       args=st.one_of(st.fixed_dictionaries({"query": QUERY_TEXT, "k": K}), st.dictionaries(st.text(max_size=6),
                                                                                           VALUES, max_size=3)))
@example(tool="search_tools", args={"query": "\ud800", "k": 1})
@example(tool="search_agents", args={"query": "x", "k": 10**30})
def test_mcp_tool_arguments_answer_or_refuse_with_a_tool_error(served, tool, args):
    import anyio
    from mcp.server.mcpserver.exceptions import ToolError

    _, server = served

    async def call():
        return await server.call_tool(tool, args)

    try:
        result = anyio.run(call)
    except ToolError as e:  # what the MCP client sees as is_error with this text
        assert str(e).strip()
        assert "Traceback" not in str(e)
        return
    assert not getattr(result, "is_error", False) or result.content
