"""Query neighbours (query_knn): the training queries nearest a query vote for the tools they used."""

import json

import pytest
import torch

import toolgraph
from toolgraph.config import EvalConfig
from toolgraph.data.formats import read_dataset
from toolgraph.data.schema import Tool
from toolgraph.errors import DataError
from toolgraph.evaluation import evaluate
from toolgraph.retrieval.loading import resolve_retriever
from toolgraph.retrieval.query_knn import QueryKNNConfig


def _knn(tiny_bert_dir, ds=None, **kw):
    r = resolve_retriever(QueryKNNConfig(model=str(tiny_bert_dir), cache_dir=None, progress=False, **kw))
    if ds is not None:
        r.fit(ds)
        r.index(ds.tools)
    return r


def test_scores_are_softmax_votes_of_the_nearest_training_queries(tiny_bert_dir, synthetic_dataset_dir):
    ds = read_dataset(synthetic_dataset_dir)
    r = _knn(tiny_bert_dir, ds, neighbors=3, temperature=0.1, description_weight=0.01)
    train = [q for q in ds.split("train") if q.tools]
    assert [t for t, _ in r.examples] == [q.text for q in train]  # train only: never val or test labels
    queries = [q.text for q in ds.split("test")[:4]]
    q = r.encode_queries(queries)
    sims = q @ r.encode_queries([q.text for q in train]).T
    pos = {t.id: i for i, t in enumerate(r.tools)}
    want = 0.01 * (q @ r.tool_vectors.T)
    for row in range(len(queries)):
        v, i = sims[row].topk(3)
        for w, j in zip(torch.softmax(v / 0.1, 0).tolist(), i.tolist(), strict=True):
            for t in train[j].tools:
                want[row, pos[t]] += w
    assert torch.allclose(r.score(queries), want, atol=1e-5)


def test_a_training_query_with_one_neighbour_returns_its_own_tools_first(tiny_bert_dir, synthetic_dataset_dir):
    ds = read_dataset(synthetic_dataset_dir)
    r = _knn(tiny_bert_dir, ds, neighbors=1)
    texts = [q.text for q in ds.split("train")]
    unique = [q for q in ds.split("train") if texts.count(q.text) == 1][:5]
    assert len(unique) == 5
    for q in unique:  # its nearest training query is itself
        assert set(r.retrieve([q.text], len(q.tools)).ids[0]) == set(q.tools)


def test_tools_no_neighbour_used_rank_by_their_text_and_unfitted_is_an_error(tiny_bert_dir, synthetic_dataset_dir):
    ds = read_dataset(synthetic_dataset_dir)
    r = _knn(tiny_bert_dir, ds, neighbors=1)
    r.add_tools([Tool("new", "get_tides", "returns tide times for a beach")])
    s = r.score(["tide times for the beach"])
    i = [t.id for t in r.tools].index("new")
    assert s[0, i] == pytest.approx(1e-3 * float(r.encode_queries(["tide times for the beach"])[0] @ r.tool_vectors[i]),
                                    abs=1e-6)
    unfitted = _knn(tiny_bert_dir)
    unfitted.index(ds.tools)
    with pytest.raises(DataError, match=r"no training queries: fit\(dataset\)"):
        unfitted.retrieve(["x"], 3)


def test_evaluate_fits_it_and_a_saved_folder_votes_without_the_dataset(tiny_bert_dir, synthetic_dataset_dir, tmp_path):
    ds = read_dataset(synthetic_dataset_dir)
    r = _knn(tiny_bert_dir)
    report = evaluate(r, ds, "test", EvalConfig(ks=[1, 5]))
    assert r.examples and report.metrics["recall@5"] > 0
    vectors = r.example_vectors
    evaluate(r, ds, "val", EvalConfig(ks=[5]))  # fits again on the same training queries: nothing re-encoded
    assert r.example_vectors is vectors
    folder = r.save(tmp_path / "knn")
    back = toolgraph.load(folder)
    q = [x.text for x in ds.split("test")[:5]]
    assert back.retrieve(q, 5).ids == r.retrieve(q, 5).ids
    assert torch.allclose(back.score(q), r.score(q), atol=1e-6)
    assert back.examples == r.examples and torch.equal(back.example_vectors, r.example_vectors)


def test_damaged_training_queries_file_is_named(tiny_bert_dir, synthetic_dataset_dir, tmp_path):
    ds = read_dataset(synthetic_dataset_dir)
    folder = _knn(tiny_bert_dir, ds).save(tmp_path / "knn")
    (folder / "manifest.json").unlink()
    (folder / "examples.json").write_text(json.dumps({"text": "not a list"}))
    with pytest.raises(DataError, match=r"examples\.json: expected a JSON list"):
        toolgraph.load(folder)
    folder = _knn(tiny_bert_dir, ds).save(tmp_path / "knn2")
    (folder / "manifest.json").unlink()
    examples = json.loads((folder / "examples.json").read_text())
    (folder / "examples.json").write_text(json.dumps(examples[:-1]))
    with pytest.raises(DataError, match=r"example_vectors\.safetensors: example_vectors has \d+ rows"):
        toolgraph.load(folder)
