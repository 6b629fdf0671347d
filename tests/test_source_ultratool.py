import json
from pathlib import Path

import pytest

from toolgraph.data.schema import Dependency
from toolgraph.data.sources.ultratool import load_ultratool
from toolgraph.data.sources.ultratool_original import load_ultratool_original, normalize_text
from toolgraph.errors import ConfigError, DataError

_SKIP_REPEAT = "repeated call of a tool already in the request's gold list"
_SKIP_SELF = "task link from a tool to itself (no self-edge)"
_SKIP_EXTRA = "request in user_requests.json without a plan in data.json"
_SKIP_DEDUPE = "train request also in the original UltraTool test (dedupe_original)"


@pytest.mark.realdata
def test_ultratool_real(data_root):
    ds = load_ultratool(data_root)
    st = ds.stats()
    assert st["tools"] == 260 and st["agents"] == 0
    assert st["queries"] == {"train": 2229, "val": 248, "test": 500}
    assert st["max_labels_per_query"] == 5
    assert st["dependencies"] == 568
    assert st["skipped"] == {_SKIP_REPEAT: 37, _SKIP_EXTRA: 11, _SKIP_SELF: 36, _SKIP_DEDUPE: 550}
    assert ds.notes["tools_enriched_from_original"] == 184
    assert ds.notes["descriptions_from_original"] == 10
    overlap = ds.notes["original_overlap_ids"]
    assert len(overlap["train"]) == 550 and len(overlap["test"]) == 89
    assert overlap["test"][:3] == ["2898", "2901", "2910"]

    q = {x.id: x for x in ds.queries}
    assert q["3186"].text == ("I need to cancel the single alarm set for 8:00 AM today, and change the daily alarm "
                              "from 7:00 AM to 6:30 AM every day.")
    assert q["3186"].tools == ("clock_alarm_cancel", "clock_alarm_change") and q["3186"].split == "test"
    assert q["202"].tools == ("team_collaboration_tool", "route_planning")
    assert Dependency("clock_alarm_change", "clock_alarm_cancel", "sequence") in ds.dependencies
    tools = ds.tool_by_id()
    agenda = tools["search_agenda"]  # reformat's text is the longer one; schema from the original
    assert agenda.description == "Search Agenda Schedule Tool. Search for any other schedules"
    assert agenda.category == "Agenda, Meeting"
    assert list(agenda.parameters["properties"])[:2] == ["agenda_id", "agenda_keyword"]
    sms = tools["send_sms"]  # no original definition of that name
    assert sms.description == "SMS notification sending tool" and sms.parameters is None and sms.returns is None

    # no train/val request is an original test question; without dedupe 550 are
    original = {normalize_text(x.text) for x in load_ultratool_original(data_root).queries}
    assert not [x for x in ds.queries if x.split != "test" and normalize_text(x.text) in original]
    full = load_ultratool(data_root, dedupe_original=False)
    assert full.stats()["queries"] == {"train": 2724, "val": 303, "test": 500}
    assert full.stats()["dependencies"] == 598
    assert full.skipped == {_SKIP_REPEAT: 48, _SKIP_EXTRA: 11, _SKIP_SELF: 47}
    assert sum(normalize_text(x.text) in original for x in full.queries if x.split != "test") == 550
    assert sum(normalize_text(x.text) in original for x in full.queries if x.split == "test") == 89

    graph = load_ultratool(data_root, dependency_source="graph")
    assert graph.stats()["dependencies"] == 606
    assert graph.skipped["graph link from a tool to itself (no self-edge)"] == 5
    links = {(d.source, d.target) for d in full.dependencies}
    glinks = {(d.source, d.target) for d in graph.dependencies}
    assert len(links & glinks) == 596 and len(glinks - links) == 10 and len(links - glinks) == 2
    assert load_ultratool(data_root, dependency_splits=["train"]).stats()["dependencies"] == 521


def _node(name: str, desc: str, domain: list[str]) -> dict:
    return {"id": name, "desc": desc, "domain": domain}


