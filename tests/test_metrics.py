"""Metrics against ranx (an independent, well-kept implementation) and hand-checked cases."""

import random

import pytest
import torch
from ranx import Qrels, Run, evaluate

from toolgraph import metrics as M


def _random_case(seed: int, n_queries: int = 60, n_docs: int = 30, depth: int = 12):
    rng = random.Random(seed)
    docs = [f"d{i}" for i in range(n_docs)]
    rankings, golds = [], []
    for _ in range(n_queries):
        gold = rng.sample(docs, rng.randint(1, 15))  # often |G| > K
        ranking = rng.sample(docs, depth)
        rankings.append(ranking)
        golds.append(gold)
    return rankings, golds


def _ranx(rankings, golds, names):
    qrels = Qrels({f"q{i}": {g: 1 for g in gold} for i, gold in enumerate(golds)})
    # strictly decreasing scores: ranx sees exactly our order
    run = Run({f"q{i}": {d: float(len(r) - j) for j, d in enumerate(r)} for i, r in enumerate(rankings)})
    return evaluate(qrels, run, names, make_comparable=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_ranx(seed):
    rankings, golds = _random_case(seed)
    ks = [1, 3, 5, 10]
    ours = M.compute(rankings, golds, ks)
    names = [f"{m}@{k}" for m in ("recall", "precision", "ndcg") for k in ks] + ["mrr"]
    ref = _ranx(rankings, golds, names)
    for name in names:
        assert ours[name] == pytest.approx(ref[name], abs=1e-6), name


def _map_reference(ranking, gold, k):
    gold = set(gold)
    hits, total = 0, 0.0
    for i, d in enumerate(ranking[:k], 1):
        if d in gold:
            hits += 1
            total += hits / i
    return total / min(len(gold), k)


def _pass_reference(ranking, gold, k):
    return float(set(gold) <= set(ranking[:k]))


@pytest.mark.parametrize("seed", [3, 4])
def test_map_and_pass_against_plain_python(seed):
    rankings, golds = _random_case(seed)
    for k in (1, 3, 5, 10):
        ours = M.compute(rankings, golds, [k], ["map", "pass"])
        ref_map = sum(_map_reference(r, g, k) for r, g in zip(rankings, golds)) / len(golds)
        ref_pass = sum(_pass_reference(r, g, k) for r, g in zip(rankings, golds)) / len(golds)
        assert ours[f"map@{k}"] == pytest.approx(ref_map, abs=1e-6)
        assert ours[f"pass@{k}"] == pytest.approx(ref_pass, abs=1e-6)


def test_map_equals_ranx_when_gold_fits_in_k():
    # with |G| <= K, min(|G|, K) = |G| and our mAP@K equals ranx's map@K
    rng = random.Random(7)
    docs = [f"d{i}" for i in range(20)]
    golds = [rng.sample(docs, rng.randint(1, 3)) for _ in range(40)]
    rankings = [rng.sample(docs, 10) for _ in range(40)]
    ours = M.compute(rankings, golds, [5, 10], ["map"])
    ref = _ranx(rankings, golds, ["map@5", "map@10"])
    assert ours["map@5"] == pytest.approx(ref["map@5"], abs=1e-6)
    assert ours["map@10"] == pytest.approx(ref["map@10"], abs=1e-6)


def test_hand_computed_case():
    # gold {a, b, c}; ranking x a y b: one hit at 2, one at 4
    out = M.compute([["x", "a", "y", "b"]], [["a", "b", "c"]], [2, 4], M.METRICS)
    assert out["recall@2"] == pytest.approx(1 / 3)
    assert out["recall@4"] == pytest.approx(2 / 3)
    assert out["precision@4"] == pytest.approx(0.5)
    dcg4 = 1 / torch.log2(torch.tensor(3.0)).item() + 1 / torch.log2(torch.tensor(5.0)).item()
    idcg4 = sum(1 / torch.log2(torch.tensor(i + 1.0)).item() for i in (1, 2, 3))
    assert out["ndcg@4"] == pytest.approx(dcg4 / idcg4)
    # ToolBench's variant: ideal from the 2 retrieved hits only -> larger than ours
    idcg_tb = 1 + 1 / torch.log2(torch.tensor(3.0)).item()
    assert out["ndcg_toolbench@4"] == pytest.approx(dcg4 / idcg_tb)
    assert out["ndcg_toolbench@4"] > out["ndcg@4"]
    assert out["map@4"] == pytest.approx((1 / 2 + 2 / 4) / 3)
    assert out["pass@4"] == 0.0
    assert out["mrr"] == pytest.approx(0.5)


def test_gold_not_retrieved_counts_in_denominator():
    out = M.compute([["a", "x"]], [["a", "b"]], [2])
    assert out["recall@2"] == pytest.approx(0.5)
    assert out["pass@2"] == 0.0


def test_duplicates_in_ranking_count_once():
    out = M.compute([["a", "a", "b"]], [["a", "b"]], [3])
    assert out["recall@3"] == pytest.approx(1.0)
    assert out["precision@3"] == pytest.approx(2 / 3)


def test_k_larger_than_depth():
    out = M.compute([["a"]], [["a"]], [5], ["recall", "precision", "ndcg", "pass"])
    assert out["recall@5"] == 1.0 and out["precision@5"] == pytest.approx(0.2)
    assert out["ndcg@5"] == pytest.approx(1.0) and out["pass@5"] == 1.0


def test_torchmetrics_metric_matches_functional_in_batches():
    rankings, golds = _random_case(5)
    ks = [1, 5, 10]
    metric = M.RetrievalMetrics(ks, M.METRICS, prefix="test/")
    for lo in range(0, len(rankings), 17):
        metric.update(*M.hit_matrix(rankings[lo:lo + 17], golds[lo:lo + 17], depth=12))
    got = {k: float(v) for k, v in metric.compute().items()}
    want = M.compute(rankings, golds, ks, M.METRICS)
    for name, value in want.items():
        assert got["test/" + name] == pytest.approx(value, abs=1e-6)


def test_recall_matches_torchmetrics_on_full_corpus_scores():
    # when every document is scored, torchmetrics' RetrievalRecall has our definition
    from torchmetrics.retrieval import RetrievalRecall

    g = torch.Generator().manual_seed(0)
    scores = torch.rand(20, 15, generator=g)
    target = torch.rand(20, 15, generator=g) < 0.3
    target[:, 0] = True
    order = scores.argsort(1, descending=True)
    rankings = [[str(int(i)) for i in row] for row in order]
    golds = [[str(j) for j in range(15) if target[q, j]] for q in range(20)]
    ours = M.compute(rankings, golds, [5])["recall@5"]
    idx = torch.arange(20).repeat_interleave(15)
    ref = RetrievalRecall(top_k=5)(scores.flatten(), target.flatten(), indexes=idx)
    assert ours == pytest.approx(float(ref), abs=1e-6)


def test_roll_up_keeps_first_occurrence_order():
    owner = {"t1": "A", "t2": "B", "t3": "A", "t4": "C"}
    assert M.roll_up(["t3", "t2", "t1", "t9", "t4"], owner) == ["A", "B", "C"]


def test_unknown_metric_and_bad_k():
    with pytest.raises(ValueError, match="unknown metric"):
        M.compute([["a"]], [["a"]], [1], ["nope"])
    with pytest.raises(ValueError, match="K must be"):
        M.compute([["a"]], [["a"]], [0])


def test_bootstrap_interval_brackets_the_mean_and_matches_the_standard_error():
    from toolgraph.metrics import intervals

    g = torch.Generator().manual_seed(1)
    for q in (250, 4000):
        v = (torch.rand(q, generator=g) < 0.9).float()
        lo, hi = intervals({"recall@5": v}, samples=2000)["recall@5"]
        assert lo < float(v.mean()) < hi
        se = float(v.std()) / q ** 0.5  # a 95 % interval of a mean spans about 2 * 1.96 standard errors
        assert (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.15)
    assert intervals({"r": v}, samples=300, seed=4) == intervals({"r": v}, samples=300, seed=4)  # seeded
    assert intervals({"r": v}, samples=300, seed=4) != intervals({"r": v}, samples=300, seed=5)
    assert intervals({"r": torch.ones(50)}, samples=100) == {"r": (1.0, 1.0)}


def test_paired_difference_sees_a_shift_and_not_noise():
    from toolgraph.metrics import paired_difference

    a = (torch.arange(400) % 3 == 0).float()
    same = paired_difference(a, a.clone(), samples=500)
    assert same == {"difference": 0.0, "low": 0.0, "high": 0.0, "p": 1.0}
    better = a.clone()
    better[1:100:3] = 1.0  # 33 queries gained, none lost
    d = paired_difference(a, better, samples=2000)
    assert d["difference"] == pytest.approx(33 / 400) and 0 < d["low"] < d["difference"] < d["high"] and d["p"] < 0.001
    swap = a.clone()
    swap[0:60:3] = 0.0  # 20 queries lost ...
    swap[1:61:3] = 1.0  # ... and 20 gained: a tie overall
    noisy = paired_difference(a, swap, samples=2000)
    assert noisy["difference"] == 0.0 and noisy["low"] < 0 < noisy["high"] and noisy["p"] > 0.5
    with pytest.raises(ValueError, match="shape"):
        paired_difference(a, a[:10])
    with pytest.raises(ValueError, match="at least one query"):
        paired_difference(a[:0], a[:0])
