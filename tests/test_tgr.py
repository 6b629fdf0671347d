"""TGR: the parameter-free GCN (checked against dense maths) and the TGR retriever (gold graph,
edge files, save/load, evaluation)."""

import json

import pytest
import torch
import torch.nn.functional as F

from toolgraph.data import load_dataset
from toolgraph.errors import ConfigError
from toolgraph.nn.propagate import gcn_smooth, normalized_adjacency
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.dense import DenseConfig
from toolgraph.retrieval.loading import resolve_retriever
from toolgraph.retrieval.tgr import TGRConfig


def _dense_adjacency(edges, n, direction):
    a = torch.eye(n)
    for s, t in edges:
        if s == t:
            continue
        if direction in ("to_prerequisite", "symmetric"):
            a[t, s] = 1.0
        if direction in ("to_dependent", "symmetric"):
            a[s, t] = 1.0
    d = a.sum(1).rsqrt()
    return d[:, None] * a * d[None, :]


@pytest.mark.parametrize("direction", ["to_prerequisite", "to_dependent", "symmetric"])
def test_normalized_adjacency_matches_dense_formula(direction):
    edges = [(0, 1), (2, 1), (3, 1), (1, 4), (0, 1), (2, 2)]  # a repeat and a self-loop
    ref = _dense_adjacency(edges, 5, direction)
    got = normalized_adjacency(torch.tensor(edges), 5, direction).to_dense()
    assert torch.allclose(got, ref, atol=1e-6)
    x = torch.randn(5, 3)
    assert torch.allclose(gcn_smooth(x, torch.tensor(edges), 2, direction), ref @ ref @ x, atol=1e-5)


def test_prerequisite_moves_towards_its_dependents():
    """to_prerequisite: tool 1 (needed by 0) mixes in 0's vector; 0 stays itself."""
    x = torch.eye(3)
    out = gcn_smooth(x, torch.tensor([[0, 1]]), 1, "to_prerequisite")
    assert torch.equal(out[0], x[0]) and out[1, 0] > 0 and out[2].tolist() == [0.0, 0.0, 1.0]
    assert torch.equal(gcn_smooth(x, torch.zeros(0, 2, dtype=torch.long), 3), x)  # no edges, no change
    with pytest.raises(ValueError, match="direction"):
        normalized_adjacency(torch.tensor([[0, 1]]), 3, "both")


def _tgr(tiny_bert_dir, **kw):
    return resolve_retriever(TGRConfig(model=str(tiny_bert_dir), cache_dir=None, progress=False, **kw))


def test_tgr_vectors_are_the_smoothed_dense_vectors(dependency_dataset_dir, tiny_bert_dir):
    ds = load_dataset(str(dependency_dataset_dir))
    dense = resolve_retriever(DenseConfig(model=str(tiny_bert_dir), cache_dir=None, progress=False))
    dense.index(ds.tools)
    for layers, direction in [(1, "to_prerequisite"), (2, "symmetric")]:
        r = _tgr(tiny_bert_dir, layers=layers, direction=direction)
        r.fit(ds)
        r.index(ds.tools)
        ids = [t.id for t in r.tools]
        edges = torch.tensor([(ids.index(d.source), ids.index(d.target)) for d in ds.dependencies])
        ref = F.normalize(gcn_smooth(dense.tool_vectors, edges, layers, direction), dim=-1)
        assert r.graph_edges == 16 and torch.allclose(r.tool_vectors, ref, atol=1e-5)
    flat = _tgr(tiny_bert_dir, layers=0)
    flat.fit(ds)
    flat.index(ds.tools)
    assert torch.allclose(flat.tool_vectors, dense.tool_vectors, atol=1e-6)


