"""index sync's fast path (retrieval/delta_sync.py) and the base + delta format (retrieval/delta.py): a
dense index synced from a dataset folder changes by a delta; what it loads is what a full sync makes."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from toolgraph.data.formats import write_dataset
from toolgraph.data.schema import Tool, ToolDataset
from toolgraph.errors import DataError
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.delta import DELTA_META, SYNC_STATE
from toolgraph.retrieval.delta_sync import COMPACT_AT
from toolgraph.sync import sync_index

WORDS = ["weather", "flights", "hotels", "money", "music", "news", "maps", "mail", "stocks", "recipes"]
QUERIES = [f"{w} {v}" for w in WORDS for v in ("today", "price")]


def _tools(n: int, start: int = 0, tag: str = "") -> list[Tool]:
    return [Tool(f"t{i}", f"{WORDS[i % 10]} tool {i}", f"get {WORDS[i % 10]} and {WORDS[(i * 7) % 10]} {i}{tag}",
                 agent=f"server{i % 7}") for i in range(start, start + n)]


def _catalog(folder: Path, tools: list[Tool]) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    return write_dataset(ToolDataset("c", tools, []), folder)


def _spec(tiny_bert_dir, index: str = "exact") -> dict:
    return {"name": "dense", "encoder": {"name": str(tiny_bert_dir), "cache_dir": None}, "index": index,
            "progress": False}


def _full(tmp_path: Path, catalog: Path, tiny_bert_dir, index: str) -> Retriever:
    """The index a full sync from scratch makes of ``catalog``."""
    out = tmp_path / f"full-{index}"
    shutil.rmtree(out, ignore_errors=True)
    sync_index(catalog, out, _spec(tiny_bert_dir, index))
    return Retriever.load(out)


def _same(a: Retriever, b: Retriever) -> None:
    assert [t for t in a.tools] == [t for t in b.tools]
    assert torch.allclose(a.tool_vectors, b.tool_vectors, atol=1e-5)
    assert a.retrieve(QUERIES, 10).ids == b.retrieve(QUERIES, 10).ids


@pytest.mark.parametrize("index", ["exact", "faiss-ivf", "faiss-hnsw"])
def test_a_sync_writes_a_delta_and_loads_as_the_full_sync_would(index, tiny_bert_dir, tmp_path):
    tools = _tools(400)
    first = sync_index(_catalog(tmp_path / "v1", tools), tmp_path / "idx", _spec(tiny_bert_dir, index))
    assert first["created"] and "delta" not in first
    assert SYNC_STATE in json.loads((tmp_path / "idx" / "manifest.json").read_text())["files"]
    # one added, one removed, one changed, one re-serialised with its keys in another order (unchanged)
    changed = replace(tools[5], description="now about volcanoes")
    v2 = [t for t in tools if t.id not in ("t3", "t5")] + [changed] + _tools(1, start=400)
    catalog = _catalog(tmp_path / "v2", v2)
    lines = (catalog / "tools.jsonl").read_text().splitlines()
    lines[0] = json.dumps(dict(reversed(list(json.loads(lines[0]).items()))))
    (catalog / "tools.jsonl").write_text("\n".join(lines) + "\n")
    counts = sync_index(catalog, tmp_path / "idx")
    assert counts["delta"] == {"tools": 2, "removed": 2}  # t400 and t5 in it; t3 and the old t5 out of the base
    assert {k: counts[k] for k in ("added", "removed", "updated", "unchanged", "encoded", "tools")} == \
        {"added": 1, "removed": 1, "updated": 1, "unchanged": 398, "encoded": 2, "tools": 400}
    served = Retriever.load(tmp_path / "idx")
    _same(served, _full(tmp_path, catalog, tiny_bert_dir, index))
    assert served.search(changed.document(), 1)[0].id == "t5"
    assert served.index_kind() == index
    # the base's files are the very files of the first index (hard links), its vectors never rewritten
    assert json.loads((tmp_path / "idx" / "retriever.json").read_text())["tools"] == 400
    assert json.loads((tmp_path / "idx" / DELTA_META).read_text())["base_tools"] == 400


def test_deltas_compose_and_a_large_change_compacts_into_a_new_base(tiny_bert_dir, tmp_path):
    tools = _tools(300)
    sync_index(_catalog(tmp_path / "c", tools), tmp_path / "idx", _spec(tiny_bert_dir, "faiss-ivf"))
    now = tools
    for step in range(3):  # each sync: two new tools, the oldest delta tool changed again
        now = now + _tools(2, start=300 + 2 * step)
        if step:  # a tool of the last delta changed again
            old = f"t{300 + 2 * step - 2}"
            now = [t if t.id != old else replace(t, description=f"changed at {step}") for t in now]
        catalog = _catalog(tmp_path / "c", now)
        counts = sync_index(catalog, tmp_path / "idx")
        assert "delta" in counts
    assert counts["delta"] == {"tools": 6, "removed": 0}
    _same(Retriever.load(tmp_path / "idx"), _full(tmp_path, catalog, tiny_bert_dir, "faiss-ivf"))
    # past COMPACT_AT of the base: the full sync, one base again (and a state for the next)
    many = now + _tools(int(COMPACT_AT * 300) + 1, start=1000)
    counts = sync_index(_catalog(tmp_path / "c", many), tmp_path / "idx")
    assert "delta" not in counts and counts["added"] == int(COMPACT_AT * 300) + 1
    assert not (tmp_path / "idx" / DELTA_META).exists()
    assert "delta" in sync_index(_catalog(tmp_path / "c", many + _tools(1, start=5000)), tmp_path / "idx")


def test_an_unchanged_catalog_writes_nothing(tiny_bert_dir, tmp_path):
    catalog = _catalog(tmp_path / "c", _tools(50))
    sync_index(catalog, tmp_path / "idx", _spec(tiny_bert_dir))
    before = (tmp_path / "idx" / "manifest.json").stat().st_ino
    counts = sync_index(catalog, tmp_path / "idx")
    assert counts["unchanged"] == 50 and counts["encoded"] == 0
    assert (tmp_path / "idx" / "manifest.json").stat().st_ino == before


def test_a_bad_new_line_gets_the_full_sync_s_error_with_its_line(tiny_bert_dir, tmp_path):
    catalog = _catalog(tmp_path / "c", _tools(50))
    sync_index(catalog, tmp_path / "idx", _spec(tiny_bert_dir))
    with (catalog / "tools.jsonl").open("a") as f:
        f.write(json.dumps({"id": "t1", "name": "again", "description": "a repeated id"}) + "\n")
    with pytest.raises(DataError, match=r"tools.jsonl:51.*duplicate tool id 't1'"):
        sync_index(catalog, tmp_path / "idx")
    lines = (catalog / "tools.jsonl").read_text().splitlines()[:50] + ['{"id": "x", "name": "broken"']
    (catalog / "tools.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"tools.jsonl:51"):
        sync_index(catalog, tmp_path / "idx")
    assert len(Retriever.load(tmp_path / "idx").tools) == 50  # the index as it was


def test_a_catalog_with_queries_or_another_retriever_takes_the_full_sync(tiny_bert_dir, tmp_path):
    from toolgraph.data.schema import Query

    tools = _tools(60)
    ds = ToolDataset("c", tools, [Query("q1", "weather today", ("t0",), "test")])
    sync_index(write_dataset(ds, tmp_path / "c"), tmp_path / "idx", _spec(tiny_bert_dir))
    assert SYNC_STATE not in json.loads((tmp_path / "idx" / "manifest.json").read_text())["files"]
    sync_index(_catalog(tmp_path / "b", tools), tmp_path / "bm", {"name": "bm25"})
    counts = sync_index(_catalog(tmp_path / "b", tools + _tools(1, start=60)), tmp_path / "bm")
    assert "delta" not in counts and counts["added"] == 1


def test_a_full_save_over_a_delta_index_drops_the_delta(tiny_bert_dir, tmp_path):
    tools = _tools(100)
    sync_index(_catalog(tmp_path / "c", tools), tmp_path / "idx", _spec(tiny_bert_dir))
    sync_index(_catalog(tmp_path / "c", tools + _tools(2, start=100)), tmp_path / "idx")
    r = Retriever.load(tmp_path / "idx")
    r.add_tools(_tools(1, start=200))
    r.save(tmp_path / "idx")
    assert not (tmp_path / "idx" / DELTA_META).exists() and not (tmp_path / "idx" / SYNC_STATE).exists()
    ids = [t.id for t in Retriever.load(tmp_path / "idx").tools]
    assert len(ids) == 103 and {"t100", "t101", "t200"} <= set(ids)


def test_a_damaged_delta_is_refused_naming_the_file(tiny_bert_dir, tmp_path):
    tools = _tools(100)
    sync_index(_catalog(tmp_path / "c", tools), tmp_path / "idx", _spec(tiny_bert_dir))
    sync_index(_catalog(tmp_path / "c", tools + _tools(2, start=100)), tmp_path / "idx")
    path = tmp_path / "idx" / "delta.jsonl"
    path.write_text(path.read_text().replace("t101", "t102"))
    with pytest.raises(DataError, match="delta.jsonl"):
        Retriever.load(tmp_path / "idx")


def test_a_delta_the_manifest_does_not_list_is_not_applied(tiny_bert_dir, tmp_path):
    tools = _tools(100)
    sync_index(_catalog(tmp_path / "c", tools), tmp_path / "idx", _spec(tiny_bert_dir))
    sync_index(_catalog(tmp_path / "c", tools + _tools(2, start=100)), tmp_path / "idx")
    shutil.copy(tmp_path / "idx" / DELTA_META, tmp_path / "delta.json")
    r = Retriever.load(tmp_path / "idx")
    r.remove_tools(["t100", "t101"])
    Retriever.save(r, tmp_path / "idx")  # the base class's save: no clean-up of its own
    shutil.copy(tmp_path / "delta.json", tmp_path / "idx" / DELTA_META)  # a stale copy, not listed
    assert len(Retriever.load(tmp_path / "idx").tools) == 100


def test_a_delta_sync_keeps_the_user_s_files_and_a_changed_agents_file_takes_the_full_sync(tiny_bert_dir, tmp_path):
    from toolgraph.data.schema import Agent

    tools = _tools(100)
    agents = [Agent(f"server{i}", f"server {i}") for i in range(7)]
    sync_index(write_dataset(ToolDataset("c", tools, [], agents), tmp_path / "c"), tmp_path / "idx",
               _spec(tiny_bert_dir))
    (tmp_path / "idx" / "README.md").write_text("my notes\n")
    counts = sync_index(write_dataset(ToolDataset("c", tools + _tools(1, start=100), [], agents), tmp_path / "c"),
                        tmp_path / "idx")
    assert "delta" in counts and (tmp_path / "idx" / "README.md").read_text() == "my notes\n"
    agents[0] = Agent("server0", "renamed server")
    counts = sync_index(write_dataset(ToolDataset("c", tools + _tools(2, start=100), [], agents), tmp_path / "c"),
                        tmp_path / "idx")
    assert "delta" not in counts and counts["added"] == 1  # another agents.jsonl: read in full
    assert (tmp_path / "idx" / "README.md").read_text() == "my notes\n"
    assert not (tmp_path / "idx" / DELTA_META).exists()


def test_a_running_server_swaps_in_the_delta_index(tiny_bert_dir, tmp_path):
    from toolgraph.serving import LiveIndex

    tools = _tools(80)
    sync_index(_catalog(tmp_path / "c", tools), tmp_path / "idx", _spec(tiny_bert_dir, "faiss-ivf"))
    live = LiveIndex(tmp_path / "idx", check_every=0).start()
    try:
        assert live.wait_loaded(120)
        new = Tool("volcano", "volcano alerts", "eruption warnings for a volcano", agent="server1")
        counts = sync_index(_catalog(tmp_path / "c", tools + [new]), tmp_path / "idx")
        assert counts["delta"] == {"tools": 1, "removed": 0}
        assert live.reload_if_replaced() and live.health()["tools"] == 81
        assert live.search_tools(new.document(), 1)[0]["id"] == "volcano"
    finally:
        live.close()


def test_reading_a_big_tools_file_pauses_the_collector_and_freezes_what_it_made(tmp_path, monkeypatch):
    import gc

    from toolgraph.data import formats
    from toolgraph.retrieval.base import read_saved_tools

    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in _tools(30)))
    gc.unfreeze()
    assert len(read_saved_tools(path)) == 30 and gc.isenabled() and gc.get_freeze_count() == 0  # small: no freeze
    monkeypatch.setattr(formats, "BIG_FILE_RECORDS", 20)
    try:
        assert len(read_saved_tools(path)) == 30 and gc.isenabled() and gc.get_freeze_count() > 0
        gc.unfreeze()
        path.write_text(path.read_text() + "{not json\n")
        with pytest.raises(DataError, match="tools.jsonl:31"):
            read_saved_tools(path)
        assert gc.isenabled() and gc.get_freeze_count() == 0  # a failed read leaves the collector as it was
    finally:
        gc.unfreeze()
