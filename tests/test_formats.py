"""Canonical JSONL reader/writer: round trip, and every kind of bad input names file and line."""

import json

import pytest

from toolgraph.data.formats import read_dataset, write_dataset
from toolgraph.data.schema import Query, Tool, ToolDataset, render_tool
from toolgraph.errors import DataError


def test_round_trip(tiny_dataset_dir, tmp_path):
    ds = read_dataset(tiny_dataset_dir, name="tiny")
    assert ds.stats()["tools"] == 5 and ds.stats()["agents"] == 2
    assert ds.stats()["queries"] == {"train": 2, "val": 0, "test": 3}
    out = write_dataset(ds, tmp_path / "copy")
    again = read_dataset(out, name="tiny")
    assert again.tools == ds.tools and again.queries == ds.queries
    assert again.agents == ds.agents and again.dependencies == ds.dependencies


def _rewrite(folder, file, lines):
    (folder / file).write_text("".join(lines))


@pytest.mark.parametrize(
    "file,line,needle",
    [
        ("tools.jsonl", '{"id": "t9", "name": "x"\n', "malformed JSON"),
        ("tools.jsonl", '{"id": "t9", "description": "x"}\n', "missing field 'name'"),
        ("tools.jsonl", '{"id": "t1", "name": "x", "description": "y"}\n', "duplicate tool id 't1'"),
        ("tools.jsonl", '{"id": "t9", "name": "x", "description": "y", "colour": 1}\n', "unknown field"),
        ("tools.jsonl", '{"id": "", "name": "x", "description": "y"}\n', "field 'id' is empty"),
        ("queries.jsonl", '{"id": "q9", "text": "  ", "tools": ["t1"], "split": "test"}\n', "field 'text' is empty"),
        ("queries.jsonl", '{"id": "q9", "text": "hi", "tools": ["nope"], "split": "test"}\n', "unknown tool 'nope'"),
        ("queries.jsonl", '{"id": "q9", "text": "hi", "tools": [], "split": "test"}\n', "no gold tools"),
        ("queries.jsonl", '{"id": "q1", "text": "hi", "tools": ["t1"], "split": "test"}\n', "duplicate query id"),
        ("queries.jsonl", '{"id": "q9", "text": "hi", "tools": ["t1"], "split": "dev"}\n', "split 'dev'"),
        ("queries.jsonl", '{"id": "q9", "text": "hi", "tools": "t1"}\n', "field 'tools' must be list"),
        ("dependencies.jsonl", '{"source": "t1", "target": "zz"}\n', "unknown tool 'zz'"),
        ("agents.jsonl", '{"id": "a1", "name": "again"}\n', "duplicate agent id"),
    ],
)
def test_bad_input_names_file_and_line(tiny_dataset_dir, file, line, needle):
    path = tiny_dataset_dir / file
    lines = path.read_text().splitlines(keepends=True)
    _rewrite(tiny_dataset_dir, file, lines + [line])
    with pytest.raises(DataError) as err:
        read_dataset(tiny_dataset_dir)
    msg = str(err.value)
    assert needle in msg
    assert f"{file}:{len(lines) + 1}:" in msg  # file and line of the bad record


def test_tool_naming_unknown_agent(tiny_dataset_dir):
    path = tiny_dataset_dir / "tools.jsonl"
    path.write_text(path.read_text() + json.dumps({"id": "t9", "name": "x", "description": "y", "agent": "zz"}) + "\n")
    with pytest.raises(DataError, match=r"tools.jsonl:6: tool 't9' names unknown agent 'zz'"):
        read_dataset(tiny_dataset_dir)


def test_missing_folder_and_file(tmp_path):
    with pytest.raises(DataError, match="dataset folder not found"):
        read_dataset(tmp_path / "nope")
    with pytest.raises(DataError, match="tools.jsonl: file not found"):
        read_dataset(tmp_path)


def test_in_memory_validation():
    tools = [Tool("a", "x", "d"), Tool("a", "y", "d")]
    with pytest.raises(DataError, match="duplicate tool id"):
        ToolDataset("t", tools, [])
    with pytest.raises(DataError, match="unknown tool 'b'"):
        ToolDataset("t", [Tool("a", "x", "d")], [Query("q", "text", ("b",))])


def test_render_styles_put_name_and_description_first():
    t = Tool("1", "get_weather", "Current weather.", agent="Weather", category="Data",
             parameters={"required": [{"name": "city"}], "optional": [{"name": "units"}]})
    assert render_tool(t) == "get_weather: Current weather. from Weather. category Data. parameters: city, units"
    assert render_tool(t, "name_desc") == "get_weather: Current weather."
    assert render_tool(t, "toolbench").startswith("category_name:Data, tool_name:Weather, api_name:get_weather")
    with pytest.raises(DataError, match="unknown tool text style"):
        render_tool(t, "fancy")
