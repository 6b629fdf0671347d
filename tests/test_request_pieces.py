"""Training pieces (toolgraph/data/request_pieces.py, ``data.options.query_pieces``): a query that needs
several tools trains as its clauses too, each with the gold tool it names; leaks are checked per piece."""

import json
from pathlib import Path

import pytest

from toolgraph.data.loading import load_dataset
from toolgraph.data.request_pieces import labelled_pieces, named_tool, words
from toolgraph.data.schema import Query, Tool
from toolgraph.errors import ConfigError

TOOLS = {"taxi": Tool("taxi", "order_taxi", "Order a taxi to an address."),
         "table": Tool("table", "bookRestaurantTable", "Book a table at a restaurant."),
         "cab": Tool("cab", "order_cab", "A taxi.")}


def test_words_split_names_drop_stop_words_and_compare_on_stems():
    assert words("bookRestaurantTable") == {"book", "restau", "table"}
    assert words("Forecasting weathers") & words("weather_forecast") == {"foreca", "weathe"}  # 6 letters compare
    assert words("Booking tables") & words("booked a table") == frozenset()  # no lemmatiser: "tables" != "table"
    assert words("I want it now, please") == frozenset()


def test_a_piece_names_the_gold_tool_it_shares_most_words_with_or_none():
    gold = {t: words(f"{TOOLS[t].name} {TOOLS[t].description}") for t in ("taxi", "table")}
    assert named_tool("Then order a taxi to the restaurant", gold) == "taxi"  # taxi + order beat restaurant
    assert named_tool("Book a table for two at Luigi's", gold) == "table"
    assert named_tool("It is my birthday", gold) is None  # no shared word: no label
    tie = {t: words(f"{TOOLS[t].name} {TOOLS[t].description}") for t in ("taxi", "cab")}
    assert named_tool("Order a taxi", tie) is None  # two tools equally named: no label rather than a guess


def test_only_training_queries_with_several_tools_and_pieces_give_pieces():
    queries = [Query("1", "Book a table at a restaurant for two. Then order a taxi to it", ("table", "taxi"), "train"),
               Query("2", "Book a table at a restaurant for two. Then order a taxi to it", ("table", "taxi"), "val"),
               Query("3", "Book a table at a restaurant for two and order a taxi", ("table", "taxi"), "train"),
               Query("4", "Order a taxi to the station. Then order another taxi home", ("taxi",), "train"),
               Query("5", "Order a taxi now. Then book a restaurant table. Thanks a lot for it",
                     ("table", "taxi"), "train")]
    got = labelled_pieces(queries, TOOLS)
    assert [(q.id, q.text, q.tools, q.split) for q in got] == [
        ("1#piece0", "Book a table at a restaurant for two", ("table",), "train"),
        ("1#piece1", "order a taxi to it", ("taxi",), "train"),
        ("5#piece0", "Order a taxi now", ("taxi",), "train"),
        ("5#piece1", "book a restaurant table", ("table",), "train")]  # "Thanks a lot for it" names no tool
    assert [q.id for q in labelled_pieces(queries, TOOLS, "sentences")] == ["1#piece0", "1#piece1", "5#piece0",
                                                                            "5#piece1"]
    with pytest.raises(ValueError, match="query pieces split by one of"):
        labelled_pieces(queries, TOOLS, "none")


def _write(folder: Path, tools: list[dict], queries: list[dict]) -> str:
    folder.mkdir(parents=True)
    for name, rows in [("tools", tools), ("queries", queries)]:
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


@pytest.fixture
def mixed(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLGRAPH_DATA", str(tmp_path))
    tools = [{"id": k, "name": t.name, "description": t.description} for k, t in TOOLS.items() if k != "cab"]
    a = _write(tmp_path / "a", tools, [
        {"id": "1", "text": "Book a table at a restaurant for two. Then order a taxi to it", "tools": ["table", "taxi"],
         "split": "train"},
        {"id": "2", "text": "Order a taxi to the airport. Also book a restaurant table there",
         "tools": ["table", "taxi"], "split": "train"},
        {"id": "3", "text": "order a taxi", "tools": ["taxi"], "split": "val"}])
    shuttle = [{"id": "s", "name": "airport_shuttle", "description": "Book a seat on an airport shuttle."}]
    held = _write(tmp_path / "held", shuttle, [{"id": "9", "text": "Order a taxi to the airport!", "tools": ["s"],
                                                "split": "test"}])
    return a, held


def test_a_mixture_trains_on_pieces_in_their_own_dataset_and_drops_leaked_ones(mixed, tmp_path):
    a, held = mixed
    plain = load_dataset("mixture", datasets=[a])
    ds = load_dataset("mixture", datasets=[a], query_pieces="clauses")
    pieces = [q for q in ds.queries if "#piece" in q.id]
    assert len(ds.queries) == len(plain.queries) + 4 and len(pieces) == 4
    assert {(q.text, q.tools) for q in pieces} == {
        ("Book a table at a restaurant for two", (f"{a}::table",)), ("order a taxi to it", (f"{a}::taxi",)),
        ("Order a taxi to the airport", (f"{a}::taxi",)), ("book a restaurant table there", (f"{a}::table",))}
    assert all(q.split == "train" and q.id.startswith(f"{a}::") for q in pieces)
    assert ds.notes["mixture"][a]["pieces"] == 4 and ds.notes["mixture"][a]["train"] == 2
    # the held-out dataset asks "Order a taxi to the airport!": the piece with that text never trains
    leak = load_dataset("mixture", datasets=[a], holdout=[held], query_pieces="clauses")
    assert "Order a taxi to the airport" not in {q.text for q in leak.queries}
    assert leak.notes["mixture"][a]["dropped"].get("piece text also in a held-out dataset") == 1
    dups = tmp_path / "dups.json"
    dups.write_text(json.dumps({"queries": [f"{a}::1#piece1"], "tools": []}))
    near = load_dataset("mixture", datasets=[a], near_duplicates=str(dups), query_pieces="clauses")
    assert f"{a}::1#piece1" not in {q.id for q in near.queries}
    assert near.notes["mixture"][a]["dropped"] == {"piece near-duplicate of a held-out query (embedding)": 1}


def test_a_bad_query_pieces_rule_names_the_key(mixed):
    with pytest.raises(ConfigError, match=r"data.options.query_pieces: 'words' is not a split rule"):
        load_dataset("mixture", datasets=[mixed[0]], query_pieces="words")
    with pytest.raises(ConfigError, match="query_pieces: 'none'"):
        load_dataset("mixture", datasets=[mixed[0]], query_pieces="none")
    with pytest.raises(ConfigError, match=r"query_pieces: \['clauses'\] is not a split rule"):
        load_dataset("mixture", datasets=[mixed[0]], query_pieces=["clauses"])  # a list in YAML: named, no TypeError
