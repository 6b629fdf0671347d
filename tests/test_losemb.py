"""LoSemB: logical features, tool/query transfer, pruning, ablations, add_tools, KL (tiny encoders)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from toolgraph.config import EvaluateConfig, load_config
from toolgraph.data import load_dataset
from toolgraph.data.schema import Tool
from toolgraph.data.splits import inductive
from toolgraph.errors import ConfigError, DataError
from toolgraph.evaluation import evaluate
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.loading import resolve_retriever
from toolgraph.retrieval.losemb import LoSemBConfig, LoSemBRetriever, gaussian_kl


def _fitted(data_dir, model_dir, **kw) -> tuple[LoSemBRetriever, object]:
    ds = load_dataset(str(data_dir))
    r = LoSemBRetriever(LoSemBConfig(encoder=str(model_dir), cache_dir=None, **kw))
    r.fit(ds)
    r.index(ds.tools)
    return r, ds


def test_seen_tools_keep_graph_features_and_unseen_get_frequency_weighted_transfer(tiny_dataset_dir, tiny_bert_dir):
    r, ds = _fitted(tiny_dataset_dir, tiny_bert_dir, top_j=1)
    ids = [t.id for t in r.tools]
    assert sorted(r.seen_delta) == ["t1", "t3", "t4"]  # invoked by train queries q1, q2
    assert [ids[i] for i, tr in enumerate(r.transferred) if tr] == ["t2", "t5"]
    for tid in ("t2", "t5"):
        i = ids.index(tid)
        near = int((r.tool_x[i] @ r.query_x.T).argmax())  # S_t with J = 1
        used = r.query_tools[near]  # seen tools it invoked, frequency 1 each
        want = torch.stack([r.seen_delta[t] for t in used]).mean(0)
        assert torch.allclose(r.tool_e[i] - r.tool_x[i], want, atol=1e-6)
        assert r.users[near, i]  # counts as used by its similar query (pruning)


def test_logical_features_are_lightgcn_minus_text(tiny_dataset_dir, tiny_bert_dir):
    """Layer mean of a 1-layer propagation on q1-t1, q2-t3, q2-t4: dE_t1 = (x_t1 + x_q1) / 2 - x_t1."""
    r, _ = _fitted(tiny_dataset_dir, tiny_bert_dir, layers=1)
    i = [t.id for t in r.tools].index("t1")
    q1 = r.query_x[0]  # train queries in file order: q1, q2
    assert torch.allclose(r.seen_delta["t1"], (r.tool_x[i] + q1) / 2 - r.tool_x[i], atol=1e-5)


def test_query_transfer_and_pruning_and_ablations(tiny_dataset_dir, tiny_bert_dir):
    r, _ = _fitted(tiny_dataset_dir, tiny_bert_dir, top_j=2, top_i=1)
    q = ["weather in paris today"]
    full = r.score(q)
    # pruning: the candidates are the tools of the single most similar training query (+ unseen tools it "uses")
    near = int((F.normalize(r.embedder.embed(q, max_length=128), dim=-1) @ r.query_x.T).argmax())
    cand = r.users[near]
    assert (full[0, cand].min() > full[0, ~cand].max()).item()
    r.config.no_relational_retrieval = True
    unpruned = r.score(q)
    assert torch.allclose(unpruned[0, cand], full[0, cand])
    r.config.no_query_transfer = True
    plain = r.score(q)
    xq = F.normalize(r.embedder.embed(q, max_length=128), dim=-1)
    assert torch.allclose(plain, xq @ F.normalize(r.tool_e, dim=-1).T, atol=1e-6)
    r.config.prune_unseen = False  # tools without training queries stay candidates for every request
    r.index(r.tools)
    assert all(bool(r.users[:, i].all()) == tr for i, tr in enumerate(r.transferred) if tr)
    r.config.no_tool_transfer = True
    r.index(r.tools)
    for i, tr in enumerate(r.transferred):
        if tr:
            assert torch.equal(r.tool_e[i], r.tool_x[i])


def test_add_tools_with_and_without_example_queries(tiny_dataset_dir, tiny_bert_dir, tmp_path):
    r, _ = _fitted(tiny_dataset_dir, tiny_bert_dir, top_j=1)
    before = r.score(["what is the weather in paris"])
    r.add_tools([Tool("t6", "ski_report", "snow depth at ski resorts")])
    r.add_tools([Tool("t7", "rain_radar", "rain radar map")], example_queries={"t7": ["what is the weather in paris"]})
    after = r.score(["what is the weather in paris"])
    assert after.shape[1] == before.shape[1] + 2
    ids = [t.id for t in r.tools]
    assert r.transferred[ids.index("t6")] and r.transferred[ids.index("t7")]
    # the example request is a pruning row of t7: the same request keeps t7 among the candidates
    assert r.users[-1, ids.index("t7")] and r.query_tools[-1] == ["t7"]
    with pytest.raises(DataError, match="not being added"):
        r.add_tools([Tool("t8", "x", "y")], example_queries={"t9": ["z"]})
    r.save(tmp_path / "r")
    loaded = Retriever.load(tmp_path / "r")
    assert torch.allclose(loaded.score(["what is the weather in paris"]), after, atol=1e-5)
    loaded.remove_tools(["t7"])
    assert "t7" not in {t.id for t in loaded.tools} and "t7" not in loaded.examples


def test_gaussian_kl_matches_closed_form():
    torch.manual_seed(0)
    a = torch.randn(20000, 3)
    assert gaussian_kl(a, a) == pytest.approx(0.0, abs=1e-9)
    shifted = a + torch.tensor([1.0, 0.0, 0.0])
    assert gaussian_kl(shifted, a) == pytest.approx(0.5, abs=0.03)  # ||mu||^2 / 2 for unit covariance
    wide = a * 2
    assert gaussian_kl(wide, a) == pytest.approx(0.5 * 3 * (4 - 1 - math.log(4)), rel=0.05)


def test_alignment_kl_needs_both_kinds(tiny_dataset_dir, tiny_bert_dir):
    r, _ = _fitted(tiny_dataset_dir, tiny_bert_dir)
    kl = r.alignment_kl(dims=2)
    assert set(kl) == {"before", "after"} and all(math.isfinite(v) for v in kl.values())
    r.remove_tools(["t2", "t5"])
    with pytest.raises(DataError, match="seen and unseen"):
        r.alignment_kl()


def test_inductive_evaluation_and_config(synthetic_dataset_dir, tiny_bert_dir):
    """Through evaluate(): unseen tools of an inductive split are retrieved via transfer."""
    ds, unseen = inductive(load_dataset(str(synthetic_dataset_dir)), 0.3, seed=0)
    cfg = load_config(EvaluateConfig, [], ["retriever.name=losemb", f"retriever.encoder={tiny_bert_dir}",
                                           "retriever.cache_dir=null", "eval.ks=[1,3,5]"])
    r = resolve_retriever(cfg.retriever)
    report = evaluate(r, ds, "test", cfg.eval)
    ids = [t.id for t in r.tools]
    assert {ids[i] for i, tr in enumerate(r.transferred) if tr} == set(unseen)
    assert 0 < report.metrics["recall@5"] <= 1
    with pytest.raises(ConfigError, match="top_j"):
        LoSemBRetriever(LoSemBConfig(top_j=0))
