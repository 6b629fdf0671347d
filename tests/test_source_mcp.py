import json

import pytest
from conftest import MCP_SERVERS, write_mcp_catalog

from toolgraph.data import load_dataset
from toolgraph.data.formats import read_dataset, write_dataset
from toolgraph.data.sources.mcp import numbered_items
from toolgraph.errors import ConfigError, DataError


def load(servers, tasks=None, **kw):
    return load_dataset("mcp", servers.parent, servers=str(servers), tasks=str(tasks) if tasks else None, **kw)


def test_servers_become_agents_and_tools_keep_schema(mcp_catalog):
    ds = load(*mcp_catalog)
    assert [a.id for a in ds.agents] == [s["name"] for s in MCP_SERVERS]
    assert ds.agents[0].category == "Weather" and ds.agents[0].description.startswith("Weather forecasts")
    t = ds.tool_by_id()["weather-server::get_forecast"]
    assert t.agent == "weather-server" and t.parameters["properties"]["city"] == {"type": "string"}
    assert "finance::convert_currency" in ds.tool_by_id()  # tools given as a plain list
    assert len(ds.tools) == 10


def test_tool_repeated_inside_a_server_is_an_error_unless_told(tmp_path):
    servers = [dict(MCP_SERVERS[3], tools={
        "ddg": {"tools": [{"name": "search", "description": "web search"}, {"name": "fetch_page"}]},
        "ddg-copy": {"tools": [{"name": "search", "description": "second copy"}]}})]
    s, t = write_mcp_catalog(tmp_path, servers, [])
    with pytest.raises(DataError, match=r"server 'web-search': duplicate tool inside a server 'web-search::search'"
                                        r".*on_duplicate: keep-first or keep-last") as e:
        load(s, t)
    assert str(s) in str(e.value)
    first = load(s, t, on_duplicate="keep-first")
    assert first.tool_by_id()["web-search::search"].description == "web search"
    assert first.skipped == {"repeated tool inside a server (first kept)": 1}
    last = load(s, t, on_duplicate="keep-last")
    assert last.tool_by_id()["web-search::search"].description == "second copy"
    assert [t.id for t in last.tools] == ["web-search::search", "web-search::fetch_page"]
    with pytest.raises(ConfigError, match="data.options.on_duplicate: 'keep' is not one of"):
        load(s, t, on_duplicate="keep")


def test_repeated_task_id_is_an_error_unless_told(tmp_path):
    task = {"task_id": 7, "Question": "weather in Oslo", "Annotator Metadata": {"Tools": "1. get_forecast"}}
    s, t = write_mcp_catalog(tmp_path, MCP_SERVERS[:1], [task, dict(task, Question="weather in Rome")])
    with pytest.raises(DataError, match=r"task #1: duplicate task_id '7' \(first on task #0\)") as e:
        load(s, t)
    assert str(t) in str(e.value)
    assert [q.text for q in load(s, t, on_duplicate="keep-first").queries] == ["weather in Oslo"]
    last = load(s, t, on_duplicate="keep-last")
    assert [q.text for q in last.queries] == ["weather in Rome"]
    assert last.skipped["repeated task_id (last kept)"] == 1


def test_gold_and_steps_from_numbered_lines(mcp_catalog):
    ds = load(*mcp_catalog)
    q = {q.id: q for q in ds.queries}
    assert q["t1"].tools == ("weather-server::get_forecast",)
    assert q["t1"].steps == ("Get the forecast for Paris", "Look for rain")
    assert q["t2"].steps[1] == "Search hotels in Rome with free rooms"  # continuation line joined
    # 'search' is in hotels and web-search: the task category (Travel) picks hotels
    assert q["t2"].tools == ("flights::search_flights", "hotels::search")
    # category Search picks web-search; 'finance/convert_currency' is server-qualified; 'not_a_tool' dropped
    assert q["t3"].tools == ("web-search::search", "finance::convert_currency")
    assert "t4" not in q  # its only tool is not in the catalog
    assert ds.notes["ambiguous_names_in_catalog"] == 1
    assert ds.notes["ambiguous_gold"] == 2 and ds.notes["resolved_by_category"] == 2
    assert ds.notes["tools_count_mismatch"] == 1  # t3 lists 3 tools, declares 2
    assert ds.skipped["gold tool not in the catalog (name dropped)"] == 2
    assert ds.skipped["task with no gold tool in the catalog"] == 1
    assert all(q.split == "test" for q in ds.queries)


