"""Learned score fusion (toolgraph/retrieval/fusion_model.py, ``retriever.method: learned``): the
features, fitting on one catalog's labels and ranking another, the retriever that saves and loads it,
and the errors that name the file or key."""

import json
import math

import pytest
import torch

import toolgraph
from toolgraph.config import EvaluateConfig, load_config
from toolgraph.data.formats import read_dataset
from toolgraph.errors import ConfigError
from toolgraph.retrieval.fusion_model import FEATURES, FusionModel, pair_features
from toolgraph.retrieval.loading import resolve_retriever


def test_pair_features_by_hand():
    s = torch.tensor([[0.0, 2.0, 4.0, 1.0]])
    x, mask = pair_features([s, -s], candidates=1)
    assert x.shape == (1, 4, 2 * len(FEATURES))
    norm = [0.0, 0.5, 1.0, 0.25]
    assert x[0, :, 0].tolist() == norm  # score
    assert x[0, :, 1].tolist() == pytest.approx([1 / 4, 1 / 2, 1.0, 1 / 3])  # 1 / rank
    assert x[0, :, 2].tolist() == [1.0] * 4  # conf: 1 - the 10th best (here the 4th: 0.0)
    assert x[0, :, 4].tolist() == pytest.approx([v * math.log(4) for v in norm])
    assert mask.tolist() == [[True, False, True, False]]  # each member's top 1


def _catalog(n_queries, n_tools, lexical_is_right, seed):
    """Two members over one catalog: member 1 finds the gold tool when ``lexical_is_right``, else member 0."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.rand(n_queries, n_tools, generator=g), torch.rand(n_queries, n_tools, generator=g)
    gold = torch.zeros(n_queries, n_tools)
    gold[torch.arange(n_queries), torch.randint(n_tools, (n_queries,), generator=g)] = 1
    right = b if lexical_is_right else a
    right += 2 * gold  # the right member ranks the gold tool first
    return [a, b], gold


def _r1(scores, gold):
    return float(gold.gather(1, scores.argmax(1, keepdim=True)).mean())


def test_a_fitted_model_learns_which_member_to_trust_and_ranks_an_unseen_catalog():
    train = [_catalog(40, 30, True, s) for s in range(3)]
    model = FusionModel.fit(train, candidates=10, names=["a", "b", "c"])
    test_scores, test_gold = _catalog(50, 25, True, 99)
    fused = model.score(test_scores)
    assert _r1(fused, test_gold) == 1.0 and _r1(test_scores[0], test_gold) < 0.2
    other = FusionModel.fit([_catalog(40, 30, False, s) for s in range(3)], candidates=10)
    scores, gold = _catalog(50, 25, False, 98)
    assert _r1(other.score(scores), gold) == 1.0
    # non-candidates rank below every candidate
    x, mask = pair_features(test_scores, 10)
    assert fused[mask].min() > fused[~mask].max()


def test_the_learned_fusion_retriever_saves_its_model_and_loads_anywhere(tiny_dataset_dir, tmp_path, monkeypatch):
    ds = read_dataset(tiny_dataset_dir)
    q = ["weather forecast in paris", "book a flight"]
    model = FusionModel.fit([_catalog(20, 12, True, 1)], candidates=5, names=["synthetic"])
    path = model.save(tmp_path / "fusion.json")
    assert json.loads(path.read_text())["features"][:2] == ["0:score", "0:inv_rank"]
    cfg = load_config(EvaluateConfig, [{"retriever": {"name": "fusion", "members": ["bm25", {"name": "bm25"}],
                                                      "method": "learned", "model_file": str(path)}}])
    fused = resolve_retriever(cfg.retriever)
    fused.index(ds.tools)
    got = fused.retrieve(q, 3)
    single = resolve_retriever(load_config(EvaluateConfig, []).retriever)
    single.index(ds.tools)
    assert got.ids[0][0] == single.retrieve(q, 1).ids[0][0]  # two copies of BM25 agree with BM25 on top
    fused.save(tmp_path / "saved")
    assert (tmp_path / "saved" / "fusion_model.json").is_file()
    path.unlink()  # the saved folder holds its own copy
    monkeypatch.chdir(tmp_path / "saved" / "member_0")
    again = toolgraph.load(tmp_path / "saved").retrieve(q, 3)
    assert again.ids == got.ids and torch.allclose(again.scores, got.scores)


def test_bad_fusion_models_name_the_key_or_the_file(tiny_dataset_dir, tmp_path):
    def fusion(**extra):
        cfg = load_config(EvaluateConfig, [{"retriever": {"name": "fusion", "members": ["bm25", "bm25"], **extra}}])
        return resolve_retriever(cfg.retriever)

    with pytest.raises(ConfigError, match="retriever.model_file: method 'learned' needs"):
        fusion(method="learned")
    missing = fusion(method="learned", model_file=str(tmp_path / "nope.json"))  # may be a saved folder's file ...
    missing.index(read_dataset(tiny_dataset_dir).tools)
    with pytest.raises(ConfigError, match="no fusion model at .*nope.json"):  # ... so it fails when it must score
        missing.score(["book a flight"])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json is not a fusion model JSON"):
        fusion(method="learned", model_file=str(tmp_path / "bad.json"))
    three = FusionModel.fit([([torch.rand(4, 6), torch.rand(4, 6), torch.rand(4, 6)], torch.eye(4, 6))], candidates=3)
    with pytest.raises(ConfigError, match="fitted on 3 members, retriever.members has 2"):
        fusion(method="learned", model_file=str(three.save(tmp_path / "three.json")))
    raw = json.loads((tmp_path / "three.json").read_text())
    raw["features"][0] = "0:bm25_magic"
    (tmp_path / "odd.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="odd.json was fitted on features"):
        FusionModel.load(tmp_path / "odd.json")
    raw = json.loads((tmp_path / "three.json").read_text())
    raw["mean"] = "zeros"
    (tmp_path / "text.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="text.json: weights, mean and std must be lists of numbers"):
        FusionModel.load(tmp_path / "text.json")
    with pytest.raises(ConfigError, match="retriever.weights: method 'learned' takes its weights"):
        fusion(method="learned", model_file=str(tmp_path / "three.json"), weights=[1.0, 0.3])
    raw = json.loads((tmp_path / "three.json").read_text())
    raw["weights"] = raw["weights"][:-1]
    (tmp_path / "short.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="short.json: weights, mean and std need 15 values"):
        FusionModel.load(tmp_path / "short.json")
