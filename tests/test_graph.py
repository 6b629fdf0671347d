"""The query–tool–agent graph, the three GNNs and the GraphTask (tiny random encoders)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_train_overrides

from toolgraph.config import load_config
from toolgraph.data import load_dataset
from toolgraph.data.graph import build_graph, without_queries_edges
from toolgraph.errors import ConfigError
from toolgraph.nn.gnn import EDGE_TYPES, INVOKES, build_gnn
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.dense import NodeText, text_embedder
from toolgraph.training import TrainConfig, train


def _graph(data_dir, model_dir, **kw):
    ds = load_dataset(str(data_dir))
    return ds, build_graph(ds, text_embedder(NodeText(encoder=str(model_dir), cache_dir=None)), **kw)


def test_graph_has_train_invokes_only_and_reverse_edges(tiny_dataset_dir, tiny_bert_dir):
    ds, g = _graph(tiny_dataset_dir, tiny_bert_dir)
    d = g.data
    assert d["query"].num_nodes == 5 and d["tool"].num_nodes == 5 and d["agent"].num_nodes == 2
    inv = d[INVOKES].edge_index
    # q1 -> t1, q2 -> t3, t4 (train); test queries q3..q5 have no edges
    pairs = {(g.query_ids[q], g.tools[t].id) for q, t in inv.T.tolist()}
    assert pairs == {("q1", "t1"), ("q2", "t3"), ("q2", "t4")}
    assert torch.equal(d[("tool", "rev_invokes", "query")].edge_index, inv.flip(0))
    dep = d[("tool", "depends_on", "tool")].edge_index
    assert [(g.tools[a].id, g.tools[b].id) for a, b in dep.T.tolist()] == [("t4", "t3")]
    own = {(g.tools[t].id, g.agents[a]) for t, a in d[("tool", "belongs_to", "agent")].edge_index.T.tolist()}
    assert own == {("t1", "a1"), ("t2", "a1"), ("t3", "a2"), ("t4", "a2")}  # t5 has no owner
    assert g.stats["tools_without_invocations"] == 2  # t2, t5
    assert d["tool"].x.shape[1] == d["query"].x.shape[1]


def test_edge_kinds_can_be_left_out_and_unknown_kinds_fail(tiny_dataset_dir, tiny_bert_dir):
    _, g = _graph(tiny_dataset_dir, tiny_bert_dir, edges=["invokes"])
    assert g.data[("tool", "depends_on", "tool")].edge_index.shape == (2, 0)
    assert g.data[("tool", "belongs_to", "agent")].edge_index.shape == (2, 0)
    with pytest.raises(ConfigError, match="model.edges"):
        _graph(tiny_dataset_dir, tiny_bert_dir, edges=["invokes", "cites"])


def test_batch_queries_are_isolated_in_training(tiny_dataset_dir, tiny_bert_dir):
    _, g = _graph(tiny_dataset_dir, tiny_bert_dir)
    q2 = g.query_ids.index("q2")
    edges = without_queries_edges(g.edge_index_dict(), torch.tensor([q2]), g.data["query"].num_nodes)
    assert edges[INVOKES].tolist() == [[g.query_ids.index("q1")], [0]]
    assert edges[("tool", "rev_invokes", "query")].tolist() == [[0], [g.query_ids.index("q1")]]


@pytest.mark.parametrize("kind", ["lightgcn", "gat", "sage"])
def test_isolated_nodes_depend_on_their_own_text_only(kind):
    torch.manual_seed(0)
    x = {"query": torch.randn(30, 16), "tool": torch.randn(8, 16), "agent": torch.randn(2, 16)}
    q, t = torch.randint(0, 20, (40,)), torch.randint(0, 8, (40,))
    edges = {INVOKES: torch.stack([q, t]), EDGE_TYPES[1]: torch.stack([t, q])}
    m = build_gnn(kind, 16, 2, hidden=16, heads=4).eval()
    full = m(x, edges)
    alone = m({"query": x["query"][20:]}, {})["query"]  # queries 20..29 have no edges
    assert torch.allclose(full["query"][20:], alone, atol=1e-5)
    assert not torch.allclose(full["tool"], m({"tool": x["tool"]}, {})["tool"], atol=1e-3)  # tools did aggregate


def test_untrained_lightgcn_is_mean_of_propagated_text():
    """Zero-initialised adapters: layer 0 = the text embedding, E = mean_l (D^-1/2 A D^-1/2)^l X."""
    torch.manual_seed(0)
    x = {"query": torch.randn(3, 4), "tool": torch.randn(2, 4)}
    e = torch.tensor([[0, 1, 2], [0, 0, 1]])
    m = build_gnn("lightgcn", 4, 2)
    out = m(x, {INVOKES: e, EDGE_TYPES[1]: e.flip(0)})
    a = torch.zeros(5, 5)
    for qi, ti in e.T.tolist():
        a[qi, 3 + ti] = a[3 + ti, qi] = 1
    dinv = a.sum(1).pow(-0.5)
    norm = dinv[:, None] * a * dinv[None, :]
    x0 = torch.cat([x["query"], x["tool"]])
    want = (x0 + norm @ x0 + norm @ norm @ x0) / 3
    assert torch.allclose(torch.cat([out["query"], out["tool"]]), want, atol=1e-5)


@pytest.mark.parametrize("kind,loss", [("lightgcn", "bpr"), ("gat", "infonce"), ("sage", "infonce")])
def test_graph_task_trains_exports_and_reloads(kind, loss, synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run", steps=30) + [
        "model.name=graph", f"model.gnn={kind}", f"model.loss={loss}", "model.hidden=32", "model.cache_dir=null",
        "data.batch_size=64", "optim.lr=5e-3", "trainer.check_val_every_n_epoch=null"]
    cfg = load_config(TrainConfig, [], over)
    summary = train(cfg)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["metrics"]["recall@5"] == pytest.approx(summary["metrics"]["recall@5"])
    graph = json.loads((tmp_path / "run" / "graph.json").read_text())
    assert graph["invokes"] > 0 and graph["belongs_to"] == 24
    r = Retriever.load(tmp_path / "run" / "retriever")
    ds = load_dataset(str(synthetic_dataset_dir))
    test = ds.split("test")
    ranking = r.retrieve([q.text for q in test], 5)
    hits = sum(set(q.tools) <= set(ids) for q, ids in zip(test, ranking.ids, strict=True))  # pass@k: all gold found
    assert hits / len(test) == pytest.approx(results["metrics"]["pass@5"], abs=1e-6)
    # learned something beyond chance on 24 tools (5/24 = 0.21 at random)
    assert results["metrics"]["recall@5"] > 0.5
    # a bare checkpoint rebuilds the graph from its data section and ranks the same
    import toolgraph

    from_ckpt = toolgraph.load(summary["best_checkpoint"])
    assert from_ckpt.retrieve([q.text for q in test], 5).ids == ranking.ids


def test_gnn_retriever_add_tools_scores_new_tools_from_text(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    from toolgraph.data.schema import Tool

    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run", steps=4) + [
        "model.name=graph", "model.gnn=sage", "model.hidden=32", "model.cache_dir=null", "test=false",
        "trainer.check_val_every_n_epoch=null"]
    train(load_config(TrainConfig, [], over))
    r = Retriever.load(tmp_path / "run" / "retriever")
    before = r.score(["please tell me the weather"])
    r.add_tools([Tool("new", "get_snow_report", "returns snow depth at ski resorts")])
    after = r.score(["please tell me the weather"])
    assert after.shape[1] == before.shape[1] + 1
    assert torch.allclose(after[:, :-1], before, atol=1e-5)  # graph tools keep their embeddings


def test_graph_config_errors(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path / "run") + ["model.name=graph"]
    with pytest.raises(ConfigError, match="model.gnn"):
        train(load_config(TrainConfig, [], over + ["model.gnn=gcn"]))
    with pytest.raises(ConfigError, match="model.loss"):
        train(load_config(TrainConfig, [], over + ["model.loss=hinge"]))


def test_dependencies_from_a_tgr_edge_file(tiny_dataset_dir, tiny_bert_dir, tmp_path):
    edges = tmp_path / "edges.jsonl"
    edges.write_text('{"source": "t2", "target": "t1", "prob": 0.9}\n{"source": "t3", "target": "t5", "prob": 0.2}\n'
                     '{"source": "t9", "target": "t1", "prob": 0.99}\n')
    _, g = _graph(tiny_dataset_dir, tiny_bert_dir, dependencies=str(edges), dependency_threshold=0.5)
    dep = g.data[("tool", "depends_on", "tool")].edge_index
    # the 0.2 edge is under the threshold; t9 is not in the catalog
    assert [(g.tools[a].id, g.tools[b].id) for a, b in dep.T.tolist()] == [("t2", "t1")]


def test_inductive_unseen_tools_have_no_invoke_edges(synthetic_dataset_dir, tiny_bert_dir):
    from toolgraph.data.splits import inductive

    ds, unseen = inductive(load_dataset(str(synthetic_dataset_dir)), 0.3, seed=0)
    g = build_graph(ds, text_embedder(NodeText(encoder=str(tiny_bert_dir), cache_dir=None)))
    invoked = {g.tools[t].id for t in g.data[INVOKES].edge_index[1].tolist()}
    assert unseen and not invoked & set(unseen)
    assert g.stats["tools_without_invocations"] == len(unseen)