@pytest.mark.parametrize("policy,t2_gold", [
    ("first", ("flights::search_flights", "hotels::search")),  # hotels comes before web-search
    ("all", ("flights::search_flights", "hotels::search", "web-search::search")),
    ("drop", ("flights::search_flights",)),
])
def test_duplicate_name_policies(mcp_catalog, policy, t2_gold):
    ds = load(*mcp_catalog, duplicate_names=policy)
    assert {q.id: q for q in ds.queries}["t2"].tools == t2_gold


def test_duplicate_name_error_names_the_task(mcp_catalog):
    with pytest.raises(DataError, match="task 't2'.*'search'.*several servers"):
        load(*mcp_catalog, duplicate_names="error")
    with pytest.raises(ConfigError, match="duplicate_names"):
        load(*mcp_catalog, duplicate_names="random")


def test_category_tie_falls_back_to_catalog_order(tmp_path):
    servers = [dict(MCP_SERVERS[2]), dict(MCP_SERVERS[3], category="Travel")]
    tasks = [{"task_id": 1, "Question": "q", "category": "Travel",
              "Annotator Metadata": {"Steps": "", "Tools": "search"}}]
    ds = load(*write_mcp_catalog(tmp_path, servers, tasks))
    assert ds.queries[0].tools == ("hotels::search",) and ds.queries[0].steps is None
    assert ds.notes["resolved_by_catalog_order"] == 1


def test_tools_list_responses(tmp_path):
    folder = tmp_path / "lists"
    folder.mkdir()
    (folder / "files.json").write_text(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"tools": [
        {"name": "read_file", "description": "read a file", "inputSchema": {"type": "object"}}]}}))
    (folder / "git.json").write_text(json.dumps({"tools": [{"name": "git_log", "description": "show commits"}]}))
    ds = load_dataset("mcp", tmp_path, tools_lists="lists")
    assert sorted(t.id for t in ds.tools) == ["files::read_file", "git::git_log"]
    assert {a.id for a in ds.agents} == {"files", "git"} and not ds.queries


def test_round_trip_keeps_agent_category(mcp_catalog, tmp_path):
    ds = load(*mcp_catalog)
    back = read_dataset(write_dataset(ds, tmp_path / "out"))
    assert back.agents == ds.agents and back.queries == ds.queries


def test_numbered_items():
    assert numbered_items("1. a\n2) b\n   more\n\n3. c") == ["a", "b more", "c"]
    assert numbered_items("just one tool") == ["just one tool"]
    assert numbered_items("") == []


@pytest.mark.parametrize("servers,match", [
    ({"name": "x"}, "expected a JSON list of servers"),
    ([{"description": "no name", "tools": []}], r"server #0: missing or empty 'name'"),
    ([{"name": "s", "tools": {"cfg": {"no": []}}}], r"server #0 \('s'\): tools\['cfg'\] needs a 'tools' list"),
    ([{"name": "s", "tools": [{"description": "nameless"}]}], r"tools\['tools'\]\[0\] needs a non-empty 'name'"),
    ([{"name": "s", "tools": []}, {"name": "s", "tools": []}], "server 's' appears twice"),
    ([{"name": "s", "description": ["a", "list"], "tools": []}], "server 's': 'description' and 'category' must be"),
])
def test_bad_servers_file(tmp_path, servers, match):
    s, t = write_mcp_catalog(tmp_path, servers, [])
    with pytest.raises(DataError, match=match) as e:
        load(s, t)
    assert str(s) in str(e.value)


def test_bad_tools_list_response_names_the_file(tmp_path):
    import json

    from toolgraph.data.sources.mcp import read_catalog

    bad = tmp_path / "weather.json"
    bad.write_text(json.dumps({"tools": [{"name": "t"}], "server": {"category": 7}}))
    with pytest.raises(DataError, match="server 'weather': 'description' and 'category' must be strings") as e:
        read_catalog(tools_lists=tmp_path)
    assert str(bad) in str(e.value)


def test_bad_tasks_file(tmp_path):
    s, t = write_mcp_catalog(tmp_path, None, [{"task_id": "a", "Question": "q", "Annotator Metadata": "oops"}])
    with pytest.raises(DataError, match=r"task #0 \('a'\): 'Annotator Metadata'") as e:
        load(s, t)
    assert str(t) in str(e.value)
    with pytest.raises(ConfigError, match="needs 'servers'"):
        load_dataset("mcp", tmp_path)


