import json
from pathlib import Path

import pytest

from toolgraph.data.sources.metatool import load_metatool
from toolgraph.errors import ConfigError, DataError


@pytest.mark.realdata
def test_metatool_real(data_root):
    ds = load_metatool(data_root)
    st = ds.stats()
    assert st["tools"] == 199 and st["agents"] == 0 and st["dependencies"] == 0
    assert st["queries"] == {"train": 14720, "val": 2103, "test": 4206}
    assert st["max_labels_per_query"] == 2
    assert st["skipped"] == {
        "plugin_info.json entry for a plugin not in plugin_des.json": 236,
        "plugin_info.json entry repeating a plugin name (first kept)": 1,
        "query text given different gold tools (ambiguous, all copies skipped)": 29,
        "repeated query text with the same gold tools (first kept)": 53}
    q = {x.id: x for x in ds.queries}
    assert q["s0"].text == "Can I find academic research papers on this topic?" and q["s0"].tools == ("ResearchHelper",)
    assert q["m0"].tools == ("FinanceTool", "NewsTool")
    assert sum(len(x.tools) == 2 for x in ds.queries) == 497
    assert "What's the weather like today?" not in {x.text for x in ds.queries}
    tools = ds.tool_by_id()
    assert tools["Tax_Calculator"].description.startswith("Given an address in the United States and an amount")
    assert tools["FinanceTool"].description.startswith("Stay informed with the latest financial updates")
    assert len(ds.notes["merged_tools"]) == 47 and "FinanceTool" in ds.notes["merged_tools"]
    # options: the plugin_des text, and merging ambiguous texts into multi-label queries
    human = load_metatool(data_root, description="human").tool_by_id()
    assert human["Tax_Calculator"].description == ("Calculate sales tax given a U.S. address (or just a city) and an "
                                                   "amount. Powered by Avalara.")
    merged = load_metatool(data_root, conflicts="merge")
    assert len(merged.queries) == len(ds.queries) + 12
    weather = [x for x in merged.queries if x.text == "What's the weather like today?"]
    assert [x.tools for x in weather] == [("WeatherTool", "word_sneak")]
    # the split depends on the seed only
    assert [x.split for x in load_metatool(data_root).queries] == [x.split for x in ds.queries]
    assert [x.split for x in load_metatool(data_root, seed=1).queries] != [x.split for x in ds.queries]


def _write(root: Path, des: object = None, csv_text: str | None = None, multi: object = None,
           info: object = None, big: object = None) -> Path:
    folder = root / "metatool" / "dataset"
    (folder / "data").mkdir(parents=True)
    des = des if des is not None else {"Weather": "Get the weather.", "News": "Read the news.", "Big": "Merged."}
    info = info if info is not None else [
        {"name_for_model": "Weather", "name_for_human": "Weather", "description_for_model": "Weather API for LLMs.",
         "description_for_human": "Get the weather."},
        {"name_for_model": "Other", "name_for_human": "Other", "description_for_model": "x", "description_for_human": "x"}]
    big = big if big is not None else {"Big": "Merged."}
    csv_text = csv_text if csv_text is not None else (
        "Query,Tool\nWill it rain?,Weather\nWill it rain?,Weather\n\"Hello, news?\",News\n"
        "Ambiguous?,Weather\nAmbiguous?,News\nUnknown tool?,Nope\n")
    multi = multi if multi is not None else [{"query": "Rain and news", "tool": ["Weather", "News"]},
                                             {"query": "Big thing", "tool": ["Big", "Big"]}]
    for name, data in (("plugin_des.json", des), ("plugin_info.json", info), ("big_tool_des.json", big),
                       ("data/multi_tool_query_golden.json", multi)):
        (folder / name).write_text(data if isinstance(data, str) else json.dumps(data, indent=1))
    (folder / "data" / "all_clean_data.csv").write_text(csv_text)
    return root


def test_metatool_labels_dedup_and_skips(tmp_path):
    ds = load_metatool(_write(tmp_path), test_fraction=0.0, val_fraction=0.0)
    assert {q.id: (q.text, q.tools) for q in ds.queries} == {
        "s0": ("Will it rain?", ("Weather",)), "s2": ("Hello, news?", ("News",)),
        "m0": ("Rain and news", ("Weather", "News")), "m1": ("Big thing", ("Big",))}
    assert all(q.split == "train" for q in ds.queries)
    assert ds.tool_by_id()["Weather"].description == "Weather API for LLMs."
    assert ds.tool_by_id()["News"].description == "Read the news."
    assert ds.notes["merged_tools"] == ["Big"]
    assert ds.skipped == {"repeated query text with the same gold tools (first kept)": 1,
                          "query text given different gold tools (ambiguous, all copies skipped)": 2,
                          "query naming a tool missing from plugin_des.json": 1,
                          "plugin_info.json entry for a plugin not in plugin_des.json": 1,
                          "tool repeated in a query's gold list": 1}
    merged = load_metatool(tmp_path, conflicts="merge", description="human")
    assert [q.tools for q in merged.queries if q.text == "Ambiguous?"] == [("Weather", "News")]
    assert merged.tool_by_id()["Weather"].description == "Get the weather."


def test_metatool_repeated_catalog_key_counted(tmp_path):
    des = '{"Weather": "first", "News": "n", "Weather": "second"}'
    ds = load_metatool(_write(tmp_path, des=des, info=[], big={}, multi=[]), description="human")
    assert ds.tool_by_id()["Weather"].description == "first"
    assert ds.skipped["tool name repeated in plugin_des.json (first kept)"] == 1


def test_metatool_malformed_json_names_file_and_line(tmp_path):
    with pytest.raises(DataError, match=r"plugin_des\.json:3: malformed JSON"):
        load_metatool(_write(tmp_path, des='{\n "Weather": "x",\n oops\n}'))


def test_metatool_missing_field(tmp_path):
    with pytest.raises(DataError, match=r"multi_tool_query_golden\.json: record 1: missing field 'tool'"):
        load_metatool(_write(tmp_path, multi=[{"query": "a", "tool": ["News"]}, {"query": "b"}]))
    with pytest.raises(DataError, match=r"plugin_info\.json: record 0: missing field 'description_for_model'"):
        load_metatool(_write(tmp_path / "b", info=[{"name_for_model": "Weather"}]))


def test_metatool_bad_csv_row_names_line(tmp_path):
    with pytest.raises(DataError, match=r"all_clean_data\.csv:3: expected 2 columns, got 3"):
        load_metatool(_write(tmp_path, csv_text="Query,Tool\nok?,News\nbad,News,extra\n"))
    with pytest.raises(DataError, match=r"all_clean_data\.csv:1: header must name"):
        load_metatool(_write(tmp_path / "b", csv_text="Text,Label\nok?,News\n"))


def test_metatool_bad_options(tmp_path):
    with pytest.raises(ConfigError, match="description"):
        load_metatool(_write(tmp_path), description="long")
    with pytest.raises(ConfigError, match="sum to <= 1"):
        load_metatool(tmp_path, test_fraction=0.8, val_fraction=0.3)
