import json
from pathlib import Path

import pytest

from toolgraph.data.sources.toolbench import load_g1, load_g2, load_g3, load_instructions
from toolgraph.errors import ConfigError, DataError

G3_FILE = "toolbench-stabletoolbench/solvable_queries/test_instruction/G3_instruction.json"
COLT_FILE = "toolbench-colt/datasets/ToolBenchG3/corpus.jsonl"


@pytest.mark.realdata
def test_toolbench_g1_real(data_root):
    ds = load_g1(data_root)
    st = ds.stats()
    assert (st["tools"], st["agents"]) == (1684, 339)
    assert st["queries"] == {"train": 0, "val": 0, "test": 474}
    assert st["max_labels_per_query"] == 6 and st["dependencies"] == 0 and st["skipped"] == {}
    q = {x.id: x for x in ds.queries}
    assert q["G1_instruction:588"].tools == ("TheClique::Transfermarkt search", "TheClique::Transfermarkt details")
    t = ds.tool_by_id()["TheClique::Songkick concert"]
    assert (t.name, t.description, t.agent, t.category) == ("Songkick concert", "Concert info", "TheClique", "Data")
    assert t.parameters["required"][0]["name"] == "id_conc" and t.parameters["optional"] == []
    assert t.returns["venue_name"] == "str"
    # same (tool, api) with another doc -> '~2'; each query keeps the doc its api_list showed it
    tools = ds.tool_by_id()
    assert [tools[f"👋 Demo Project::Get Order{s}"].category for s in ("", "~2", "~3")] == ["Media", "Sports", "Events"]
    assert tools["Currency Converter_v2::Convert~2"].description == "Convert between Currencies."
    assert q["G1_tool:70359"].tools == ("Currency Converter_v2::Convert~2", "Currency Converter_v2::List")
    assert q["G1_tool:26820"].tools == ("Currency Converter_v2::Supported Currencies", "Currency Converter_v2::Convert")
    assert "Morpheus Predictions::Best Sign 2" in tools  # raw tool_name has a trailing space
    assert load_g1(data_root, subsets=["tool"]).stats()["queries"]["test"] == 158


@pytest.mark.realdata
def test_toolbench_g2_real(data_root):
    st = load_g2(data_root).stats()
    assert (st["tools"], st["agents"], st["queries"]["test"]) == (1037, 564, 230)
    assert st["skipped"] == {"repeated relevant API within a query": 4}
    draft = load_g2(data_root, source="draft")
    st = draft.stats()
    assert (st["tools"], st["agents"], st["queries"]["test"]) == (545, 280, 199)
    assert st["skipped"] == {"repeated relevant API within a query": 8}
    assert {x.id: x for x in draft.queries}["G2_category:7"].tools == ("Turkey Postal Codes::il", "Transitaires::Transitaires")
    with pytest.raises(ConfigError, match="tool"):
        load_g2(data_root, subsets=["tool"])
    with pytest.raises(ConfigError, match="draft"):
        load_g1(data_root, source="draft")


@pytest.mark.realdata
def test_toolbench_g3_real(data_root):
    st = load_g3(data_root).stats()
    assert (st["tools"], st["agents"], st["queries"]["test"], st["skipped"]) == (44, 7, 61, {})
    st = load_g3(data_root, source="draft").stats()
    assert (st["tools"], st["agents"], st["queries"]["test"]) == (49, 7, 100)
    assert st["skipped"] == {"repeated relevant API within a query": 2}

    colt = load_g3(data_root, corpus="colt")
    st = colt.stats()
    assert (st["tools"], st["agents"], st["queries"]["test"], st["skipped"]) == (1419, 240, 61, {})
    assert (colt.notes["colt_relevant_found"], colt.notes["colt_relevant_total"]) == (32, 32)
    q = {x.id: x for x in colt.queries}["G3_instruction:455"]
    assert q.tools == ("Vimeo::SearchVideos", "Vimeo::GetRelatedPeople", "YTStream - Download YouTube Videos::Download/Stream")
    t = colt.tool_by_id()["Vimeo::SearchVideos"]
    assert (t.description, t.category, t.returns) == ("Search for videos.", "Media", "")
    assert t.parameters["required"][1] == {"name": "query", "type": "STRING", "description": "The search terms"}
    assert colt.tool_by_id()["Priceline com Provider::Auto complete~2"].description.endswith("in passed string.")
    draft = load_g3(data_root, source="draft", corpus="colt")
    assert (draft.notes["colt_relevant_found"], draft.notes["colt_relevant_total"]) == (40, 40)


@pytest.mark.realdata
def test_toolbench_instructions_real(data_root):
    ds = load_instructions(data_root)
    st = ds.stats()
    assert (st["tools"], st["agents"], st["queries"]) == (12, 2, {"train": 5, "val": 0, "test": 0})
    assert {x.id: x for x in ds.queries}["G1_query:1"].tools == ("SQUAKE::Checkhealth", "SQUAKE::Projects")
    folder = "toolbench-demo/data_example/instruction"
    ds = load_instructions(data_root, path=[f"{folder}/G{i}_query.json" for i in (1, 2, 3)])
    assert ds.stats()["queries"] == {"train": 9, "val": 1, "test": 0}


def _api(tool: str, api: str, desc: str = "does it", category: str = "Data") -> dict:
    return {"category_name": category, "tool_name": tool, "api_name": api, "api_description": desc,
            "required_parameters": [{"name": "x", "type": "STRING", "description": "", "default": ""}],
            "optional_parameters": [], "method": "GET", "template_response": {"y": "str"}}


def _rec(qid: int, apis: list[dict], relevant: list[list[str]], query: str = "please help") -> dict:
    return {"api_list": apis, "query": query, "relevant APIs": relevant, "query_id": qid}