# ---- queries: labels for your own catalog (a JSONL file) ------------------------------------------


def write_queries(folder, *lines):
    path = folder / "queries.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def load_queries(tmp_path, *lines, tasks=None, **kw):
    s, _ = write_mcp_catalog(tmp_path, None, tasks or [])
    q = write_queries(tmp_path, *lines)
    return load_dataset("mcp", tmp_path, servers=s.name, queries=q.name, tasks="tasks.json" if tasks else None, **kw)


def test_queries_name_tools_as_ids_qualified_or_bare_names(tmp_path):
    ds = load_queries(tmp_path,
                      {"query": "rain in Paris?", "tools": ["weather-server::get_forecast"], "id": "a"},
                      {"query": "flight and hotel", "tools": ["flights/search_flights", "hotels.search"]},
                      {"query": "a quote", "tools": ["stock_quote", "finance::Convert_Currency"], "split": "train"},
                      "",  # a blank line is skipped, and the line numbers still count it
                      {"query": "  fetch it  ", "tools": ["web-search: fetch_page", "fetch_page"], "id": 7})
    q = {q.id: q for q in ds.queries}
    assert list(q) == ["a", "line-2", "line-3", "7"]
    assert q["a"].tools == ("weather-server::get_forecast",) and q["a"].split == "test"
    assert q["line-2"].tools == ("flights::search_flights", "hotels::search")
    assert q["line-3"].tools == ("finance::stock_quote", "finance::convert_currency") and q["line-3"].split == "train"
    assert q["7"].text == "fetch it" and q["7"].tools == ("web-search::fetch_page",)  # the same tool twice: once
    assert ds.notes["queries"] == "queries.jsonl" and not ds.skipped


@pytest.mark.parametrize("policy,gold", [
    ("category", ("hotels::search",)),  # a query has no category: catalog order (hotels before web-search)
    ("first", ("hotels::search",)),
    ("all", ("hotels::search", "web-search::search")),
])
def test_a_bare_name_several_servers_offer_follows_duplicate_names(tmp_path, policy, gold):
    ds = load_queries(tmp_path, {"query": "find it", "tools": ["search"]}, duplicate_names=policy)
    assert ds.queries[0].tools == gold
    assert ds.notes["ambiguous_gold"] == 1


def test_duplicate_names_error_and_drop_on_queries(tmp_path):
    lines = ({"query": "weather", "tools": ["get_forecast"]}, {"query": "find it", "tools": ["search"]})
    with pytest.raises(DataError, match=r"queries\.jsonl:2: tool 'search' is offered by several servers "
                                        r"\['hotels', 'web-search'\]; write it as server::tool"):
        load_queries(tmp_path, *lines, duplicate_names="error")
    ds = load_queries(tmp_path, *lines, duplicate_names="drop")
    assert [q.text for q in ds.queries] == ["weather"]
    assert ds.skipped == {"ambiguous gold tool (dropped by policy)": 1,
                          "query with no gold tool left (duplicate_names: drop)": 1}


def test_queries_and_tasks_together_and_their_ids(tmp_path):
    task = {"task_id": "t1", "Question": "rain?", "Annotator Metadata": {"Tools": "1. get_forecast"}}
    ds = load_queries(tmp_path, {"query": "book a flight", "tools": ["flights::book_flight"]}, tasks=[task])
    assert [(q.id, q.tools) for q in ds.queries] == [("t1", ("weather-server::get_forecast",)),
                                                     ("line-1", ("flights::book_flight",))]
    with pytest.raises(DataError, match=r"queries\.jsonl:1: id 't1' is also a task_id in .*tasks\.json"):
        load_queries(tmp_path, {"query": "x", "tools": ["book_flight"], "id": "t1"}, tasks=[task])


def test_a_repeated_query_id_is_an_error_unless_told(tmp_path):
    lines = ({"query": "one", "tools": ["book_flight"], "id": "q"}, {"query": "two", "tools": ["search_flights"], "id": "q"})
    with pytest.raises(DataError, match=r"queries\.jsonl:2: duplicate query id 'q' \(first on line 1\)"):
        load_queries(tmp_path, *lines)
    assert [q.text for q in load_queries(tmp_path, *lines, on_duplicate="keep-first").queries] == ["one"]
    last = load_queries(tmp_path, *lines, on_duplicate="keep-last")
    assert [q.text for q in last.queries] == ["two"] and last.skipped == {"repeated query id (last kept)": 1}
