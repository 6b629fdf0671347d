import json
from pathlib import Path

import pytest

from toolgraph.data.sources.ultratool_original import load_ultratool_original, load_ultratool_original_zh
from toolgraph.errors import ConfigError, DataError

_REAL_SKIPPED = {"repeated call of a tool already in the query's gold list": 249,
                 "tool called twice in a row (no self-edge)": 178}


@pytest.mark.realdata
def test_ultratool_original_real(data_root):
    ds = load_ultratool_original(data_root)
    st = ds.stats()
    assert st["tools"] == 436 and st["agents"] == 0
    assert st["queries"] == {"train": 0, "val": 0, "test": 1000}
    assert st["labels_per_query"] == 2.132 and st["max_labels_per_query"] == 7
    assert st["dependencies"] == 511
    assert st["skipped"] == _REAL_SKIPPED
    assert ds.notes["tool_definitions"] == 2132
    q = {x.id: x for x in ds.queries}
    assert q["1"].text.startswith("I need to organize a report to give to the client.")
    assert q["1"].tools == ("file_write", "check_file_content", "file_delete")
    assert q["1"].steps == ("Write the report content", "Check the report file content",
                            "Delete the old data backup file")
    tools = ds.tool_by_id()
    fw = tools["file_write"]
    assert fw.description == ("Used to write content to a specified file. If the file does not exist, "
                              "a new file will be created.")
    assert fw.category == "Document, Other"
    assert list(fw.parameters["properties"]) == ["file_path", "content"]
    assert list(fw.returns["properties"]) == ["status"]
    support = {(s, t): c for s, t, c in ds.notes["dependency_support"]}
    assert support[("file_modify", "file_write")] == 54
    assert support[("file_delete", "check_file_content")] == 2
    assert load_ultratool_original(data_root, dependency_splits=[]).dependencies == []


@pytest.mark.realdata
def test_ultratool_original_zh_real(data_root):
    en, zh = load_ultratool_original(data_root), load_ultratool_original_zh(data_root)
    assert zh.name == "ultratool-original-zh"
    assert zh.stats() == {**en.stats(), "name": "ultratool-original-zh"}
    assert [q.tools for q in zh.queries] == [q.tools for q in en.queries]
    q1 = {x.id: x for x in zh.queries}["1"]
    assert q1.text.startswith("我需要整理报告送给客户")
    assert q1.steps == ("写入报告内容", "核对报告文件内容", "删除旧数据备份文件")
    assert zh.tool_by_id()["file_write"].description == (
        "用于将内容写入指定文件。如果文件不存在，将创建新文件。")


def _tool(name: str, desc: str = "") -> dict:
    return {"name": name, "description": desc or f"{name} does things",
            "arguments": {"type": "object", "properties": {"x": {"type": "string"}}},
            "results": {"type": "object", "properties": {"y": {"type": "string"}}}}


def _rec(question: str, calls: list[str], tools: list[dict], domain: str = "Test") -> dict:
    plan = [{"step": "1. Do it", "tool": "null"}, {"step": "1.1 Gather info", "tool": "No tool required"}]
    plan += [{"step": f"1.{i + 2} Step {c}", "tool": c} for i, c in enumerate(calls)]
    return {"question": question, "plan": plan, "tools": tools, "domain": domain}


def _write(root: Path, lines: list) -> Path:
    folder = root / "ultratool" / "data" / "English-dataset"
    folder.mkdir(parents=True)
    (folder / "test.json").write_text("".join(x if isinstance(x, str) else json.dumps(x) + "\n" for x in lines))
    return root


def test_labels_steps_dependencies_conflicts(tmp_path):
    a, b, c = _tool("a"), _tool("b"), _tool("c")
    root = _write(tmp_path, [
        _rec("first\n", ["a(x='1')", "a(x='2')", "b(x=1)", "a(x=3)"], [a, b], "Files"),
        _rec("second", ["c ( x=1 )", "b()"], [c, _tool("b", "another description")], "Money"),
        _rec("third", [], [a]),                                  # no call -> skipped
        _rec("   ", ["a()"], [a]),                                # empty text -> skipped
        _rec("fourth", ["zzz(x=1)"], [a]),                        # calls a tool nobody defines -> skipped
        _rec("fifth", ["a()", "see the manual"], [a]),            # unparsable tool field -> step ignored
    ])
    ds = load_ultratool_original(tmp_path)
    q = {x.id: x for x in ds.queries}
    assert set(q) == {"0", "1", "5"}
    assert q["0"].text == "first" and q["0"].tools == ("a", "b") and q["0"].split == "test"
    assert q["0"].steps == ("Step a(x='1')", "Step a(x='2')", "Step b(x=1)", "Step a(x=3)")
    assert q["1"].tools == ("c", "b")
    assert {(d.source, d.target, d.kind) for d in ds.dependencies} == {
        ("b", "a", "sequence"), ("a", "b", "sequence"), ("b", "c", "sequence")}
    tools = ds.tool_by_id()
    assert tools["b"].description == "b does things"  # first definition kept
    assert tools["a"].category == "Files, Test" and tools["c"].category == "Money"
    assert tools["a"].parameters == a["arguments"] and tools["a"].returns == a["results"]
    assert ds.skipped == {
        "repeated call of a tool already in the query's gold list": 2,
        "tool called twice in a row (no self-edge)": 1,
        "tool redefined with another description (first kept)": 1,
        "query whose plan calls no tool": 1,
        "query with empty text": 1,
        "query calling a tool no record defines": 1,
        "plan step whose tool field is neither a call nor a no-tool marker (step ignored)": 1,
    }
    assert ds.notes["tool_definitions"] == 8
    assert load_ultratool_original(root, dependency_splits=["train"]).dependencies == []


def test_malformed_json_names_file_and_line(tmp_path):
    _write(tmp_path, [_rec("ok", ["a()"], [_tool("a")]), '{"question": "broken",\n'])
    with pytest.raises(DataError, match=r"test\.json:2: malformed JSON"):
        load_ultratool_original(tmp_path)


@pytest.mark.parametrize("field", ["question", "plan", "tools"])
def test_missing_record_field(tmp_path, field):
    rec = _rec("ok", ["a()"], [_tool("a")])
    del rec[field]
    _write(tmp_path, [_rec("fine", ["a()"], [_tool("a")]), rec])
    with pytest.raises(DataError, match=rf"test\.json:2: record: missing field '{field}'"):
        load_ultratool_original(tmp_path)


def test_missing_step_and_tool_fields(tmp_path):
    rec = _rec("ok", ["a()"], [_tool("a")])
    del rec["plan"][2]["tool"]
    _write(tmp_path, [rec])
    with pytest.raises(DataError, match=r"test\.json:1: plan step: missing field 'tool'"):
        load_ultratool_original(tmp_path)
    bad = _rec("ok", ["a()"], [{"name": "a"}])
    (tmp_path / "ultratool" / "data" / "English-dataset" / "test.json").write_text(json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=r"test\.json:1: tool definition: missing field 'description'"):
        load_ultratool_original(tmp_path)


def test_bad_dependency_splits(tmp_path):
    _write(tmp_path, [_rec("ok", ["a()"], [_tool("a")])])
    with pytest.raises(ConfigError, match="dependency_splits"):
        load_ultratool_original(tmp_path, dependency_splits=["dev"])
