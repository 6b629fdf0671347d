"""index sync builds and updates any retriever that can index a catalog (bm25, dense, t2a ...), refuses a
trained-only one by its key, and a t2a index with scorer bm25 never builds an encoder (issue 43, item 10)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MCP_SERVERS, write_mcp_catalog

from toolgraph.cli import main as cli
from toolgraph.errors import ConfigError
from toolgraph.retrieval.loading import load
from toolgraph.sync import sync_index

REPO = Path(__file__).resolve().parents[1]
RECIPES = MCP_SERVERS + [{"name": "recipes", "description": "Cooking recipes", "category": "Food",
                          "tools": [{"name": "find_recipe", "description": "vegan lasagna recipes with spinach",
                                     "inputSchema": {}}]}]


def sync_json(capsys, *args) -> dict:
    assert cli(["index", "sync", *map(str, args)]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_bm25_index_is_created_and_updated_by_the_shipped_config(mcp_catalog, tmp_path, capsys):
    index, config = tmp_path / "bm25", REPO / "configs" / "retriever" / "bm25.yaml"
    first = sync_json(capsys, mcp_catalog[0], "--index", index, "--retriever-config", config)
    assert first["created"] and first["added"] == 10 and first["tools"] == 10 and first["agents"] == 5
    r = load(index)
    assert r.name == "bm25" and r.retrieve(["seven day weather forecast"], 1).ids == [["weather-server::get_forecast"]]
    assert r.retrieve_agents(["reserve a hotel room"], 1).ids == [["hotels"]]  # agents by roll-up

    v2, _ = write_mcp_catalog(tmp_path / "v2", RECIPES[1:])  # weather-server gone, recipes new
    second = sync_json(capsys, v2, "--index", index)  # the index says what it is: no --retriever-config
    assert (second["created"], second["added"], second["removed"], second["unchanged"]) == (False, 1, 2, 8)
    r = load(index)
    assert len(r.tools) == 9 and r.retrieve(["vegan lasagna"], 1).ids == [["recipes::find_recipe"]]
    assert not any(t.agent == "weather-server" for t in r.tools)
    assert sync_json(capsys, v2, "--index", index)["unchanged"] == 9


def test_a_dense_index_is_created_and_updated(mcp_catalog, tiny_bert_dir, tmp_path):
    index = tmp_path / "dense"
    spec = {"name": "dense", "encoder": {"name": str(tiny_bert_dir), "cache_dir": None}, "progress": False}
    assert sync_index(mcp_catalog[0], index, spec)["added"] == 10
    v2, _ = write_mcp_catalog(tmp_path / "v2", RECIPES)
    counts = sync_index(v2, index)
    assert counts["added"] == 1 and counts["reindexed"] == 11
    r = load(index)
    assert r.name == "dense" and "recipes::find_recipe" in {t.id for t in r.tools}
    assert len(r.retrieve(["vegan lasagna"], 3).ids[0]) == 3
    assert not (tmp_path / ".cache").exists()


@pytest.mark.parametrize("spec,key", [
    ({"name": "mlc"}, "retriever.name: 'mlc' is a trained retriever"),
    ("gnn", "retriever.name: 'gnn' is a trained retriever"),
    ({"name": "pipeline", "first_stage": "bm25", "reranker": {"name": "cross_encoder"}},
     "retriever.reranker.name: 'cross_encoder' is a trained retriever"),
    ({"name": "query_knn", "encoder": {"name": "TINY", "cache_dir": None}, "progress": False},
     "retriever.name: a new 'query_knn' index cannot be built from a catalog alone .*training queries"),
])
def test_a_retriever_that_cannot_index_a_bare_catalog_is_refused_by_its_key(mcp_catalog, tiny_bert_dir, tmp_path,
                                                                             spec, key):
    spec = json.loads(json.dumps(spec).replace("TINY", str(tiny_bert_dir)))
    with pytest.raises(ConfigError, match=key):
        sync_index(mcp_catalog[0], tmp_path / "idx", spec)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mcp"]  # no index, no lock file, no temp folder


def test_a_saved_trained_retriever_is_accepted_by_its_folder(mcp_catalog, tiny_bert_dir, tmp_path, monkeypatch):
    """A name in TRAINED_ONLY is refused as a config, never as a path to a saved retriever."""
    from toolgraph.retrieval.loading import resolve_retriever
    from toolgraph.sync import read_catalog_any

    saved = tmp_path / "gnn"  # stands for a training run's export: a folder named like the retriever
    r = resolve_retriever({"name": "dense", "encoder": {"name": str(tiny_bert_dir), "cache_dir": None}})
    r.index(read_catalog_any(mcp_catalog[0])[0])
    r.save(saved)
    monkeypatch.chdir(tmp_path)  # "gnn" names the folder here
    counts = sync_index(mcp_catalog[0], tmp_path / "idx", "gnn")
    assert counts["created"] and counts["unchanged"] == 10 and load(tmp_path / "idx").name == "dense"


T2A_BM25 = """
import json, sys
from toolgraph.sync import sync_index
from toolgraph.retrieval.loading import load
catalog, index = sys.argv[1:]
counts = sync_index(catalog, index, {"name": "t2a", "scorer": "bm25"})
r = load(index)
out = {"counts": counts, "agents": r.retrieve_agents(["seven day weather forecast"], 1).ids,
       "tools": r.retrieve(["reserve a hotel room"], 1).ids, "dense_built": r._dense is not None,
       "transformers_imported": "transformers" in sys.modules}
print(json.dumps(out))
"""


def test_a_t2a_bm25_index_never_builds_an_encoder(mcp_catalog, tmp_path):
    """In a fresh process: sync, load and query a t2a index with scorer bm25; transformers is never even
    imported (the default dense member, MiniLM here, would import it to load the model), and the index
    has no dense/ folder and no vector width."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    index = tmp_path / "t2a"
    done = subprocess.run([sys.executable, "-c", T2A_BM25, str(mcp_catalog[0]), str(index)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["agents"] == [["weather-server"]] and out["tools"] == [["hotels::reserve_room"]]
    assert out["counts"]["encoded"] == 0 and not out["dense_built"] and not out["transformers_imported"]
    assert not (index / "dense").exists()
    saved = json.loads((index / "retriever.json").read_text())["config"]
    assert saved["scorer"] == "bm25" and saved["dense"] is None
    from safetensors import safe_open

    with safe_open(str(index / "entity_vectors.safetensors"), "pt") as f:
        assert list(f.get_slice("tool_vectors").get_shape()) == [10, 0]


def test_a_t2a_bm25_index_still_answers_dense_when_its_scorer_changes(mcp_catalog, tiny_bert_dir, tmp_path):
    """Vectors are encoded when a scorer first needs them (an index built under bm25, then asked for rrf)."""
    dense = {"name": "dense", "encoder": {"name": str(tiny_bert_dir), "cache_dir": None}, "progress": False}
    sync_index(mcp_catalog[0], tmp_path / "idx", {"name": "t2a", "scorer": "bm25", "dense": dense})
    r = load(tmp_path / "idx")
    r.config.scorer = "rrf"
    assert r.retrieve_agents(["seven day weather forecast"], 5).ids[0][:1] == ["weather-server"]
    assert r.encoded == 15 and r.tool_vectors.shape == (10, 32)