def _write_g3(root: Path, payload) -> Path:
    path = root / G3_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload, indent=1))
    return root


def test_toolbench_labels_variants_and_skips(tmp_path):
    a, b, b2 = _api("Weather ", "now"), _api("Weather", "week"), _api("Weather", "week", "other doc", "Travel")
    recs = [
        _rec(1, [a, b], [["Weather", "week"], ["Weather ", "now"], ["Weather", "now"]]),
        _rec(2, [b2, a], [["Weather", "week"], ["Ghost", "boo"]]),  # shown the second 'week' doc
        _rec(3, [a], [["Ghost", "boo"]]),  # nothing resolvable
        _rec(4, [a], [["Weather", "week"]]),  # not in its own api_list, but another query's: resolved by name
        _rec(5, [a], [["Weather", "now"]], query="  "),
    ]
    ds = load_g3(_write_g3(tmp_path, recs))
    q = {x.id: x.tools for x in ds.queries}
    assert q == {"G3_instruction:1": ("Weather::week", "Weather::now"), "G3_instruction:2": ("Weather::week~2",),
                 "G3_instruction:4": ("Weather::week",)}
    assert [t.id for t in ds.tools] == ["Weather::now", "Weather::week", "Weather::week~2"]
    assert [x.id for x in ds.agents] == ["Weather"]
    assert ds.tool_by_id()["Weather::week~2"].category == "Travel"
    assert ds.skipped == {"repeated relevant API within a query": 1, "relevant API not in the catalog (pair dropped)": 2,
                          "query with no relevant API in the catalog": 1, "query with empty text": 1}
    assert ds.notes["relevant pairs resolved by name in the catalog"] == 1
    assert all(x.split == "test" for x in ds.queries)


def test_toolbench_malformed_json(tmp_path):
    root = _write_g3(tmp_path, '[\n {"query": "hi",\n  "query_id": 1,,\n}]')
    with pytest.raises(DataError, match=r"G3_instruction\.json:3: malformed JSON"):
        load_g3(root)


@pytest.mark.parametrize("field", ["query", "query_id", "api_list", "relevant APIs"])
def test_toolbench_missing_record_field(tmp_path, field):
    rec = _rec(2, [_api("T", "a")], [["T", "a"]])
    del rec[field]
    with pytest.raises(DataError, match=rf"G3_instruction\.json: record 1: missing '{field}'"):
        load_g3(_write_g3(tmp_path, [_rec(1, [_api("T", "a")], [["T", "a"]]), rec]))


def test_toolbench_bad_api_and_pair(tmp_path):
    api = _api("T", "a")
    del api["api_name"]
    with pytest.raises(DataError, match=r"record 0 \(query_id 1\) api_list\[0\]: missing or empty 'api_name'"):
        load_g3(_write_g3(tmp_path, [_rec(1, [api], [["T", "a"]])]))
    with pytest.raises(DataError, match="not a \\[tool_name, api_name\\] pair"):
        load_g3(_write_g3(tmp_path, [_rec(1, [_api("T", "a")], [["T"]])]))


def test_toolbench_colt_corpus(tmp_path):
    def doc(tool: str, api: str, desc: str) -> str:
        return (f"category_name:Media, tool_name:{tool}, api_name:{api}, api_description:{desc}, "
                f'required_params: [{{"name": "q", "type": "STRING", "description": "terms"}}], '
                f'optional_params: [], return_schema: ""')

    lines = [doc("Vimeo", "Search", "find"), doc("Vimeo ", "Search", "find again"), doc("Vimeo", "Other", "x")]
    (tmp_path / COLT_FILE).parent.mkdir(parents=True)
    (tmp_path / COLT_FILE).write_text("".join(json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in enumerate(lines)))
    _write_g3(tmp_path, [_rec(1, [_api("Vimeo", "Search", "candidate doc")], [["Vimeo", "Search"], ["Gone", "x"]])])
    ds = load_g3(tmp_path, corpus="colt")
    assert [t.id for t in ds.tools] == ["Vimeo::Search", "Vimeo::Search~2", "Vimeo::Other"]
    assert ds.queries[0].tools == ("Vimeo::Search",)  # the COLT doc, not the candidate
    assert ds.tool_by_id()["Vimeo::Search"].parameters == {"required": [{"name": "q", "type": "STRING",
                                                                          "description": "terms"}], "optional": []}
    assert ds.skipped == {"relevant API not in the catalog (pair dropped)": 1}
    assert (ds.notes["colt_relevant_found"], ds.notes["colt_relevant_total"]) == (1, 2)
    with (tmp_path / COLT_FILE).open("a") as f:
        f.write(json.dumps({"_id": "9", "text": "just prose"}) + "\n")
    with pytest.raises(DataError, match=r"corpus\.jsonl:4: not a ToolBench API document"):
        load_g3(tmp_path, corpus="colt")
    with pytest.raises(ConfigError, match="corpus"):
        load_g3(tmp_path, corpus="bm25")


def test_toolbench_instructions_paths(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps([_rec(i, [_api("T", f"x{i}")], [["T", f"x{i}"]])
                                                           for i in range(20)]))
    ds = load_instructions(tmp_path, path=["a.json", str(tmp_path / "b.json")], val_fraction=0.25, seed=1)
    assert ds.stats()["queries"] == {"train": 30, "val": 10, "test": 0}
    assert {x.id for x in ds.queries} >= {"a:0", "b:19"} and len(ds.tools) == 20
    with pytest.raises(ConfigError, match="differ"):
        load_instructions(tmp_path, path=["a.json", str(tmp_path / "a.json")])
