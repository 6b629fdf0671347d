"""index sync never replaces a folder it did not write, and two syncs of one index never interleave
(issue 20, finding 2)."""

import json
import threading
import time
from pathlib import Path

import pytest
from conftest import MCP_SERVERS, write_mcp_catalog

from toolgraph.cli import main as cli
from toolgraph.errors import ConfigError
from toolgraph.retrieval.loading import load as load_index
from toolgraph.sync import sync_index


def spec(tiny_bert_dir):
    return {"name": "t2a", "scorer": "rrf",
            "dense": {"name": "dense", "model": str(tiny_bert_dir), "cache_dir": None, "progress": False}}


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_sync_refuses_an_existing_folder_that_is_not_an_index(mcp_catalog, tiny_bert_dir, tmp_path, capsys):
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "notes.txt").write_text("my notes")
    (work / "src" / "main.py").write_text("print('hi')")
    before = tree(work)
    with pytest.raises(ConfigError, match="not a toolgraph index"):
        sync_index(mcp_catalog[0], work, spec(tiny_bert_dir))
    assert tree(work) == before  # nothing renamed, nothing deleted
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".work")) == []  # no lock file left

    assert cli(["index", "sync", str(mcp_catalog[0]), "--index", str(work)]) == 2
    err = capsys.readouterr().err
    assert "not a toolgraph index" in err and "nothing was changed" in err and "Traceback" not in err
    assert tree(work) == before

    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me")
    with pytest.raises(ConfigError, match="not a folder"):
        sync_index(mcp_catalog[0], a_file, spec(tiny_bert_dir))
    assert a_file.read_text() == "keep me"


def test_an_empty_folder_may_be_used_and_created_is_true_only_when_created(mcp_catalog, tiny_bert_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    counts = sync_index(mcp_catalog[0], empty, spec(tiny_bert_dir))
    assert counts["created"] is True and counts["added"] == 15
    assert load_index(empty).name == "t2a"
    again = sync_index(mcp_catalog[0], empty)
    assert again["created"] is False and again["encoded"] == 0


def test_two_syncs_at_once_run_one_after_the_other(mcp_catalog, tiny_bert_dir, tmp_path, monkeypatch):
    """Both syncs bring the same new server into the index: the second must see the first's result
    (nothing left to add) instead of both diffing against the old index and the last one winning,
    and neither may delete the other's half-saved folder."""
    index = tmp_path / "idx"
    sync_index(mcp_catalog[0], index, spec(tiny_bert_dir))
    servers = MCP_SERVERS + [{"name": "recipes", "description": "Cooking recipes", "category": "Food",
                              "tools": [{"name": "find_recipe", "description": "vegan lasagna recipes",
                                         "inputSchema": {}}]}]
    catalog, _ = write_mcp_catalog(tmp_path / "v2", servers, [])
    from toolgraph.retrieval.agents import AgentRetriever

    real_save = AgentRetriever.save

    def slow_save(self, folder):  # a long save: the other sync starts while this one writes
        out = real_save(self, folder)
        time.sleep(1.0)
        return out

    monkeypatch.setattr(AgentRetriever, "save", slow_save)
    results, errors = [], []

    def run():
        try:
            results.append(sync_index(catalog, index))
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.3)
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(r["added"] for r in results) == [0, 2]  # one added the server and its tool, the other nothing
    assert len(load_index(index).tools) == 11
    assert not list(tmp_path.glob(".idx.new-*")) and not list(tmp_path.glob(".idx.old-*"))


def test_a_sync_that_cannot_get_the_lock_fails_with_a_clear_message(mcp_catalog, tiny_bert_dir, tmp_path, capsys):
    from toolgraph.errors import DataError
    from toolgraph.sync import index_lock

    index = tmp_path / "idx"
    sync_index(mcp_catalog[0], index, spec(tiny_bert_dir))
    before = tree(index)
    with index_lock(index):
        t0 = time.monotonic()
        with pytest.raises(DataError, match=r"another toolgraph index sync \(pid \d+\) is writing") as e:
            sync_index(mcp_catalog[0], index, wait=0.5)
        assert 0.4 < time.monotonic() - t0 < 10 and ".idx.lock" in str(e.value)
        assert cli(["index", "sync", str(mcp_catalog[0]), "--index", str(index), "--wait", "0"]) == 2
        assert "--wait" in capsys.readouterr().err
    assert tree(index) == before
    assert json.loads(json.dumps(sync_index(mcp_catalog[0], index, wait=0)))["encoded"] == 0  # free again


def test_stale_new_folders_are_cleaned_and_never_loaded(mcp_catalog, tiny_bert_dir, tmp_path):
    index = tmp_path / "idx"
    stale = tmp_path / ".idx.new-k2j3h4_x"  # left by a sync killed while saving
    stale.mkdir()
    (stale / "retriever.json").write_text("{half")
    other = tmp_path / ".idx.new-x.new-abc"  # not a name a sync of idx makes: left alone
    other.mkdir()
    counts = sync_index(mcp_catalog[0], index, spec(tiny_bert_dir))
    assert counts["created"] and not stale.exists() and other.is_dir()
    assert load_index(index).name == "t2a"
