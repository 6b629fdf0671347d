"""toolgraph.tuning: a grid of config overrides chosen on val (one tie-break rule), tested once; the
composed retrievers reuse their members' outputs across grid points (pipeline.py: reconfigure, remember)."""

import json
import zlib

import pytest
import torch

from toolgraph.config import EvalConfig, EvaluateConfig, load_config
from toolgraph.data import prepare_dataset
from toolgraph.errors import ConfigError
from toolgraph.evaluation import evaluate
from toolgraph.retrieval.bm25 import BM25Retriever
from toolgraph.retrieval.pipeline import PipelineConfig, PipelineRetriever, Reranker
from toolgraph.tuning import choose_on_val, evaluate_grid, parse_grid, pick

EVAL = {"ks": [1, 2, 3], "bootstrap": 0, "agent_level": False}


@pytest.fixture
def crossed(tmp_path):
    """Four tools with one keyword each. On val the gold tool is the keyword's (BM25 is right); on test the
    gold tool is another one, the one the toy reranker below favours."""
    tools = [{"id": f"t{i}", "name": f"get_{w}", "description": f"{w} {w} information"}
             for i, w in enumerate(["weather", "flight", "hotel", "music"], start=1)]
    queries = [
        {"id": "v1", "text": "weather today", "tools": ["t1"], "split": "val"},
        {"id": "v2", "text": "a flight please", "tools": ["t2"], "split": "val"},
        {"id": "v3", "text": "cheap hotel", "tools": ["t3"], "split": "val"},
        {"id": "s1", "text": "hotel tonight", "tools": ["t1"], "split": "test"},
        {"id": "s2", "text": "music playlist", "tools": ["t2"], "split": "test"},
        {"id": "s3", "text": "flight to rome", "tools": ["t4"], "split": "test"},
        {"id": "r1", "text": "weather in paris", "tools": ["t1"], "split": "train"},
    ]
    for name, rows in (("tools", tools), ("queries", queries)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


FAVOURITE = {"weather today": "t2", "a flight please": "t3", "cheap hotel": "t4",  # val: a wrong tool
             "hotel tonight": "t1", "music playlist": "t2", "flight to rome": "t4"}  # test: the gold tool


class ToyReranker(Reranker):
    """Scores 1 for the query's favourite tool, else a small hash of (query, tool); counts its calls."""

    name = "toy"

    def __init__(self):
        super().__init__()
        self.calls = 0

    def rerank(self, queries, candidates):
        self.calls += 1
        width = max(len(c) for c in candidates)
        out = torch.full((len(queries), width), -1.0e7)
        for i, (q, cands) in enumerate(zip(queries, candidates)):
            for j, t in enumerate(cands):
                out[i, j] = 1.0 if FAVOURITE.get(q) == t else (zlib.crc32(f"{q}|{t}".encode()) % 100) / 1000
        return out


def base_config(folder, retriever=None, **data):
    return load_config(EvaluateConfig, [{"data": {"name": str(folder), "split": "test", **data},
                                         "retriever": retriever or {"name": "bm25"}, "eval": EVAL}])


def toy_pipeline(w=0.0):
    return PipelineRetriever(PipelineConfig(depth=4, first_stage_weight=w), first_stage=BM25Retriever(),
                             reranker=ToyReranker())


def test_the_grid_is_searched_on_val_and_the_winner_tested_once(crossed, tmp_path):
    cfg = base_config(crossed)
    cfg.retriever = toy_pipeline().config
    r = toy_pipeline()
    grid = {"retriever.first_stage_weight": [0.0, 100.0]}
    tuned = choose_on_val(cfg, grid, "recall@1", retriever=r)
    # val: BM25 is right, so the large weight wins there ...
    assert [p.metrics["recall@1"] for p in tuned.table] == [0.0, 1.0]
    assert tuned.winner == {"retriever.first_stage_weight": 100.0}
    assert r.config.first_stage_weight == 100.0 and tuned.config.retriever.first_stage_weight == 100.0
    # ... although on test the other point is the better one: test never chooses
    on_test = evaluate_grid(cfg, grid, "test", retriever=toy_pipeline())
    assert [p.metrics["recall@1"] for p in on_test] == [1.0, 0.0]
    assert tuned.report.metrics["recall@1"] == 0.0 and len(tuned.report.query_ids) == 3
    # the reranker scored val once (one batch) for both weights, and test once
    assert r.reranker.calls == 2


def test_testing_on_the_val_split_is_refused(crossed):
    cfg = base_config(crossed, split="val")
    with pytest.raises(ConfigError, match="val split"):
        choose_on_val(cfg, {"retriever.k1": [1.2, 1.5]}, "recall@1")


def test_the_tie_break_rule():
    # the first metric decides; equal at 4 decimals is a tie, which the next metric named breaks ...
    rows = [{"recall@5": 0.98731, "recall@3": 0.95}, {"recall@5": 0.98734, "recall@3": 0.96},
            {"recall@5": 0.9870, "recall@3": 0.99}]
    assert pick(rows, ["recall@5", "recall@3"]) == 1
    assert pick(rows, "recall@5,recall@3") == 1
    # ... and a tie on every metric goes to the row listed first (not the largest, not the last)
    assert pick(rows, "recall@5") == 0
    assert pick([{"m": 0.5}, {"m": 0.7}, {"m": 0.7}], "m") == 1
    assert pick(rows, "recall@5", decimals=6) == 1  # at 6 places 0.98734 > 0.98731
    with pytest.raises(ConfigError, match="'ndcg@5'.*recall@3, recall@5"):
        pick(rows, "ndcg@5")


def test_a_tie_on_the_grid_goes_to_the_point_listed_first(crossed):
    cfg = base_config(crossed, retriever={"name": "fusion", "method": "score",
                                          "members": [{"name": "bm25"}, {"name": "bm25", "k1": 1.2}]})
    for weights in ([[2.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [2.0, 0.0]]):  # the same ranking at every point
        tuned = choose_on_val(cfg, {"retriever.weights": weights}, ["recall@1", "recall@3"], test=False)
        assert len({json.dumps(p.metrics) for p in tuned.table}) == 1
        assert tuned.winner == {"retriever.weights": weights[0]} and tuned.report is None


@pytest.mark.parametrize("key, named", [
    ("retriever.nope", "nope"),  # not in the retriever's schema
    ("retriever.members.1.nope", "nope"),  # not in a member's schema
    ("retriever.members.5.k1", "retriever.members.5.k1"),  # no such member
    ("retriever.members.0.name.x", "retriever.members.0.name.x"),  # below a value
    ("data.name", "data.name"),  # the val queries must stay the same
    ("out", "out"),
])
def test_a_bad_grid_key_is_a_config_error_naming_it_before_any_work(crossed, key, named, monkeypatch):
    import toolgraph.tuning as tuning

    monkeypatch.setattr(tuning, "evaluate", lambda *a, **k: pytest.fail("evaluated before the grid was checked"))
    cfg = base_config(crossed, retriever={"name": "fusion", "members": [{"name": "bm25"}, {"name": "bm25"}]})
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")) as e:
        choose_on_val(cfg, {"retriever.weights": [[1, 1]], key: [1, 2]}, "recall@1")
    assert key in str(e.value)


def test_a_metric_the_eval_section_does_not_compute_is_refused(crossed):
    with pytest.raises(ConfigError, match="recall@5"):
        choose_on_val(base_config(crossed), {"retriever.k1": [1.2]}, "recall@5")  # eval.ks is [1, 2, 3]


def test_reused_member_outputs_rank_as_a_fresh_pipeline_at_every_weight(crossed):
    ds = prepare_dataset(load_config(EvaluateConfig, [{"data": {"name": str(crossed)}}]).data)
    eval_cfg = EvalConfig(**EVAL)
    shared = toy_pipeline()
    shared.remember(True)
    for w in (0.0, 0.05, 0.3, 1.0, 100.0, 0.05):
        assert shared.reconfigure(PipelineConfig(depth=4, first_stage_weight=w))
        for split in ("val", "test"):
            got = evaluate(shared, ds, split, eval_cfg)
            want = evaluate(toy_pipeline(w), ds, split, eval_cfg)
            assert got.ranking.ids == want.ranking.ids
            assert torch.equal(got.ranking.scores, want.ranking.scores)
            assert got.metrics == want.metrics
    assert shared.reranker.calls == 2  # val once, test once, for six weights
    shared.remember(False)
    evaluate(shared, ds, "val", eval_cfg)
    assert shared.reranker.calls == 3  # memo off: scored again


def test_a_fusion_grid_scores_each_member_once_and_only_changed_members_again(crossed, monkeypatch):
    calls = []
    score = BM25Retriever.score
    monkeypatch.setattr(BM25Retriever, "score", lambda self, q: calls.append(self.config.k1) or score(self, q))
    cfg = base_config(crossed, retriever={"name": "fusion", "method": "score",
                                          "members": [{"name": "bm25"}, {"name": "bm25", "k1": 0.5}]})
    grid = {"retriever.members.1.k1": [0.5, 3.0], "retriever.weights": [[1.0, 0.0], [1.0, 0.3], [0.0, 1.0]]}
    table = evaluate_grid(cfg, grid, "val")
    assert sorted(calls) == [0.5, 1.5, 3.0]  # the first member once, the second once per k1 value
    assert [p.overrides for p in table][:2] == [{"retriever.members.1.k1": 0.5, "retriever.weights": [1.0, 0.0]},
                                                {"retriever.members.1.k1": 0.5, "retriever.weights": [1.0, 0.3]}]
    from toolgraph.tuning import point_config

    ds = prepare_dataset(cfg.data)
    for p in table:  # the same metrics as a fusion built afresh for the point
        fresh = point_config(cfg, p.overrides)
        from toolgraph.retrieval.loading import resolve_retriever

        assert evaluate(resolve_retriever(fresh.retriever), ds, "val", fresh.eval).metrics == p.metrics


def test_parse_grid_reads_yaml_values_and_keeps_lists_whole():
    assert parse_grid(["retriever.first_stage_weight=0,0.5,10", "retriever.weights=[1, 0.3],[1,0.5]",
                       "--eval.step_merge=max,rrf"]) == {
        "retriever.first_stage_weight": [0, 0.5, 10], "retriever.weights": [[1, 0.3], [1, 0.5]],
        "eval.step_merge": ["max", "rrf"]}
    for bad in (["retriever.depth"], ["=1,2"], ["retriever.depth="], ["a=1", "a=2"]):
        with pytest.raises(ConfigError, match="--grid"):
            parse_grid(bad)


def test_out_gets_the_tuned_retriever_and_the_val_table(crossed, tmp_path):
    import toolgraph

    cfg = base_config(crossed, retriever={"name": "fusion", "method": "score",
                                          "members": [{"name": "bm25"}, {"name": "bm25", "k1": 0.5}]})
    cfg.out = str(tmp_path / "tuned")
    tuned = choose_on_val(cfg, {"retriever.weights": [[1.0, 0.0], [1.0, 2.0]]}, "recall@1")
    res = json.loads((tmp_path / "tuned" / "results.json").read_text())
    assert res["tuning"]["winner"] == tuned.winner and len(res["tuning"]["table"]) == 2
    assert res["tuning"]["val_split"] == "val" and "listed first" in res["tuning"]["rule"]
    assert res["config"]["retriever"]["weights"] == tuned.winner["retriever.weights"]
    assert res["metrics"] == pytest.approx(tuned.report.metrics)
    loaded = toolgraph.load(tmp_path / "tuned" / "retriever")
    assert loaded.config.weights == tuned.winner["retriever.weights"]


def test_the_tune_command_chooses_on_val_and_writes_the_tuned_folder(crossed, tmp_path, capsys):
    """`toolgraph tune`: the grid from --grid, scored on val, the winner tested on data.split and saved with
    the val table; a bad grid key fails before any work, with exit 2 and the key named."""
    from toolgraph.cli import main

    out = tmp_path / "tuned"
    base = ["tune", "retriever.name=bm25", f"data.name={crossed}", "eval.ks=[1,2,3]", "eval.bootstrap=0",
            "eval.agent_level=false"]
    assert main([*base, "--grid", "retriever.k1=0.5,1.5", "--metric", "recall@1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "chosen on val" in printed and "val grid: 2 points" in printed
    results = json.loads((out / "results.json").read_text())
    assert len(results["tuning"]["table"]) == 2 and (out / "retriever" / "retriever.json").is_file()
    assert main([*base, "--grid", "retriever.no_such_key=1,2", "--metric", "recall@1"]) == 2
    assert "no_such_key" in capsys.readouterr().err