def _req(rid: str, text: str, nodes: list[str], links: list[tuple[str, str]]) -> dict:
    return {"id": rid, "user_request": text, "task_steps": [f"Step {i + 1} Call {n}" for i, n in enumerate(nodes)],
            "task_nodes": [{"task": n} for n in nodes], "task_links": [{"source": s, "target": t} for s, t in links],
            "n_tools": len(nodes), "type": "chain"}


def _write(root: Path, data: list | None = None, nodes: list | None = None) -> Path:
    folder = root / "ultratool-gnn4taskplan" / "data" / "ultratool"
    folder.mkdir(parents=True, exist_ok=True)
    nodes = nodes if nodes is not None else [_node("a", "A tool", ["X"]), _node("b", "B tool", ["X", "Y"]),
                                             _node("c", "C tool, described at length here", [])]
    data = data if data is not None else [
        _req("1", "plain train\n", ["a", "b"], [("a", "b")]),
        _req("2", "  overlap   train\n", ["b"], []),
        _req("3", "overlap test", ["a", "c", "a"], [("a", "c"), ("c", "a")]),
        _req("4", "unknown tool", ["a", "zzz"], [("a", "zzz")]),
        _req("5", "self", ["b", "b"], [("b", "b")]),
        _req("6", " ", ["a"], []),
    ]
    (folder / "data.json").write_text("".join(x if isinstance(x, str) else json.dumps(x) + "\n" for x in data))
    (folder / "tool_desc.json").write_text(json.dumps({"nodes": nodes}, indent=4))
    (folder / "graph_desc.json").write_text(json.dumps(
        {"nodes": nodes, "links": [{"source": "a", "target": "b"}, {"source": "b", "target": "b"},
                                   {"source": "a", "target": "zzz"}]}))
    (folder / "split_ids.json").write_text(json.dumps({"test_ids": {"chain": ["3", "99"]}}))
    (folder / "user_requests.json").write_text("".join(
        json.dumps({"id": str(i), "user_request": "x"}) + "\n" for i in range(1, 8)))
    orig = root / "ultratool" / "data" / "English-dataset"
    orig.mkdir(parents=True, exist_ok=True)
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    tools = [{"name": "a", "description": "The original, longer description of A", "arguments": schema,
              "results": {}},
             {"name": "c", "description": "C", "arguments": schema, "results": {}}]
    (orig / "test.json").write_text("".join(json.dumps(
        {"question": q, "plan": [{"step": "1.1 go", "tool": "a()"}], "tools": tools, "domain": "X"}) + "\n"
        for q in ("overlap train", "overlap test\n")))
    return root


def test_labels_splits_dependencies_enrichment(tmp_path):
    _write(tmp_path)
    ds = load_ultratool(tmp_path, val_fraction=0.0)
    q = {x.id: x for x in ds.queries}
    assert set(q) == {"1", "3", "5"}
    assert (q["1"].text, q["1"].tools, q["1"].split) == ("plain train", ("a", "b"), "train")
    assert (q["3"].tools, q["3"].split, q["3"].steps) == (("a", "c"), "test", None)
    assert q["5"].tools == ("b",)
    assert {(d.source, d.target, d.kind) for d in ds.dependencies} == {
        ("b", "a", "sequence"), ("c", "a", "sequence"), ("a", "c", "sequence")}
    assert ds.skipped == {_SKIP_DEDUPE: 1, "request using a tool missing from tool_desc.json": 1,
                          _SKIP_SELF: 1, _SKIP_REPEAT: 2, "request with empty text": 1,
                          "split_ids.json test id without a record in data.json": 1, _SKIP_EXTRA: 1}
    assert ds.notes["original_overlap_ids"] == {"train": ["2"], "test": ["3"]}
    assert ds.notes["tools_enriched_from_original"] == 2 and ds.notes["descriptions_from_original"] == 1
    assert sorted(map(tuple, ds.notes["dependency_support"])) == [("a", "c", 1), ("b", "a", 1), ("c", "a", 1)]
    tools = ds.tool_by_id()
    assert tools["a"].description == "The original, longer description of A" and tools["a"].parameters
    assert tools["c"].description == "C tool, described at length here" and tools["c"].parameters
    assert tools["b"].parameters is None and tools["b"].category == "X, Y" and tools["c"].category is None

    kept = load_ultratool(tmp_path, val_fraction=0.0, dedupe_original=False)
    assert {x.id: x.split for x in kept.queries}["2"] == "train" and _SKIP_DEDUPE not in kept.skipped
    train_only = load_ultratool(tmp_path, val_fraction=0.0, dependency_splits=["train"])
    assert {(d.source, d.target) for d in train_only.dependencies} == {("b", "a")}
    graph = load_ultratool(tmp_path, val_fraction=0.0, dependency_source="graph")
    assert [(d.source, d.target) for d in graph.dependencies] == [("b", "a")]
    assert graph.skipped["graph link from a tool to itself (no self-edge)"] == 1
    assert graph.skipped["graph link naming an unknown tool (no edge)"] == 1


