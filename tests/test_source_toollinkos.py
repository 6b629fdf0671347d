import json
from collections import Counter
from pathlib import Path

import pytest

from toolgraph.data.sources.toollinkos import load_toollinkos
from toolgraph.errors import ConfigError, DataError


@pytest.mark.realdata
def test_toollinkos_real(data_root):
    ds = load_toollinkos(data_root)
    st = ds.stats()
    assert st["tools"] == 573 and st["agents"] == 0
    assert st["queries"] == {"train": 1098, "val": 157, "test": 314}
    assert st["dependencies"] == 1494
    assert st["skipped"] == {"depends_on entry merged into an edge with the same tool, target and type": 2}
    assert Counter(d.kind for d in ds.dependencies) == {
        "TOOL_DIRECTLY_DEPENDS_ON": 675, "PARAMETER_DIRECTLY_DEPENDS_ON": 403, "PARAMETER_INDIRECTLY_DEPENDS_ON": 239,
        "TOOL_INDIRECTLY_DEPENDS_ON": 175, "PARAMETER_DEPENDS_ON": 2}
    assert ds.notes["closure"] == {"gold == main + transitive dependencies": 1047, "gold strictly inside the closure": 522}
    assert Counter(t.category for t in ds.tools) == {"core": 50, "regular": 523}
    q = {x.id: x for x in ds.queries}
    assert q["0"].text == "Can you send my current location to my friend at john.doe@example.com?"
    assert q["0"].tools == ("share_location_via_email", "set_location_service_status", "get_current_location",
                            "get_location_service_status", "validate_email")
    assert ds.notes["main_tool"]["0"] == "share_location_via_email"
    assert all(x.tools[0] == ds.notes["main_tool"][x.id] for x in ds.queries)
    tool = ds.tool_by_id()["get_current_date"]
    assert tool.description == "Returns the current date in a standard format (e.g., YYYY-MM-DD)."
    edges = {(d.source, d.target, d.kind) for d in ds.dependencies}
    assert ("share_location_via_email", "validate_email", "PARAMETER_DIRECTLY_DEPENDS_ON") in edges
    # the split depends on the seed only
    other = load_toollinkos(data_root, seed=1)
    assert [x.split for x in other.queries] != [x.split for x in ds.queries]
    assert [x.split for x in load_toollinkos(data_root).queries] == [x.split for x in ds.queries]


def _tool(name: str, deps: list[tuple[str, str]] = (), kind: str = "regular") -> dict:
    return {"name": name, "description": f"{name} does things", "func_type": kind,
            "parameters": [{"name": "x", "type": "string", "description": "an x", "required": True}],
            "depends_on": [{"name": t, "dependence_type": ty, "parameter_name": None, "reason": "why"} for t, ty in deps]}


def _write(root: Path, core: object, regular: object, instances: object) -> Path:
    folder = root / "toollinkos" / "toollinkos"
    folder.mkdir(parents=True)
    for name, data in (("core_tools.json", core), ("regular_tools.json", regular), ("instances.json", instances)):
        (folder / name).write_text(data if isinstance(data, str) else json.dumps(data, indent=1))
    return root


def _inst(text: str, main: str, gold: list[str]) -> dict:
    return {"user_query": text, "main_golden_function_name": main, "golden_function_names": gold}


def test_toollinkos_labels_deps_and_closure(tmp_path):
    core = [_tool("date", kind="core"), _tool("wifi", kind="core")]
    regular = [
        _tool("b", [("date", "TOOL_DIRECTLY_DEPENDS_ON")]),
        _tool("a", [("b", "PARAMETER_DIRECTLY_DEPENDS_ON"), ("b", "PARAMETER_DIRECTLY_DEPENDS_ON"),
                    ("ghost", "TOOL_DIRECTLY_DEPENDS_ON"), ("wifi", "TOOL_INDIRECTLY_DEPENDS_ON")]),
    ]
    instances = [
        _inst("do a", "a", ["b", "a", "date", "wifi"]),  # main moved first; full closure
        _inst("do a quickly", "a", ["a", "b"]),  # strict subset of the closure
        _inst("do b", "b", ["b", "nope"]),  # unknown tool -> skipped
        _inst("do b again", "b", ["b", "date"]),
    ]
    _write(tmp_path, core, regular, instances)
    ds = load_toollinkos(tmp_path, test_fraction=0.34, val_fraction=0.33)
    q = {x.id: x for x in ds.queries}
    assert q["0"].tools == ("a", "b", "date", "wifi") and q["1"].tools == ("a", "b") and "2" not in q
    assert sorted(x.split for x in ds.queries) == ["test", "train", "val"]
    assert ds.notes["main_tool"] == {"0": "a", "1": "a", "3": "b"}
    assert ds.notes["closure"] == {"gold == main + transitive dependencies": 2, "gold strictly inside the closure": 1}
    assert {(d.source, d.target, d.kind) for d in ds.dependencies} == {
        ("b", "date", "TOOL_DIRECTLY_DEPENDS_ON"), ("a", "b", "PARAMETER_DIRECTLY_DEPENDS_ON"),
        ("a", "wifi", "TOOL_INDIRECTLY_DEPENDS_ON")}
    assert ds.skipped == {"depends_on naming an unknown tool": 1,
                          "depends_on entry merged into an edge with the same tool, target and type": 1,
                          "query naming a tool missing from the catalog": 1}


def test_toollinkos_malformed_json(tmp_path):
    _write(tmp_path, [_tool("date")], '[\n  {"name": "a",\n  "description": }\n]', [])
    with pytest.raises(DataError, match=r"regular_tools\.json:3: malformed JSON"):
        load_toollinkos(tmp_path)


def test_toollinkos_missing_fields(tmp_path):
    bad = _tool("b")
    del bad["description"]
    _write(tmp_path, [_tool("a")], [bad], [])
    with pytest.raises(DataError, match=r"regular_tools\.json: record 0: missing field 'description'"):
        load_toollinkos(tmp_path)
    _write(tmp_path / "q", [_tool("a")], [], [_inst("x", "a", ["a"]), {"user_query": "y", "golden_function_names": []}])
    with pytest.raises(DataError, match=r"instances\.json: record 1: missing field 'main_golden_function_name'"):
        load_toollinkos(tmp_path / "q")
    dep = _tool("b")
    dep["depends_on"] = [{"name": "a"}]
    _write(tmp_path / "d", [_tool("a")], [dep], [])
    with pytest.raises(DataError, match=r"record 0 \(b\) depends_on\[0\]: missing field 'dependence_type'"):
        load_toollinkos(tmp_path / "d")
    with pytest.raises(ConfigError, match="must be >= 0 and sum to <= 1"):
        load_toollinkos(tmp_path / "q", test_fraction=0.8, val_fraction=0.3)
