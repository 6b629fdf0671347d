"""Tool.to_dict: the one way a tool becomes plain data (tools.jsonl, a checkpoint's catalog)."""

from toolgraph.data.schema import Tool


def test_to_dict_leaves_out_none_fields_and_reads_back():
    full = Tool("t1", "get_weather", "weather for a city", agent="a1", category="Weather",
                parameters={"properties": {"city": {}}}, returns={"temp": {"type": "float"}})
    bare = Tool("t2", "joke", "")
    assert full.to_dict() == {"id": "t1", "name": "get_weather", "description": "weather for a city", "agent": "a1",
                              "category": "Weather", "parameters": {"properties": {"city": {}}},
                              "returns": {"temp": {"type": "float"}}}
    assert bare.to_dict() == {"id": "t2", "name": "joke", "description": ""}  # "" is kept, None is not
    for t in (full, bare):
        assert Tool(**t.to_dict()) == t
        assert list(t.to_dict()) == [k for k in ("id", "name", "description", "agent", "category", "parameters",
                                                 "returns") if getattr(t, k) is not None]  # field order