def test_val_is_carved_from_train_and_filters_dependencies(tmp_path):
    # odd requests: a then b (b needs a); even requests: c then b (b needs c)
    _write(tmp_path, data=[_req(str(i), f"request {i}", ["a", "b"] if i % 2 else ["c", "b"],
                                [("a", "b")] if i % 2 else [("c", "b")]) for i in range(1, 21)])
    ds = load_ultratool(tmp_path, val_fraction=0.5, seed=0, dependency_splits=["val"])
    splits = {x.id: x.split for x in ds.queries}
    assert splits["3"] == "test" and sum(s == "val" for s in splits.values()) == 10
    val = [int(i) for i, s in splits.items() if s == "val"]
    want = {("b", "a"): sum(i % 2 for i in val), ("b", "c"): sum(1 - i % 2 for i in val)}
    assert {(s, t): c for s, t, c in ds.notes["dependency_support"]} == {k: v for k, v in want.items() if v}


def test_malformed_data_json_names_file_and_line(tmp_path):
    _write(tmp_path, data=[_req("1", "ok", ["a"], []), '{"id": "2", "user_request": \n'])
    with pytest.raises(DataError, match=r"data\.json:2: malformed JSON"):
        load_ultratool(tmp_path)


@pytest.mark.parametrize("field", ["id", "user_request", "task_nodes", "task_links"])
def test_missing_request_field(tmp_path, field):
    bad = _req("2", "ok", ["a"], [])
    del bad[field]
    _write(tmp_path, data=[_req("1", "fine", ["a"], []), bad])
    with pytest.raises(DataError, match=rf"data\.json:2: record: missing field '{field}'"):
        load_ultratool(tmp_path)


def test_missing_node_task_and_tool_desc(tmp_path):
    bad = _req("1", "ok", ["a"], [])
    bad["task_nodes"] = [{"name": "a"}]
    _write(tmp_path, data=[bad])
    with pytest.raises(DataError, match=r"data\.json:1: task node: missing field 'task'"):
        load_ultratool(tmp_path)
    _write(tmp_path, nodes=[_node("a", "A", []), {"id": "b", "domain": []}])
    with pytest.raises(DataError, match=r"tool_desc\.json: node 1 \('b'\): missing 'desc'"):
        load_ultratool(tmp_path)


def test_malformed_tool_desc_names_file_and_line(tmp_path):
    _write(tmp_path)
    path = tmp_path / "ultratool-gnn4taskplan" / "data" / "ultratool" / "tool_desc.json"
    path.write_text('{\n  "nodes": [\n    {"id": "a",, "desc": "x"}\n  ]\n}\n')
    with pytest.raises(DataError, match=r"tool_desc\.json:3: malformed JSON"):
        load_ultratool(tmp_path)


def test_bad_options(tmp_path):
    _write(tmp_path)
    with pytest.raises(ConfigError, match="dependency_source"):
        load_ultratool(tmp_path, dependency_source="both")
    with pytest.raises(ConfigError, match="dependency_splits"):
        load_ultratool(tmp_path, dependency_source="graph", dependency_splits=["train"])
    with pytest.raises(ConfigError, match="dependency_splits"):
        load_ultratool(tmp_path, dependency_splits=["dev"])
