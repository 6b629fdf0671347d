import json
from pathlib import Path

import pytest

from toolgraph.data.sources.seal_tools import load_seal_tools
from toolgraph.errors import ConfigError, DataError


@pytest.mark.realdata
def test_seal_tools_real(data_root):
    ds = load_seal_tools(data_root)
    st = ds.stats()
    assert st["tools"] == 4076 and st["agents"] == 0
    assert st["queries"] == {"train": 0, "val": 700, "test": 1354}
    assert st["dependencies"] == 102
    assert st["skipped"] == {"reference to the output of a later call (no edge)": 1,
                             "repeated call of an API already in the query's gold list": 4}
    assert len({t.category for t in ds.tools}) == 2276
    q = {x.id: x for x in ds.queries}
    assert q["dev-easy-0"].tools == ("getHealthWorkforce",)
    assert q["dev-difficult-328"].tools == ("simulateHardware", "getEmbeddedSystemInfo", "resetDeviceSettings")
    assert q["test_out_domain-difficult-241"].split == "test"
    tool = ds.tool_by_id()["getHealthWorkforce"]
    assert tool.description == "Retrieve information about the health workforce in a specific location"
    assert tool.category == "Public Health/Health Workforce"
    assert tool.parameters["required"] == ["location"]
    edges = {(d.source, d.target, d.kind) for d in ds.dependencies}
    # searchCrop produces API_call_1..5, read by getAvailableResources' "location" (dev-difficult-200)
    assert ("getAvailableResources", "searchCrop", "data") in edges
    assert ("submitReview", "getLanguageEvolution", "data") in edges
    # the ill-ordered record (audit reads a later call's output) yields no edge
    assert not any(s == "performSecurityAudit" for s, _, _ in edges)

    only_in = load_seal_tools(data_root, test="in")
    assert only_in.stats()["queries"]["test"] == 700
    assert only_in.skipped["test_out_domain.jsonl query left out by option test='in'"] == 654
    assert load_seal_tools(data_root, test="out").stats()["queries"]["test"] == 654


@pytest.mark.realdata
def test_seal_tools_labels_agree_with_dpr(data_root):
    """The authors' DPR files hold one positive per call; ours are the calls' APIs, each once."""
    ds = load_seal_tools(data_root)
    by_text = {q.text: q.tools for q in ds.queries}
    agree = total = 0
    for name in ("dev", "test_in_domain", "test_out_domain"):
        dpr: dict[str, list[str]] = {}
        for row in json.loads((data_root / "seal-tools" / "DPR_Training" / f"{name}_split.json").read_text()):
            dpr.setdefault(row["question"], []).extend(p["title"] for p in row["positive_ctxs"])
        for text, titles in dpr.items():
            total += 1
            agree += by_text.get(text) == tuple(dict.fromkeys(titles))
    assert (agree, total) == (2054, 2054)


def _tool(name: str, **extra) -> dict:
    return {"api_name": name, "api_description": f"{name} does things", "field": "Test/Unit",
            "parameters": {"x": {"type": "str", "description": "an x"}}, "required": ["x"],
            "responses": {"out": {"type": "str", "description": "result"}}, **extra}


def _write(root: Path, tools: list, files: dict[str, list]) -> Path:
    folder = root / "seal-tools" / "Seal-Tools_Dataset"
    folder.mkdir(parents=True)
    (folder / "tool.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tools))
    for name in ("dev.jsonl", "test_in_domain.jsonl", "test_out_domain.jsonl"):
        rows = files.get(name, [])
        (folder / name).write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows))
    return folder


def _rec(qid: str, calls: list[tuple[str, dict, list[str]]], text: str = "do it") -> dict:
    return {"id": qid, "query": text,
            "calling": [{"api": a, "parameters": p, "responses": r} for a, p, r in calls]}


def test_seal_tools_labels_and_dependencies(tmp_path):
    tools = [_tool("a"), _tool("b"), _tool("c")]
    dev = [
        # b reads API_call_2, which is a's *second* output label: the producer is call 0, not call 2
        _rec("dev-difficult-0", [("a", {}, ["API_call_0", "API_call_1", "API_call_2"]),
                                 ("b", {"x": "API_call_2 response"}, ["API_call_3"]),
                                 ("c", {"x": ["API_call_3"]}, ["API_call_4"])]),
        _rec("dev-difficult-1", [("a", {"x": "API_call_1"}, ["API_call_0"]), ("c", {}, ["API_call_1"]),
                                 ("a", {}, ["API_call_2"])]),
        _rec("dev-easy-2", [("zzz", {}, ["API_call_0"])]),
        _rec("dev-easy-3", [("a", {"x": "API_call_9"}, ["API_call_0"])]),
    ]
    _write(tmp_path, tools, {"dev.jsonl": dev, "test_out_domain.jsonl": [_rec("test_out_domain-easy-0", [("c", {}, [])])]})
    ds = load_seal_tools(tmp_path)
    q = {x.id: x for x in ds.queries}
    assert q["dev-difficult-0"].tools == ("a", "b", "c") and q["dev-difficult-0"].split == "val"
    assert q["dev-difficult-1"].tools == ("a", "c")
    assert q["test_out_domain-easy-0"].split == "test"
    assert "dev-easy-2" not in q
    assert {(d.source, d.target, d.kind) for d in ds.dependencies} == {("b", "a", "data"), ("c", "b", "data")}
    assert ds.skipped == {"query calling an API missing from tool.jsonl": 1,
                          "repeated call of an API already in the query's gold list": 1,
                          "reference to the output of a later call (no edge)": 1,
                          "API_call reference that no call produces (no edge)": 1}
    assert load_seal_tools(tmp_path, dependency_splits=["test"]).dependencies == []
    assert load_seal_tools(tmp_path, test="in").skipped["test_out_domain.jsonl query left out by option test='in'"] == 1


def test_seal_tools_malformed_json(tmp_path):
    _write(tmp_path, [_tool("a")], {"test_in_domain.jsonl": [json.dumps(_rec("t-0", [("a", {}, [])])) + "\n",
                                                             '{"id": "t-1", "query": \n']})
    with pytest.raises(DataError, match=r"test_in_domain\.jsonl:2: malformed JSON"):
        load_seal_tools(tmp_path)


def test_seal_tools_missing_fields(tmp_path):
    _write(tmp_path, [_tool("a")], {"dev.jsonl": [{"id": "d-0", "query": "hi"}]})
    with pytest.raises(DataError, match=r"dev\.jsonl:1: query: missing field 'calling'"):
        load_seal_tools(tmp_path)
    bad_tool = {k: v for k, v in _tool("b").items() if k != "api_description"}
    _write(tmp_path / "t", [_tool("a"), bad_tool], {})
    with pytest.raises(DataError, match=r"tool\.jsonl:2: tool: missing field 'api_description'"):
        load_seal_tools(tmp_path / "t")
    _write(tmp_path / "c", [_tool("a")], {"dev.jsonl": [{"id": "d-0", "query": "hi", "calling": [{"name": "a"}]}]})
    with pytest.raises(DataError, match=r"dev\.jsonl:1: call: missing field 'api'"):
        load_seal_tools(tmp_path / "c")


def test_seal_tools_bad_options(tmp_path):
    _write(tmp_path, [_tool("a")], {})
    with pytest.raises(ConfigError, match="test='both'"):
        load_seal_tools(tmp_path, test="both")
    with pytest.raises(ConfigError, match="dependency_splits"):
        load_seal_tools(tmp_path, dependency_splits=["dev"])