def test_tgr_from_an_edge_file_with_threshold(dependency_dataset_dir, tiny_bert_dir, tmp_path):
    ds = load_dataset(str(dependency_dataset_dir))
    rows = [{"source": "do_bank", "target": "login_bank", "prob": 0.9},
            {"source": "do_mail", "target": "login_mail", "prob": 0.3}]
    (tmp_path / "edges.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _tgr(tiny_bert_dir, graph=str(tmp_path), threshold=0.5)
    r.fit(ds)  # an edge file is not replaced by the dataset's gold graph
    r.index(ds.tools)
    assert r.edges == [("do_bank", "login_bank")] and r.graph_edges == 1


def test_tgr_save_load_keeps_graph_and_add_tools_resmooths(dependency_dataset_dir, tiny_bert_dir, tmp_path):
    ds = load_dataset(str(dependency_dataset_dir))
    r = _tgr(tiny_bert_dir)
    r.fit(ds)
    r.index([t for t in ds.tools if t.id != "login_bank"])
    assert r.graph_edges == 15  # the edge to a tool not indexed waits for it
    before = r.retrieve(["sign in to the bank service"], 5)
    folder = r.save(tmp_path / "tgr")
    back = Retriever.load(folder)
    assert back.retrieve(["sign in to the bank service"], 5).ids == before.ids
    back.add_tools([t for t in ds.tools if t.id == "login_bank"])
    assert back.graph_edges == 16


def test_tgr_config_errors(tiny_bert_dir):
    with pytest.raises(ConfigError, match="retriever.direction"):
        _tgr(tiny_bert_dir, direction="up")
    with pytest.raises(ConfigError, match="retriever.graph"):
        _tgr(tiny_bert_dir, graph="/nowhere/edges.jsonl")


def test_evaluate_runs_tgr_from_config(dependency_dataset_dir, tiny_bert_dir, tmp_path):
    from toolgraph.cli import main

    rc = main(["evaluate", f"data.name={dependency_dataset_dir}", "data.split=train", "retriever.name=tgr",
               f"retriever.model={tiny_bert_dir}", "retriever.cache_dir=null", "retriever.progress=false",
               "eval.ks=[1,5]", f"--out={tmp_path / 'ev'}"])
    assert rc == 0
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert 0 <= res["metrics"]["recall@5"] <= 1


def test_edge_file_keeps_each_tools_most_probable_prerequisites(tmp_path):
    from toolgraph.data.formats import read_edges

    rows = [{"source": "a", "target": "x", "prob": 0.6}, {"source": "a", "target": "y", "prob": 0.9},
            {"source": "a", "target": "z", "prob": 0.7}, {"source": "b", "target": "x", "prob": 0.55},
            {"source": "b", "target": "y", "prob": 0.3}]
    (tmp_path / "edges.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_edges(tmp_path, 0.5) == [("a", "x"), ("a", "y"), ("a", "z"), ("b", "x")]
    assert read_edges(tmp_path, 0.5, max_per_source=1) == [("a", "y"), ("b", "x")]
    assert read_edges(tmp_path, 0.5, max_per_source=2) == [("a", "y"), ("a", "z"), ("b", "x")]
    with pytest.raises(ConfigError, match="max_prerequisites"):
        read_edges(tmp_path, 0.5, max_per_source=0)


def test_alpha_mixes_each_vector_with_its_propagated_one():
    x = torch.randn(4, 3)
    edges = torch.tensor([[0, 1], [2, 1]])
    full = gcn_smooth(x, edges, 1, "to_prerequisite")
    assert torch.equal(gcn_smooth(x, edges, 1, "to_prerequisite", alpha=0.0), x)
    assert torch.allclose(gcn_smooth(x, edges, 1, "to_prerequisite", alpha=0.25), 0.75 * x + 0.25 * full, atol=1e-6)
    with pytest.raises(ValueError, match="alpha"):
        gcn_smooth(x, edges, 1, alpha=1.5)


def test_boost_lifts_a_prerequisite_next_to_the_tool_that_needs_it(tmp_path):
    from toolgraph.data.schema import Tool
    from toolgraph.retrieval.tgr import TGRConfig, TGRRetriever

    tools = [Tool("delete", "DeleteAccount", "delete the user account"), Tool("token", "GetUserToken", "get a token"),
             Tool("other", "OtherThing", "unrelated")]
    r = TGRRetriever(TGRConfig(model="all-MiniLM-L6-v2", graph="gold", alpha=0.0, boost=0.5, cache_dir=None))
    r.edges = [("delete", "token")]
    r.tools = tools
    r._index_edges()
    base = torch.tensor([[0.9, 0.1, 0.3]])
    r.encode_queries = lambda q: base  # noqa: E731 - scores are then base @ I
    r.tool_vectors = torch.eye(3)
    boosted = r.score(["delete my account"])
    assert torch.allclose(boosted, torch.tensor([[0.9, 0.1 + 0.5 * 0.9, 0.3]]))
    assert r.retrieve(["delete my account"], 2).ids == [["delete", "token"]]  # without the boost: other 2nd
