import json
from pathlib import Path

import pytest

from toolgraph.data.sources.nestools import load_nestools
from toolgraph.errors import ConfigError, DataError


@pytest.mark.realdata
def test_nestools_real(data_root):
    ds = load_nestools(data_root)
    st = ds.stats()
    assert st["tools"] == 3034 and st["agents"] == 0
    assert st["queries"] == {"train": 0, "val": 0, "test": 1000}
    assert st["dependencies"] == 1638
    assert st["skipped"] == {"repeated call of an API already in the task's gold list": 2}
    assert ds.notes["names_with_conflicting_definitions"] == 177
    q = {x.id: x for x in ds.queries}
    assert q["1"].tools == ("9031", "10894", "1163")  # scan_isbn, locate_book, engage_ar_experience
    tools = ds.tool_by_id()
    assert [tools[t].name for t in q["1"].tools] == ["scan_isbn", "locate_book", "engage_ar_experience"]
    assert tools["9031"].description == "Scan the ISBN of a book to retrieve information."
    assert tools["9031"].category == "Library Science/Library Augmented Reality"
    edges = {(d.source, d.target) for d in ds.dependencies}
    assert {("10894", "9031"), ("1163", "9031"), ("1163", "10894")} <= edges
    # two different clean_up APIs stay two tools
    assert sorted(t.description for t in ds.tools if t.name == "clean_up") == [
        "Clean up the kitchen after meal preparation.", "Schedule cleaning up."]

    by_name = load_nestools(data_root, tool_ids="name")
    assert by_name.stats()["tools"] == 2799
    assert by_name.stats()["dependencies"] == 1634
    assert by_name.skipped["API name redefined with a different schema (first definition kept)"] == 235
    assert {x.id: x for x in by_name.queries}["1"].tools == ("scan_isbn", "locate_book", "engage_ar_experience")


def _api(name: str, desc: str = "") -> dict:
    return {"api_name": name, "api_description": desc or f"{name} does things",
            "parameters": {"x": {"type": "str", "description": "an x"}}, "required": ["x"],
            "responses": {"out": {"type": "str", "description": "result"}}}


def _task(tid: int, apis: list[dict], calls: list[tuple[str, dict, list[str]]], task: str = "do it") -> dict:
    return {"test_id": tid, "api": apis, "task": task, "field": "Test/Unit",
            "call": [{"api_name": a, "parameters": p, "responses": r} for a, p, r in calls]}


def _write(root: Path, tasks: list, ids: list) -> Path:
    (root / "nestools" / "data").mkdir(parents=True)
    (root / "nestools" / "inference" / "build_test_prompt").mkdir(parents=True)
    (root / "nestools" / "data" / "test_data.jsonl").write_text(
        "".join(t if isinstance(t, str) else json.dumps(t) + "\n" for t in tasks))
    (root / "nestools" / "inference" / "build_test_prompt" / "test_api_ids.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in ids))
    return root


def test_nestools_ids_labels_dependencies(tmp_path):
    tasks = [
        _task(1, [_api("a"), _api("b")], [("a", {}, ["API_call_0", "API_call_1"]), ("b", {"x": "API_call_1"}, ["API_call_2"])]),
        _task(2, [_api("a", "another a"), _api("c")], [("c", {}, ["API_call_0"]), ("a", {"x": "API_call_0"}, ["API_call_1"]),
                                                      ("c", {}, ["API_call_2"])]),
        _task(3, [_api("d")], [("e", {}, ["API_call_0"])]),
    ]
    ids = [{"test_id": 1, "api_ids": [10, 11]}, {"test_id": 2, "api_ids": [12, 13]}, {"test_id": 3, "api_ids": [14]}]
    _write(tmp_path, tasks, ids)
    ds = load_nestools(tmp_path)
    q = {x.id: x for x in ds.queries}
    assert q["1"].tools == ("10", "11") and q["2"].tools == ("13", "12") and "3" not in q
    assert ds.tool_by_id()["12"].description == "another a" and ds.tool_by_id()["12"].name == "a"
    assert {(d.source, d.target, d.kind) for d in ds.dependencies} == {("11", "10", "data"), ("12", "13", "data")}
    assert ds.skipped == {"call naming an API outside the task's api list": 1,
                          "repeated call of an API already in the task's gold list": 1}
    assert len(ds.tools) == 5

    by_name = load_nestools(tmp_path, tool_ids="name")
    assert {x.id: x for x in by_name.queries}["2"].tools == ("c", "a")
    assert by_name.tool_by_id()["a"].description == "a does things"  # first definition kept
    assert by_name.skipped["API name redefined with a different schema (first definition kept)"] == 1


def test_nestools_malformed_json(tmp_path):
    good = _task(1, [_api("a")], [("a", {}, ["API_call_0"])])
    _write(tmp_path, [good, '{"test_id": 2, "api": [\n'], [{"test_id": 1, "api_ids": [1]}])
    with pytest.raises(DataError, match=r"test_data\.jsonl:2: malformed JSON"):
        load_nestools(tmp_path)


def test_nestools_missing_fields_and_bad_ids(tmp_path):
    task = _task(1, [_api("a")], [("a", {}, [])])
    del task["call"]
    _write(tmp_path, [task], [{"test_id": 1, "api_ids": [1]}])
    with pytest.raises(DataError, match=r"test_data\.jsonl:1: task: missing field 'call'"):
        load_nestools(tmp_path)
    api = _api("a")
    del api["api_description"]
    _write(tmp_path / "d", [_task(1, [api], [("a", {}, [])])], [{"test_id": 1, "api_ids": [1]}])
    with pytest.raises(DataError, match="api: missing field 'api_description'"):
        load_nestools(tmp_path / "d")
    _write(tmp_path / "n", [_task(1, [_api("a"), _api("b")], [("a", {}, [])])], [{"test_id": 1, "api_ids": [1]}])
    with pytest.raises(DataError, match="2 APIs but 1 ids"):
        load_nestools(tmp_path / "n")
    _write(tmp_path / "m", [_task(1, [_api("a")], [("a", {}, [])])], [{"test_id": 7, "api_ids": [1]}])
    with pytest.raises(DataError, match="test_id 1 has no line"):
        load_nestools(tmp_path / "m")
    with pytest.raises(ConfigError, match="tool_ids"):
        load_nestools(tmp_path / "m", tool_ids="index")
