"""Tool2Vec: tool vector = mean of its training queries' vectors; description fallback."""

import pytest
import torch

from toolgraph.config import EvalConfig
from toolgraph.data.formats import read_dataset
from toolgraph.data.schema import Tool
from toolgraph.evaluation import evaluate
from toolgraph.retrieval import Retriever
from toolgraph.retrieval.loading import resolve_retriever
from toolgraph.retrieval.tool2vec import Tool2VecConfig


def _t2v(tiny_bert_dir, **kw):
    return resolve_retriever(Tool2VecConfig(model=str(tiny_bert_dir), cache_dir=None, progress=False, **kw))


def test_tool_vector_is_the_mean_of_its_training_queries(tiny_bert_dir, synthetic_dataset_dir):
    ds = read_dataset(synthetic_dataset_dir)
    r = _t2v(tiny_bert_dir)
    r.fit(ds)
    r.index(ds.tools)
    tool = r.tools[0]
    texts = [q.text for q in ds.split("train") if tool.id in q.tools]
    assert texts and len(r.usage[tool.id]) == len(texts)
    expected = torch.nn.functional.normalize(r.encode_queries(texts).mean(0), dim=0)
    assert torch.allclose(r.tool_vectors[0], expected, atol=1e-5)
    # only train queries shape the vectors (val/test would leak the labels being scored)
    assert sum(map(len, r.usage.values())) == sum(len(q.tools) for q in ds.split("train"))


def test_unused_and_new_tools_keep_their_description_vector(tiny_bert_dir, synthetic_dataset_dir):
    ds = read_dataset(synthetic_dataset_dir)
    r = _t2v(tiny_bert_dir)
    r.fit(ds)
    r.index(ds.tools)
    new = Tool("new", "get_tides", "returns tide times for a beach")
    r.add_tools([new])
    i = [t.id for t in r.tools].index("new")
    assert torch.allclose(r.tool_vectors[i], r.embed([new.document()])[0], atol=1e-6)


def test_usage_weight_zero_is_the_dense_retriever(tiny_bert_dir, synthetic_dataset_dir):
    from toolgraph.retrieval.dense import DenseConfig

    ds = read_dataset(synthetic_dataset_dir)
    a = _t2v(tiny_bert_dir, usage_weight=0.0)
    a.fit(ds)
    a.index(ds.tools)
    b = resolve_retriever(DenseConfig(model=str(tiny_bert_dir), cache_dir=None, progress=False))
    b.index(ds.tools)
    assert torch.allclose(a.tool_vectors, b.tool_vectors, atol=1e-6)
    with pytest.raises(ValueError, match="usage_weight"):
        _t2v(tiny_bert_dir, usage_weight=1.5)


def test_evaluate_fits_on_train_and_saved_vectors_reload(tiny_bert_dir, synthetic_dataset_dir, tmp_path):
    ds = read_dataset(synthetic_dataset_dir)
    r = _t2v(tiny_bert_dir)
    report = evaluate(r, ds, "test", EvalConfig(ks=[1, 5]))
    assert r.usage and 0 <= report.metrics["recall@5"] <= 1
    r.save(tmp_path / "t2v")
    loaded = Retriever.load(tmp_path / "t2v")
    assert torch.equal(loaded.tool_vectors, r.tool_vectors)
    q = ["please tell me the weather"]
    assert loaded.retrieve(q, 3).ids == r.retrieve(q, 3).ids
    # a loaded index keeps its usage: adding a tool does not turn the others into description vectors
    loaded.config.model = str(tiny_bert_dir)
    loaded.add_tools([Tool("new", "get_tides", "returns tide times for a beach")])
    keep = [i for i, t in enumerate(loaded.tools) if t.id != "new"]
    assert torch.allclose(loaded.tool_vectors[keep], r.tool_vectors, atol=1e-5)


def test_query_pairs_share_a_tool_and_no_tool_repeats(synthetic_dataset_dir):
    from toolgraph.tasks.tool2vec import QueryPairSampler

    ds = read_dataset(synthetic_dataset_dir)
    ids = sorted({t.id for t in ds.tools})
    gold = [[ids.index(t) for t in q.tools] for q in ds.split("train")]
    users = {}
    for i, g in enumerate(gold):
        for t in g:
            users.setdefault(t, []).append(i)
    s = QueryPairSampler(gold, users, 8, seed=1)
    plan = s.plan()
    repeats = sum(len(b) - len({t for _, t, _ in b}) for b in plan)
    assert plan and repeats <= s.duplicates  # only the counted leftovers repeat a tool
    for batch in plan:
        for q, t, p in batch:
            assert t in gold[q] and t in gold[p] and (p != q or users[t] == [q])
    assert QueryPairSampler(gold, users, 8, seed=1).plan() == plan


def test_query_to_query_fine_tuning_trains_and_exports_tool2vec(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    from conftest import tiny_train_overrides

    import toolgraph
    from toolgraph.config import load_config
    from toolgraph.training import TrainConfig, train

    over = tiny_train_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path, steps=30) + ["model.name=tool2vec"]
    summary = train(load_config(TrainConfig, [], over))
    assert summary["metrics"]["recall@3"] > 0.5  # chance ~0.12
    for k in ("recall@1", "recall@3", "ndcg@5"):
        assert summary["test"][f"test/{k}"] == pytest.approx(summary["metrics"][k], abs=1e-5)
    a, b = toolgraph.load(tmp_path), toolgraph.load(summary["best_checkpoint"])
    assert a.name == b.name == "tool2vec" and a.usage == b.usage
    q = ["please tell me the weather"]
    assert a.retrieve(q, 3).ids == b.retrieve(q, 3).ids
